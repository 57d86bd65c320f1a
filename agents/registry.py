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
| ppo           | the trained actor in weights/<task>.npz (or `weights_path`), numpy only |
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
are imported on first use (dynamo_planner's Holt forecast is computed as statsmodels computes it, without
it: statsmodels, the `autoscale` extra, is the reference tests/test_autoscale.py checks it against).
"""

from __future__ import annotations

import functools
from typing import Any

from llmserve_env.agents.base import Policy
from llmserve_env.agents.parallel import EpisodeJob
from llmserve_env.agents.planner import PlannerPolicy
from llmserve_env.agents.singles import SINGLES, PolicyFactory


class UnknownPolicyError(KeyError):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown policy {self.name!r}; choose one of: {', '.join(POLICIES)}"


_COMPOSITE: dict[str, PolicyFactory] = {
    "planner": lambda task_id, seed=0, **kw: PlannerPolicy(task_id, "sampled", seed=seed, **kw),
    "clairvoyant": lambda task_id, seed=0, **kw: PlannerPolicy(task_id, "clairvoyant", seed=seed, **kw),
}
# The order of the table above (choices and error messages list them so).
_ORDER = ("random", "starve", "vllm_default", "static", "tuned_static", "heuristic", "llm", "ppo", "planner",
          "clairvoyant", "hpa", "dynamo_planner", "operator", "schedule", "least_work", "llmd_scorer", "dynamo_kv")
POLICIES: dict[str, PolicyFactory] = {name: {**SINGLES, **_COMPOSITE}[name] for name in _ORDER}


def make_policy(name: str, task_id: str, **options: Any) -> Policy:
    """A fresh policy `name` for `task_id`; `options` reach the factory (seed, model, client, ...)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(name) from None
    return factory(task_id, **options)


def registry_job(agent: str, task_id: str, seed: int, **options: Any) -> EpisodeJob:
    """An episode of the registry's `agent` (agents/registry.py). The random agent's own action
    stream is seeded by the episode seed, so each job is a pure function of (agent, task, seed)."""
    return EpisodeJob(functools.partial(make_policy, agent, task_id, **{**options, "seed": seed}), task_id, seed)
