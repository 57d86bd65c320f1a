"""Every single policy by name (the rollout planner's possible bases): all of agents/registry.py's
policies but the two that compose others (planner, clairvoyant). Apart from the registry so that the
planner, which the registry lists, builds its bases without importing the registry back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmserve_env.agents.base import Policy
from llmserve_env.agents.heuristic import heuristic
from llmserve_env.agents.ppo_policy import PPOPolicy
from llmserve_env.agents.random_policy import RandomPolicy
from llmserve_env.agents.static import starve, vllm_default
from llmserve_env.agents.tuned_static import tuned_static

PolicyFactory = Callable[..., Policy]


def _llm_policy(task_id: str, model: str | None, **kw: Any) -> Policy:
    # Imported here: the OpenAI SDK costs ~0.7 s of import that no other policy (nor a training
    # worker, nor evaluate.py without `llm`) needs.
    from llmserve_env.agents.llm_policy import DEFAULT_MODEL, LLMPolicy

    return LLMPolicy(task_id, model=model or DEFAULT_MODEL, **{k: v for k, v in kw.items() if k != "seed"})


def _autoscale():
    from llmserve_env.agents import autoscale

    return autoscale


def _operator():
    from llmserve_env.agents import operator

    return operator


def _routing():
    from llmserve_env.agents import routing

    return routing


SINGLES: dict[str, PolicyFactory] = {
    "random": lambda task_id, seed=0, **_: RandomPolicy(seed),
    "starve": lambda task_id, **_: starve(),
    "vllm_default": lambda task_id, **_: vllm_default(),
    "static": lambda task_id, **_: vllm_default(),
    "tuned_static": lambda task_id, **_: tuned_static(task_id),
    "heuristic": lambda task_id, **_: heuristic(task_id),
    "llm": lambda task_id, model=None, **kw: _llm_policy(task_id, model, **kw),
    # weights_path: an actor not shipped (a run folder's), to score it as the shipped one is
    "ppo": lambda task_id, weights_path=None, **_: PPOPolicy(task_id, weights_path),
    "hpa": lambda task_id, **_: _autoscale().hpa(task_id),
    "dynamo_planner": lambda task_id, **_: _autoscale().dynamo_planner(task_id),
    "operator": lambda task_id, **_: _operator().operator(task_id),
    "schedule": lambda task_id, **_: _operator().schedule(task_id),
    "least_work": lambda task_id, **_: _routing().rival("least_work", task_id),
    "llmd_scorer": lambda task_id, **_: _routing().rival("llmd_scorer", task_id),
    "dynamo_kv": lambda task_id, **_: _routing().rival("dynamo_kv", task_id),
}


def make_single(name: str, task_id: str, **options: Any) -> Policy:
    """A fresh policy `name` (one of SINGLES) for `task_id`; KeyError for any other name."""
    return SINGLES[name](task_id, **options)
