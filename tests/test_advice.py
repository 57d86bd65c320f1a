"""Residual control over the heuristic: following reproduces it exactly, overrides change one knob."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from llmserve_env.agents.advice import ADVICE_DIM, ADVICE_NVEC, FOLLOW, decode_advised
from llmserve_env.agents.encoding import OBS_DIM
from llmserve_env.agents.heuristic import heuristic
from llmserve_env.agents.ppo_policy import PPOPolicy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.models import KNOBS, ServeAction

PROPOSAL = ServeAction(batch_cap=96, kv_budget_fraction=0.9, speculation_depth=2, quantization_tier="INT8",
                       prefill_decode_split=False, priority_routing=True)


def test_following_every_knob_is_the_proposal_and_a_nudge_changes_one_knob():
    assert decode_advised(FOLLOW, PROPOSAL) == PROPOSAL  # off-grid values (96, 0.9) kept exactly
    for knob, choice, value in (("batch_cap", 1, 48), ("batch_cap", 2, 192), ("kv_budget_fraction", 1, 0.75),
                                ("kv_budget_fraction", 2, 1.0), ("speculation_depth", 1, 0),
                                ("speculation_depth", 3, 4), ("quantization_tier", 1, "FP16"),
                                ("quantization_tier", 3, "INT4"), ("prefill_decode_split", 2, True),
                                ("priority_routing", 1, False)):
        idx = list(FOLLOW)
        idx[KNOBS.index(knob)] = choice
        got = decode_advised(idx, PROPOSAL)
        assert getattr(got, knob) == value, knob
        assert got.model_dump(exclude={knob}) == PROPOSAL.model_dump(exclude={knob})


def test_nudges_stay_inside_the_action_ranges():
    top = ServeAction(batch_cap=512, kv_budget_fraction=1.0, speculation_depth=8, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    bottom = ServeAction(batch_cap=1, kv_budget_fraction=0.1, speculation_depth=0, quantization_tier="FP16",
                         prefill_decode_split=False, priority_routing=False)
    up, down = decode_advised([2, 2, 3, 0, 0, 0], top), decode_advised([1, 1, 0, 0, 0, 0], bottom)
    assert (up.batch_cap, up.kv_budget_fraction, up.speculation_depth) == (512, 1.0, 8)
    assert (down.batch_cap, down.kv_budget_fraction) == (1, 0.1)


@pytest.mark.parametrize("task", ["bursty_workload", "adversarial_multitenant"])
def test_an_agent_that_always_follows_scores_exactly_as_the_heuristic(task):
    seed = 1_000_001
    env = LLMServeGymEnv(task, advice=True)
    env.reset(options={"episode_seed": seed})
    terminated = False
    while not terminated:
        _, _, terminated, _, info = env.step(np.asarray(FOLLOW))
    expect = play_episode(InProcessEnv(), heuristic(task), task, seed).score
    assert info["score"] == expect


def test_advised_env_spaces_and_check_env():
    env = LLMServeGymEnv("adversarial_multitenant", advice=True)
    assert list(env.action_space.nvec) == list(ADVICE_NVEC)
    assert env.observation_space.shape == (OBS_DIM + ADVICE_DIM,)
    check_env(env, skip_render_check=True)
    env.close()


def write_advised_weights(path: Path, follow_bias: float) -> None:
    """A tiny actor whose output bias favours FOLLOW on every head by `follow_bias` logits."""
    rng = np.random.default_rng(0)
    dim, hidden = OBS_DIM + ADVICE_DIM, 8
    bias = np.zeros(sum(ADVICE_NVEC), np.float32)
    start = 0
    for n in ADVICE_NVEC:
        bias[start] = follow_bias
        start += n
    np.savez(path, actor_w0=rng.normal(size=(dim, hidden)).astype(np.float32) * 0.01,
             actor_b0=np.zeros(hidden, np.float32),
             actor_w1=rng.normal(size=(hidden, sum(ADVICE_NVEC))).astype(np.float32) * 0.01,
             actor_b1=bias, nvec=np.asarray(ADVICE_NVEC))
    path.with_suffix(".json").write_text(json.dumps({
        "advice": "heuristic",
        "obs_norm": {"mean": [0.0] * dim, "var": [1.0] * dim, "clip": 10.0, "epsilon": 1e-8}}))


def test_advised_ppo_weights_run_the_heuristic_beside_the_actor(tmp_path):
    write_advised_weights(tmp_path / "a.npz", follow_bias=5.0)
    task, seed = "adversarial_multitenant", 1_000_002
    ppo = play_episode(InProcessEnv(), PPOPolicy(task, tmp_path / "a.npz"), task, seed, keep_actions=True)
    ref = play_episode(InProcessEnv(), heuristic(task), task, seed, keep_actions=True)
    assert ppo.actions == ref.actions and ppo.score == ref.score
    write_advised_weights(tmp_path / "b.npz", follow_bias=-5.0)  # never follows: every knob nudged
    never = play_episode(InProcessEnv(), PPOPolicy(task, tmp_path / "b.npz"), task, seed, keep_actions=True)
    assert all(a != r for a, r in zip(never.actions, ref.actions, strict=True))
