"""Routing rivals on the prefix-caching cluster tasks (issue 32): the field's routers as cache_affinity values.

Each rival is a fixed replica count and fixed per-replica knobs (tuned on training seeds, as `tuned_static`
is on the other cluster tasks) plus one routing rule, `ServeAction.cache_affinity` = a, which the cluster's
router reads as cost(replica) = (1 - a) x load / max load + a x (1 - overlap), lowest wins
(shared/prefix_routing.py). The rules:

- `least_work`: a = 0, least outstanding work (the cluster's router without the knob; with a = 0 the
  cached share only breaks ties, and a hit's tokens are not counted as work).
- `llmd_scorer`: llm-d's default scorer weights. The inference-scheduling guide (llm-d/llm-d
  guides/inference-scheduling/gaie-inference-scheduling/values.yaml) runs the InferencePool chart's
  `default-plugins.yaml`: queue-scorer weight 2, kv-cache-utilization-scorer weight 2, prefix-cache-scorer
  weight 3, each score in [0, 1], weighted sum, highest wins. Its two load scorers (queue depth, KV
  usage) are both load signals, which this router has as one (outstanding work), so the load side
  weighs 2 + 2 and a = 3 / (3 + 4) = 0.4286. Differences, stated: llm-d's queue scorer min-max
  normalises the waiting queue across endpoints (ours divides outstanding tokens by the largest), and
  its prefix scorer matches blocks the scheduler itself sent (ours: the engine's cache at the window's
  start plus what the router sent since).
- `dynamo_kv`: NVIDIA Dynamo's KV router with its default `--kv-overlap-score-weight` 1 (ai-dynamo/dynamo
  docs/router/kv_cache_routing.md; lib/llm/src/kv_router/scheduler.rs: logit = overlap_score_weight x
  prefill_blocks + decode_blocks, lowest wins). In tokens that is w x P x (1 - overlap) + W for a request
  of P prompt tokens and a replica of W outstanding tokens; ours, scaled by max load / (1 - a), is
  W + a / (1 - a) x max load x (1 - overlap). The two agree when a / (1 - a) = w x P / max load, which
  changes with every request; w = 1 weighs a token to prefill the same as a token of load, and the
  fixed a that does so when the request's prompt equals the busiest replica's outstanding work is 0.5.
  That is the value taken: an approximation of Dynamo's rule on this router, not its exact cost.

Round robin is left out: the router's knob is a weight between load and cache, and round robin is no
point on it (it ignores both); adding it would need a new action field on the wire and in every
client and Gym space, which this issue does not change.

Tuning (`python -m llmserve_env.tools.tune_routing --task mooncake_cluster,multiturn_cluster --seeds 4`; entries
stored before issue 25's move name it `python -m agents.routing`): coordinate
descent over the same grid for every rival (replicas, batch cap, KV budget) on training seeds only;
results with the command, wall time and commit in agents/routing_tuned.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from llmserve_env.agents.base import make_action
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.agents.search import coordinate_descent, tuned_entry
from llmserve_env.agents.static import VLLM_DEFAULT, StaticPolicy
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import PREFIX_TASKS, get_task

TUNED_PATH = Path(__file__).resolve().parent / "routing_tuned.json"

# rival -> its cache_affinity (see the module docstring for each figure's source and mapping)
AFFINITY: dict[str, float] = {
    "least_work": 0.0,
    "llmd_scorer": round(3.0 / 7.0, 4),
    "dynamo_kv": 0.5,
}
KINDS = tuple(AFFINITY)
# The cache-affinity values a rule that routes is tuned over (the day-plan rules and the autoscalers): the
# rivals' values above and the ends; tuning starts from Dynamo's.
AFFINITY_GRID: tuple[float, ...] = (0.0, AFFINITY["llmd_scorer"], AFFINITY["dynamo_kv"], 0.75, 1.0)
AFFINITY_START = AFFINITY["dynamo_kv"]

# The same grid for every rival, so none is tuned harder than another. Quantisation and speculation are
# left at vLLM's defaults: the routing rule and the replica count are what these tasks are about.
GRID: dict[str, tuple[Any, ...]] = {
    "replicas": (1, 2, 3, 4, 5, 6, 7, 8),
    "batch_cap": (64, 128, 256, 512),
    "kv_budget_fraction": (0.7, 0.9, 1.0),
}


class NotPrefixTaskError(KeyError):
    """A routing rival asked to play a task whose requests carry no prefix ids."""

    def __str__(self) -> str:
        return (f"{self.args[0]!r} is not a prefix-caching cluster task: the routing rivals play "
                f"{', '.join(PREFIX_TASKS)}")


def routing_action(kind: str, values: dict[str, Any]) -> ServeAction:
    """The rival's fixed action: vLLM's defaults, the tuned `values`, and its cache_affinity."""
    a = make_action(values["batch_cap"], values["kv_budget_fraction"], VLLM_DEFAULT.speculation_depth,
                    VLLM_DEFAULT.quantization_tier)
    return a.model_copy(update={"replicas": int(values["replicas"]), "cache_affinity": AFFINITY[kind]})


def _defaults(task_id: str) -> dict[str, Any]:
    task = get_task(task_id)
    return {"replicas": task.initial_replicas, "batch_cap": VLLM_DEFAULT.batch_cap,
            "kv_budget_fraction": VLLM_DEFAULT.kv_budget_fraction}


def rival(kind: str, task_id: str, values: dict[str, Any] | None = None) -> StaticPolicy:
    """A fresh `kind` rival on `task_id`: with `values`, or its tuned entry, or (untuned) the task's
    starting replicas and vLLM's defaults."""
    if kind not in AFFINITY:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if task_id not in PREFIX_TASKS:
        raise NotPrefixTaskError(task_id)
    if values is None:
        entry = (tuned_entry(TUNED_PATH, task_id) or {}).get(kind)
        values = dict(entry["params"]) if entry else _defaults(task_id)
    return StaticPolicy(routing_action(kind, values), name=kind)


def _mean(env: EpisodeEnv, kind: str, task_id: str, values: dict[str, Any], seeds: Sequence[int]) -> float:
    return float(np.mean([play_episode(env, rival(kind, task_id, values), task_id, s).score for s in seeds]))


def tune_kind(env: EpisodeEnv, kind: str, task_id: str, seeds: Sequence[int], log=print) -> tuple[dict, float, int]:
    """Coordinate descent over GRID from the untuned point; (values, mean train score, configs scored)."""
    names = list(GRID)
    base = _defaults(task_id)

    def values_at(point: tuple[int, ...]) -> dict[str, Any]:
        return {n: GRID[n][i] for n, i in zip(names, point, strict=True)}

    start = tuple(GRID[n].index(base[n]) for n in names)
    best, score, evaluated = coordinate_descent(lambda pt: _mean(env, kind, task_id, values_at(pt), seeds),
                                                [len(GRID[n]) for n in names], [start],
                                                log=lambda m: log(f"[{task_id} {kind}] {m}"))
    return values_at(best), score, evaluated

