"""Forking an episode: a copy steps bit-for-bit like the original, and neither disturbs the other."""

from __future__ import annotations

import numpy as np
import pytest
from llmserve_env.agents.base import make_action
from llmserve_env.agents.registry import make_policy
from llmserve_env.core.episode import Episode
from llmserve_env.core.errors import ForkUnsupportedError
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import get_task
from llmserve_env.sim.fork import fork_engine

TASK = "adversarial_multitenant"


def _actions(n: int, seed: int) -> list[ServeAction]:
    """A varied action sequence: every knob changes (split and priority on and off, tiers, depths)."""
    rng = np.random.default_rng(seed)
    return [make_action(int(rng.choice([8, 32, 128, 512])), float(rng.choice([0.3, 0.6, 0.9, 1.0])),
                        int(rng.choice([0, 2, 4])), str(rng.choice(["FP16", "INT8", "INT4"])),
                        bool(rng.integers(2)), bool(rng.integers(2))) for _ in range(n)]


def _key(obs: ServeObservation) -> dict:
    return obs.model_dump(exclude={"episode_id"})


def _midway(task: str = TASK, seed: int = 5, steps: int = 24) -> InProcessEnv:
    env = InProcessEnv()
    policy = make_policy("heuristic", task)
    policy.reset()
    obs = env.reset(task, seed)
    for _ in range(steps):
        obs = env.step(policy.act(obs))
    return env


def test_fork_then_step_both_gives_identical_observations_rewards_and_grades() -> None:
    env = _midway()
    branch = env.fork()
    assert branch.episode.episode_id != env.episode.episode_id
    assert branch.episode.step_count == env.episode.step_count
    for action in _actions(get_task(TASK).horizon - 24, seed=1):
        a, b = env.step(action), branch.step(action)
        assert _key(a) == _key(b)
        assert a.reward == b.reward
    assert env.grade()["score"] == branch.grade()["score"]
    assert env.episode.cumulative_reward == branch.episode.cumulative_reward


def test_stepping_the_copy_never_changes_the_original() -> None:
    env, untouched = _midway(), _midway()  # two identical episodes; only env is forked
    branch = env.fork()
    for action in _actions(30, seed=2):  # the copy runs far ahead under other actions
        branch.step(action)
    for action in _actions(get_task(TASK).horizon - 24, seed=3):
        assert _key(env.step(action)) == _key(untouched.step(action))
    assert env.grade() | {"episode_id": ""} == untouched.grade() | {"episode_id": ""}
    assert branch.episode.step_count == 54 and not branch.episode.done


def test_a_copy_of_a_copy_and_save_restore() -> None:
    env = _midway(seed=8)
    first = env.fork()
    first.step(_actions(1, seed=4)[0])
    second = first.fork()  # forked after one more step
    actions = _actions(10, seed=5)
    out_first = [_key(first.step(a)) for a in actions]
    out_second = [_key(second.step(a)) for a in actions]
    assert out_first == out_second

    saved = env.save()
    run1 = [_key(env.step(a)) for a in actions]
    assert _key(env.restore(saved)) == _key(saved.last_observation)
    run2 = [_key(env.step(a)) for a in actions]
    env.restore(saved)  # a snapshot can be restored more than once
    run3 = [_key(env.step(a)) for a in actions]
    assert run1 == run2 == run3
    assert saved.step_count == 24  # the snapshot itself never moved


def test_constants_are_shared_and_state_is_not(monkeypatch) -> None:
    """The Python engine's structures (the compiled engine's arrays: tests/test_array_engine.py)."""
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "python")
    env = _midway()
    ep = env.episode
    clone = ep.fork()
    assert clone.task is ep.task and clone.windows is ep.windows
    b, c = ep.backend, clone.backend
    assert c.profile is b.profile and c._models is b._models
    e, f = b._engine, c._engine
    live = [*e.decoding.values(), *e.prefilling, *e.sched.waiting()]
    assert live, "the mid-episode engine should hold requests"
    copies = {id(r) for r in [*f.decoding.values(), *f.prefilling, *f.sched.waiting()]}
    assert not copies & {id(r) for r in live}
    assert not {id(r.rec) for r in live} & {id(r.rec) for r in [*f.decoding.values(), *f.prefilling]}
    assert clone.tracker.open_requests() == ep.tracker.open_requests() and clone.tracker._open is not ep.tracker._open
    # one request in several structures stays one object in the copy
    for _, _, _, r in f.fin_heap:
        if r.rid in f.decoding and r.gen == f.decoding[r.rid].gen:
            assert r is f.decoding[r.rid]


def test_fork_engine_keeps_aliasing_and_refuses_unknown_builtins() -> None:
    shared_list = [1, 2]

    class Box:
        def __init__(self) -> None:
            self.a = shared_list
            self.b = {"x": shared_list}
            self.rng = np.random.default_rng(3)

    box = Box()
    copy = fork_engine(box)
    assert copy.a is copy.b["x"] and copy.a is not shared_list
    assert copy.rng.random() == box.rng.random()
    box.c = iter([1])  # an iterator cannot be copied faithfully: refused, not shared by mistake
    with pytest.raises(TypeError, match="list_iterator"):
        fork_engine(box)


class _RealLikeBackend:
    name = "real"

    def reset(self, seed: int) -> None: ...

    def close(self) -> None: ...


def test_a_backend_without_fork_answers_409() -> None:
    ep = Episode.start(get_task("static_workload"), 0, "sim")
    ep.backend = _RealLikeBackend()  # type: ignore[assignment]
    ep.mode = "real"
    with pytest.raises(ForkUnsupportedError, match="sim mode") as info:
        ep.fork()
    assert info.value.status == 409


def test_gym_wrapper_exposes_the_runtime_for_forking() -> None:
    env = LLMServeGymEnv("bursty_workload")
    env.reset(options={"episode_seed": 4})
    action = np.array([5, 5, 0, 0, 0, 0])
    for _ in range(3):
        env.step(action)
    branch = env.unwrapped.runtime.fork()
    obs = env.unwrapped.runtime.step(env.view.decode(action))
    assert _key(obs) == _key(branch.step(env.view.decode(action)))
    env.close()


def test_http_fork_continues_from_the_same_state(client, app) -> None:
    from conftest import STEADY_ACTION

    eid = client.post("/reset", json={"task_id": "bursty_workload", "seed": 3}).json()["observation"]["episode_id"]
    for _ in range(5):
        assert client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid}).status_code == 200
    r = client.post("/fork", json={"episode_id": eid})
    assert r.status_code == 200, r.text
    state = r.json()
    fid = state["episode_id"]
    assert fid != eid and state["step_count"] == 5 and len(state["action_history"]) == 5
    a = client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid}).json()
    b = client.post("/step", json={"action": STEADY_ACTION, "episode_id": fid}).json()
    a["observation"].pop("episode_id"), b["observation"].pop("episode_id")
    assert a == b
    assert client.post("/fork", json={"episode_id": "nope"}).status_code == 404
    assert client.post("/fork", json={}).status_code == 422
    assert client.post("/fork", json={"episode_id": 7}).status_code == 422
    # a backend that cannot be copied (real mode) answers 409 with the reason
    ep = app.state.episode_store.get(eid)
    ep.backend, ep.mode = _RealLikeBackend(), "real"
    r = client.post("/fork", json={"episode_id": eid})
    assert r.status_code == 409 and "sim mode" in r.json()["detail"]


def test_http_forks_count_against_the_store_limit(client, app) -> None:
    store = app.state.episode_store
    eid = client.post("/reset", json={"task_id": "static_workload", "seed": 1}).json()["observation"]["episode_id"]
    forks = [client.post("/fork", json={"episode_id": eid}).json()["episode_id"] for _ in range(store.max_episodes)]
    from conftest import STEADY_ACTION

    assert len(store) == store.max_episodes  # never more than the limit
    # the least recently used (the first fork: every later fork touched its parent) was dropped
    assert client.post("/step", json={"action": STEADY_ACTION, "episode_id": forks[0]}).status_code == 404
    assert client.post("/step", json={"action": STEADY_ACTION, "episode_id": forks[-1]}).status_code == 200


# ----------------------------------------------------------------------------------- cluster tasks

CLUSTER = "multitenant_autoscale"


def _cluster_actions(n: int, seed: int, task: str = CLUSTER) -> list[ServeAction]:
    """Varied knobs and replica counts over the task's whole range (scale-ups start replicas that become
    ready several windows later; scale-downs cancel starting ones and drain ready ones)."""
    lo, hi = get_task(task).replicas
    rng = np.random.default_rng(seed)
    return [a.model_copy(update={"replicas": int(rng.integers(lo, hi + 1))}) for a in _actions(n, seed)]


def _cluster_state(env: InProcessEnv) -> list[tuple]:
    return [(r.index, r.state, r.requested_s, r.ready_s, r.gone_s, r.est_work, r.est_t)
            for r in env.episode.backend.replicas]


@pytest.mark.parametrize("task", ["diurnal_autoscale", CLUSTER])
def test_cluster_fork_step_both_and_isolation(task: str) -> None:
    env, untouched = _midway(task, steps=12), _midway(task, steps=12)
    branch = env.fork()
    counts = branch.episode.backend.counts()
    assert counts == env.episode.backend.counts() and sum(counts.values()) >= 1
    # the copy runs ahead under other actions (other replica counts) first: the original must not notice
    for action in _cluster_actions(20, seed=11, task=task):
        branch.step(action)
    replay = env.fork()
    actions = _cluster_actions(get_task(task).horizon - 12, seed=12, task=task)
    for action in actions:
        a, b, c = env.step(action), untouched.step(action), replay.step(action)
        assert _key(a) == _key(b) == _key(c)
    assert _cluster_state(env) == _cluster_state(untouched) == _cluster_state(replay)
    assert env.grade() | {"episode_id": ""} == untouched.grade() | {"episode_id": ""} == \
        replay.grade() | {"episode_id": ""}


def test_cluster_fork_mid_cold_start_and_a_copy_of_a_copy() -> None:
    env = _midway(CLUSTER, steps=6)
    hi = get_task(CLUSTER).replicas[1]
    env.step(_actions(1, seed=6)[0].model_copy(update={"replicas": hi}))  # replicas now starting
    assert env.episode.backend.counts()["starting"] > 0
    first = env.fork()
    first.step(_cluster_actions(1, seed=7)[0])
    second = first.fork()
    actions = _cluster_actions(12, seed=8)
    assert [_key(first.step(a)) for a in actions] == [_key(second.step(a)) for a in actions]
    assert _cluster_state(first) == _cluster_state(second)
    # no engine or replica object is shared between an episode and its copy
    b, c = env.episode.backend, env.fork().episode.backend
    assert c.profile is b.profile and c._models is b._models
    assert not {id(r) for r in c.replicas} & {id(r) for r in b.replicas}
    assert not {id(r.engine) for r in c.replicas if r.engine} & {id(r.engine) for r in b.replicas if r.engine}
