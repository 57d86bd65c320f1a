"""Adaptive rule-based serving policy: the feedback control an operator would write by hand.

Rules, applied every window to the observation of the window just served:

- batch cap (multiplicative feedback): halve it when the median inter-token latency passes
  `itl_high` x the tightest TPOT SLO (a big batch slows every token); otherwise double it back
  towards `batch_cap` while requests wait.
- KV budget: `kv`, raised by 0.1 after evictions or when the cache runs past 90 % (recomputed
  work and memory pressure are both charged).
- quantization, with hysteresis: INT8 once the queue reaches `int8_queue` (faster decode and more
  KV room while a backlog costs SLOs), back to FP16 once it is down to `fp16_queue` (INT8 costs
  quality on every token it serves).
- speculation: `spec_depth` only at low load (at most `spec_max_queue` waiting, at most
  `spec_max_active` running, arrivals at most `spec_max_rate`); draft tokens use idle compute
  then and steal it under load.
- priority routing: on when the task has tenants of different priorities and the queue reaches
  `priority_queue` (0 = always).
- prefill/decode split: on while the queue is at least `split_queue` (off by default).

`HeuristicParams()` are hand-set defaults; `heuristic_tuned.json` holds per-task thresholds
chosen by coordinate descent on training seeds (`python -m llmserve_env.tools.tune_heuristic --task all`),
which `heuristic(task_id)` uses when present, so the rival PPO faces is the best of its kind.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from llmserve_env.agents.base import make_action
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.agents.search import coordinate_descent, tuned_entry
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TaskSpec, get_task

if TYPE_CHECKING:
    from llmserve_env.agents.parallel import Runner

TUNED_PATH = Path(__file__).resolve().parent / "heuristic_tuned.json"
NEVER = 10**9


@dataclass(frozen=True)
class HeuristicParams:
    batch_cap: int = 256
    min_batch_cap: int = 16
    itl_high: float = 0.8
    kv: float = 0.9
    int8_queue: int = 20
    fp16_queue: int = 2
    spec_depth: int = 2
    spec_max_active: int = 32
    spec_max_rate: float = 15.0
    spec_max_queue: int = 0
    priority_queue: int = 4
    split_queue: int = NEVER


# The values the tuner tries for each threshold (the defaults above are among them).
TUNING_GRID: dict[str, tuple[Any, ...]] = {
    "batch_cap": (64, 128, 256, 512),
    "itl_high": (0.5, 0.8, 1.0, 10.0),
    "kv": (0.7, 0.9, 1.0),
    "int8_queue": (5, 10, 20, 50, NEVER),
    "fp16_queue": (0, 2, 5),
    "spec_depth": (0, 1, 2, 3, 4),
    "spec_max_active": (8, 32, 128),
    "spec_max_rate": (15.0, 30.0, 1e9),
    "spec_max_queue": (0, 8, NEVER),
    "priority_queue": (0, 4, 16, NEVER),
    "split_queue": (10, 50, NEVER),
}


class HeuristicPolicy:
    """Queue/latency feedback control of the six knobs (see the module docstring)."""

    def __init__(self, task: TaskSpec, params: HeuristicParams | None = None):
        self.task = task
        self.p = params or HeuristicParams()
        self.name = "heuristic"
        self.tpot_slo_ms = min(t.tpot_slo_ms for t in task.tenants)
        self.multi_priority = len({t.priority for t in task.tenants}) > 1
        self.reset()

    def reset(self) -> None:
        self.batch_cap = self.p.batch_cap
        self.kv = self.p.kv
        self.int8 = False

    def act(self, obs: ServeObservation) -> ServeAction:
        p = self.p
        if obs.p50_itl_ms > p.itl_high * self.tpot_slo_ms:
            self.batch_cap = max(p.min_batch_cap, self.batch_cap // 2)
        elif obs.queue_depth > 0:
            self.batch_cap = min(p.batch_cap, self.batch_cap * 2)
        if obs.eviction_events > 0 or obs.kv_cache_occupancy > 0.9:
            self.kv = min(1.0, self.kv + 0.1)
        if obs.queue_depth >= p.int8_queue:
            self.int8 = True
        elif obs.queue_depth <= p.fp16_queue:
            self.int8 = False
        low_load = (obs.queue_depth <= p.spec_max_queue and obs.active_requests <= p.spec_max_active
                    and obs.request_arrival_rate <= p.spec_max_rate)
        return make_action(
            batch_cap=self.batch_cap,
            kv_budget_fraction=round(self.kv, 4),
            speculation_depth=p.spec_depth if low_load else 0,
            quantization_tier="INT8" if self.int8 else "FP16",
            prefill_decode_split=obs.queue_depth >= p.split_queue,
            priority_routing=self.multi_priority and obs.queue_depth >= p.priority_queue,
        )


def tuned_params(task_id: str, path: Path = TUNED_PATH) -> HeuristicParams:
    """The task's tuned thresholds, or the hand-set defaults when none are stored."""
    entry = tuned_entry(path, task_id)
    return HeuristicParams(**entry["params"]) if entry else HeuristicParams()


def heuristic(task_id: str) -> HeuristicPolicy:
    from llmserve_env.shared.workloads import resolve_task  # trace replays too (the planner's base policy)

    return HeuristicPolicy(resolve_task(task_id), tuned_params(task_id))


def tune(env: EpisodeEnv, task_id: str, seeds: list[int], log=print,
         runner: Runner | None = None) -> tuple[HeuristicParams, float, int]:
    """Coordinate descent over TUNING_GRID from the defaults; mean score on `seeds` (played on `env`,
    or as parallel jobs on `runner`)."""
    task = get_task(task_id)
    names = list(TUNING_GRID)

    def params_at(point: tuple[int, ...]) -> HeuristicParams:
        return HeuristicParams(**{n: TUNING_GRID[n][i] for n, i in zip(names, point, strict=True)})

    def score(point: tuple[int, ...]) -> float:
        if runner is not None:
            from llmserve_env.agents.parallel import EpisodeJob

            build = functools.partial(HeuristicPolicy, task, params_at(point))
            return float(np.mean([o.score for o in runner.map([EpisodeJob(build, task_id, s) for s in seeds])]))
        policy = HeuristicPolicy(task, params_at(point))
        return float(np.mean([play_episode(env, policy, task_id, s).score for s in seeds]))

    # Two starts: the hand-set defaults, and the rules switched off around a static configuration
    # (so the heuristic can never end below what a fixed setting of its grid would score).
    static_like = HeuristicParams(batch_cap=512, itl_high=10.0, kv=1.0, int8_queue=NEVER, spec_depth=2,
                                  spec_max_active=128, spec_max_rate=1e9, spec_max_queue=NEVER,
                                  priority_queue=0, split_queue=NEVER)
    starts = [tuple(TUNING_GRID[n].index(getattr(p, n)) for n in names) for p in (HeuristicParams(), static_like)]
    best, best_score, evaluated = coordinate_descent(score, [len(TUNING_GRID[n]) for n in names], starts,
                                                     log=lambda m: log(f"[{task_id}] {m}"))
    return params_at(best), best_score, evaluated
