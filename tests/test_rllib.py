"""RLlib's PPO trains on LLMServe-v0 on a local Ray, and its exported actor serves without Ray or torch."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(600)


def _rllib():
    if os.environ.get("LLMSERVE_REQUIRE_RLLIB") == "1":
        return importlib.import_module("ray.rllib")
    return pytest.importorskip("ray.rllib", reason="RLlib is in the rllib extra (pip install -e '.[rllib]')")


def test_rllib_ppo_trains_and_its_export_serves(tmp_path) -> None:
    _rllib()
    import ray
    import torch
    from llmserve_env.agents.ppo_policy import ActorWeights, PPOPolicy
    from llmserve_env.agents.rollout import play_episode
    from llmserve_env.core.inprocess import InProcessEnv
    from llmserve_env.gym_env import LLMServeGymEnv
    from llmserve_env.tools.train_rllib import build_config, export

    task = "static_workload"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        algo = build_config(task, env_runners=1, hidden=16, seed=0, train_batch=128, minibatch=64, epochs=2,
                            lr=3e-4, entropy=0.003).build_algo()
        for _ in range(2):
            result = algo.train()
        assert result["env_runners"]["num_episodes_lifetime"] >= 2
        module = algo.get_module()
        npz = export(module, task, tmp_path, {"command": "test"})
        # the numpy actor computes the same logits as the trained torch module
        weights = ActorWeights.load(npz)
        env = LLMServeGymEnv(task)
        obs, _ = env.reset(seed=3)
        x = np.stack([obs, env.step(env.action_space.sample())[0]])
        with torch.no_grad():
            ref = module.forward_inference({"obs": torch.as_tensor(x)})["action_dist_inputs"].numpy()
        ours = np.stack([np.concatenate(weights.logits(row.astype(np.float64))) for row in x])
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
        algo.stop()
    finally:
        ray.shutdown()
    # served like the shipped PPO actor: numpy only
    r = play_episode(InProcessEnv(), PPOPolicy(task, weights_path=npz), task, 500_000)
    assert 0.0 <= r.score <= 1.0 and r.steps == 64
