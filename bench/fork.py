"""Fork speed: copying a mid-episode of every task (Episode.fork), against copy.deepcopy.

    python bench/fork.py [--seeds 3] [--at 16,32,48] [--repeats 200] [--tasks a,b]

For every task in shared.tasks.TASKS, episodes played by the tuned heuristic are stopped at the
windows in `--at` and forked `--repeats` times each (the episode: engine, queues, KV cache,
random stream, metrics tracker, step log). CPU time of this process (time.process_time), so
neighbours on a shared machine slow the measurement less than wall-clock time would; one core.
deepcopy of (backend, tracker, step log) is timed on the same states (fewer repeats: it is slow) as the baseline a user would
otherwise reach for; it also copies the profile and the step-time models, which fork shares.
Prints a table, then (last line) one JSON object: `fork_ms_p50` and `deepcopy_ms_p50` (the
adversarial_multitenant task, the issue's target), `fork_speedup`, and `<task>.fork_ms_p50`,
`<task>.fork_ms_p90`, `<task>.deepcopy_ms_p50`, `<task>.live_requests` per task.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

from llmserve_env.agents.registry import make_policy
from llmserve_env.core.episode import Episode
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.tools import cli

TARGET_TASK = "adversarial_multitenant"


def states(task_id: str, seeds: list[int], at: list[int]) -> list[Episode]:
    """Snapshots of heuristic-played episodes at the windows `at` (never stepped afterwards)."""
    out = []
    for seed in seeds:
        env = InProcessEnv()
        policy = make_policy("heuristic", task_id)
        policy.reset()
        obs = env.reset(task_id, seed)
        for k in range(max(at)):
            if k in at:
                out.append(env.save())
            obs = env.step(policy.act(obs))
        out.append(env.save())
    return out


def cpu_ms(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        out.append((time.process_time() - t0) * 1e3)
    return out


def live_requests(ep: Episode) -> int:
    return ep.tracker.outstanding


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/fork.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--at", default="16,32,48", help="windows at which episodes are forked")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--tasks", type=cli.task_list, default="all", help="comma-separated task ids, or all (default)")
    args = ap.parse_args(argv)
    at = [int(x) for x in args.at.split(",")]
    seeds = list(range(args.seeds))
    tasks = args.tasks
    out: dict[str, float] = {}
    print(f"{'task':<26} {'states':>6} {'live req':>8} {'fork p50 ms':>11} {'p90 ms':>7} {'deepcopy p50 ms':>15} "
          f"{'ratio':>6}")
    for tid in tasks:
        snaps = states(tid, seeds, at)
        fork_t: list[float] = []
        deep_t: list[float] = []
        for ep in snaps:
            ep.fork()  # warm the per-class copiers
            fork_t += cpu_ms(ep.fork, args.repeats)
            # the episode's state without its lock (which deepcopy cannot copy)
            deep_t += cpu_ms(lambda ep=ep: copy.deepcopy((ep.backend, ep.tracker, ep.steps)),
                             max(3, args.repeats // 20))
        f50 = statistics.median(fork_t)
        f90 = statistics.quantiles(fork_t, n=10)[-1]
        d50 = statistics.median(deep_t)
        live = statistics.mean(live_requests(ep) for ep in snaps)
        print(f"{tid:<26} {len(snaps):>6} {live:>8.0f} {f50:>11.3f} {f90:>7.3f} {d50:>15.2f} {d50 / f50:>6.1f}")
        out[f"{tid}.fork_ms_p50"] = round(f50, 4)
        out[f"{tid}.fork_ms_p90"] = round(f90, 4)
        out[f"{tid}.deepcopy_ms_p50"] = round(d50, 3)
        out[f"{tid}.live_requests"] = round(live, 1)
    if TARGET_TASK in tasks:
        out = {"fork_ms_p50": out[f"{TARGET_TASK}.fork_ms_p50"],
               "deepcopy_ms_p50": out[f"{TARGET_TASK}.deepcopy_ms_p50"],
               "fork_speedup": round(out[f"{TARGET_TASK}.deepcopy_ms_p50"] / out[f"{TARGET_TASK}.fork_ms_p50"], 1),
               **out}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
