"""The best fixed configuration per task, found by search on training seeds only.

`tuned_static.json` beside this file holds, per task, the action the search chose, its mean
score on the search's training seeds, and the command (with commit) that produced it:

    python -m agents.tuned_static --task all --seeds 8 --random 96

The search runs on the action grid PPO plays on (agents/encoding.py), so the two compare on
equal terms: a random sample of grid points on a few seeds, then coordinate descent from the
best (every value of one knob at a time, repeated until no knob improves) on more seeds.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from llmserve_env.agents.encoding import ACTION_NVEC, decode_action, encode_action
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.agents.search import coordinate_descent, git_commit, load_tuned, tuned_entry
from llmserve_env.agents.seeds import train_seeds
from llmserve_env.agents.static import VLLM_DEFAULT, StaticPolicy
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import TASKS

if TYPE_CHECKING:
    from llmserve_env.agents.parallel import Runner

TUNED_PATH = Path(__file__).resolve().parent / "tuned_static.json"


class NotTunedError(KeyError):
    """No tuned configuration stored for this task."""


def tuned_action(task_id: str, path: Path = TUNED_PATH) -> ServeAction:
    entry = tuned_entry(path, task_id)
    if entry is None:
        raise NotTunedError(f"no tuned static configuration for {task_id!r}; run python -m agents.tuned_static")
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


def main(argv: list[str] | None = None) -> None:
    from llmserve_env.agents.parallel import add_runner_arguments, runner_from_args
    from llmserve_env.tools import cli

    ap = argparse.ArgumentParser(prog="python -m agents.tuned_static", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.task_list, default="all", help="comma-separated task ids, or 'all'")
    ap.add_argument("--seeds", type=cli.int_at_least(1), default=8,
                    help="training seeds per configuration (descent stage)")
    ap.add_argument("--random", type=cli.int_at_least(0), default=96,
                    help="random grid configurations in the first stage")
    ap.add_argument("--output", type=cli.writable_file, default=TUNED_PATH, help="tuned configurations file (JSON)")
    add_runner_arguments(ap)
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    runner = runner_from_args(ap, args)
    # The CLI plays episodes in process; the policy itself needs nothing from the server.
    from llmserve_env.core.inprocess import InProcessEnv

    # The cluster tasks' fixed configurations include a replica count: `python -m agents.autoscale` tunes them.
    tasks = [t for t in args.task if not TASKS[t].is_cluster]
    stored = load_tuned(args.output)
    command = "python -m agents.tuned_static " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = git_commit()
    for task_id in tasks:
        env = cli.EpisodeCounter(InProcessEnv(), f"searching {task_id}", quiet=args.quiet)
        r = search(env, task_id, train_seeds(args.seeds), args.random, log=logging.getLogger(__name__).info,
                   runner=runner)
        env.close()
        stored["tasks"][task_id] = {
            "action": r.action.knobs(),
            "train_score": round(r.score, 6),
            "train_seeds": r.seeds,
            "configs_evaluated": r.evaluated,
            "search_wall_s": round(r.wall_s, 1),
            "command": command,
            "git_commit": commit,
        }
        print(f"{task_id}: {r.action.knobs()} train score {r.score:.4f} ({r.evaluated} evals, {r.wall_s:.0f} s)")
        args.output.write_text(json.dumps(stored, indent=2) + "\n")
    runner.close()


if __name__ == "__main__":
    main()
