"""How fast the PPO training loop consumes environment steps on this machine.

    python bench/train_speed.py --task adversarial_multitenant --steps 16384
    python bench/train_speed.py --task diurnal_autoscale --single-only --against 9d1832e --repeats 3

Measures, on the same task:
1. one in-process Gymnasium env stepped with random actions in this process after 64 warm-up steps (the
   simulator's per-window cost plus metrics, reward, features; the wrapper's fast path), as steps per CPU
   second of this process (`time.process_time`: a shared machine's wall clock counts the
   neighbours), the fastest of `--repeats`: the most a learner on one core could consume;
2. train.py's whole loop (rollouts in `num_workers` processes, PPO updates, validation), as
   environment steps per wall-clock second, worker start-up included (needs torch, the `train`
   extra; `--single-only` skips it); and the same over the rollouts and updates alone
   (`loop_env_steps_per_s`: the start-up, i.e. the workers' start, behaviour cloning, the rivals' and the
   first validation runs, left out; a fixed ~5-6 s on diurnal_autoscale, most of a short run's time).

The last line is one JSON object; `env_steps_per_s` is (2), the figure the issues target (`meets_target`:
>= 2,000 on a single-server task, an earlier issue's figure; >= 1,000 on a cluster task, issue 27's, learner
included), `single_env_steps_per_s` is (1). `--against REV` measures (1) (and (2) unless `--single-only`) on git
revision REV's package too, alternating child processes (bench/against.py), and prints before/after.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from against import alternate, check_rev, compare
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.workloads import resolve_task
from llmserve_env.tools import cli
from llmserve_env.tools.train_config import Args  # train.py's defaults, without torch

# env steps per second of train.py's loop: on a single-server task (an earlier issue), on a cluster task (issue 27)
TARGETS = {"single": 2000.0, "cluster": 1000.0}


def single_env_rate(task: str, steps: int) -> float:
    """Random-action steps per CPU second of one in-process Gym env (resets included)."""
    env = LLMServeGymEnv(task, grade_on_done=True)
    rng = np.random.default_rng(0)

    def play(n: int) -> None:
        for _ in range(n):
            _, _, terminated, truncated, _ = env.step(rng.integers(0, env.action_space.nvec))
            if terminated or truncated:
                env.reset()

    env.reset(seed=0)
    play(64)  # warm: numba loads each kernel from its disk cache at its first call (~10-50 ms each), once a process
    env.reset(seed=0)
    t0 = time.process_time()
    play(steps)
    return steps / (time.process_time() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/train_speed.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.task_id, default="adversarial_multitenant", help="task to train on")
    ap.add_argument("--steps", type=cli.int_at_least(1), default=16384,
                    help="environment steps for the training-loop run (at least num_envs x 64)")
    ap.add_argument("--single-steps", type=cli.int_at_least(1), default=1024,
                    help="steps of the single in-process environment")
    ap.add_argument("--num-envs", type=cli.int_at_least(1), default=Args.num_envs, help="environments")
    ap.add_argument("--num-workers", type=cli.int_at_least(1), default=Args.num_workers,
                    help="worker processes, 1..num_envs")
    ap.add_argument("--repeats", type=cli.int_at_least(1), default=1,
                    help="timed repeats of (1), the fastest kept (with --against: rounds)")
    ap.add_argument("--single-only", action="store_true", help="measure (1) only: no train.py loop, no torch")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="a git revision measured in the same run (before/after)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one --against side: JSON only
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    if args.num_workers > args.num_envs:
        ap.error(f"argument --num-workers: expected 1..num_envs ({args.num_envs}), got {args.num_workers}")
    if args.against is not None:
        bad = check_rev(args.against)
        if bad:
            ap.error(f"argument --against: {bad}")
        child = ["--task", args.task, "--steps", str(args.steps), "--single-steps", str(args.single_steps),
                 "--num-envs", str(args.num_envs), "--num-workers", str(args.num_workers), "--repeats", "1"]
        rounds = alternate(__file__, ["--child", "--quiet", *child] + (["--single-only"] if args.single_only else []), args.against,
                           args.repeats, args.quiet)
        print(json.dumps(compare(rounds, lower_is_better=())))
        return 0

    single = max(single_env_rate(args.task, args.single_steps) for _ in range(args.repeats))
    if args.single_only:
        if not args.child:
            print(f"train speed on {args.task}\n  single env, in process (steps per CPU s)  {single:>10,.0f}")
        print(json.dumps({"single_env_steps_per_s": round(single, 1), "task": args.task}))
        return 0
    from llmserve_env.tools import train  # needs torch (the `train` extra); exits with the install command

    if args.steps < args.num_envs * Args.rollout_steps:
        ap.error(f"argument --steps: expected at least one rollout, num_envs x {Args.rollout_steps} = "
                 f"{args.num_envs * Args.rollout_steps}, got {args.steps}")
    with tempfile.TemporaryDirectory() as tmp:
        targs = train.Args(task=args.task, total_steps=args.steps, num_envs=args.num_envs, num_workers=args.num_workers,
                           out_dir=Path(tmp) / "weights", run_dir=Path(tmp) / "runs",
                           command="bench/train_speed.py", quiet=args.quiet)
        summary = train.train(targs)
    rate = summary["env_steps_per_s"]
    cluster = resolve_task(args.task).is_cluster
    target = TARGETS["cluster" if cluster else "single"]
    loop = summary.get("loop_env_steps_per_s")  # absent before 373aca0 (an --against run's before side)
    rows = [
        ("single env, in process (steps per CPU s)", f"{single:,.0f}"),
        (f"training loop, {args.num_envs} envs / {args.num_workers} workers (steps/s)", f"{rate:,.0f}"),
        *([("  of it the PPO loop alone, start-up left out (steps/s)", f"{loop:,.0f}")] if loop is not None else []),
        ("share of loop time waiting on env steps", f"{summary['env_step_share']:.0%}"),
        ("training-loop steps / wall s", f"{summary['global_steps']:,} / {summary['wall_s']:.1f}"),
        (f"target on a {'cluster' if cluster else 'single-server'} task (steps/s)", f"{target:,.0f}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"train speed on {args.task}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>14}")
    print(json.dumps({
        "env_steps_per_s": rate,
        "single_env_steps_per_s": round(single, 1),
        **({"loop_env_steps_per_s": loop} if loop is not None else {}),
        "env_step_share": summary["env_step_share"],
        "task": args.task,
        "steps": summary["global_steps"],
        "num_envs": args.num_envs,
        "num_workers": args.num_workers,
        "meets_target": rate >= target,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
