"""The compiled engine (sim/array_engine.py, sim/compiled_core.py) against the Python one (sim/engine.py).

Differential: the same arrivals and actions through both engines give equal reports window by window,
every field of every record, sample and measurement (floats compared exactly); random actions reach
every knob (split lanes, priority routing, speculation depth changes, pools small enough to preempt and
reject). Then the pieces around it: the choice of engine (LLMSERVE_SIM_CORE, numba absent), the
hand-over to the Python engine for prefix caching, forks, the tracked router, cluster episodes.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from golden import episode_digest
from llmserve_env.agents.static import VLLM_DEFAULT as VLLM
from llmserve_env.shared.backend import Arrival, WindowReport
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction
from llmserve_env.shared.records import FirstTokens, ItlSamples, RequestBatch
from llmserve_env.shared.tasks import SINGLE_SERVER_TASKS, TASKS
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim import array_engine, compiled_core
from llmserve_env.sim.array_engine import ArrayEngine, make_engine
from llmserve_env.sim.backend import SimBackend, _models_for
from llmserve_env.sim.cluster import ClusterBackend
from llmserve_env.sim.engine import Engine
from llmserve_env.sim.profiles import load_profile
from llmserve_env.sim.resource_samples import SampleColumns
from llmserve_env.sim.window_join import join_ends

pytestmark = pytest.mark.skipif(not compiled_core.HAVE_NUMBA, reason="numba is not installed")


def random_action(rng: random.Random) -> ServeAction:
    return ServeAction(batch_cap=rng.choice([1, 2, 8, 64, 256, 512]), kv_budget_fraction=rng.choice([0.1, 0.2, 0.5, 1.0]),
                       speculation_depth=rng.choice([0, 0, 2, 5, 8]), quantization_tier=rng.choice(QUANTIZATION_TIERS),
                       prefill_decode_split=rng.random() < 0.4, priority_routing=rng.random() < 0.4)


def plain(x):
    """A report as plain data: dataclasses to dicts, tuples to lists (floats stay floats: compared exactly);
    requests as columns read as the records they stand for."""
    if isinstance(x, RequestBatch):
        return plain(x.records())
    if isinstance(x, FirstTokens):
        return plain(x.rows())
    if isinstance(x, ItlSamples):
        return plain(x.rows())
    if isinstance(x, SampleColumns):
        return plain(x.records())
    if isinstance(x, WindowReport):
        return plain(x.to_dict())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if hasattr(x, "__slots__") and not isinstance(x, (str, int, float)):
        slots = [k for cls in type(x).__mro__ for k in getattr(cls, "__slots__", ())]  # a subclass's too
        return {k: plain(getattr(x, k)) for k in slots}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def both(profile_id: str, seed: int) -> tuple[Engine, ArrayEngine]:
    profile = load_profile(profile_id)
    models = _models_for(profile)
    return Engine(profile, seed, models), ArrayEngine(profile, seed, models)


@pytest.mark.parametrize("task_id", sorted(SINGLE_SERVER_TASKS))
def test_random_actions_give_the_python_engines_reports(task_id):
    task = TASKS[task_id]
    evictions = rejected = 0
    for seed in (0, 1):
        py, ar = both(task.profile, seed)
        rng = random.Random(seed)
        for k, w in enumerate(windows(generate_arrivals(task, seed), task)):
            a = random_action(rng)
            want = py.serve_window(a, w, k * task.window_s, task.window_s)
            got = ar.serve_window(a, w, k * task.window_s, task.window_s)
            assert plain(got) == plain(want), f"seed {seed}, window {k}, {a}"
            evictions += want[3].evictions
            rejected += want[3].rejected
    assert evictions > 0  # the random pools were small enough to preempt


@pytest.mark.parametrize("task_id", ["static_workload", "adversarial_multitenant"])
def test_rates_owed_at_depth_0_are_drawn_in_turn_once_it_speculates(task_id):
    """Windows at depth 0 owe their arrivals' acceptance rates (through compactions, which drop rows whose rates
    are still owed), drawn in arrival order once the engine speculates: the Python engine's reports, which draws
    every window's at once (one tenant, and three: NumPy's and the compiled draws)."""
    task = TASKS[task_id]
    py, ar = both(task.profile, 3)
    rng = random.Random(3)
    compacted = 0
    wins = windows(generate_arrivals(task, 3), task)
    switch = 30  # the window it first speculates in
    for k, w in enumerate(wins[:switch + 8]):
        a = random_action(rng)
        if k < switch:  # a pool and batch that keep up (finished rows to drop), the split and routing drawn
            a = a.model_copy(update={"speculation_depth": 0, "batch_cap": 256, "kv_budget_fraction": 1.0,
                                     "quantization_tier": "FP16"})
        elif k == switch:
            a = a.model_copy(update={"speculation_depth": 5})
        rows = int(ar.SI[compiled_core.SI_NREQ])
        want = py.serve_window(a, w, k * task.window_s, task.window_s)
        got = ar.serve_window(a, w, k * task.window_s, task.window_s)
        assert plain(got) == plain(want), f"window {k}, {a}"
        if k < switch:
            compacted += int(ar.SI[compiled_core.SI_NREQ]) < rows + len(w)
            assert ar._owed_count == sum(len(x) for x in wins[:k + 1])
        elif k == switch:
            assert not ar._owed_count and not ar._owed_tenants
    assert compacted  # rows were dropped while their rates were owed


def test_a_small_gpu_preempts_and_rejects_alike():
    """A GPU left with ~2 GiB for the KV cache at full budget: requests larger than a 0.1 pool are rejected,
    and most windows preempt."""
    base = load_profile("h100-llama3.1-8b")
    memory = (base.weights_gib("FP16", True) + base.activation_reserve_gib + 2.0) / base.gpu_memory_utilization
    small = dataclasses.replace(base, memory_gib=memory)
    task = TASKS["adversarial_multitenant"]
    py, ar = Engine(small, 4, {}), ArrayEngine(small, 4, {})
    rng = random.Random(4)
    evictions = rejected = 0
    for k, w in enumerate(windows(generate_arrivals(task, 4), task)):
        a = random_action(rng)
        want = py.serve_window(a, w, k * task.window_s, task.window_s)
        assert plain(ar.serve_window(a, w, k * task.window_s, task.window_s)) == plain(want), f"window {k}, {a}"
        evictions += want[3].evictions
        rejected += want[3].rejected
    assert evictions > 20 and rejected > 0


def test_resource_samples_read_as_the_python_engines_and_join_in_order():
    """The compiled engine hands its resource samples over unbuilt (sim/resource_samples.py): read, they are
    the Python engine's records, a loop stopped for want of room (its samples kept as a block) included;
    joined, lists stay a list, and columns keep the parts' order."""
    task = TASKS["static_workload"]
    py, ar = both(task.profile, 0)
    w0, w1 = windows(generate_arrivals(task, 0), task)[:2]
    assert plain(ar.serve_window(VLLM, w0, 0.0, task.window_s)) == plain(py.serve_window(VLLM, w0, 0.0, task.window_s))
    ar.itl_v, ar.itl_n = np.zeros(2), np.zeros(2, dtype=np.int64)  # the loop stops for room, here after a sample
    dt = task.window_s
    want = py.serve_window(VLLM, w1, dt, dt)[3].samples
    got = ar.serve_window(VLLM, w1, dt, dt)[3].samples
    assert isinstance(got, SampleColumns) and len(got.parts) == 2 and len(got) == len(want) == 2
    assert got.records() == want
    assert SampleColumns.concat([want[:1], want[1:]]) == want
    joined = SampleColumns.concat([got, [], want[:1], got])
    assert isinstance(joined, SampleColumns) and joined.records() == want + want[:1] + want
    report = WindowReport(0.0, task.window_s, samples=got)
    assert report.samples == want and report.to_dict()["samples"] == [dataclasses.asdict(x) for x in want]


def test_a_clusters_joined_columns_are_its_replicas_reports_joined():
    """sim/window_join.py: engines ended in place, their outputs joined straight from their buffers, give the
    columns their own reports (`report`) joined by concat give: rejections' messages re-keyed, an idle
    replica's empty rows, every window of a small GPU's episode split over three engines."""
    base = load_profile("h100-llama3.1-8b")
    memory = (base.weights_gib("FP16", True) + base.activation_reserve_gib + 2.0) / base.gpu_memory_utilization
    small = dataclasses.replace(base, memory_gib=memory)
    task = TASKS["adversarial_multitenant"]
    engines = [ArrayEngine(small, s, {}) for s in range(3)]
    rng = random.Random(6)
    rejected = 0
    for k, w in enumerate(windows(generate_arrivals(task, 6), task)[:40]):
        a = random_action(rng)
        cut = len(w) // 2
        for eng, part in zip(engines, (w[:cut], w[cut:], []), strict=True):  # the third replica idle
            eng.begin_window(a, k * task.window_s, task.window_s, part)
        ends = [eng.end_in_place() for eng in engines]
        joined = join_ends(ends)
        reports = [e.engine.report(e) for e in ends]
        assert plain(joined.finished) == plain(RequestBatch.concat([acc.finished for _, _, _, acc in reports]))
        assert plain(joined.pending) == plain(RequestBatch.concat([p for p, _, _, _ in reports]))
        assert plain(joined.first_tokens) == plain(FirstTokens.concat([acc.first_tokens for _, _, _, acc in reports]))
        assert plain(joined.itl) == plain(ItlSamples.concat([acc.itl for _, _, _, acc in reports]))
        lens = [len(p) for p, _, _, _ in reports]
        assert joined.pending_rows == [(sum(lens[:i]), sum(lens[:i + 1])) for i in range(3)]
        assert joined.finished.error == RequestBatch.concat([acc.finished for _, _, _, acc in reports]).error
        rejected += sum(e.rejected for e in ends)
    assert rejected > 0


def test_the_rows_an_engine_starts_with_change_no_result(monkeypatch):
    """An engine that starts with 4 rows grows (`_grow`, and the loop's stops for room) through the same windows to
    the same reports as one that starts with INITIAL_ROWS."""
    task = TASKS["bursty_workload"]
    wins = windows(generate_arrivals(task, 6), task)[:30]

    def play() -> list:
        eng = ArrayEngine(load_profile(task.profile), 6, {})
        rng = random.Random(6)
        return [plain(eng.serve_window(random_action(rng), w, k * task.window_s, task.window_s))
                for k, w in enumerate(wins)]

    want = play()
    monkeypatch.setattr(array_engine, "INITIAL_ROWS", 4)
    assert play() == want


@pytest.mark.parametrize("profile_id", ["a100-llama3-8b", "h100-llama3.1-70b-tp4"])
def test_other_profiles_too(profile_id):
    task = TASKS["bursty_workload"]
    py, ar = both(profile_id, 5)
    rng = random.Random(5)
    for k, w in enumerate(windows(generate_arrivals(task, 5), task)[:24]):
        a = random_action(rng)
        assert plain(ar.serve_window(a, w, k * task.window_s, task.window_s)) == \
            plain(py.serve_window(a, w, k * task.window_s, task.window_s)), f"window {k}"


def test_a_fork_continues_as_the_original_and_independently():
    task = TASKS["static_workload"]
    backend = SimBackend(task.profile)
    assert isinstance(backend._engine, ArrayEngine)
    backend.reset(2)
    wins = windows(generate_arrivals(task, 2), task)
    rng = random.Random(2)
    actions = [random_action(rng) for _ in wins]
    for k in range(10):
        backend.run_window(actions[k], wins[k], k * task.window_s, task.window_s)
    fork = backend.fork()
    for k in range(10, 20):
        a = plain(backend.run_window(actions[k], wins[k], k * task.window_s, task.window_s))
        b = plain(fork.run_window(actions[k], wins[k], k * task.window_s, task.window_s))
        assert a == b
    other = fork.fork()
    other.run_window(actions[0], [], 20 * task.window_s, task.window_s)  # the copy moves on alone
    assert plain(fork.run_window(actions[20], wins[20], 20 * task.window_s, task.window_s)) == \
        plain(backend.run_window(actions[20], wins[20], 20 * task.window_s, task.window_s))


@pytest.mark.parametrize("task_id", ["diurnal_autoscale", "multitenant_family", "multiturn_cluster"])
def test_cluster_episodes_are_the_python_engines(task_id, monkeypatch):
    """Random replica counts and knobs; multiturn_cluster's arrivals carry prefix ids, so its engines hand
    over to the Python engine at their first arrivals (the episode must still be the same)."""
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "python")
    want = episode_digest(task_id, "random", 3)
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "compiled")
    assert episode_digest(task_id, "random", 3) == want


def test_the_tracked_router_reads_the_same_outstanding_work(monkeypatch):
    task = TASKS["diurnal_autoscale"]
    wins = windows(generate_arrivals(task, 1), task)[:12]
    reports = {}
    for core in ("python", "compiled"):
        monkeypatch.setenv("LLMSERVE_SIM_CORE", core)
        backend = ClusterBackend(task.profile, (1, 4), 3, router="tracked")
        backend.reset(1)
        rng = random.Random(1)
        reports[core] = [plain(backend.run_window(random_action(rng).model_copy(update={"replicas": 3}), w,
                                                  k * task.window_s, task.window_s)) for k, w in enumerate(wins)]
    assert reports["compiled"] == reports["python"]


def test_prefix_arrivals_hand_over_only_before_the_first_request():
    profile = load_profile("h100-llama3.1-8b")
    action = ServeAction(batch_cap=8, kv_budget_fraction=0.5, speculation_depth=0, quantization_tier="FP16",
                         prefill_decode_split=False, priority_routing=False)
    keyed = Arrival(7, 0.2, 64, 4, prefix_ids=(1, 2, 3, 4), prefix_block_tokens=16)
    fresh = ArrayEngine(profile, 0, _models_for(profile))
    fresh.serve_window(action, [], 0.0, 1.0)  # an empty window first: replayed on the Python engine
    fresh.serve_window(action, [keyed], 1.0, 1.0)
    assert isinstance(fresh._py, Engine) and fresh.kv is fresh._py.kv
    used = ArrayEngine(profile, 0, _models_for(profile))
    used.serve_window(action, [Arrival(1, 0.1, 64, 4)], 0.0, 1.0)
    with pytest.raises(ValueError, match="prefix ids"):
        used.serve_window(action, [keyed], 1.0, 1.0)


def test_the_engine_choice(monkeypatch):
    profile = load_profile("h100-llama3.1-8b")
    models = _models_for(profile)
    monkeypatch.delenv("LLMSERVE_SIM_CORE", raising=False)
    assert isinstance(make_engine(profile, 0, models), ArrayEngine)
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "python")
    assert type(make_engine(profile, 0, models)) is Engine
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "fast")
    with pytest.raises(ValueError, match="LLMSERVE_SIM_CORE must be one of auto, python, compiled"):
        make_engine(profile, 0, models)
    monkeypatch.setattr(compiled_core, "HAVE_NUMBA", False)  # numba absent: the Python engine serves
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "auto")
    assert type(make_engine(profile, 0, models)) is Engine
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "compiled")
    with pytest.raises(RuntimeError, match="numba is not installed"):
        make_engine(profile, 0, models)


def test_a_profile_outside_the_scope_gets_the_python_engine(monkeypatch):
    profile = load_profile("h100-llama3.1-8b")
    raw = {**profile.raw, "engine": {**profile.raw.get("engine", {}), "prefix_cache": {"kind": "slots", "slots": 2}}}
    slotted = dataclasses.replace(profile, raw=raw)  # a llama-server-like engine (sim/slot_cache.py)
    assert not array_engine.supports(slotted, {})
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "auto")
    assert type(make_engine(slotted, 0, {})) is Engine
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "compiled")
    with pytest.raises(RuntimeError, match="outside its scope"):
        make_engine(slotted, 0, {})


def test_heap_and_power_helpers_match_the_standard_library():
    """The kernels' heap is CPython's heapq step for step (the pending report walks its layout), and their
    speculation rate is the Python engine's pow to the bit."""
    import heapq

    import numpy as np
    from llmserve_env.sim.engine import tokens_per_step

    rng = random.Random(0)
    F = np.zeros((200, compiled_core.NF))
    Ix = np.zeros((200, compiled_core.NI), dtype=np.int64)
    F[:, compiled_core.F_ARR] = [rng.choice([0.5, 1.0, 1.5]) for _ in range(200)]
    Ix[:, compiled_core.I_RID] = rng.sample(range(1000), 200)
    h = np.zeros(200, dtype=np.int64)
    ref: list[tuple[float, int, int]] = []
    n = 0
    for i in range(200):
        n = compiled_core.heap_push(h, n, i, 0, F, Ix, 0)
        heapq.heappush(ref, (F[i, compiled_core.F_ARR], int(Ix[i, compiled_core.I_RID]), i))
        assert h[:n].tolist() == [e[2] for e in ref]
        if i % 3 == 0:
            top, n = compiled_core.heap_pop(h, n, 0, F, Ix, 0)
            assert top == heapq.heappop(ref)[2]
            assert h[:n].tolist() == [e[2] for e in ref]
    for _ in range(500):
        a, g = rng.random(), rng.randint(0, 8)
        assert compiled_core.tokens_per_step(a, g) == tokens_per_step(a, g)
