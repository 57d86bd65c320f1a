"""The Gymnasium wrapper: spaces, check_env, determinism, and a few hundred steps of SB3 PPO."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from conftest import train_extra
from gymnasium.utils.env_checker import check_env
from llmserve_env.agents.encoding import ACTION_NVEC, OBS_DIM
from llmserve_env.gym_env import ENV_ID, LLMServeGymEnv
from llmserve_env.shared.tasks import TASKS, get_task


def test_registered_and_made_with_a_task():
    env = gymnasium.make(ENV_ID, task="bursty_workload")
    assert env.spec.id == ENV_ID
    assert isinstance(env.action_space, gymnasium.spaces.MultiDiscrete)
    assert list(env.action_space.nvec) == list(ACTION_NVEC)
    assert env.observation_space.shape == (OBS_DIM,)
    env.close()


def test_check_env_passes():
    env = LLMServeGymEnv("static_workload")
    check_env(env, skip_render_check=True)
    env.close()


def test_episode_plays_to_the_horizon_and_reports_the_grade():
    env = LLMServeGymEnv("adversarial_multitenant")
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs) and "episode_seed" in info
    steps, total, terminated = 0, 0.0, False
    while not terminated:  # the horizon ends the episode (arrivals stop, the engine drains): termination
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and np.isfinite(reward) and not truncated
        total += reward
        steps += 1
    assert steps == get_task("adversarial_multitenant").horizon
    assert 0.0 <= info["score"] <= 1.0
    env.close()


def test_same_seed_same_episode_and_chosen_episode_seed():
    a, b = LLMServeGymEnv("bursty_workload"), LLMServeGymEnv("bursty_workload")
    oa, ia = a.reset(seed=11)
    ob, ib = b.reset(seed=11)
    assert ia == ib and np.array_equal(oa, ob)
    action = np.array([5, 5, 0, 0, 0, 0])
    for _ in range(5):
        ra, rb = a.step(action), b.step(action)
        assert np.array_equal(ra[0], rb[0]) and ra[1] == rb[1]
    _, info = a.reset(options={"episode_seed": 1_000_003})
    assert info["episode_seed"] == 1_000_003


def test_stable_baselines3_ppo_trains_a_few_hundred_steps():
    PPO = train_extra("stable_baselines3").PPO

    env = gymnasium.make(ENV_ID, task="static_workload")
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=2, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=256)
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(action)
    env.close()


def test_train_py_runs_end_to_end_and_its_weights_load_without_torch(tmp_path):
    train_extra("torch")
    import llmserve_env.tools.train as train
    from llmserve_env.agents.ppo_policy import PPOPolicy

    args = train.Args(task="static_workload", total_steps=256, num_envs=2, num_workers=1, rollout_steps=64,
                      bc_episodes=2, bc_epochs=2, val_episodes=1, val_every=1,
                      out_dir=tmp_path / "weights", run_dir=tmp_path / "runs", command="test")
    summary = train.train(args)
    assert summary["global_steps"] == 256 and summary["episodes"] == 4
    assert (tmp_path / "runs" / "static_workload__s0" / "progress.csv").read_text().count("\n") == 3
    policy = PPOPolicy("static_workload", tmp_path / "weights" / "static_workload.npz")
    assert policy.weights.meta["command"] == "test" and "obs_norm" in policy.weights.meta


def test_train_py_is_reproducible_with_workers_served_out_of_order(tmp_path):
    """Two workers are stepped as each finishes (no lockstep); the same seed still gives the same run."""
    train_extra("torch")
    import llmserve_env.tools.train as train

    def run(name: str) -> tuple[dict, list[list[str]]]:
        args = train.Args(task="bursty_workload", total_steps=256, num_envs=4, num_workers=2, rollout_steps=32,
                          bc_episodes=2, bc_epochs=2, val_episodes=2, val_every=1,
                          out_dir=tmp_path / name / "weights", run_dir=tmp_path / name / "runs", command="test")
        train.train(args)
        with np.load(tmp_path / name / "weights" / "bursty_workload.npz") as z:
            arrays = {k: z[k] for k in z.files}
        rows = (tmp_path / name / "runs" / "bursty_workload__s0" / "progress.csv").read_text().splitlines()
        # every column but the speed (sps)
        return arrays, [row.split(",")[:2] + row.split(",")[3:] for row in rows]

    (w1, log1), (w2, log2) = run("a"), run("b")
    assert log1 == log2 and len(log1) == 3
    assert w1.keys() == w2.keys() and all(np.array_equal(w1[k], w2[k]) for k in w1)


@pytest.mark.parametrize("task_id", list(TASKS))
def test_fast_path_matches_the_full_observation_path(task_id: str) -> None:
    """Differential: the same random actions through the fast path (Episode.advance: no pydantic
    observation, step log unvalidated) and the full one (Episode.step) give the same features,
    rewards, done flags, grade, step log and, read at the end, the same last observation."""
    fast, full = LLMServeGymEnv(task_id), LLMServeGymEnv(task_id)
    assert fast.fast  # the default without advice
    full.fast = False
    rng = np.random.default_rng(7)
    x_fast, _ = fast.reset(options={"episode_seed": 11})
    x_full, _ = full.reset(options={"episode_seed": 11})
    assert np.array_equal(x_fast, x_full)
    done = False
    while not done:
        a = rng.integers(0, fast.action_space.nvec)
        x_fast, r_fast, done, _, info_fast = fast.step(a)
        x_full, r_full, done_full, _, info_full = full.step(a)
        assert np.array_equal(x_fast, x_full) and r_fast == r_full and done == done_full
    assert info_fast["score"] == info_full["score"]
    assert fast.runtime.episode.episode_log().model_dump(exclude={"episode_id"}) == \
        full.runtime.episode.episode_log().model_dump(exclude={"episode_id"})
    assert fast.last_observation.model_dump(exclude={"episode_id"}) == \
        full.last_observation.model_dump(exclude={"episode_id"})
