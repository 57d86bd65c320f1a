"""A learner on the prefix-caching tasks (issue 32): the routing rules teach it through the prefix view's
`encode`, the trainer sizes its networks by the view the Gym wrapper uses (agents/views.py), and PPOPolicy
plays weights trained on that view with the cache_affinity head."""

from __future__ import annotations

import numpy as np
import pytest
from llmserve_env.agents.encoding import ACTION_NVEC
from llmserve_env.agents.ppo_policy import ActorWeights, PPOPolicy
from llmserve_env.agents.prefix_view import AFFINITY_LEVELS, PREFIX_ENCODING, PrefixFeatureView
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.views import make_view, view_dims, view_meta
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.tasks import PREFIX_TASKS, get_task
from llmserve_env.tools.train_config import parse_args


@pytest.mark.parametrize("task_id", ["multiturn_cluster", "diurnal_autoscale", "static_workload", "diurnal_family"])
def test_the_trainer_sizes_its_networks_by_the_gym_wrappers_view(task_id):
    env = LLMServeGymEnv(task_id, encoding="family" if task_id == "diurnal_family" else "default")
    nvec, dim = view_dims(get_task(task_id), encoding="family" if task_id == "diurnal_family" else "default")
    assert tuple(env.action_space.nvec) == nvec and env.observation_space.shape == (dim,)
    assert isinstance(env.view, PrefixFeatureView) == (task_id in PREFIX_TASKS)


@pytest.mark.parametrize("kind", ["least_work", "llmd_scorer", "dynamo_kv"])
def test_a_routing_rules_action_encodes_on_the_grid_and_decodes_back(kind):
    """What behaviour cloning labels: the rule's knobs, a step towards its replica count, and the affinity
    level nearest its weight (llm-d's 3/7 -> 0.5)."""
    task = get_task("multiturn_cluster")
    view = make_view(task)
    assert isinstance(view, PrefixFeatureView)
    obs = InProcessEnv().reset("multiturn_cluster", 0)
    view.reset()
    view.features(obs)
    action = make_policy(kind, "multiturn_cluster").act(obs)
    idx = view.encode(action)
    assert len(idx) == len(view.nvec) and all(0 <= i < n for i, n in zip(idx, view.nvec, strict=True))
    back = view.decode(idx)
    want = {"least_work": 0.0, "llmd_scorer": 0.5, "dynamo_kv": 0.5}[kind]
    assert back.cache_affinity == want == AFFINITY_LEVELS[idx[-1]]
    # on the grid's points: the batch cap exactly (256), the KV fraction to the nearest of 7 levels (0.9 -> 0.85)
    assert back.batch_cap == action.batch_cap and abs(back.kv_budget_fraction - action.kv_budget_fraction) <= 0.075
    # the rule asks for more replicas than the task starts with: one step up
    assert action.replicas > task.initial_replicas and back.replicas == task.initial_replicas + 1


def test_weights_trained_on_the_prefix_view_play_its_affinity_head():
    task = get_task("multiturn_cluster")
    nvec, dim = view_dims(task)
    assert nvec == (*ACTION_NVEC, 3, len(AFFINITY_LEVELS))
    rng = np.random.default_rng(0)
    arrays = {"actor_w0": rng.normal(size=(dim, 8)), "actor_b0": np.zeros(8),
              "actor_w1": rng.normal(size=(8, sum(nvec))), "actor_b1": np.zeros(sum(nvec)), "nvec": np.array(nvec)}
    meta = {"obs_norm": {"mean": [0.0] * dim, "var": [1.0] * dim, "clip": 10.0, "epsilon": 1e-8},
            "advice": None, "replicas_range": list(task.replicas), **view_meta(make_view(task))}
    assert meta["encoding"] == PREFIX_ENCODING and len(meta["feature_names"]) == dim
    policy = PPOPolicy("multiturn_cluster", weights=ActorWeights.from_arrays(arrays, meta))
    env = InProcessEnv()
    obs = env.reset("multiturn_cluster", 3)
    policy.reset()
    for _ in range(3):
        action = policy.act(obs)
        assert action.cache_affinity in AFFINITY_LEVELS and action.replicas is not None
        obs = env.step(action)
    assert obs.metadata["applied"]["cache_affinity"] is True
    # the same weights on a task without the prefix view: refused, naming both views
    with pytest.raises(ValueError, match="prefix view"):
        PPOPolicy("diurnal_autoscale", weights=ActorWeights.from_arrays(arrays, meta))


def test_routing_teachers_only_on_the_prefix_tasks(tmp_path, capsys):
    args = parse_args(["--task", "multiturn_cluster", "--init", "bc", "--teacher", "dynamo_kv",
                       "--run-dir", str(tmp_path)])
    assert args.teacher == "dynamo_kv"
    with pytest.raises(SystemExit):
        parse_args(["--task", "diurnal_autoscale", "--init", "bc", "--teacher", "llmd_scorer",
                    "--run-dir", str(tmp_path)])
    assert "argument --teacher" in capsys.readouterr().err
