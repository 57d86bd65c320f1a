"""ClusterBackend's tracked router (sim/cluster.py `router="tracked"`): each arrival routed on the replicas'
true outstanding work at its arrival time, the engines run arrival by arrival (sim/engine.py)."""

from __future__ import annotations

import pytest
from llmserve_env.shared.backend import Arrival, WindowReport
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import TASKS
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.cluster import ClusterBackend

PROFILE = "h100-llama3.1-8b"
ACT = ServeAction(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=2, quantization_tier="FP16",
                  prefill_decode_split=False, priority_routing=False, replicas=2)


def play(backend: ClusterBackend, task_id: str, acts: list[ServeAction], seed: int = 0) -> list[WindowReport]:
    task = TASKS[task_id]
    backend.reset(seed)
    ws = windows(generate_arrivals(task, seed), task)
    return [backend.run_window(a, ws[k], k * task.window_s, task.window_s) for k, a in enumerate(acts)]


def records(reports: list[WindowReport]) -> list[tuple]:
    return [(r.request_id, r.status, r.dispatch_s, r.first_token_s, r.finish_s, r.output_tokens, r.preemptions)
            for rep in reports for r in rep.finished]


def test_tracked_router_skips_a_replica_still_busy_that_the_estimate_thinks_drained(monkeypatch):
    """Window 0's long prompt gives replica 0 a high measured rate (tokens per busy second), so the estimate
    drains a long answer's 2000 tokens within a fraction of a second; one second later that answer has barely
    started decoding. The estimated router sees two idle replicas and sends the next request to replica 0
    (ties to the lower index); the tracked router sees replica 0's true work and sends it to idle replica 1.
    The Python engine, whose decoding map the test reads (the compiled one routes the same:
    tests/test_array_engine.py)."""
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "python")
    act = ACT.model_copy(update={"speculation_depth": 0})  # one token per step: the answers outlast the window

    def where(router: str) -> dict[int, list[int]]:
        b = ClusterBackend(PROFILE, (2, 2), 2, router=router)
        b.reset(0)
        b.run_window(act, [Arrival(0, 1.0, 4000, 4)], 0.0, 10.0)
        assert b.replicas[0].rate_tps > 10_000 and b.replicas[1].rate_tps == 0.0
        b.run_window(act, [Arrival(1, 10.0, 16, 2000), Arrival(2, 11.0, 16, 2000)], 10.0, 10.0)
        out = {}
        for r in b.replicas:
            assert r.engine is not None
            out[r.index] = sorted(r.engine.decoding)  # both answers still decode at the window's end
        return out

    assert where("estimated") == {0: [1, 2], 1: []}
    assert where("tracked") == {0: [1], 1: [2]}


def test_tracked_router_counts_queued_and_running_requests_at_the_arrival():
    """The work the router reads is the engine's at the arrival's instant: a request's prompt until its first
    token, then the output still to come."""
    b = ClusterBackend(PROFILE, (1, 1), 1, router="tracked")
    b.reset(0)
    eng = b.replicas[0].engine
    assert eng is None  # made ready in the first window
    b.run_window(ACT.model_copy(update={"replicas": 1}), [], 0.0, 10.0)
    eng = b.replicas[0].engine
    assert eng is not None
    eng.begin_window(ACT, 10.0, 10.0)
    eng.add_arrival(Arrival(0, 10.0, 1000, 500), routed_hit=200)
    assert eng.outstanding_tokens() == 800 + 500  # not reached yet: prompt less its routed hit, all output
    eng.advance(12.0)
    work = eng.outstanding_tokens()
    assert 0 < work < 500  # prefilled, decoding: only output to come
    eng.advance(30.0)
    assert eng.outstanding_tokens() == 0.0
    _, _, _, acc = eng.end_window()
    assert [r.request_id for r in acc.finished] == [0]


@pytest.mark.parametrize("split", [False, True])
def test_one_replica_tracked_serves_as_the_window_at_once(split):
    """With one replica every arrival goes to it either way: running the engine arrival by arrival gives the
    records serving the window at once gives (the acceptance rates are drawn per arrival, in the same order)."""
    act = ACT.model_copy(update={"replicas": 1, "prefill_decode_split": split})
    runs = [records(play(ClusterBackend(PROFILE, (1, 1), 1, router=router), "static_workload", [act] * 5))
            for router in ("estimated", "tracked")]
    assert len(runs[0]) > 100 and len(runs[0]) == len(runs[1])
    for a, b in zip(*runs, strict=True):
        assert a[:2] == b[:2] and a[5:] == b[5:]
        assert all(x == pytest.approx(y, abs=1e-9) for x, y in zip(a[2:5], b[2:5], strict=True))


def test_tracked_router_is_deterministic_and_forks():
    acts = [ACT.model_copy(update={"replicas": n, "cache_affinity": 0.5}) for n in (2, 3, 3, 2)]
    runs = [records(play(ClusterBackend(PROFILE, (1, 8), 2, router="tracked"), "multiturn_cluster", acts))
            for _ in range(2)]
    assert len(runs[0]) > 100 and runs[0] == runs[1]
    # a fork between windows continues as the original does
    task = TASKS["multiturn_cluster"]
    b = ClusterBackend(PROFILE, (1, 8), 2, router="tracked")
    b.reset(0)
    ws = windows(generate_arrivals(task, 0), task)
    b.run_window(acts[0], ws[0], 0.0, task.window_s)
    c = b.fork()
    assert c.router == "tracked"
    reps = [x.run_window(acts[1], ws[1], task.window_s, task.window_s) for x in (b, c)]
    assert records(reps[:1]) == records(reps[1:])


def test_tracked_routes_differ_from_the_estimated_ones_on_a_cluster_task():
    acts = [ACT.model_copy(update={"replicas": 3})] * 4
    est = play(ClusterBackend(PROFILE, (1, 8), 3), "diurnal_autoscale", acts)
    tracked = play(ClusterBackend(PROFILE, (1, 8), 3, router="tracked"), "diurnal_autoscale", acts)
    assert records(est) != records(tracked)
    # the same requests are held either way: finished, or pending at the last window's end
    ids = [sorted([r.request_id for rep in reps for r in rep.finished] + [r.request_id for r in reps[-1].pending])
           for reps in (est, tracked)]
    assert ids[0] == ids[1]


def test_default_router_is_the_estimated_one():
    acts = [ACT.model_copy(update={"replicas": n, "cache_affinity": a}) for n, a in ((2, None), (3, 0.5), (1, 0.0))]
    default = play(ClusterBackend(PROFILE, (1, 8), 2), "multiturn_cluster", acts)
    named = play(ClusterBackend(PROFILE, (1, 8), 2, router="estimated"), "multiturn_cluster", acts)
    assert ClusterBackend(PROFILE).router == "estimated"
    assert [r.to_dict() for r in default] == [r.to_dict() for r in named]
    with pytest.raises(ValueError, match="router"):
        ClusterBackend(PROFILE, router="exact")
