"""Metrics: vLLM-benchmark latency definitions, SLO settlement exactly once, speed."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from llmserve_env.core.metrics import (
    SLO_EPS_S,
    MetricsTracker,
    WindowMetrics,
    percentiles,
    weighted_percentiles,
)
from llmserve_env.shared.backend import Arrival, RequestRecord, WindowReport
from llmserve_env.shared.tasks import TASKS, TaskSpec, TenantSpec

TASK = TaskSpec(
    task_id="unit",
    difficulty="easy",
    description="two tenants for metric tests",
    tenants=(
        TenantSpec("a", 0, 0.5, ttft_slo_ms=500.0, tpot_slo_ms=50.0, prompt_tokens=(100, 0.1), output_tokens=(10, 0.1)),
        TenantSpec("b", 1, 0.5, ttft_slo_ms=2000.0, tpot_slo_ms=100.0, prompt_tokens=(100, 0.1),
                   output_tokens=(10, 0.1)),
    ),
    workload={"kind": "poisson", "rate_rps": 1.0},
    horizon=4,
)


def arrival(rid: int, t: float, tenant: str = "a", prompt: int = 100, out: int = 11) -> Arrival:
    return Arrival(rid, t, prompt, out, tenant, 0 if tenant == "a" else 1)


def record(a: Arrival, status: str = "ok", dispatch: float | None = None, first: float | None = None,
           finish: float | None = None, tokens: int | None = None, chunks: list[float] | None = None) -> RequestRecord:
    return RequestRecord(a.request_id, a.tenant, a.priority, a.arrival_s, a.prompt_tokens, a.output_tokens,
                         status=status, dispatch_s=dispatch, first_token_s=first, finish_s=finish,
                         output_tokens=a.output_tokens if tokens is None else tokens, chunk_times_s=chunks or [])


def report(t0: float, finished=(), pending=(), first_tokens=(), itl=(), **kw) -> WindowReport:
    return WindowReport(t0=t0, dt=1.0, finished=list(finished), pending=list(pending),
                        first_tokens=list(first_tokens), itl_samples=list(itl), **kw)


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 127, 128, 500):
        vals = rng.exponential(1.0, n).tolist()
        qs = (0, 1, 50, 90, 99, 100)
        assert percentiles(vals, *qs) == pytest.approx(np.percentile(vals, qs).tolist(), rel=1e-12, abs=1e-15)
    assert percentiles([], 50, 99) == [0.0, 0.0]


def test_percentiles_of_many_are_numpys_bit_for_bit():
    """From _NUMPY_MIN values on, numpy's linear method is computed on a sorted array: exactly np.percentile's
    value (ties, negative and huge values, every weight of the lerp, the bounds), NaN left to numpy."""
    from llmserve_env.shared.percentiles import _NUMPY_MIN

    rng = np.random.default_rng(7)
    qs = (0, 0.5, 1, 5, 25, 33.3, 50, 66.7, 75, 90, 95, 99, 99.9, 100)
    for n in (_NUMPY_MIN, _NUMPY_MIN + 1, 200, 257, 1000, 4099):
        for vals in (rng.exponential(0.05, n), rng.normal(0.0, 1e6, n), rng.integers(0, 5, n).astype(float),
                     np.full(n, 0.125), rng.lognormal(-3.0, 2.0, n)):
            assert percentiles(vals.tolist(), *qs) == np.percentile(vals, qs).tolist()
            assert percentiles(vals, *qs) == np.percentile(vals, qs).tolist()
    with_nan = np.append(rng.random(300), np.nan)
    assert all(x != x for x in percentiles(with_nan, 50, 99))


def test_weighted_percentile_matches_expanded_numpy():
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 40, 127, 128, 300):
        samples = [(float(rng.exponential(0.01)), int(rng.integers(0, 20))) for _ in range(n)]
        samples.append((0.5, 1))
        expanded = np.repeat([s[0] for s in samples], [s[1] for s in samples])
        qs = (0, 25, 50, 99, 100)
        assert weighted_percentiles(samples, *qs) == pytest.approx(np.percentile(expanded, qs).tolist(), rel=1e-12)
    assert weighted_percentiles([], 50) == [0.0]
    assert weighted_percentiles([(1.0, 0)], 50) == [0.0]


def test_compiled_weighted_percentiles_are_numpys_bit_for_bit(monkeypatch):
    """The compiled selection (shared/percentiles.py `_weighted_ranks`) gives the sorting paths' values
    exactly (numpy's from _NUMPY_MIN pairs on, the Python list's below), with ties, zero counts and heavy
    counts, from pairs and from columns; a NaN or a negative count is left to those paths."""
    from llmserve_env.shared import percentiles as pct
    from llmserve_env.shared.records import ItlSamples

    if not pct.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(7)
    qs = (0.0, 1.0, 25.0, 33.3, 50.0, 90.0, 99.0, 99.9, 100.0)
    cases = []
    for n in (pct._SELECT_MIN, 17, 40, 127, 128, 129, 400, 3000):
        for values in (np.round(rng.exponential(0.01, n), 4), rng.integers(0, 3, n).astype(float), np.full(n, 0.25)):
            counts = rng.integers(0, 3, n) * rng.integers(1, 400, n)
            counts[-1] = max(counts[-1], 1)
            cases.append((values, counts))
            cases.append((values, np.ones(n, dtype=np.int64)))
    for values, counts in cases:
        columns, pairs = ItlSamples(values, counts), list(zip(values.tolist(), counts.tolist(), strict=True))
        with monkeypatch.context() as m:
            m.setattr(pct, "HAVE_NUMBA", False)
            want, want_pairs = weighted_percentiles(columns, *qs), weighted_percentiles(pairs, *qs)
        assert want == want_pairs
        if len(values) >= pct._NUMPY_MIN:
            assert want == pct._weighted_numpy(values, counts, int(counts.sum()), qs)
        assert weighted_percentiles(columns, *qs) == want
        assert weighted_percentiles(pairs, *qs) == want
    out = np.zeros(2)
    nan = np.append(rng.random(30), np.nan)
    assert not pct._weighted_ranks(nan, np.ones(31, dtype=np.int64), np.array([50.0, 99.0]), out)
    negative = np.ones(30, dtype=np.int64)
    negative[3] = -1
    assert not pct._weighted_ranks(rng.random(30), negative, np.array([50.0, 99.0]), out)
    assert out.tolist() == [0.0, 0.0]
    assert pct.weighted_percentiles(ItlSamples(np.ones(20), np.zeros(20, dtype=np.int64)), 50.0) == [0.0]


def _value_sets(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Values a selection by bins must get right: ties, huge and negative values, one far outlier (the first
    binning then puts nearly everything in one bin), all one value, an infinity."""
    outlier = np.append(rng.random(max(n - 1, 0)) * 1e-6, 1e6)[:n]
    inf = rng.random(n)
    inf[n // 2:n // 2 + 1] = np.inf
    return [rng.exponential(0.02, n), np.round(rng.random(n), 2), rng.normal(0.0, 1e6, n), outlier, np.full(n, 0.25),
            rng.lognormal(-3.0, 3.0, n), inf]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf: NaN, as numpy gives
def test_selection_by_bins_is_the_sorting_paths_bit_for_bit(monkeypatch):
    """From _BUCKET_MIN pairs on, the compiled weighted selection bins the values first (shared/percentiles.py
    `_bucket_ranks`): numpy's sorting path's values exactly, whatever the values' spread."""
    from llmserve_env.shared import percentiles as pct
    from llmserve_env.shared.records import ItlSamples

    if not pct.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(13)
    qs = (0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0)
    for n in (pct._BUCKET_MIN - 1, pct._BUCKET_MIN, 200, 2000, 9000):
        for values in _value_sets(rng, n):
            for counts in (np.ones(n, dtype=np.int64), rng.integers(0, 3, n) * rng.integers(1, 500, n)):
                counts[0] = max(counts[0], 1)
                samples = ItlSamples(values, counts)
                with monkeypatch.context() as m:
                    m.setattr(pct, "HAVE_NUMBA", False)
                    want = pct.weighted_percentiles(samples, *qs)
                assert repr(pct.weighted_percentiles(samples, *qs)) == repr(want)  # (an infinity's NaN)


def test_compiled_percentiles_are_the_sorting_paths_bit_for_bit(monkeypatch):
    """A float array of fewer than _NUMPY_MIN values has its percentiles in one compiled call (shared/percentiles.py
    `_few`): the Python list path's values exactly (ties, huge and negative values, the bounds); a NaN is left
    to that path."""
    from llmserve_env.shared import percentiles as pct

    if not pct.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(11)
    qs = (0.0, 0.5, 1.0, 25.0, 33.3, 50.0, 66.7, 90.0, 99.0, 99.9, 100.0)
    for n in (1, 2, 3, 10, 50, pct._NUMPY_MIN - 1):
        for values in (rng.exponential(0.05, n), rng.normal(0.0, 1e6, n), rng.integers(0, 4, n).astype(float),
                       np.full(n, 0.125), rng.lognormal(-3.0, 2.0, n)):
            with monkeypatch.context() as m:
                m.setattr(pct, "HAVE_NUMBA", False)
                want = pct.percentiles(values, *qs)
            assert want == pct.percentiles(values.tolist(), *qs)
            out = np.empty(len(qs))
            assert pct._few(values, np.array(qs), out) and out.tolist() == want
            assert pct.percentiles(values, *qs) == want
    nan = np.append(rng.random(30), np.nan)
    assert not pct._few(nan, np.array([50.0]), np.empty(1))
    with monkeypatch.context() as m:
        m.setattr(pct, "HAVE_NUMBA", False)
        want = pct.percentiles(nan, 50.0, 99.0)
    assert repr(pct.percentiles(nan, 50.0, 99.0)) == repr(want)  # (NaN != NaN)


def test_latencies_as_vllm_defines_them():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.1, out=11)
    rec = record(a, dispatch=0.15, first=0.3, finish=0.8)
    m = tr.observe(report(0.0, finished=[rec], first_tokens=[(0, "a", 0.2)], itl=[(0.05, 10)], output_tokens=11,
                          prompt_tokens=100), [a])
    assert m.p50_ttft_ms == pytest.approx(200.0)
    assert m.p50_ttft_dispatch_ms == pytest.approx(150.0)
    assert m.p50_tpot_ms == pytest.approx(50.0)  # (0.8 - 0.3) / (11 - 1)
    assert m.p50_e2e_ms == pytest.approx(700.0)
    assert m.p50_itl_ms == pytest.approx(50.0)
    assert (m.slo_met, m.slo_missed, m.slo_attainment) == (1, 0, 1.0)  # TPOT exactly at its SLO meets it
    assert m.goodput_rps == 1.0 and m.goodput_tokens_per_s == 11.0 and m.throughput_tps == 11.0


@pytest.mark.parametrize(
    ("status", "first", "finish", "met"),
    [
        ("ok", 0.59, 1.0, True),
        ("ok", 0.61, 1.0, False),  # TTFT 510 ms > 500 ms
        ("ok", 0.2, 0.75, False),  # TPOT 55 ms > 50 ms
        ("error", 0.2, 0.5, False),
        ("timeout", None, 0.9, False),
        ("rejected", None, 0.1, False),
    ],
)
def test_every_slo_and_status_judged(status, first, finish, met):
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.1)
    m = tr.observe(report(0.0, finished=[record(a, status=status, dispatch=0.1, first=first, finish=finish)]), [a])
    assert (m.slo_met, m.slo_missed) == ((1, 0) if met else (0, 1))
    assert m.per_tenant["a"].attainment == (1.0 if met else 0.0)


def test_late_waiter_is_missed_once_not_again_when_it_finishes():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.2)  # TTFT SLO 500 ms: hopeless from t=0.7
    m0 = tr.observe(report(0.0, pending=[record(a, status="queued")]), [a])
    assert (m0.slo_met, m0.slo_missed, m0.queue_depth) == (0, 1, 1)
    assert m0.slo_attainment == 0.0
    done = record(a, dispatch=1.5, first=1.6, finish=1.9)
    m1 = tr.observe(report(1.0, finished=[done], first_tokens=[(0, "a", 1.4)]), [])
    assert (m1.slo_met, m1.slo_missed, m1.finished) == (0, 0, 1)
    assert m1.slo_attainment == 1.0  # nothing settled in this window
    assert m1.p50_ttft_ms == pytest.approx(1400.0) and m1.p50_e2e_ms == pytest.approx(1700.0)


def test_waiter_within_its_slo_is_not_settled_early():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.6)  # only 0.4 s old at the window's end
    m0 = tr.observe(report(0.0, pending=[record(a, status="queued")]), [a])
    assert (m0.slo_met, m0.slo_missed) == (0, 0)
    m1 = tr.observe(report(1.0, finished=[record(a, dispatch=1.0, first=1.05, finish=1.4)]), [])
    assert (m1.slo_met, m1.slo_missed) == (1, 0)


def test_running_request_settled_early_when_its_tpot_is_already_lost():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.0, tenant="a", out=11)  # TPOT SLO 50 ms x 10 tokens: must finish by first + 0.5 s
    slow = record(a, status="running", dispatch=0.0, first=0.1)
    m0 = tr.observe(report(0.0, pending=[slow]), [a])
    assert m0.slo_missed == 1 and m0.active_requests == 1  # 0.9 s of decoding already > 0.5 s


def test_final_window_charges_the_backlog():
    tr = MetricsTracker(TASK)
    a, b, c = arrival(0, 3.5, "a"), arrival(1, 3.6, "b"), arrival(2, 3.7, "b")
    m = tr.observe(report(3.0, finished=[record(c, dispatch=3.7, first=3.75, finish=3.9)],
                          pending=[record(a, status="queued"), record(b, status="running", first=3.8)]),
                   [a, b, c], final=True)
    assert (m.slo_met, m.slo_missed, m.backlog_missed) == (1, 2, 2)
    assert m.per_tenant["a"].missed == 1 and m.per_tenant["b"].missed == 1 and m.per_tenant["b"].met == 1
    assert tr.outstanding == 0
    with pytest.raises(ValueError, match="final"):
        tr.observe(report(4.0), [])


def test_backlog_counted_even_if_the_backend_forgot_it():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.5)
    m = tr.observe(report(0.0), [a], final=True)  # neither pending nor finished
    assert m.slo_missed == 1 and m.backlog_missed == 1


def test_unknown_or_twice_finished_requests_are_backend_bugs():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.1)
    with pytest.raises(ValueError, match="not outstanding"):
        tr.observe(report(0.0, finished=[record(arrival(9, 0.1), first=0.2, finish=0.3)]), [a])
    tr = MetricsTracker(TASK)
    rec = record(a, dispatch=0.1, first=0.2, finish=0.3)
    tr.observe(report(0.0, finished=[rec]), [a])
    with pytest.raises(ValueError, match="not outstanding"):
        tr.observe(report(1.0, finished=[rec]), [])


def test_itl_from_chunk_times_when_no_samples():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.0, out=4)
    rec = record(a, dispatch=0.0, first=0.1, finish=0.4, tokens=4, chunks=[0.1, 0.2, 0.25, 0.4])
    m = tr.observe(report(0.0, finished=[rec]), [a])
    assert m.p50_itl_ms == pytest.approx(100.0)  # gaps 100, 50, 150 ms
    assert m.p99_itl_ms == pytest.approx(149.0)


def test_resources_cost_and_speculation():
    tr = MetricsTracker(TASK)
    m = tr.observe(report(0.0, output_tokens=2000, prompt_tokens=500, evictions=3, spec_proposed=40, spec_accepted=30,
                          kv_occupancy=1.2, gpu_memory_used_gb=70.5, cost_usd=0.002, quality=0.97), [])
    assert m.spec_acceptance_rate == 0.75 and m.evictions == 3 and m.kv_occupancy == 1.0
    assert m.cost_per_1k_tokens == pytest.approx(0.001) and m.quality == 0.97 and m.gpu_memory_used_gb == 70.5
    idle = MetricsTracker(TASK).observe(report(0.0, cost_usd=0.002), [])
    assert idle.cost_per_1k_tokens == 0.0 and idle.spec_acceptance_rate == 0.0
    assert idle.slo_attainment == 1.0 and idle.p50_ttft_ms == 0.0


def test_to_dict_is_flat_json_with_the_observation_fields():
    tr = MetricsTracker(TASK)
    a = arrival(0, 0.8)
    d = tr.observe(report(0.0, pending=[record(a, status="queued")]), [a]).to_dict()
    json.dumps(d)
    required = {"arrivals", "arrival_rate_rps", "mean_prompt_tokens", "finished", "slo_met", "slo_missed",
                "slo_attainment", "goodput_rps", "goodput_tokens_per_s", "p50_ttft_ms", "p99_ttft_ms", "p50_itl_ms",
                "p50_tpot_ms", "p50_e2e_ms", "throughput_tps", "queue_depth", "active_requests", "kv_occupancy",
                "gpu_memory_used_gb", "evictions", "spec_acceptance_rate", "cost_usd", "cost_per_1k_tokens",
                "quality", "per_tenant"}
    assert required <= set(d)
    assert all(not isinstance(v, dict) for k, v in d.items() if k != "per_tenant")
    assert d["per_tenant"]["a"] == {"arrived": 1, "met": 0, "missed": 0, "attainment": 1.0}
    assert set(d) - {"per_tenant"} == set(WindowMetrics.__dataclass_fields__) - {"per_tenant"}


def test_every_arrival_settled_exactly_once_under_random_backends():
    """Random (but contract-abiding) backends: met + missed always equals the arrivals at the end."""
    task = TASKS["adversarial_multitenant"]
    for seed in range(20):
        rnd = random.Random(seed)
        tr = MetricsTracker(task)
        live: list[Arrival] = []
        rid, total_arrived, met, missed = 0, 0, 0, 0
        horizon = 6
        for k in range(horizon):
            arrs = []
            for _ in range(rnd.randint(0, 8)):
                t = task.tenants[rnd.randrange(3)]
                arrs.append(Arrival(rid, k + rnd.random() * 0.99, 50, rnd.randint(1, 30), t.name, t.priority))
                rid += 1
            arrs.sort(key=lambda x: x.arrival_s)
            live += arrs
            total_arrived += len(arrs)
            finished, pending = [], []
            for a in list(live):
                if rnd.random() < 0.5:
                    first = max(a.arrival_s, k + rnd.random() * 0.5)
                    finished.append(record(a, status=rnd.choice(["ok", "ok", "ok", "error"]), dispatch=a.arrival_s,
                                           first=first, finish=first + rnd.random() * 0.4))
                    live.remove(a)
                else:
                    pending.append(record(a, status=rnd.choice(["queued", "running"])))
            m = tr.observe(report(float(k), finished=finished, pending=pending), arrs, final=k == horizon - 1)
            met += m.slo_met
            missed += m.slo_missed
        assert met + missed == total_arrived


def test_observe_reads_columns_without_building_objects(monkeypatch):
    """The RL inner loop calls this every step (its speed is bench/sim_speed.py's and bench/train_speed.py's
    to measure): a report whose requests, first tokens and ITL samples come as columns (the compiled
    simulator's shape) is observed without turning them back into records, triples or pairs, and gives
    the metrics the lists give."""
    from llmserve_env.shared.records import FirstTokens, ItlSamples, RequestBatch

    task = TASKS["static_workload"]
    arrs = [Arrival(i, 0.04 * i, 256, 128, "chat", 1) for i in range(200)]
    fin = [record(a, dispatch=a.arrival_s, first=a.arrival_s + 0.05, finish=a.arrival_s + 0.9) for a in arrs[:180]]
    pend = [record(a, status="running", dispatch=a.arrival_s, first=a.arrival_s + 0.05) for a in arrs[180:]]
    firsts = [(a.request_id, "chat", 0.05 + 1e-4 * a.request_id) for a in arrs]
    for n_itl in (100, 300):  # below and above percentiles' numpy threshold
        itl = [(0.008 + 1e-5 * (j % 37), 1 + j % 12) for j in range(n_itl)]
        want = MetricsTracker(task).observe(report(0.0, finished=fin, pending=pend, first_tokens=firsts, itl=itl,
                                                   output_tokens=2500), arrs)
        columns = WindowReport(t0=0.0, dt=1.0, finished=RequestBatch.from_records(fin),
                               pending=RequestBatch.from_records(pend), first_tokens=FirstTokens.of(firsts),
                               itl_samples=ItlSamples.of(itl), output_tokens=2500)
        with monkeypatch.context() as m:
            m.setattr(RequestBatch, "records", lambda self: pytest.fail("observe built records"))
            m.setattr(FirstTokens, "rows", lambda self: pytest.fail("observe built triples"))
            if n_itl >= 128:  # fewer samples are sorted as pairs (shared/percentiles.py), as a list would be
                m.setattr(ItlSamples, "rows", lambda self: pytest.fail("observe built pairs"))
            got = MetricsTracker(task).observe(columns, arrs)
        assert got == want


SLO_S = {"a": (0.5 + SLO_EPS_S, 0.05 + SLO_EPS_S), "b": (2.0 + SLO_EPS_S, 0.1 + SLO_EPS_S)}


def late(a: Arrival, rec: RequestRecord, t_end: float) -> bool:
    """The module docstring's rule for a pending request, one request at a time."""
    ttft, tpot = SLO_S[a.tenant]
    deadline, ft = a.arrival_s + ttft, rec.first_token_s
    if ft is None:
        return t_end > deadline
    return ft > deadline or (a.output_tokens >= 2 and t_end - ft > tpot * (a.output_tokens - 1))


@pytest.mark.parametrize("columns", [False, True])
def test_a_long_queue_is_settled_request_by_request(columns):
    """900 pending requests, looked up in the open table at once, settle as the docstring's rule says one
    request at a time: the late ones missed once (per tenant), the rest still open, and a flagged request
    that finishes later is not counted again; the report's requests as records or as columns read the same."""
    from llmserve_env.shared.records import RequestBatch

    rng = random.Random(5)
    arrivals = [arrival(i, 0.001 * i, rng.choice("ab"), out=rng.randint(1, 40)) for i in range(900)]
    first = [record(a, "running", dispatch=0.9, first=rng.choice([None, 0.95, 1.5]), tokens=1) for a in arrivals]
    later = [record(a, "queued") for a in arrivals[::2]] + [record(a, "running", dispatch=1.0, first=2.1, tokens=2)
                                                          for a in arrivals[1::2]]
    tracker = MetricsTracker(TASK)
    open_ = {a.request_id: a for a in arrivals}
    for k, (arr, pend) in enumerate(((arrivals, first), ([], later))):
        t_end = k + 2.0
        want = {"a": 0, "b": 0}
        for rec in pend:
            a = open_.get(rec.request_id)
            if a is not None and late(a, rec, t_end):
                want[a.tenant] += 1
                del open_[a.request_id]
        pending = RequestBatch.from_records(pend) if columns else pend
        m = tracker.observe(WindowReport(t0=float(k + 1), dt=1.0, pending=pending), arr)
        assert {n: t.missed for n, t in m.per_tenant.items()} == want and m.slo_met == 0
        assert tracker.open_ids().tolist() == sorted(open_)
    assert 0 < len(open_) < 900
    gone = next(a for a in arrivals if a.request_id not in open_)  # flagged: finishing now settles nothing
    m = tracker.observe(report(3.0, finished=[record(gone, dispatch=1.0, first=2.1, finish=3.5)]), [])
    assert (m.finished, m.slo_met, m.slo_missed) == (1, 0, 0)


def test_requests_out_of_id_order_are_merged_and_an_open_id_is_refused():
    """A planner's sampled day may bring ids below the open ones: they are merged in, and each is looked up by
    its id; an id arriving while it is still open is a bug (ValueError naming it, nothing added)."""
    tracker = MetricsTracker(TASK)
    tracker.observe(report(0.0), [arrival(10, 0.1), arrival(12, 0.2, tenant="b")])
    tracker.observe(report(1.0), [arrival(3, 1.1, tenant="b"), arrival(11, 1.2)])
    assert tracker.open_ids().tolist() == [3, 10, 11, 12]
    with pytest.raises(ValueError, match="request 11 arrived while it is still open"):
        tracker.observe(report(2.0), [arrival(11, 2.5)])
    assert tracker.outstanding == 4
    fin = [record(arrival(11, 1.2), dispatch=1.2, first=1.3, finish=1.4), record(arrival(3, 1.1, tenant="b"),
                                                                                status="error")]
    m = tracker.observe(report(2.0, finished=fin), [])
    assert (m.per_tenant["a"].met, m.per_tenant["b"].missed, m.slo_met, m.slo_missed) == (1, 1, 1, 1)
    assert tracker.open_ids().tolist() == [10, 12]
    clone = tracker.fork()
    clone.observe(report(3.0), [arrival(13, 3.1)])
    assert tracker.open_ids().tolist() == [10, 12] and clone.open_ids().tolist() == [10, 12, 13]


def test_an_arrival_from_a_tenant_the_task_lacks_is_refused_whole():
    tracker = MetricsTracker(TASK)
    with pytest.raises(ValueError, match=r"tenant\(s\) \['z'\] the task does not have \(tenants: a, b\)"):
        tracker.observe(report(0.0), [arrival(0, 0.1), arrival(1, 0.2, tenant="z")])
    assert tracker.outstanding == 0  # nothing half-opened
    m = tracker.observe(report(0.0), [arrival(0, 0.1), arrival(1, 0.2, tenant="b"), arrival(2, 0.3)])
    assert (m.arrivals, m.per_tenant["a"].arrived, m.per_tenant["b"].arrived, tracker.outstanding) == (3, 2, 1, 3)
    a_slo, b_slo = (0.5 + SLO_EPS_S, 0.05 + SLO_EPS_S), (2.0 + SLO_EPS_S, 0.1 + SLO_EPS_S)
    assert sorted(tracker.open_requests()) == [("a", 0.1 + a_slo[0], a_slo[1]), ("a", 0.3 + a_slo[0], a_slo[1]),
                                               ("b", 0.2 + b_slo[0], b_slo[1])]


def _random_settlement(rng: np.random.Generator, trial: int) -> tuple:
    """settle_window's arguments for a random window: open and unknown requests, finished twice, missing times,
    every status."""
    from llmserve_env.core import settlement
    from llmserve_env.shared import records as rb

    m = int(rng.integers(0, 60))
    open_ids = np.unique(rng.integers(0, 120, m)).astype(np.int64)
    m = len(open_ids)
    tenant = rng.integers(0, 3, m).astype(np.int64)
    deadline = rng.uniform(0.0, 2.0, m)
    tpot_slo = rng.uniform(0.01, 0.1, m)

    def rows(n: int) -> tuple[np.ndarray, ...]:
        ids = rng.integers(0, 130, n).astype(np.int64)  # some not open, some twice
        ft = np.where(rng.random(n) < 0.2, np.nan, rng.uniform(0.0, 3.0, n))
        disp = np.where(rng.random(n) < 0.2, np.nan, ft - rng.uniform(0.0, 0.5, n))
        return (ids, rng.integers(0, len(rb.STATUSES), n).astype(np.int64), rng.uniform(0.0, 1.0, n), ft,
                np.where(rng.random(n) < 0.1, np.nan, ft + rng.uniform(0.0, 2.0, n)),
                rng.integers(0, 40, n).astype(np.int64), disp)

    f_id, f_status, f_arr, f_ft, f_fin, f_out, f_disp = rows(int(rng.integers(0, 40)))
    p_id, p_status, _, p_ft, _, p_target, p_disp = rows(int(rng.integers(0, 40)))
    na = int(rng.integers(0, 20))
    a_ids = np.arange(130, 130 + na, dtype=np.int64)  # after every open id: appended
    a_tenant = rng.integers(0, 3, na).astype(np.int64)
    assert settlement.appends(open_ids, a_ids)
    assert not settlement.appends(open_ids, a_ids[::-1]) or na < 2
    return (open_ids, tenant, deadline, tpot_slo, a_ids, a_tenant, rng.uniform(1.0, 2.0, na),
            rng.integers(1, 900, na).astype(np.int64), bool(trial % 3), np.array([0.5, 1.0, 2.0]),
            np.array([0.02, 0.05, 0.1]), f_id, f_status, f_arr, f_ft, f_fin, f_out, f_disp, p_id, p_status,
            p_ft, p_target, p_disp, 1.0, 2.0, 3, rb.OK, rb.QUEUED, bool(trial % 2))


def test_settlement_compiled_and_plain_python_agree():
    """core/settlement.py's one definition runs compiled (numba) or as plain Python where numba is missing:
    both give the same verdicts, row for row, on random windows, and change nothing they are given."""
    from llmserve_env.core import settlement

    if not settlement.HAVE_NUMBA:
        pytest.skip("numba is not installed: the plain-Python path is the only one")
    rng = np.random.default_rng(11)
    for trial in range(200):
        args = _random_settlement(rng, trial)
        before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        compiled = settlement.settle_window(*args)
        plain = settlement.settle_window.py_func(*args)
        for got, want in zip(compiled, plain, strict=True):
            np.testing.assert_array_equal(got, want)
        for a, b in zip(args, before, strict=True):
            np.testing.assert_array_equal(a, b)


def test_settlement_looks_requests_up_by_table_as_by_search(monkeypatch):
    """The open requests are looked up through a table by id where their ids span few values (`_slots`), by
    binary search otherwise: the same verdicts either way (the plain-Python run with the table withheld
    against the compiled run with it, on random windows whose ids span less than the rows looked up)."""
    from llmserve_env.core import settlement

    impl = getattr(settlement.settle_window, "py_func", settlement.settle_window)
    rng = np.random.default_rng(12)
    tables = 0
    for trial in range(200):
        args = _random_settlement(rng, trial)
        tables += len(settlement._slots(args[0], len(args[11]) + len(args[18]))) > 0
        with_table = settlement.settle_window(*args)
        with monkeypatch.context() as mp:
            mp.setattr(settlement, "_slots", lambda ids, rows: np.empty(0, dtype=np.int64))
            searched = impl(*args)
        for got, want in zip(with_table, searched, strict=True):
            np.testing.assert_array_equal(got, want)
    assert tables > 150  # the table path was the one taken
