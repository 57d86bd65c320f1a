"""Tune agents/operator.py's settings on training seeds and store them (the tuning search is
agents.operator's; this is its command line, apart from the library). Entries stored before issue 25
name the command it replaced, `python -m agents.operator`.

    python -m llmserve_env.tools.tune_operator --help
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from llmserve_env.agents import operator as policy
from llmserve_env.agents.operator import KINDS, TUNED_PATH, tune
from llmserve_env.agents.parallel import add_runner_arguments, runner_from_args
from llmserve_env.agents.search import git_commit, load_tuned
from llmserve_env.agents.seeds import train_seeds
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.day_shape import publishes_day
from llmserve_env.shared.tasks import CLUSTER_TASKS, TASKS, get_task
from llmserve_env.tools import cli


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.tools.tune_operator", description=policy.__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.task_list, default="all",
                    help=f"comma-separated cluster task ids ({', '.join(CLUSTER_TASKS)}), or 'all'")
    ap.add_argument("--kind", type=cli.names_from(KINDS), default="all",
                    help=f"comma-separated rules to tune ({', '.join(KINDS)}), or 'all'")
    ap.add_argument("--seeds", type=cli.int_at_least(1), default=8, help="training seeds 0..N-1 per configuration")
    add_runner_arguments(ap)
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    single = [t for t in args.task if not get_task(t).is_cluster]
    if args.task != list(TASKS) and single:  # 'all' means the cluster tasks; naming another is an error
        ap.error(f"argument --task: {', '.join(single)} is a single-server task; the day-plan rules tune "
                 f"cluster tasks ({', '.join(CLUSTER_TASKS)})")
    cli.configure_logging(args)
    runner = runner_from_args(ap, args)
    # the rules plan by the published day: 'all' leaves out the cluster tasks without one (a trace replay such
    # as mooncake_cluster); naming one is an error
    no_day = [t for t in args.task if get_task(t).is_cluster and not publishes_day(get_task(t))]
    if args.task != list(TASKS) and no_day:
        ap.error(f"argument --task: {', '.join(no_day)} publishes no day (a 'cycle' workload or a multi-turn chat "
                 "with a 'day'): the day-plan rules cannot play it")
    tasks = [t for t in args.task if get_task(t).is_cluster and t not in no_day]
    command = "python -m llmserve_env.tools.tune_operator " + " ".join(sys.argv[1:] if argv is None else argv)
    log = logging.getLogger(policy.__name__).info
    try:
        for task_id in tasks:
            # the schedule first: the operator's descent also starts from the schedule's tuned plan
            for kind in sorted(args.kind, key=lambda k: k != "schedule"):
                t0, c0 = time.perf_counter(), time.process_time()
                env = cli.EpisodeCounter(InProcessEnv(), f"tuning {kind} on {task_id}", quiet=args.quiet)
                values, score, evaluated = tune(env, kind, task_id, train_seeds(args.seeds), log=log, runner=runner)
                env.close()
                stored = load_tuned(TUNED_PATH)
                stored["tasks"].setdefault(task_id, {})[kind] = {
                    "params": values, "train_score": round(score, 6), "train_seeds": train_seeds(args.seeds),
                    "configs_evaluated": evaluated, "search_wall_s": round(time.perf_counter() - t0, 1),
                    "search_cpu_s_this_process": round(time.process_time() - c0, 1),
                    "command": command, "git_commit": git_commit()}
                TUNED_PATH.write_text(json.dumps(stored, indent=2) + "\n")
                print(f"{task_id} {kind}: {values} train score {score:.4f} ({evaluated} configurations, "
                      f"{time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        runner.close()


if __name__ == "__main__":
    main()
