"""How fast the PPO training loop consumes environment steps on this machine.

    python bench/train_speed.py --task adversarial_multitenant --steps 16384

Measures, on the same task:
1. one in-process Gymnasium env stepped with random actions in this process (the simulator's
   per-window cost plus metrics, reward, observation and encoding);
2. train.py's whole loop (rollouts in `num_workers` processes, PPO updates, validation), as
   environment steps per wall-clock second, worker start-up included.

The last line is one JSON object; `env_steps_per_s` is (2), the figure the issue targets (>= 2,000).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # train.py lives at the repository root, outside the package's import path

from llmserve_env import cli  # noqa: E402
from llmserve_env.gym_env import LLMServeGymEnv  # noqa: E402

import train  # noqa: E402

TARGET = 2000.0


def single_env_rate(task: str, steps: int) -> float:
    env = LLMServeGymEnv(task, grade_on_done=True)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, done, _, _ = env.step(rng.integers(0, env.action_space.nvec))
        if done:
            env.reset()
    return steps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/train_speed.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.task_id, default="adversarial_multitenant", help="task to train on")
    ap.add_argument("--steps", type=cli.int_at_least(1), default=16384,
                    help="environment steps for the training-loop run (at least num_envs x 64)")
    ap.add_argument("--single-steps", type=cli.int_at_least(1), default=1024,
                    help="steps of the single in-process environment")
    ap.add_argument("--num-envs", type=cli.int_at_least(1), default=train.Args.num_envs, help="environments")
    ap.add_argument("--num-workers", type=cli.int_at_least(1), default=train.Args.num_workers,
                    help="worker processes, 1..num_envs")
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    if args.num_workers > args.num_envs:
        ap.error(f"argument --num-workers: expected 1..num_envs ({args.num_envs}), got {args.num_workers}")
    if args.steps < args.num_envs * train.Args.num_steps:
        ap.error(f"argument --steps: expected at least one rollout, num_envs x {train.Args.num_steps} = "
                 f"{args.num_envs * train.Args.num_steps}, got {args.steps}")

    single = single_env_rate(args.task, args.single_steps)
    with tempfile.TemporaryDirectory() as tmp:
        targs = train.Args(task=args.task, steps=args.steps, num_envs=args.num_envs, num_workers=args.num_workers,
                           out_dir=Path(tmp) / "weights", run_dir=Path(tmp) / "runs",
                           command="bench/train_speed.py", quiet=args.quiet)
        summary = train.train(targs)
    rate = summary["env_steps_per_s"]
    rows = [
        ("single env, in process (steps/s)", f"{single:,.0f}"),
        (f"training loop, {args.num_envs} envs / {args.num_workers} workers (steps/s)", f"{rate:,.0f}"),
        ("share of loop time waiting on env steps", f"{summary['env_step_share']:.0%}"),
        ("training-loop steps / wall s", f"{summary['global_steps']:,} / {summary['wall_s']:.1f}"),
        ("target (steps/s)", f"{TARGET:,.0f}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"train speed on {args.task}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>14}")
    print(json.dumps({
        "env_steps_per_s": rate,
        "single_env_steps_per_s": round(single, 1),
        "env_step_share": summary["env_step_share"],
        "task": args.task,
        "steps": summary["global_steps"],
        "num_envs": args.num_envs,
        "num_workers": args.num_workers,
        "meets_target": rate >= TARGET,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
