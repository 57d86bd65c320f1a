"""The scenario families' learned policy (issue 28): its view reads only the observation, its count head
stays in the task's range, DAgger labels the states the student visits, and the shipped family weights
load and act fast (agents/family_features.py, tools/dagger.py, weights/<family>.npz)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from llmserve_env.agents.encoding import ACTION_NVEC
from llmserve_env.agents.family_features import FAMILY_ENCODING, FamilyView, family_shape
from llmserve_env.agents.ppo_policy import WEIGHTS_DIR, ActorWeights, PPOPolicy
from llmserve_env.agents.registry import make_policy
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.models import ServeObservation
from llmserve_env.shared.splits import SHIFTED_TASKS
from llmserve_env.shared.tasks import get_task
from llmserve_env.tools.dagger import label_episode, label_episodes
from llmserve_env.tools.train_config import parse_args

FAMILIES = list(SHIFTED_TASKS)


class _Recorder:
    """An observation that records which fields and which metadata keys are read."""

    def __init__(self, obs: ServeObservation, read: set[str]):
        self._obs, self._read = obs, read

    def __getattr__(self, name: str) -> Any:
        self._read.add(name)
        value = getattr(self._obs, name)
        if name == "metadata":
            outer = self._read

            class _Meta(dict):
                def get(self, key, default=None):  # type: ignore[override]
                    outer.add(f"metadata.{key}")
                    return super().get(key, default)

                def __getitem__(self, key):
                    outer.add(f"metadata.{key}")
                    return super().__getitem__(key)

            return _Meta(value or {})
        return value


@pytest.mark.parametrize("task_id", FAMILIES)
def test_family_view_reads_only_observation_fields_and_the_cluster_metadata(task_id):
    """Every input comes from the observation: its declared fields and metadata["cluster"] (what the Gym
    fast path's ObservedWindow carries), never per-tenant grades, the seed or the drawn day."""
    env, view, read = InProcessEnv(), FamilyView(task_id), set()
    obs = env.reset(task_id=task_id, seed=3)
    for _ in range(12):
        x = view.features(_Recorder(obs, read))  # type: ignore[arg-type]
        assert x.shape == (view.dim,) and np.all(np.isfinite(x))
        obs = env.step(make_policy("operator", task_id).act(obs).model_copy(update={"replicas": 3}))
    fields = set(ServeObservation.model_fields)
    assert {r for r in read if not r.startswith("metadata.")} <= fields
    assert {r for r in read if r.startswith("metadata.")} == {"metadata.cluster"}


@pytest.mark.parametrize("task_id", FAMILIES)
def test_fast_path_and_full_observation_give_the_same_family_features(task_id):
    gym = LLMServeGymEnv(task_id, encoding="family")
    slow = FamilyView(task_id)
    gym.reset(options={"episode_seed": 5})
    slow.reset()
    x_slow = slow.features(gym.last_observation)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    for _ in range(10):
        idx = np.array([7, 6, 0, 0, 0, 1, int(rng.integers(0, 8))])
        slow.decode(idx)
        x_fast, *_ = gym.step(idx)
        x_slow = slow.features(gym.last_observation)  # type: ignore[arg-type]
        np.testing.assert_allclose(x_fast, x_slow, rtol=0, atol=1e-6)


def test_count_head_names_an_absolute_target_in_the_task_range():
    task = get_task("diurnal_family")
    view = FamilyView(task)
    assert view.nvec == ACTION_NVEC + (task.replicas[1] - task.replicas[0] + 1,)
    for i in range(view.nvec[-1]):
        a = view.decode([7, 6, 0, 0, 0, 0, i])
        assert a.replicas == task.replicas[0] + i
        assert view.encode(a)[-1] == i
    # a teacher's count outside the range is labelled at the nearest bound
    assert view.encode(a.model_copy(update={"replicas": 99}))[-1] == view.nvec[-1] - 1


def test_dagger_labels_the_states_the_student_visits():
    """Round 0 (the expert plays) agrees with its own labels on every state; a student's episode is
    labelled on the states the student reached (its actions, the expert's labels)."""
    expert = label_episodes("diurnal_family", [7], "operator", None, 0.99)[0]
    task = get_task("diurnal_family")
    assert expert.agreement == 1.0 and expert.labels.shape == (task.horizon, len(ACTION_NVEC) + 1)
    nvec, dim = family_shape(["chat"], task.replicas)
    rng = np.random.default_rng(0)
    arrays = {"actor_w0": rng.normal(size=(dim, 8)).astype(np.float32), "actor_b0": np.zeros(8, np.float32),
              "actor_w1": rng.normal(size=(8, sum(nvec))).astype(np.float32),
              "actor_b1": np.zeros(sum(nvec), np.float32), "nvec": np.asarray(nvec)}
    meta = {"obs_norm": {"mean": [0.0] * dim, "var": [1.0] * dim, "clip": 10.0, "epsilon": 1e-8},
            "replicas_range": list(task.replicas), **FamilyView(task).meta()}
    student = label_episodes("diurnal_family", [7], "operator", (arrays, meta), 0.99)[0]
    assert student.features.shape == (task.horizon, dim)
    assert not np.array_equal(student.features, expert.features)  # other states: the student's
    assert student.agreement < 1.0


def test_the_planner_labels_the_students_states_through_decide_and_commit():
    """The planner as DAgger's expert: it decides on each state the student reached, then plays the
    student's action in its mirror (`commit`), so it follows an episode it did not choose to the end
    (a mirror that diverged would raise). The cheapest planner keeps the test short."""
    task = get_task("multitenant_family")
    view = FamilyView(task)
    nvec, dim = family_shape(list(view.tenants), task.replicas)
    rng = np.random.default_rng(1)
    arrays = {"actor_w0": rng.normal(size=(dim, 8)).astype(np.float32), "actor_b0": np.zeros(8, np.float32),
              "actor_w1": rng.normal(size=(8, sum(nvec))).astype(np.float32),
              "actor_b1": np.zeros(sum(nvec), np.float32), "nvec": np.asarray(nvec)}
    meta = {"obs_norm": {"mean": [0.0] * dim, "var": [1.0] * dim, "clip": 10.0, "epsilon": 1e-8},
            "replicas_range": list(task.replicas), **view.meta()}
    env = LLMServeGymEnv("multitenant_family", grade_on_done=False, encoding="family")
    cheap = {"bases": ("operator",), "samples": 1, "keep": 0, "bridging": False}
    ep = label_episode(env, "planner", 7, ActorWeights.from_arrays(arrays, meta), 0.99, cheap)
    assert ep.labels.shape == (task.horizon, len(nvec)) and ep.agreement < 1.0
    # its labels are the planner's own decisions: on the planner's own episode it agrees with itself
    own = label_episode(env, "planner", 7, None, 0.99, cheap)
    assert own.agreement == 1.0
    env.close()


def test_dagger_needs_the_family_view_and_an_expert_that_labels_others_states(tmp_path, capsys):
    for argv, named in ((["--task", "diurnal_family", "--init", "dagger", "--teacher", "operator"], "--init"),
                        (["--task", "diurnal_family", "--init", "dagger", "--encoding", "family", "--teacher",
                          "tuned_static"], "--teacher"),
                        (["--task", "bursty_workload", "--encoding", "family", "--init", "dagger"], "--encoding")):
        with pytest.raises(SystemExit):
            parse_args([*argv, "--run-dir", str(tmp_path)])
        assert f"argument {named}" in capsys.readouterr().err


@pytest.mark.parametrize("family", [f for f in FAMILIES if (WEIGHTS_DIR / f"{f}.npz").exists()])
def test_shipped_family_weights_load_act_fast_and_stay_in_range(family):
    """The shipped family actor: numpy only, the family view, a count in the replica range every window,
    on the family and on its shifted task (played as built for the family). The time per decision is
    measured and printed; the bound asserted is loose (a shared machine), the README gives the figure."""
    policy = make_policy("ppo", family)
    assert isinstance(policy, PPOPolicy)
    assert policy.weights.meta["encoding"] == FAMILY_ENCODING
    lo, hi = get_task(family).replicas
    env, times = InProcessEnv(), []
    for task_id in (family, SHIFTED_TASKS[family]):
        policy.reset()
        obs = env.reset(task_id=task_id, seed=1_000_000)
        while not obs.done:
            t0 = time.perf_counter()
            action = policy.act(obs)
            times.append(time.perf_counter() - t0)
            assert action.replicas is not None and lo <= action.replicas <= hi
            obs = env.step(action)
    median_ms = 1e3 * float(np.median(times))
    print(f"{family}: {median_ms:.3f} ms a decision (median of {len(times)})")
    assert median_ms < 20.0


def test_fixed_day_cluster_weights_play_the_view_their_json_names():
    """A fixed-day actor plays the view it was trained on: without "encoding" in its JSON (multitenant_autoscale's)
    the default view's ±1 replica step, with the family encoding (diurnal_autoscale's, DAgger from the operator)
    the family view's replica-count head; each plays its task's first windows within its range."""
    env = InProcessEnv()
    for task_id in ("diurnal_autoscale", "multitenant_autoscale"):
        if not (WEIGHTS_DIR / f"{task_id}.npz").exists():
            continue
        w = ActorWeights.load(WEIGHTS_DIR / f"{task_id}.npz")
        task = get_task(task_id)
        if w.meta.get("encoding") == FAMILY_ENCODING:
            assert w.nvec == family_shape(w.meta["tenants"], task.replicas)[0]
        else:
            assert "encoding" not in w.meta and w.nvec == ACTION_NVEC + (3,)
        policy = PPOPolicy(task_id)
        policy.reset()
        obs = env.reset(task_id, 0)
        for _ in range(3):
            action = policy.act(obs)
            assert action.replicas is not None and task.replicas[0] <= action.replicas <= task.replicas[1]
            obs = env.step(action)


def test_the_planner_as_daggers_expert_is_not_validated_as_a_rival(tmp_path):
    """16 validation episodes of the planner are hours of CPU before learning starts: with --teacher planner
    the rivals are the day-plan rules and the autoscalers; a cheap teacher is still among them."""
    from conftest import train_extra
    train_extra("torch")
    import llmserve_env.tools.train as train

    args = train.Args(task="multitenant_family", encoding="family", init="dagger", teacher="planner", out_dir=tmp_path,
                      command="test")
    assert "planner" not in train.rival_names(args) and {"operator", "schedule"} <= set(train.rival_names(args))
    cheap = train.Args(task="multitenant_family", encoding="family", init="bc", teacher="hpa", out_dir=tmp_path,
                       command="test")
    assert "hpa" in train.rival_names(cheap)


def test_daggers_rounds_keep_their_labelled_states_in_the_run_folder(tmp_path):
    """Each round's labelled states are written to the run folder (`dagger_data.npz`): an expensive
    expert's labels (the planner's take hours) outlive the run. Two rounds of one episode each."""
    from conftest import train_extra
    train_extra("torch")
    import llmserve_env.tools.train as train

    args = train.Args(task="diurnal_family", encoding="family", init="dagger", teacher="operator", dagger_rounds=1,
                      dagger_episodes=1, bc_epochs=1, num_envs=1, num_workers=1, run_dir=tmp_path, command="test")
    args.run_path.mkdir(parents=True)
    nvec, dim = train.view_dims(get_task("diurnal_family"), False, "family")
    envs = train.ShardedVecEnv(args.task, 1, 1, 0, False, "family")
    try:
        out = train.dagger_clone(train.Agent(dim, nvec, 8), train.RunningMeanStd((dim,)), args, envs)
    finally:
        envs.close()
    horizon = get_task("diurnal_family").horizon
    assert [r["labelled_states"] for r in out["rounds"]] == [horizon, horizon]
    kept = tmp_path / "kept.npz"
    (args.run_path / "dagger_data.npz").rename(kept)
    data = np.load(kept)
    assert data["features"].shape == (2 * horizon, dim) and data["labels"].shape == (2 * horizon, len(nvec))
    assert data["returns"].shape == (2 * horizon,) and list(np.unique(data["round"])) == [0, 1]

    # a later run goes on from them: fits them, then plays round 2 only (on round 2's seeds)
    base = ["--task", "diurnal_family", "--encoding", "family", "--init", "dagger", "--teacher", "operator",
            "--dagger-episodes", "1", "--bc-epochs", "1", "--run-dir", str(tmp_path / "more")]
    more = parse_args([*base, "--dagger-rounds", "2", "--dagger-data", str(kept)])
    more.run_path.mkdir(parents=True)
    envs = train.ShardedVecEnv(more.task, 1, 1, 0, False, "family")
    try:
        out = train.dagger_clone(train.Agent(dim, nvec, 8), train.RunningMeanStd((dim,)), more, envs)
    finally:
        envs.close()
    assert [r["round"] for r in out["rounds"]] == ["0-1", 2] and out["rounds"][1]["data_set"] == 3 * horizon
    grown = np.load(more.run_path / "dagger_data.npz")
    assert np.array_equal(grown["features"][:2 * horizon], data["features"])
    assert list(np.bincount(grown["round"])) == [horizon] * 3
    # --dagger-rounds m with rounds 0..m kept: the student is fitted to them, nothing is played
    only = parse_args([*base, "--dagger-rounds", "1", "--dagger-data", str(kept), "--seed", "1"])
    only.run_path.mkdir(parents=True)
    out = train.dagger_clone(train.Agent(dim, nvec, 8), train.RunningMeanStd((dim,)), only, envs)
    assert [r["round"] for r in out["rounds"]] == ["0-1"] and out["rounds"][0]["data_set"] == 2 * horizon


@pytest.mark.parametrize("extra, says", [
    (["--dagger-rounds", "0"], "--dagger-rounds must be at least 1"),
    (["--dagger-rounds", "3", "--dagger-episodes", "2"], "--dagger-episodes (2)"),
    (["--dagger-rounds", "3", "--task", "multitenant_family"], "features"),
])
def test_daggers_kept_data_is_checked_before_any_work(tmp_path, capsys, extra, says):
    task = get_task("diurnal_family")
    nvec, dim = family_shape(["chat"], task.replicas)
    rounds = np.repeat([0, 1], task.horizon).astype(np.int16)
    np.savez(tmp_path / "d.npz", features=np.zeros((len(rounds), dim), np.float32),
             labels=np.zeros((len(rounds), len(nvec)), np.int64), returns=np.zeros(len(rounds), np.float32),
             round=rounds)
    argv = ["--task", "diurnal_family", "--encoding", "family", "--init", "dagger", "--teacher", "operator",
            "--dagger-episodes", "1", "--dagger-data", str(tmp_path / "d.npz"), "--run-dir", str(tmp_path), *extra]
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err
    assert "argument --dagger-data" in err and says in err


def test_the_registrys_ppo_plays_weights_from_a_path_not_only_the_shipped_ones(tmp_path):
    """`make_policy("ppo", task, weights_path=...)` scores a run's actor as the shipped one is scored;
    without it, the shipped weights. Here: the shipped actor with its output layer's biases moved, saved
    elsewhere, acts differently."""
    shipped = WEIGHTS_DIR / "multitenant_family.npz"
    if not shipped.exists():
        pytest.skip("no shipped multitenant_family weights")
    arrays = dict(np.load(shipped))
    last = max(k for k in arrays if k.startswith("actor_b"))
    arrays[last] = arrays[last] + np.random.default_rng(0).normal(0, 50, arrays[last].shape).astype(np.float32)
    np.savez(tmp_path / "other.npz", **arrays)
    (tmp_path / "other.json").write_text(shipped.with_suffix(".json").read_text())
    env = InProcessEnv()
    obs = env.reset(task_id="multitenant_family", seed=1_000_000)
    own = make_policy("ppo", "multitenant_family")
    other = make_policy("ppo", "multitenant_family", weights_path=tmp_path / "other.npz")
    assert isinstance(other, PPOPolicy) and other.weights is not own.weights
    assert other.act(obs) != own.act(obs)
