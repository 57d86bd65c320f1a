"""Learned policies on the cluster tasks: the replica head and cluster features exist there only, the
single-server spaces and shipped weights are untouched, and train.py clones any teacher."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import train_extra
from llmserve_env.agents.advice import AdviceOnClusterError, FeatureView
from llmserve_env.agents.encoding import (
    ACTION_NVEC,
    CLUSTER_FEATURE_NAMES,
    FEATURE_NAMES,
    OBS_DIM,
    REPLICA_STEPS,
    ObservationEncoder,
    decode_action,
    encode_action,
)
from llmserve_env.agents.ppo_policy import WEIGHTS_DIR, ActorWeights, PPOPolicy
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.static import VLLM_DEFAULT
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.tasks import CLUSTER_TASKS, PREFIX_TASKS, SINGLE_SERVER_TASKS
from llmserve_env.tools.train_config import parse_args

KEEP, UP, DOWN = REPLICA_STEPS.index(0), REPLICA_STEPS.index(1), REPLICA_STEPS.index(-1)


@pytest.mark.parametrize("task", list(SINGLE_SERVER_TASKS))
def test_single_server_spaces_are_exactly_the_six_knobs(task):
    env = LLMServeGymEnv(task)
    assert list(env.action_space.nvec) == list(ACTION_NVEC) == [10, 7, 7, 3, 2, 2]
    assert env.observation_space.shape == (OBS_DIM,) == (25,)
    x, _ = env.reset(options={"episode_seed": 3})
    assert x.shape == (OBS_DIM,)
    # the decoded action leaves `replicas` out: the seed's six-field action on the wire
    assert env.view.decode([9, 6, 0, 0, 0, 0]).replicas is None


# the prefix-caching tasks add a cache_affinity head and have no daily cycle (mooncake_cluster): tests/test_prefix_tasks.py
@pytest.mark.parametrize("task", [t for t in CLUSTER_TASKS if t not in PREFIX_TASKS])
def test_cluster_tasks_get_a_replica_step_and_the_cluster_state(task):
    env = LLMServeGymEnv(task)
    assert list(env.action_space.nvec) == [*ACTION_NVEC, len(REPLICA_STEPS)]
    assert env.observation_space.shape == (OBS_DIM + len(CLUSTER_FEATURE_NAMES),)
    names = list(FEATURE_NAMES + CLUSTER_FEATURE_NAMES)
    x, _ = env.reset(options={"episode_seed": 5})
    start = env.task.initial_replicas / env.task.replicas[1]
    assert x[names.index("replicas_target")] == pytest.approx(start)
    assert x[names.index("replicas_ready")] == pytest.approx(start)
    assert x[names.index("replicas_starting")] == 0.0
    knobs = list(encode_action(VLLM_DEFAULT, env.task.replicas, env.task.initial_replicas)[:6])
    x, *_ = env.step(np.array([*knobs, UP]))
    obs = env.last_observation
    assert obs is not None and obs.metadata["cluster"]["target"] == env.task.initial_replicas + 1
    # the new replica is billed and starting (a cold start spans several windows), not ready
    assert x[names.index("replicas_starting")] == pytest.approx(1 / env.task.replicas[1])
    assert 0.0 < x[names.index("next_ready_in")] < 1.0
    tod = x[names.index("time_of_day_sin")], x[names.index("time_of_day_cos")]
    x, *_ = env.step(np.array([*knobs, DOWN]))
    assert env.last_observation.metadata["cluster"]["target"] == env.task.initial_replicas
    assert (x[names.index("time_of_day_sin")], x[names.index("time_of_day_cos")]) != tod  # the day moves on


def test_replica_step_is_kept_in_the_task_range_and_round_trips():
    rng = (1, 8)
    assert decode_action([0, 0, 0, 0, 0, 0, DOWN], rng, current=1).replicas == 1
    assert decode_action([0, 0, 0, 0, 0, 0, UP], rng, current=8).replicas == 8
    assert decode_action([0, 0, 0, 0, 0, 0, UP], rng, current=3).replicas == 4
    for current, wanted, step in ((3, 6, UP), (3, 1, DOWN), (3, 3, KEEP), (3, None, KEEP)):
        a = VLLM_DEFAULT.model_copy(update={"replicas": wanted})
        assert encode_action(a, rng, current)[6] == step
    with pytest.raises(ValueError, match="current"):
        decode_action([0, 0, 0, 0, 0, 0, UP], rng)
    with pytest.raises(ValueError, match="7 action indices"):
        decode_action([0, 0, 0, 0, 0, 0], rng, current=2)


def test_advice_is_refused_on_cluster_tasks():
    with pytest.raises(AdviceOnClusterError, match="single-server"):
        FeatureView("diurnal_autoscale", 48, advice=True, replicas=(1, 8))


@pytest.mark.parametrize(("argv", "named", "allowed"), [
    (["--task", "diurnal_autoscale", "--advice", "true", "--init", "follow"], "--advice", "single-server"),
    (["--task", "bursty_workload", "--init", "bc", "--teacher", "hpa"], "--teacher", "cluster"),
    (["--init", "uniform", "--teacher", "planner"], "--teacher", "--init bc"),
    (["--init", "heuristic", "--teacher", "planner"], "--teacher", "--init bc"),
    (["--teacher", "nope"], "--teacher", "planner"),
])
def test_train_refuses_teacher_and_advice_mismatches(argv, named, allowed, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args([*argv, "--run-dir", str(tmp_path / "runs")])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"python tools/train.py: error: argument {named}") and allowed in line, line


def test_init_heuristic_is_behaviour_cloning_of_the_heuristic():
    args = parse_args(["--init", "heuristic"])
    assert (args.init, args.teacher) == ("bc", "heuristic")


def _by_hand(weights: ActorWeights, x: np.ndarray) -> list[int]:
    """The pre-cluster inference path: six heads over OBS_DIM features, written out here."""
    h = np.clip((x - weights.obs_mean) / np.sqrt(weights.obs_var + weights.obs_epsilon), -weights.obs_clip,
                weights.obs_clip)
    for i, (w, b) in enumerate(weights.layers):
        h = h @ w + b
        if i < len(weights.layers) - 1:
            h = np.tanh(h)
    out, start = [], 0
    for n in ACTION_NVEC:
        out.append(int(np.argmax(h[start:start + n])))
        start += n
    return out


@pytest.mark.parametrize("task", [t for t in SINGLE_SERVER_TASKS if (WEIGHTS_DIR / f"{t}.npz").exists()])
def test_shipped_single_server_weights_load_and_act_as_before(task):
    """Shipped weights keep their 25 features and six heads; every action of an episode is the one the
    six-knob path computes, with no `replicas` field."""
    policy = PPOPolicy(task)
    if policy.weights.advice:  # residual weights decode through the heuristic: tests/test_advice.py
        pytest.skip("weights trained with the heuristic's advice")
    assert policy.weights.nvec == ACTION_NVEC and policy.weights.replicas == (1, 1)
    meta = json.loads((WEIGHTS_DIR / f"{task}.json").read_text())
    assert meta.get("feature_names", list(FEATURE_NAMES))[:OBS_DIM] == list(FEATURE_NAMES)
    env, enc = InProcessEnv(), ObservationEncoder(SINGLE_SERVER_TASKS[task].horizon)
    policy.reset()
    obs = env.reset(task_id=task, seed=11)
    for _ in range(8):
        x = enc.encode(obs).astype(np.float64)
        action = policy.act(obs)
        expect = decode_action(_by_hand(policy.weights, x))
        enc.record_action(expect)
        assert action == expect and action.replicas is None
        obs = env.step(action)


def test_weights_for_another_replica_range_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    nvec, dim = (*ACTION_NVEC, len(REPLICA_STEPS)), OBS_DIM + len(CLUSTER_FEATURE_NAMES)
    arrays = {"actor_w0": rng.normal(size=(dim, 4)), "actor_b0": np.zeros(4),
              "actor_w1": rng.normal(size=(4, sum(nvec))), "actor_b1": np.zeros(sum(nvec)), "nvec": np.asarray(nvec)}
    meta = {"obs_norm": {"mean": [0.0] * dim, "var": [1.0] * dim, "clip": 10.0, "epsilon": 1e-8},
            "replicas_range": [1, 8]}
    w = ActorWeights.from_arrays(arrays, meta)
    policy = PPOPolicy("diurnal_autoscale", weights=w)
    policy.reset()
    obs = InProcessEnv().reset(task_id="diurnal_autoscale", seed=2)
    assert policy.act(obs).replicas in (1, 2, 3)  # one step from the 2 it starts with
    with pytest.raises(ValueError, match="replicas"):
        PPOPolicy("bursty_workload", weights=w)
    with pytest.raises(ValueError, match="action grid"):  # cluster weights without their range
        ActorWeights.from_arrays(arrays, {"obs_norm": meta["obs_norm"]})


def test_teacher_demos_replay_the_teacher_on_the_grid():
    """Behaviour cloning's demonstrations on a cluster task: the tuned static rival's replica count is
    reached step by step and its knobs are on the grid, so the demo episode scores like the rival."""
    train_extra("torch")
    import llmserve_env.tools.train as train

    task, seed = "multitenant_autoscale", 4
    [(x, acts, rets, score)] = train._teacher_demos(task, [seed], 0.99, "tuned_static")
    assert x.shape == (48, OBS_DIM + len(CLUSTER_FEATURE_NAMES)) and acts.shape == (48, 7)
    want = make_policy("tuned_static", task).act(InProcessEnv().reset(task_id=task, seed=seed)).replicas
    steps = want - CLUSTER_TASKS[task].initial_replicas
    assert list(acts[:, 6]) == [UP] * steps + [KEEP] * (48 - steps)
    assert rets.shape == (48,) and 0.0 < score <= 1.0


def test_cluster_gym_env_passes_gymnasiums_checker():
    from gymnasium.utils.env_checker import check_env

    check_env(LLMServeGymEnv("multitenant_autoscale"), skip_render_check=True)


def test_actor_vs_rivals_refuses_a_missing_or_mismatched_actor(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "actor_vs_rivals.py"
    spec = importlib.util.spec_from_file_location("bench_actor_vs_rivals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for argv in (["--task", "bursty_workload", "--weights", str(tmp_path / "none.npz")],
                 ["--task", "diurnal_autoscale", "--weights", str(WEIGHTS_DIR / "bursty_workload.npz")]):
        with pytest.raises(SystemExit) as exc:
            module.main(argv)
        assert exc.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
            "python bench/actor_vs_rivals.py: error: argument --weights")
