"""A learner on the prefix-caching tasks (issue 32): the routing rules teach it through the prefix view's
`encode`, the trainer sizes its networks by the view the Gym wrapper uses (agents/views.py), and PPOPolicy
plays weights trained on that view with the cache_affinity head."""

from __future__ import annotations

import numpy as np
import pytest
from llmserve_env.agents.encoding import ACTION_NVEC
from llmserve_env.agents.family_features import FAMILY_ENCODING
from llmserve_env.agents.ppo_policy import ActorWeights, PPOPolicy
from llmserve_env.agents.prefix_view import AFFINITY_LEVELS, AFFINITY_META_KEY, PrefixFeatureView
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.views import make_view, view_dims, view_meta
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.tasks import PREFIX_TASKS, get_task
from llmserve_env.tools.train_config import parse_args


@pytest.mark.parametrize(("task_id", "encoding"), [("multiturn_cluster", "default"), ("multiturn_cluster", "family"),
                                                  ("mooncake_cluster", "family"), ("diurnal_autoscale", "default"),
                                                  ("static_workload", "default"), ("diurnal_family", "family")])
def test_the_trainer_sizes_its_networks_by_the_gym_wrappers_view(task_id, encoding):
    env = LLMServeGymEnv(task_id, encoding=encoding)
    nvec, dim = view_dims(get_task(task_id), encoding=encoding)
    assert tuple(env.action_space.nvec) == nvec and env.observation_space.shape == (dim,)
    assert isinstance(env.view, PrefixFeatureView) == (task_id in PREFIX_TASKS)
    x, _ = env.reset(seed=0)
    assert x.shape == (dim,)
    meta = view_meta(env.view)
    if task_id in PREFIX_TASKS:  # the family view's count head, then the affinity head
        assert meta[AFFINITY_META_KEY] == list(AFFINITY_LEVELS) and len(meta["feature_names"]) == dim
        assert (meta.get("encoding") == FAMILY_ENCODING) == (encoding == "family")


def test_dagger_labels_the_students_states_with_a_routing_rules_action():
    """A routing rule is a fixed action, so it labels any state: its knobs, its replica count (the family
    view's count head) and its affinity level."""
    from llmserve_env.tools.dagger import label_episodes

    (ep,) = label_episodes("multiturn_cluster", [7], "dynamo_kv", None, 0.99)
    lo = get_task("multiturn_cluster").replicas[0]
    assert ep.labels.shape[1] == len(view_dims(get_task("multiturn_cluster"), encoding="family")[0])
    assert set(ep.labels[:, -2]) == {4 - lo} and set(ep.labels[:, -1]) == {AFFINITY_LEVELS.index(0.5)}


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
    assert meta[AFFINITY_META_KEY] == list(AFFINITY_LEVELS) and len(meta["feature_names"]) == dim
    policy = PPOPolicy("multiturn_cluster", weights=ActorWeights.from_arrays(arrays, meta))
    env = InProcessEnv()
    obs = env.reset("multiturn_cluster", 3)
    policy.reset()
    for _ in range(3):
        action = policy.act(obs)
        assert action.cache_affinity in AFFINITY_LEVELS and action.replicas is not None
        obs = env.step(action)
    assert obs.metadata["applied"]["cache_affinity"] is True
    # the same weights on a task without the prefix view: refused, naming the head
    with pytest.raises(ValueError, match="cache_affinity head"):
        PPOPolicy("diurnal_autoscale", weights=ActorWeights.from_arrays(arrays, meta))


def test_routing_teachers_only_on_the_prefix_tasks(tmp_path, capsys):
    args = parse_args(["--task", "multiturn_cluster", "--init", "bc", "--teacher", "dynamo_kv",
                       "--run-dir", str(tmp_path)])
    assert args.teacher == "dynamo_kv"
    with pytest.raises(SystemExit):
        parse_args(["--task", "diurnal_autoscale", "--init", "bc", "--teacher", "llmd_scorer",
                    "--run-dir", str(tmp_path)])
    assert "argument --teacher" in capsys.readouterr().err
