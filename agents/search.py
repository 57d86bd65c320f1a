"""Coordinate descent over a grid: how the tuned static configuration and the heuristic's thresholds are chosen.

Scores are means over training seeds (agents/seeds.py), never evaluation seeds.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmserve_env.shared.splits import tuned_task

Point = tuple[int, ...]  # one index into each axis of the grid


def coordinate_descent(score: Callable[[Point], float], axes: Sequence[int], starts: Sequence[Point],
                       log: Callable[[str], None] | None = None) -> tuple[Point, float, int]:
    """From each of `starts`, try every value of one axis at a time, keep any improvement, repeat
    until none; return the best point over all starts, its score, and how many distinct points were
    scored. `axes[k]` is the number of values on axis k; each point is scored once (points recur).
    """
    cache: dict[Point, float] = {}

    def cached(point: Point) -> float:
        if point not in cache:
            cache[point] = score(point)
        return cache[point]

    overall: tuple[Point, float] | None = None
    for start in starts:
        best, best_score = start, cached(start)
        improved = True
        while improved:
            improved = False
            for k, n in enumerate(axes):
                for v in range(n):
                    cand = best[:k] + (v,) + best[k + 1:]
                    s = cached(cand)
                    if s > best_score + 1e-9:
                        best, best_score, improved = cand, s, True
            if log:
                log(f"descent pass: best {best} score {best_score:.4f}")
        if overall is None or best_score > overall[1]:
            overall = (best, best_score)
    if overall is None:
        raise ValueError("coordinate_descent needs at least one start")
    return overall[0], overall[1], len(cache)


def load_tuned(path: Path) -> dict[str, Any]:
    """A tuned-settings file (agents/*_tuned.json, agents/tuned_static.json), or an empty one."""
    return json.loads(path.read_text()) if path.exists() else {"tasks": {}}


def tuned_entry(path: Path, task_id: str) -> Any:
    """`task_id`'s entry in a tuned-settings file (None when there is none); a shifted test task
    reads its training family's (shared.splits.tuned_task)."""
    return load_tuned(path)["tasks"].get(tuned_task(task_id))


def git_commit() -> str:
    """The checkout's commit (with +dirty when it has uncommitted changes), for provenance records."""
    root = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=root)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=10, cwd=root)
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")
