"""Tune agents/tuned_static.py's settings on training seeds and store them (the tuning search is
agents.tuned_static's; this is its command line, apart from the library). Entries stored before issue 25
name the command it replaced, `python -m agents.tuned_static`.

    python -m llmserve_env.tools.tune_static --help
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from llmserve_env.agents import tuned_static as policy
from llmserve_env.agents.parallel import add_runner_arguments, runner_from_args
from llmserve_env.agents.search import git_commit, load_tuned
from llmserve_env.agents.seeds import train_seeds
from llmserve_env.agents.tuned_static import TUNED_PATH, search
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.tasks import TASKS
from llmserve_env.tools import cli


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.tools.tune_static", description=policy.__doc__,
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
    # The cluster tasks' fixed configurations include a replica count: `python -m llmserve_env.tools.tune_autoscale` tunes them.
    tasks = [t for t in args.task if not TASKS[t].is_cluster]
    stored = load_tuned(args.output)
    command = "python -m llmserve_env.tools.tune_static " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = git_commit()
    for task_id in tasks:
        env = cli.EpisodeCounter(InProcessEnv(), f"searching {task_id}", quiet=args.quiet)
        r = search(env, task_id, train_seeds(args.seeds), args.random, log=logging.getLogger(policy.__name__).info,
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
