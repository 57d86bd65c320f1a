"""The routing rivals against least outstanding work, paired per seed, on the prefix-caching tasks (issue 32).

    python bench/routing_pairs.py --episodes 10

1. Each tuned routing rival (agents/routing.py) minus `least_work` on the same held-out test seeds:
   mean of the per-seed score differences ± the half-width of its 95 % Student-t interval (the score
   table's cells overlap where the per-seed pairs do not).
2. The routing rule alone: every rival's affinity at one fixed configuration (3 replicas, batch cap 256,
   KV 0.9) on test seed 1,000,000, episode mean of the window hit rate and the score, so the replica
   count each rival tuned does not hide what the rule does.

One process, in the simulator; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.routing import AFFINITY, rival
from llmserve_env.agents.seeds import eval_seeds
from llmserve_env.agents.stats import paired_diff_ci
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.tasks import PREFIX_TASKS
from llmserve_env.tools import cli

FIXED = {"replicas": 3, "batch_cap": 256, "kv_budget_fraction": 0.9}


def fixed_rule(task_id: str, kind: str, seed: int) -> tuple[float, float]:
    """(mean window hit rate, score) of `kind`'s affinity at FIXED on one seed."""
    env, policy = InProcessEnv(), rival(kind, task_id, FIXED)
    obs = env.reset(task_id, seed)
    hits = []
    while not obs.done:
        obs = env.step(policy.act(obs))
        hits.append(obs.prefix_hit_rate or 0.0)
    return float(np.mean(hits)), float(env.grade()["score"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/routing_pairs.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--episodes", type=cli.int_at_least(2), default=10, help="held-out test seeds")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    seeds = eval_seeds(args.episodes)
    flat: dict[str, float] = {}
    for task_id in PREFIX_TASKS:
        scores = {k: [play_episode(InProcessEnv(), rival(k, task_id), task_id, s).score for s in seeds]
                  for k in AFFINITY}
        for k in AFFINITY:
            if k == "least_work":
                continue
            d = paired_diff_ci(scores[k], scores["least_work"])
            print(f"{task_id}: {k} minus least_work, paired over {d.n} seeds: {d}")
            flat[f"{task_id}.{k}_minus_least_work"] = round(d.mean, 4)
            flat[f"{task_id}.{k}_minus_least_work.ci95"] = round(d.half_width, 4)
        for k, a in AFFINITY.items():
            hit, score = fixed_rule(task_id, k, seeds[0])
            print(f"{task_id}: {k} (cache_affinity {a}) at {FIXED}, seed {seeds[0]}: hit rate {hit:.3f}, score {score:.3f}")
            flat[f"{task_id}.fixed.{k}.hit_rate"] = round(hit, 4)
            flat[f"{task_id}.fixed.{k}.score"] = round(score, 4)
    print(f"{time.perf_counter() - t0:.0f} s")
    print(json.dumps(flat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
