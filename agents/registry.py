"""Every policy by name: `make_policy(name, task_id)` builds a fresh one for an episode series.

| name          | policy                                                             |
|---------------|--------------------------------------------------------------------|
| random        | uniform random actions (seeded)                                    |
| starve        | batch cap 1, otherwise vLLM defaults: a deliberately bad floor     |
| vllm_default  | vLLM's defaults: batch cap 256, KV 0.9, FP16, no speculation       |
| static        | alias of vllm_default (the untuned static configuration)           |
| tuned_static  | the per-task configuration in agents/tuned_static.json             |
| heuristic     | adaptive queue/latency feedback rules (agents/heuristic.py)        |
| llm           | an OpenAI-compatible chat model (OPENAI_API_KEY / OPENAI_BASE_URL) |
| ppo           | the trained actor in weights/<task>.npz, numpy only                |
| planner       | the rollout planner over the rivals, on forks with sampled futures (agents/planner.py) |
| clairvoyant   | the planner seeing the true future arrivals: >= every rival, a bound, not a policy |
| hpa           | cluster tasks: Kubernetes HPA threshold autoscaling (agents/autoscale.py) |
| dynamo_planner | cluster tasks: NVIDIA Dynamo Planner's predictive scaling (agents/autoscale.py) |
| operator      | cluster tasks: the published day forecast, corrected by the observed level (agents/operator.py) |
| schedule      | cluster tasks: the published mean day, open loop (agents/operator.py)  |
| least_work    | prefix-caching cluster tasks: least outstanding work routing, cache_affinity 0 (agents/routing.py) |
| llmd_scorer   | prefix-caching cluster tasks: llm-d's default scorer weights as cache_affinity 3/7 (agents/routing.py) |
| dynamo_kv     | prefix-caching cluster tasks: Dynamo's KV router default weight as cache_affinity 0.5 (agents/routing.py) |

`tuned_static` on a cluster task is a fixed replica count with fixed knobs. `hpa` and `dynamo_planner`
are imported on first use (the planner needs statsmodels, the `autoscale` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmserve_env.agents.base import Policy
from llmserve_env.agents.heuristic import heuristic
from llmserve_env.agents.planner import PlannerPolicy
from llmserve_env.agents.ppo_policy import PPOPolicy
from llmserve_env.agents.random_policy import RandomPolicy
from llmserve_env.agents.static import starve, vllm_default
from llmserve_env.agents.tuned_static import tuned_static


class UnknownPolicyError(KeyError):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown policy {self.name!r}; choose one of: {', '.join(POLICIES)}"


PolicyFactory = Callable[..., Policy]


def _llm_policy(task_id: str, model: str | None, **kw: Any) -> Policy:
    # Imported here: the OpenAI SDK costs ~0.7 s of import that no other policy (nor a training
    # worker, nor evaluate.py without `llm`) needs.
    from llmserve_env.agents.llm_policy import DEFAULT_MODEL, LLMPolicy

    return LLMPolicy(task_id, model=model or DEFAULT_MODEL, **{k: v for k, v in kw.items() if k != "seed"})

POLICIES: dict[str, PolicyFactory] = {
    "random": lambda task_id, seed=0, **_: RandomPolicy(seed),
    "starve": lambda task_id, **_: starve(),
    "vllm_default": lambda task_id, **_: vllm_default(),
    "static": lambda task_id, **_: vllm_default(),
    "tuned_static": lambda task_id, **_: tuned_static(task_id),
    "heuristic": lambda task_id, **_: heuristic(task_id),
    "llm": lambda task_id, model=None, **kw: _llm_policy(task_id, model, **kw),
    "ppo": lambda task_id, **_: PPOPolicy(task_id),
    "planner": lambda task_id, seed=0, **kw: PlannerPolicy(task_id, "sampled", seed=seed, **kw),
    "clairvoyant": lambda task_id, seed=0, **kw: PlannerPolicy(task_id, "clairvoyant", seed=seed, **kw),
    "hpa": lambda task_id, **_: _autoscale().hpa(task_id),
    "dynamo_planner": lambda task_id, **_: _autoscale().dynamo_planner(task_id),
    "operator": lambda task_id, **_: _operator().operator(task_id),
    "schedule": lambda task_id, **_: _operator().schedule(task_id),
    "least_work": lambda task_id, **_: _routing().rival("least_work", task_id),
    "llmd_scorer": lambda task_id, **_: _routing().rival("llmd_scorer", task_id),
    "dynamo_kv": lambda task_id, **_: _routing().rival("dynamo_kv", task_id),
}


def _routing():
    from llmserve_env.agents import routing

    return routing


def _autoscale():
    from llmserve_env.agents import autoscale

    return autoscale


def _operator():
    from llmserve_env.agents import operator

    return operator


def make_policy(name: str, task_id: str, **options: Any) -> Policy:
    """A fresh policy `name` for `task_id`; `options` reach the factory (seed, model, client, ...)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(name) from None
    return factory(task_id, **options)
