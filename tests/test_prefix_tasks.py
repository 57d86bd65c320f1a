"""The prefix-caching cluster tasks (issue 32): registered, shaped as described, seeded, in the Gym view,
and the routing rivals on them."""

from __future__ import annotations

import numpy as np
import pytest
from llmserve_env.agents.prefix_view import AFFINITY_LEVELS, PREFIX_FEATURE_NAMES
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.routing import AFFINITY, TUNED_PATH, NotPrefixTaskError, rival
from llmserve_env.agents.search import load_tuned
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.prefix import MOONCAKE_PACKAGED, day_scale, load_prefix_trace, packaged_path
from llmserve_env.shared.tasks import CLUSTER_TASKS, PREFIX_TASKS, TASKS
from llmserve_env.shared.workloads import generate_arrivals, windows

MOONCAKE, MULTITURN = PREFIX_TASKS["mooncake_cluster"], PREFIX_TASKS["multiturn_cluster"]


def test_registered_as_cluster_tasks_and_described_with_the_cache() -> None:
    assert set(PREFIX_TASKS) == {"mooncake_cluster", "multiturn_cluster"}
    assert set(PREFIX_TASKS) <= set(CLUSTER_TASKS) <= set(TASKS)
    for task_id, task in TASKS.items():
        d = task.describe()
        assert task.caches_prefixes == (task_id in PREFIX_TASKS)
        # only the new tasks gain the key: every other task's /tasks entry is as before
        assert ("prefix_caching" in d) == (task_id in PREFIX_TASKS)
    for task in PREFIX_TASKS.values():
        assert task.is_cluster and task.replicas == (1, 8) and task.initial_replicas == 2
        assert "cache_affinity" in task.describe()["prefix_caching"]["action"]


def test_mooncake_figures_in_its_description_are_the_traces() -> None:
    pt = load_prefix_trace(packaged_path(MOONCAKE_PACKAGED))
    t = pt.trace
    assert len(t.arrival_s) == 12_031 and "12,031 requests" in MOONCAKE.description
    assert round(float(t.arrival_s[-1] - t.arrival_s[0]) / 60) == 59 and "59 minutes" in MOONCAKE.description
    tenant = MOONCAKE.tenants[0]
    assert tenant.prompt_tokens[0] == float(np.median(t.prompt_tokens)) == 6909.0
    assert tenant.output_tokens[0] == float(np.median(t.output_tokens)) == 350.0
    assert round(len(t.arrival_s) / float(t.arrival_s[-1]), 1) == 3.4


@pytest.mark.parametrize("task", list(PREFIX_TASKS.values()), ids=list(PREFIX_TASKS))
def test_arrivals_are_seeded_and_carry_prefix_ids(task) -> None:
    a = generate_arrivals(task, 3)
    assert a == generate_arrivals(task, 3) and a != generate_arrivals(task, 4)
    assert all(x.prefix_ids for x in a)
    assert len(windows(a, task)) == task.horizon


def test_mooncake_replays_a_seeded_stretch_at_its_own_pace() -> None:
    pt = load_prefix_trace(packaged_path(MOONCAKE_PACKAGED))
    t = pt.trace
    starts = set()
    for seed in (0, 1, 2):
        a = generate_arrivals(MOONCAKE, seed)
        lo = next(i for i in range(len(t.arrival_s))
                  if t.prompt_tokens[i] == a[0].prompt_tokens and tuple(pt.ids[i]) == a[0].prefix_ids)
        n = len(a)
        # own lengths and ids, own gaps between arrivals (speed 1), in order
        assert [x.prompt_tokens for x in a] == t.prompt_tokens[lo:lo + n].tolist()
        assert [x.output_tokens for x in a] == t.output_tokens[lo:lo + n].tolist()
        assert [x.prefix_ids for x in a] == [tuple(i) for i in pt.ids[lo:lo + n]]
        gaps = np.diff([x.arrival_s for x in a])
        assert np.allclose(gaps, np.diff(t.arrival_s[lo:lo + n]), atol=1e-6)
        assert a[-1].arrival_s < MOONCAKE.horizon * MOONCAKE.window_s
        starts.add(lo)
    assert len(starts) == 3  # each seed its own stretch


def test_multiturn_follows_its_daily_cycle() -> None:
    day = MULTITURN.workload["day"]
    scale = day_scale(MULTITURN.window_s, day["cycle_windows"], day["peak_window"], day["trough_ratio"])
    peak_t = day["peak_window"] * MULTITURN.window_s
    assert scale(peak_t) == pytest.approx(1.0)
    assert scale(peak_t + 24 * MULTITURN.window_s) == pytest.approx(day["trough_ratio"])
    # requests per window over three seeds: the peak's hours (windows 24-32) carry well over twice the
    # trough's (its turns trail the starts by the 20 s between turns, two windows at most on average)
    peak, trough = 0, 0
    for seed in range(3):
        per_window = [len(w) for w in windows(generate_arrivals(MULTITURN, seed), MULTITURN)]
        peak += sum(per_window[24:33])
        trough += sum(per_window[0:5]) + sum(per_window[44:48])
    assert peak > 2.0 * trough


def test_gym_adds_the_affinity_head_and_the_hit_rate_on_these_tasks_only() -> None:
    plain = LLMServeGymEnv("diurnal_autoscale")
    for task_id in PREFIX_TASKS:
        env = LLMServeGymEnv(task_id)
        assert list(env.action_space.nvec) == [*plain.action_space.nvec, len(AFFINITY_LEVELS)]
        assert env.observation_space.shape == (plain.observation_space.shape[0] + len(PREFIX_FEATURE_NAMES),)
    env = LLMServeGymEnv("multiturn_cluster")
    env.reset(options={"episode_seed": 2})
    knobs = [8, 5, 0, 0, 0, 0, 1]  # batch cap 256, KV 0.9, FP16, keep the replicas
    for level in (0, len(AFFINITY_LEVELS) - 1, 2):
        x, *_ = env.step(np.array([*knobs, level]))
        obs = env.last_observation
        assert obs is not None and obs.metadata["applied"]["cache_affinity"] is True
        assert x[-2] == pytest.approx(obs.prefix_hit_rate) and 0.0 < x[-2] <= 1.0
        assert x[-1] == pytest.approx(AFFINITY_LEVELS[level])


def test_routing_rivals_carry_their_affinity_and_are_tuned_on_training_seeds() -> None:
    assert AFFINITY == {"least_work": 0.0, "llmd_scorer": round(3 / 7, 4), "dynamo_kv": 0.5}
    stored = load_tuned(TUNED_PATH)["tasks"]
    for task_id in PREFIX_TASKS:
        for kind, a in AFFINITY.items():
            policy = make_policy(kind, task_id)
            action = policy.act(InProcessEnv().reset(task_id, 0))
            entry = stored[task_id][kind]
            assert action.cache_affinity == a == entry["cache_affinity"]
            assert action.replicas == entry["params"]["replicas"]
            assert max(entry["train_seeds"]) < 100_000 and entry["command"].startswith(("python -m agents.routing", "python -m llmserve_env.tools.tune_routing"))
    with pytest.raises(NotPrefixTaskError, match="mooncake_cluster"):
        rival("least_work", "diurnal_autoscale")


def test_affinity_raises_the_hit_rate_on_multiturn() -> None:
    """A conversation's turns that go back to its replica find their history cached: at the same replicas
    and knobs, llm-d's weights hit more than least outstanding work (seed 0, measured 0.60 -> 0.75)."""
    values = {"replicas": 3, "batch_cap": 256, "kv_budget_fraction": 0.9}
    rates = {}
    for kind in ("least_work", "llmd_scorer"):
        env, policy = InProcessEnv(), rival(kind, "multiturn_cluster", values)
        obs = env.reset("multiturn_cluster", 0)
        hits = []
        while not obs.done:
            obs = env.step(policy.act(obs))
            hits.append(obs.prefix_hit_rate)
        rates[kind] = float(np.mean(hits))
    assert rates["llmd_scorer"] > rates["least_work"] + 0.05


def test_dynamo_planner_plays_the_mooncake_trace_whose_prompts_exceed_the_token_budget() -> None:
    """Mooncake's prompts run past the engine's token budget: the planner's prefill estimate is one
    budget-sized chunk per iteration (it indexed the step-time table past its end and crashed)."""
    from llmserve_env.agents.autoscale import PerformanceModel
    from llmserve_env.agents.rollout import play_episode

    perf = PerformanceModel(MOONCAKE)
    b = perf.budget
    one = perf.prefill_s(b)
    assert perf.prefill_s(4 * b) == pytest.approx(4 * one)
    assert perf.prefill_s(b // 2) < one
    env = InProcessEnv()
    play_episode(env, make_policy("dynamo_planner", "mooncake_cluster"), "mooncake_cluster", 0)
    assert env.episode.done
