"""Tune agents/routing.py's rivals on training seeds and store them (the search is agents.routing's; this
is its command line, apart from the library). Entries stored before issue 25 name the command it
replaced, `python -m agents.routing`.

    python -m llmserve_env.tools.tune_routing --help
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from llmserve_env.agents import routing as policy
from llmserve_env.agents.routing import AFFINITY, KINDS, TUNED_PATH, tune_kind
from llmserve_env.agents.search import git_commit, load_tuned
from llmserve_env.agents.seeds import train_seeds
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.tasks import PREFIX_TASKS
from llmserve_env.tools import cli


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.tools.tune_routing", description=policy.__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", default=",".join(PREFIX_TASKS),
                    help=f"comma-separated prefix-caching cluster tasks ({', '.join(PREFIX_TASKS)})")
    ap.add_argument("--kind", type=cli.names_from(KINDS), default="all",
                    help=f"comma-separated rivals to tune ({', '.join(KINDS)}), or 'all'")
    ap.add_argument("--seeds", type=cli.int_at_least(1), default=4, help="training seeds per configuration")
    args = ap.parse_args(argv)
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    for t in tasks:
        if t not in PREFIX_TASKS:
            ap.error(f"argument --task: {t!r} is not one of {', '.join(PREFIX_TASKS)}")
    command = "python -m llmserve_env.tools.tune_routing " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = git_commit()
    for task_id in tasks:
        for kind in args.kind:
            t0 = time.perf_counter()
            env = InProcessEnv()
            values, score, evaluated = tune_kind(env, kind, task_id, train_seeds(args.seeds))
            env.close()
            stored = load_tuned(TUNED_PATH)  # re-read: another task's run may have written it meanwhile
            stored["tasks"].setdefault(task_id, {})[kind] = {
                "params": values, "cache_affinity": AFFINITY[kind], "train_score": round(score, 6),
                "train_seeds": train_seeds(args.seeds), "configs_evaluated": evaluated,
                "search_wall_s": round(time.perf_counter() - t0, 1), "command": command, "git_commit": commit,
                "tuned_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            TUNED_PATH.write_text(json.dumps(stored, indent=2) + "\n")
            print(f"{task_id} {kind}: {values} train score {score:.4f} ({evaluated} evals, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
