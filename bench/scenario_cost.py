"""What drawing a scenario family's day costs, against the CPU of the episode it drives.

    python bench/scenario_cost.py [--episodes 5] [--repeats 3] [--policy hpa]

For every scenario family task (shared.tasks.FAMILY_TASKS) and `--episodes` test seeds, in one process
on one core (time.process_time, fastest of `--repeats`, as timeit does on a shared machine):

- `draw`: drawing the seed's day from nothing (shared.scenarios._draw: parameters, AR(1) noise, flash
  crowds, jobs);
- `replicas`: the cold-start and preemption draws of every replica the episode requested
  (ReplicaDisruptions.draw, once per replica);
- `announce`: the announced-jobs look-up of every observation (the day cached, as in an episode);
- `episode`: the whole episode (Episode.start with the day's cache emptied, then every step under
  `--policy`), the draws above included.

The scenario's share is (draw + replicas + announce) / episode: what the families add to an episode's
CPU (issue 26's target: under 5 %). Generating the arrivals from the drawn rates is not counted: a
fixed-day task generates its arrivals the same way (`arrivals` columns, for comparison: the family's
generate_arrivals and its fixed-day task's, both with the day cached).

Prints a table, then (last line) one flat JSON object: `<task>.draw_ms`, `<task>.replicas_ms`,
`<task>.announce_ms`, `<task>.episode_ms`, `<task>.scenario_share`, and `scenario_share_max`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

from llmserve_env.agents.registry import make_policy
from llmserve_env.core.episode import Episode
from llmserve_env.shared import scenarios
from llmserve_env.shared.splits import test_seeds
from llmserve_env.shared.tasks import FAMILY_TASKS, TASKS, TaskSpec
from llmserve_env.shared.workloads import generate_arrivals
from llmserve_env.tools import cli

FIXED_DAY = {"diurnal": "diurnal_autoscale", "multitenant": "multitenant_autoscale"}


def cpu_s(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def episode(task_id: str, seed: int, policy_name: str) -> tuple[int, int]:
    """Play one episode from an empty day cache; (replicas requested, observations made)."""
    scenarios._CACHE.clear()
    task = TASKS[task_id]
    policy = make_policy(policy_name, task_id)
    policy.reset()
    ep = Episode.start(task, seed, "sim")
    obs = ep.last_observation
    assert obs is not None
    while not ep.done:
        obs = ep.step(policy.act(obs))
    return len(ep.backend.replicas), ep.step_count + 1  # type: ignore[attr-defined]


def _replica_draws(disrupt: scenarios.ReplicaDisruptions, seed: int, n: int) -> list[tuple[float, float]]:
    return [disrupt.draw(seed, i) for i in range(n)]


def _announcements(task: TaskSpec, seed: int, n: int) -> list[list[dict]]:
    return [scenarios.announced_jobs(task, seed, k) for k in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/scenario_cost.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--episodes", type=cli.int_at_least(1), default=5, help="test seeds per family task")
    ap.add_argument("--repeats", type=cli.int_at_least(1), default=3, help="timings per measurement (fastest kept)")
    ap.add_argument("--policy", default="hpa", help="the policy that plays the episodes (agents/registry.py)")
    args = ap.parse_args(argv)
    seeds = test_seeds(args.episodes)
    out: dict[str, float] = {}
    print(f"CPU per episode, mean over {len(seeds)} test seeds, fastest of {args.repeats}; policy {args.policy}\n")
    print(f"{'task':<28} {'draw ms':>8} {'replicas ms':>12} {'announce ms':>12} {'episode ms':>11} {'share':>7} "
          f"{'arrivals ms':>12} {'fixed-day arrivals ms':>22}")
    for task_id, task in FAMILY_TASKS.items():
        fixed = TASKS[FIXED_DAY[task_id.split("_")[0]]]
        draw = reps = announce = ep_s = arr = arr_fixed = 0.0
        scenarios._draw(task, 0)  # warm-up: the first draw of a process pays numpy's first-call costs
        for seed in seeds:
            draw += cpu_s(partial(scenarios._draw, task, seed), args.repeats)
            n_replicas, n_obs = episode(task_id, seed, args.policy)
            ep_s += cpu_s(partial(episode, task_id, seed, args.policy), args.repeats)
            disrupt = scenarios.replica_disruptions(task)
            if disrupt is not None:
                reps += cpu_s(partial(_replica_draws, disrupt, seed, n_replicas), args.repeats)
            scenarios.draw_day(task, seed)
            announce += cpu_s(partial(_announcements, task, seed, n_obs), args.repeats)
            arr += cpu_s(partial(generate_arrivals, task, seed), args.repeats)
            arr_fixed += cpu_s(partial(generate_arrivals, fixed, seed), args.repeats)
        k = 1e3 / len(seeds)
        share = (draw + reps + announce) / ep_s
        print(f"{task_id:<28} {draw * k:>8.3f} {reps * k:>12.3f} {announce * k:>12.3f} {ep_s * k:>11.1f} "
              f"{100 * share:>6.2f}% {arr * k:>12.1f} {arr_fixed * k:>22.1f}")
        out.update({f"{task_id}.draw_ms": round(draw * k, 4), f"{task_id}.replicas_ms": round(reps * k, 4),
                    f"{task_id}.announce_ms": round(announce * k, 4), f"{task_id}.episode_ms": round(ep_s * k, 1),
                    f"{task_id}.scenario_share": round(share, 5)})
    out["scenario_share_max"] = max(v for key, v in out.items() if key.endswith(".scenario_share"))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
