"""Cluster tasks: the replica life cycle, billing, the `replicas` range, grading, rivals, trace replay."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import STEADY_ACTION
from llmserve_env.agents.static import VLLM_DEFAULT
from llmserve_env.core.episode import Episode
from llmserve_env.core.errors import ReplicasOutOfRangeError
from llmserve_env.core.grader import compute_references
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import KNOBS, ServeAction
from llmserve_env.shared.tasks import CLUSTER_TASKS, SINGLE_SERVER_TASKS, TASKS
from llmserve_env.shared.workloads import generate_arrivals, resolve_task
from llmserve_env.sim.profiles import load_profile

DIURNAL = TASKS["diurnal_autoscale"]


def with_replicas(n: int | None, base: ServeAction = VLLM_DEFAULT) -> ServeAction:
    return ServeAction.model_validate({**base.knobs(), "replicas": n})


def short(task, horizon: int):
    return dataclasses.replace(task, horizon=horizon)


def play(task, actions, seed: int = 0) -> Episode:
    ep = Episode.start(task, seed, "sim")
    for a in actions:
        ep.step(a)
    return ep


def test_six_field_action_is_unchanged_and_replicas_is_optional():
    assert KNOBS == ("batch_cap", "kv_budget_fraction", "speculation_depth", "quantization_tier",
                     "prefill_decode_split", "priority_routing")
    assert set(VLLM_DEFAULT.knobs()) == set(KNOBS) and VLLM_DEFAULT.replicas is None
    assert with_replicas(3).knobs()["replicas"] == 3
    with pytest.raises(ValueError, match="replicas"):
        ServeAction.model_validate({**STEADY_ACTION, "replicas": 0})


@pytest.mark.parametrize("task_id", sorted(SINGLE_SERVER_TASKS))
def test_single_server_tasks_allow_exactly_one_replica(task_id):
    task = short(TASKS[task_id], 2)
    assert task.replicas == (1, 1) and not task.is_cluster
    ep = Episode.start(task, 0, "sim")
    ep.step(with_replicas(1))
    with pytest.raises(ReplicasOutOfRangeError) as err:
        ep.step(with_replicas(2))
    assert err.value.status == 422 and "exactly 1" in err.value.message and "replicas" in err.value.message
    assert ep.step_count == 1  # the refused action served nothing


def test_cluster_task_refuses_replicas_outside_its_range():
    ep = Episode.start(short(DIURNAL, 2), 0, "sim")
    with pytest.raises(ReplicasOutOfRangeError, match=r"1\.\.8"):
        ep.step(with_replicas(9))


def test_http_step_answers_422_naming_the_range(client):
    r = client.post("/reset", json={"task_id": "static_workload", "seed": 1})
    eid = r.json()["episode_id"] if "episode_id" in r.json() else r.json()["observation"]["episode_id"]
    r = client.post("/step", json={"action": {**STEADY_ACTION, "replicas": 3}, "episode_id": eid})
    assert r.status_code == 422 and "exactly 1" in r.text
    tasks = {t["task_id"]: t for t in client.get("/tasks").json()["tasks"]}
    assert set(CLUSTER_TASKS) <= set(tasks)
    assert tasks["diurnal_autoscale"]["replicas"] == {"min": 1, "max": 8, "initial": 2}
    assert tasks["static_workload"]["replicas"] == {"min": 1, "max": 1, "initial": 1}


def test_cold_start_spans_several_windows_and_is_billed():
    prof = load_profile(DIURNAL.profile)
    cold = prof.cold_start_s()
    # FP16 checkpoint / cited bandwidth + engine start-up, from the profile's cluster block
    assert cold == pytest.approx(prof.weights_gib("FP16", False) / 0.51 + 58.1)
    assert prof.raw["provenance"]["cluster"]
    windows_to_ready = math.ceil(cold / DIURNAL.window_s)
    assert windows_to_ready >= 5
    ep = Episode.start(short(DIURNAL, windows_to_ready + 2), 0, "sim")
    seen = []
    for _ in range(windows_to_ready + 2):
        obs = ep.step(with_replicas(5))
        c = obs.metadata["cluster"]
        seen.append((c["ready"], c["starting"]))
        # billed: 5 replicas x 10 s x price from the first window on, starting or not (the last
        # window also carries the drain after the horizon, charged to the episode)
        if not obs.done:
            assert obs.metadata["cost_usd"] == pytest.approx(5 * DIURNAL.window_s * prof.replica_price_per_s())
    assert seen[0] == (2, 3)
    assert seen[windows_to_ready - 2] == (2, 3)  # still starting just before the cold start ends
    assert seen[-1] == (5, 0)


def test_scale_down_drains_and_every_request_is_settled_once():
    task = short(DIURNAL, 12)
    ep = play(task, [with_replicas(2)] * 3 + [with_replicas(1)] * 9)
    drains = [s.metrics for s in ep.steps]
    assert sum(m["slo_met"] + m["slo_missed"] for m in drains) == sum(m["arrivals"] for m in drains)
    assert ep.last_observation.metadata["cluster"]["ready"] == 1
    assert ep.last_observation.metadata["cluster"]["draining"] == 0


def test_same_seed_and_actions_give_identical_observations():
    task = short(DIURNAL, 8)
    acts = [with_replicas(n) for n in (2, 4, 4, 3, 1, 5, 2, 2)]
    a = [o.model_dump(exclude={"episode_id"}) for o in _observations(task, acts)]
    b = [o.model_dump(exclude={"episode_id"}) for o in _observations(task, acts)]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _observations(task, acts):
    ep = Episode.start(task, 5, "sim")
    return [ep.step(x) for x in acts]


def test_observation_shows_cluster_state_and_time_of_day():
    env = InProcessEnv()
    obs = env.reset(task_id="diurnal_autoscale", seed=0)
    c = obs.metadata["cluster"]
    assert (c["ready"], c["starting"], c["draining"], c["window_in_cycle"], c["time_of_day_h"]) == (2, 0, 0, 0, 0.0)
    obs = env.step(with_replicas(2))
    assert obs.metadata["cluster"]["window_in_cycle"] == 1 and obs.metadata["cluster"]["time_of_day_h"] == 0.5
    assert obs.metadata["applied"]["replicas"] is True


def test_daily_cycle_peaks_in_the_afternoon():
    arr = generate_arrivals(DIURNAL, 0)
    per = [0] * DIURNAL.horizon
    for a in arr:
        per[int(a.arrival_s // DIURNAL.window_s)] += 1
    night, afternoon = sum(per[2:7]), sum(per[26:31])
    assert afternoon > 2 * night


def test_over_provisioning_costs_and_under_provisioning_misses():
    env = InProcessEnv()
    grades = {}
    for n in (1, 5, 8):
        env.reset(task_id="diurnal_autoscale", seed=3)
        obs = None
        while obs is None or not obs.done:
            obs = env.step(with_replicas(n))
        grades[n] = env.grade()
    assert grades[8]["terms"]["cost"] < grades[5]["terms"]["cost"]
    assert grades[1]["terms"]["goodput"] < grades[5]["terms"]["goodput"] - 0.3
    assert grades[5]["score"] > max(grades[1]["score"], grades[8]["score"])


def test_cluster_references_scale_with_the_cluster():
    refs = compute_references(DIURNAL, 0)
    single = compute_references(dataclasses.replace(DIURNAL, replicas=(1, 1), floor_replicas=1), 0)
    assert refs.upper_met >= single.upper_met and refs.floor_met >= single.floor_met
    assert refs.upper_met > refs.floor_met


@pytest.mark.parametrize("policy", ["hpa", "dynamo_planner", "tuned_static"])
def test_rivals_play_cluster_tasks_within_the_range(policy):
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.agents.rollout import play_episode

    r = play_episode(InProcessEnv(), make_policy(policy, "multitenant_autoscale"), "multitenant_autoscale", 0,
                     keep_actions=True)
    assert 0.0 <= r.score <= 1.0 and r.steps == TASKS["multitenant_autoscale"].horizon
    assert all(1 <= a["replicas"] <= 8 for a in r.actions)


def test_trace_replay_can_be_a_cluster_task(tmp_path):
    rows = "\n".join(f"{i * 0.05:.3f},{512 + i % 7},{64 + i % 5}" for i in range(1200))
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows + "\n")
    task = resolve_task(f"trace:{path}?replicas=4&initial_replicas=2&horizon=6&window_s=10")
    assert task.is_cluster and task.replicas == (1, 4) and task.initial_replicas == 2
    ep = Episode.start(task, 0, "sim")
    for n in (2, 3, 3, 1, 1, 1):
        obs = ep.step(with_replicas(n))
    assert obs.done and "cluster" in obs.metadata
    from llmserve_env.core.grader import grade_episode

    assert 0.0 <= grade_episode(ep.episode_log()).score <= 1.0


def test_the_router_kernel_groups_arrivals_by_replica_stably_the_unrouted_last():
    """sim/compiled_routing.py hands back the arrivals grouped by replica (what the cluster slices each replica's
    from): a stable sort of the choices, those no replica was ready for (choice -1) after every replica's."""
    from llmserve_env.sim.compiled_routing import route_least_work

    n, k = 60, 3  # (without numba the same function runs as Python)
    t = np.linspace(0.0, 3.0, n)
    prompt, output = np.arange(n, dtype=np.int64) * 37 % 900 + 50, np.arange(n, dtype=np.int64) % 7 + 20
    est = np.array([[0.0, 400.0, 0.0], [0.0, 0.0, 0.0], [300.0, 500.0, 200.0], [0.4, 0.3, 1.5]])
    choice, order, counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(k + 1, dtype=np.int64)
    unrouted = route_least_work(t, prompt, output, est, choice, order, counts)
    bucket = np.where(choice < 0, k, choice)
    assert unrouted == int((choice < 0).sum()) == int((t < 0.3).sum()) > 0
    assert order.tolist() == np.argsort(bucket, kind="stable").tolist()
    assert counts.tolist() == np.bincount(bucket, minlength=k + 1).tolist()
    assert set(choice[t >= 1.5].tolist()) == {0, 1, 2} and est[1].max() == t[choice >= 0].max()


def test_the_compiled_router_routes_as_the_python_loop(monkeypatch):
    """sim/compiled_routing.py is `_route`'s loop over arrays: with it and without it (the loop numba's absence
    leaves) a day of changing replica counts gives the same reports and the same router estimates."""
    import random

    from llmserve_env.shared.workloads import windows
    from llmserve_env.sim import cluster as cluster_mod

    task = short(DIURNAL, 16)
    wins = windows(generate_arrivals(task, 3), task)
    rng = random.Random(3)
    actions = [with_replicas(rng.randint(1, 8)) for _ in wins]

    def run(compiled: bool) -> list:
        monkeypatch.setattr(cluster_mod, "HAVE_NUMBA", compiled)
        backend = cluster_mod.ClusterBackend(task.profile, replicas=task.replicas, initial=task.initial_replicas)
        backend.reset(3)
        out = []
        for k, (w, a) in enumerate(zip(wins, actions, strict=True)):
            rep = backend.run_window(a, w, k * task.window_s, task.window_s)
            out.append((json.dumps(rep.to_dict(), sort_keys=True, default=repr),
                        [(r.index, r.est_work, r.est_t) for r in backend.replicas]))
        return out

    compiled, python = run(True), run(False)
    assert compiled == python
    assert sum(len(json.loads(r)["finished"]) for r, _ in python) > 500  # a real day was served
