"""What a score must mean, checked by playing whole episodes in process in the simulator.

On every task: random actions and "starve" (batch_cap 1) score under 0.2; the constant "max
everything" action is not the best static setting; a sensible static policy scores clearly
above random; each grader term moves across policies; grading is deterministic.

The better static settings below come from a grid search (3 batch caps x 2 KV budgets x 4
speculation depths x 3 tiers x split x priority) on seeds 1,000,000-1,000,001; they are fixed
here so the test is quick.
"""

from __future__ import annotations

import statistics

import pytest
from llmserve_env.agents.random_policy import RandomPolicy
from llmserve_env.core.verify import grade_log
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.server.episodes import EpisodeStore
from llmserve_env.shared.models import ServeAction

# The single-server tasks' tuning; the cluster tasks' properties are in tests/test_cluster.py.
from llmserve_env.shared.tasks import SINGLE_SERVER_TASKS as TASKS
from llmserve_env.sim.step_time import step_model


def action(bc: int, kv: float, spec: int, tier: str, split: bool, prio: bool) -> ServeAction:
    return ServeAction(batch_cap=bc, kv_budget_fraction=kv, speculation_depth=spec, quantization_tier=tier,
                       prefill_decode_split=split, priority_routing=prio)


STARVE = action(1, 0.9, 0, "FP16", False, False)
VLLM_DEFAULT = action(256, 0.9, 0, "FP16", False, False)
MAX_EVERYTHING = action(512, 1.0, 8, "INT4", True, True)
BETTER_STATIC = {
    "static_workload": action(512, 1.0, 1, "FP16", True, False),
    "bursty_workload": action(512, 1.0, 0, "INT8", False, True),
    "adversarial_multitenant": action(512, 1.0, 2, "FP16", False, True),
    "azure_conv_trace": action(512, 1.0, 1, "FP16", False, False),
}
SEEDS = [1_000_000, 1_000_001]
RANDOM_EPISODES = 6


def make_env() -> LLMServeEnvironment:
    return LLMServeEnvironment(store=EpisodeStore(max_episodes=4), config=ServerSettings(mode="sim"))


def play(env: LLMServeEnvironment, task_id: str, seed: int, policy) -> dict:
    obs = env.reset(seed=seed, task_id=task_id)
    while not obs.done:
        obs = env.step(policy(obs))
    return env.grade().model_dump()


def static(a: ServeAction):
    return lambda obs: a


@pytest.fixture(scope="module")
def env() -> LLMServeEnvironment:
    return make_env()


@pytest.fixture(scope="module")
def grades(env) -> dict[str, dict[str, list[dict]]]:
    """task -> policy -> grades, every policy on the same seeds (random on more)."""
    out: dict[str, dict[str, list[dict]]] = {}
    for task_id in TASKS:
        rnd = RandomPolicy(seed=0)
        out[task_id] = {
            "random": [play(env, task_id, 1_000_000 + i, rnd.act) for i in range(RANDOM_EPISODES)],
            "starve": [play(env, task_id, s, static(STARVE)) for s in SEEDS[:1]],
            "max_everything": [play(env, task_id, s, static(MAX_EVERYTHING)) for s in SEEDS],
            "vllm_default": [play(env, task_id, s, static(VLLM_DEFAULT)) for s in SEEDS],
            "better_static": [play(env, task_id, s, static(BETTER_STATIC[task_id])) for s in SEEDS],
        }
    return out


def mean_score(gs: list[dict]) -> float:
    return statistics.fmean(g["score"] for g in gs)


@pytest.mark.parametrize("task_id", list(TASKS))
def test_random_and_starve_score_under_0_2(grades, task_id):
    assert mean_score(grades[task_id]["random"]) < 0.2
    assert mean_score(grades[task_id]["starve"]) < 0.2


@pytest.mark.parametrize("task_id", list(TASKS))
def test_max_everything_is_not_the_best_static_setting(grades, task_id):
    assert mean_score(grades[task_id]["better_static"]) > mean_score(grades[task_id]["max_everything"]) + 0.1


@pytest.mark.parametrize("task_id", list(TASKS))
def test_sensible_static_clearly_beats_random(grades, task_id):
    rnd = mean_score(grades[task_id]["random"])
    assert mean_score(grades[task_id]["vllm_default"]) > rnd + 0.2
    assert mean_score(grades[task_id]["better_static"]) > rnd + 0.3


@pytest.mark.parametrize("task_id", list(TASKS))
def test_every_grader_term_moves_across_policies(grades, task_id):
    by_term: dict[str, list[float]] = {}
    for gs in grades[task_id].values():
        for g in gs:
            for name, value in g["terms"].items():
                by_term.setdefault(name, []).append(value)
    expected = {"goodput", "quality", "cost"} | ({"worst_tenant"} if len(TASKS[task_id].tenants) > 1 else set())
    assert set(by_term) == expected
    for name, values in by_term.items():
        assert max(values) - min(values) > 0.1, f"{task_id}: term {name} barely moves: {min(values)}..{max(values)}"


def test_grading_is_deterministic_for_the_same_episode(env):
    a = play(env, "adversarial_multitenant", 3, static(VLLM_DEFAULT))
    log = env.episode.episode_log()
    b = play(make_env(), "adversarial_multitenant", 3, static(VLLM_DEFAULT))
    assert a == b | {"episode_id": a["episode_id"]}
    assert grade_log(log).model_dump() == a  # the log replayed (core/verify.py): the same grade


def test_simulator_stays_under_the_graders_capacity_figures():
    """The grader's ideal server must be at least as fast as anything the simulator can do."""
    for task in TASKS.values():
        cap = task.capacity()
        fastest = 0.0
        for tier in ("FP16", "INT8", "INT4"):
            m = step_model(task.profile, tier)
            for tokens in (256, 512, 1024, 2048):  # one iteration's token budget filled by prefill
                fastest = max(fastest, tokens / m.iteration_s(0, 0.0, 0, [(tokens, 0)], tokens, 1))
            for batch in (64, 256, 512):  # decode at the shortest context
                fastest = max(fastest, batch / m.iteration_s(batch, float(batch), 0, [], 0, 0))
        assert fastest <= cap.peak_tokens_per_s
        fp16 = step_model(task.profile, "FP16")
        serial_step = fp16.iteration_s(1, 256.0, 0, [], 0, 0)
        assert serial_step * 1e3 == pytest.approx(cap.serial_itl_ms, rel=0.1)
        serial_prefill = 2048 / fp16.iteration_s(0, 0.0, 0, [(2048, 0)], 2048, 1)
        assert serial_prefill == pytest.approx(cap.serial_prefill_tps, rel=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("task_id", list(TASKS))
def test_random_floor_holds_over_many_episodes(env, task_id):
    rnd = RandomPolicy(seed=1)
    scores = [play(env, task_id, 1_000_100 + i, rnd.act)["score"] for i in range(24)]
    assert statistics.fmean(scores) < 0.2
