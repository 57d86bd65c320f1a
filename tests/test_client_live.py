"""The Python client and OpenEnv's own WebSocket client against a live uvicorn server."""

from __future__ import annotations

import pytest
from llmserve_env import LLMServeEnv, LLMServeError, ServeAction, ServeObservation, ServeState


@pytest.mark.presubmit
def test_readme_client_example_runs_as_written(live_server):
    # The seed README's example, verbatim apart from the URL.
    env = LLMServeEnv.from_url(live_server.url)
    observation = env.reset(task_id="static_workload", seed=42)
    while not observation.done:
        action = {
            "batch_cap": 32,
            "kv_budget_fraction": 1.0,
            "speculation_depth": 0,
            "quantization_tier": "FP16",
            "prefill_decode_split": False,
            "priority_routing": False,
        }
        observation, reward, done, info = env.step(action)
    grader_result = env.grade()
    print(grader_result)
    assert 0.0 <= grader_result["score"] <= 1.0
    env.close()


def test_client_types_context_manager_and_errors(live_server):
    with LLMServeEnv.from_url(live_server.url) as env:
        tasks = env.tasks()
        assert {t["task_id"] for t in tasks} >= {"static_workload", "bursty_workload", "adversarial_multitenant"}
        obs = env.reset(task_id="bursty_workload", seed=1)
        assert isinstance(obs, ServeObservation) and obs.episode_id == env.episode_id
        action = ServeAction(batch_cap=128, kv_budget_fraction=0.8, speculation_depth=2,
                             quantization_tier="INT8", prefill_decode_split=False, priority_routing=False)
        obs, reward, done, info = env.step(action)
        assert obs.step_index == 1 and isinstance(reward, float) and done is False
        assert "reward_terms" in info
        state = env.state()
        assert isinstance(state, ServeState) and state.step_count == 1
        assert state.action_history[0]["quantization_tier"] == "INT8"
        with pytest.raises(LLMServeError) as err:
            env.step(dict(action.knobs(), batch_cap=0))
        assert err.value.status == 422
        with pytest.raises(LLMServeError) as err:
            env.reset(task_id="no_such_task")
        assert err.value.status == 404


@pytest.mark.presubmit
def test_openenv_generic_ws_client_plays_to_done(live_server):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=live_server.url).sync() as env:
        result = env.reset(task_id="adversarial_multitenant", seed=3)
        assert result.observation["task_id"] == "adversarial_multitenant"
        steps = 0
        while not result.done:
            result = env.step({"batch_cap": 96, "kv_budget_fraction": 0.9, "speculation_depth": 0,
                               "quantization_tier": "FP16", "prefill_decode_split": False,
                               "priority_routing": True})
            steps += 1
        assert steps == result.observation["step_index"]
