"""The best fixed configuration per task, found by search on training seeds only.

`tuned_static.json` beside this file holds, per task, the action the search chose, its mean
score on the search's training seeds, and the command (with commit) that produced it:

    python -m llmserve_env.tools.tune_static --task all --seeds 8 --random 96

The search runs on the action grid PPO plays on (agents/encoding.py), so the two compare on
equal terms: a random sample of grid points on a few seeds, then coordinate descent from the
best (every value of one knob at a time, repeated until no knob improves) on more seeds.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from llmserve_env.agents.encoding import ACTION_NVEC, decode_action, encode_action
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.agents.search import coordinate_descent, tuned_entry
from llmserve_env.agents.static import VLLM_DEFAULT, StaticPolicy
from llmserve_env.shared.models import ServeAction

if TYPE_CHECKING:
    from llmserve_env.agents.parallel import Runner

TUNED_PATH = Path(__file__).resolve().parent / "tuned_static.json"


class NotTunedError(KeyError):
    """No tuned configuration stored for this task."""


def tuned_action(task_id: str, path: Path = TUNED_PATH) -> ServeAction:
    entry = tuned_entry(path, task_id)
    if entry is None:
        raise NotTunedError(f"no tuned static configuration for {task_id!r}; run python -m llmserve_env.tools.tune_static")
    return ServeAction.model_validate(entry["action"])


def tuned_static(task_id: str) -> StaticPolicy:
    return StaticPolicy(tuned_action(task_id), name="tuned_static")


@dataclass
class SearchResult:
    action: ServeAction
    score: float
    seeds: list[int]
    evaluated: int
    wall_s: float


def mean_score(env: EpisodeEnv, task_id: str, action: ServeAction, seeds: Sequence[int],
               runner: Runner | None = None) -> float:
    """Mean score of a fixed `action` on `seeds`: on `env`, or as parallel jobs on `runner`."""
    if runner is not None:
        from llmserve_env.agents.parallel import EpisodeJob

        jobs = [EpisodeJob(functools.partial(StaticPolicy, action), task_id, s) for s in seeds]
        return float(np.mean([o.score for o in runner.map(jobs)]))
    policy = StaticPolicy(action)
    return float(np.mean([play_episode(env, policy, task_id, s).score for s in seeds]))


def search(env: EpisodeEnv, task_id: str, seeds: Sequence[int], n_random: int, rng_seed: int = 0,
           log: Callable[[str], None] = print, runner: Runner | None = None) -> SearchResult:
    """Random grid sample on the first quarter of `seeds`, then coordinate descent on all of them."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(rng_seed)
    quick = list(seeds[: max(1, len(seeds) // 4)])
    cache: dict[tuple[int, ...], float] = {}

    def score(idx: tuple[int, ...], on: Sequence[int]) -> float:
        key = (*idx, len(on))
        if key not in cache:
            cache[key] = mean_score(env, task_id, decode_action(idx), on, runner)
        return cache[key]

    candidates = {tuple(int(i) for i in encode_action(VLLM_DEFAULT))}
    while len(candidates) < n_random + 1:
        candidates.add(tuple(int(rng.integers(0, n)) for n in ACTION_NVEC))
    ranked = sorted(candidates, key=lambda c: score(c, quick), reverse=True)
    log(f"[{task_id}] random stage: {len(ranked)} configs, best quick score {score(ranked[0], quick):.4f}")

    # Descend from the best of the top three (re-scored on all seeds).
    start = max(ranked[:3], key=lambda c: score(c, seeds))
    best, best_score, _ = coordinate_descent(lambda c: score(c, seeds), ACTION_NVEC, [start],
                                             log=lambda m: log(f"[{task_id}] {m}"))
    return SearchResult(action=decode_action(best), score=best_score, seeds=list(seeds),
                        evaluated=len(cache), wall_s=time.perf_counter() - t0)
