"""Does the summed step reward agree with the grade where it matters?

    python bench/reward_agreement.py --episodes 3 --workers 2

For every task in shared.tasks.TASKS, a set of policies plays the same validation seeds
(500,000 + i, never used for evaluation): the tuned heuristic, its one-knob variants (each
threshold of agents.heuristic.TUNING_GRID moved one grid step either way), random actions (two
seeds), starve, vllm_default, tuned_static and a spread of fixed settings. Per policy: the mean
summed reward and the mean grade over the seeds.

- `<task>.rank_corr`: Spearman rank correlation of (summed reward, grade) over all policies;
- `<task>.sign_agreement`: over the pairs (heuristic, one variant), the share where the change
  in mean summed reward and the change in mean grade have the same sign (both zero agrees; one
  zero and the other not disagrees): nearby policies, where a learner's choices are made.

Prints a table, then (last line) one flat JSON object with those keys per task and `policies`,
`pairs`, `episodes`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from llmserve_env.agents.base import make_action
from llmserve_env.agents.heuristic import TUNING_GRID, HeuristicPolicy, tuned_params
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.seeds import validation_seeds
from llmserve_env.agents.static import StaticPolicy
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.tasks import TASKS, get_task

FIXED = {
    "fixed_32_int8": make_action(32, 0.9, 0, "INT8", False, False),
    "fixed_128_fp16_spec2": make_action(128, 0.9, 2, "FP16", False, False),
    "fixed_512_split": make_action(512, 1.0, 0, "FP16", True, True),
    "fixed_16_int4": make_action(16, 0.5, 0, "INT4", False, False),
}


def variants(task_id: str) -> dict[str, dict]:
    """name -> HeuristicParams overrides: the tuned heuristic's one-step neighbours on each threshold."""
    base = dataclasses.asdict(tuned_params(task_id))
    out: dict[str, dict] = {}
    for name, grid in TUNING_GRID.items():
        if base[name] not in grid:
            continue
        i = grid.index(base[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(grid):
                out[f"heuristic[{name}={grid[j]}]"] = {name: grid[j]}
    return out


def build(task_id: str, name: str):
    if name in FIXED:
        return StaticPolicy(FIXED[name], name)
    if name.startswith("heuristic["):
        params = dataclasses.replace(tuned_params(task_id), **variants(task_id)[name])
        return HeuristicPolicy(get_task(task_id), params)
    if name.startswith("random"):
        return make_policy("random", task_id, seed=int(name[len("random"):]))
    return make_policy(name, task_id)


def play(job: tuple[str, str, int]) -> tuple[str, str, int, float, float]:
    task_id, name, seed = job
    r = play_episode(InProcessEnv(), build(task_id, name), task_id, seed)
    return task_id, name, seed, r.total_reward, r.score


def spearman(x: list[float], y: list[float]) -> float:
    def ranks(v: list[float]) -> np.ndarray:
        a = np.asarray(v)
        order = a.argsort(kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for val in np.unique(a):  # ties share their mean rank
            r[a == val] = r[a == val].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="all")
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    tasks = list(TASKS) if args.task == "all" else args.task.split(",")
    seeds = validation_seeds(args.episodes)
    names = {t: ["heuristic", *variants(t), "random0", "random1", "starve", "vllm_default", "tuned_static", *FIXED]
             for t in tasks}
    jobs = [(t, n, s) for t in tasks for n in names[t] for s in seeds]
    t0 = time.perf_counter()
    rewards: dict[tuple[str, str], list[float]] = {}
    grades: dict[tuple[str, str], list[float]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for t, n, _, reward, score in pool.map(play, jobs, chunksize=4):
            rewards.setdefault((t, n), []).append(reward)
            grades.setdefault((t, n), []).append(score)
    out: dict[str, float | int] = {"episodes": args.episodes}
    print(f"{'task':<26} {'policies':>8} {'rank corr':>9} {'pairs':>6} {'sign agree':>10}")
    for t in tasks:
        r = {n: float(np.mean(rewards[(t, n)])) for n in names[t]}
        g = {n: float(np.mean(grades[(t, n)])) for n in names[t]}
        rho = spearman([r[n] for n in names[t]], [g[n] for n in names[t]])
        near = [n for n in names[t] if n.startswith("heuristic[")]
        agree = 0
        for n in near:
            dr, dg = r[n] - r["heuristic"], g[n] - g["heuristic"]
            agree += int(np.sign(round(dr, 9)) == np.sign(round(dg, 9)))
        share = agree / len(near) if near else float("nan")
        print(f"{t:<26} {len(names[t]):>8} {rho:>9.3f} {len(near):>6} {share:>10.3f}")
        out[f"{t}.rank_corr"] = round(rho, 4)
        out[f"{t}.sign_agreement"] = round(share, 4)
        out[f"{t}.policies"] = len(names[t])
        out[f"{t}.pairs"] = len(near)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
