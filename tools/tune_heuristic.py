"""Tune agents/heuristic.py's settings on training seeds and store them (the tuning search is
agents.heuristic's; this is its command line, apart from the library). Entries stored before issue 25
name the command it replaced, `python -m agents.heuristic`.

    python -m llmserve_env.tools.tune_heuristic --help
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time

from llmserve_env.agents import heuristic as policy
from llmserve_env.agents.heuristic import TUNED_PATH, tune
from llmserve_env.agents.parallel import add_runner_arguments, runner_from_args
from llmserve_env.agents.search import git_commit, load_tuned
from llmserve_env.agents.seeds import train_seeds
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.tools import cli


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.tools.tune_heuristic", description=policy.__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.task_list, default="all", help="comma-separated task ids, or 'all'")
    ap.add_argument("--seeds", type=cli.int_at_least(1), default=8, help="training seeds per candidate")
    ap.add_argument("--output", type=cli.writable_file, default=TUNED_PATH, help="tuned thresholds file (JSON)")
    add_runner_arguments(ap)
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    runner = runner_from_args(ap, args)
    command = "python -m llmserve_env.tools.tune_heuristic " + " ".join(sys.argv[1:] if argv is None else argv)
    stored = load_tuned(args.output)
    for task_id in args.task:
        t0 = time.perf_counter()
        env = cli.EpisodeCounter(InProcessEnv(), f"tuning {task_id}", quiet=args.quiet)
        params, score, evaluated = tune(env, task_id, train_seeds(args.seeds), log=logging.getLogger(policy.__name__).info,
                                        runner=runner)
        env.close()
        stored["tasks"][task_id] = {"params": dataclasses.asdict(params), "train_score": round(score, 6),
                                    "train_seeds": train_seeds(args.seeds), "candidates_evaluated": evaluated,
                                    "search_wall_s": round(time.perf_counter() - t0, 1), "command": command,
                                    "git_commit": git_commit()}
        print(f"{task_id}: {dataclasses.asdict(params)} train score {score:.4f} ({evaluated} candidates)")
        args.output.write_text(json.dumps(stored, indent=2) + "\n")
    runner.close()


if __name__ == "__main__":
    main()
