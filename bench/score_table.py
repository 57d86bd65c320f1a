"""The benchmark table: every available agent on every task, mean grader score ± 95 % CI.

    python bench/score_table.py                      # default: 50 held-out seeds, 2 workers
    python bench/score_table.py --episodes 40 --workers 2 --agents random,starve,vllm_default
    python bench/score_table.py --ray-address auto   # on an existing Ray cluster (pip install -e '.[ray]')

Every agent plays the same held-out evaluation seeds (`agents.seeds.eval_seeds`, never used by
training or tuning), in the simulator; each episode is one job for the runner (agents/parallel.py:
a local process pool, or Ray when installed or asked for), and every runner gives the same table. Agents come from `agents.registry`: the
aliases that repeat another agent (`static` = `vllm_default`) are left out, `llm` plays only when
OPENAI_API_KEY is set, and an agent with nothing trained or tuned for a task (`ppo` without
weights, `tuned_static` without a tuned entry, the autoscalers `hpa` and `dynamo_planner` on a
single-server task, `operator` and `schedule` on a task without a published day, the routing rivals
`least_work`, `llmd_scorer` and `dynamo_kv` off the prefix-caching tasks) is listed as skipped for that task. For each cluster task the last line also
holds `<task>.best_rival` (the best by mean of `agents/planner.rivals_for(task)`: RIVALS_TO_BEAT, or
on the prefix-caching tasks the routing rivals, with operator and schedule where the task publishes a
day: multiturn_cluster) and its mean,
and, when `ppo` played it, `<task>.ppo_minus_best_rival` with `.ci95`: the mean of the per-seed
differences (the same seeds for both) and the half-width of its 95 % Student-t interval; the same
`<task>.planner_minus_best_rival` (and `clairvoyant_...`) when `--agents` names a planner.

Scenario families (shared/splits.py; agents/family_table.py): a family named in `--tasks` (or its
shifted task) is also reported per split: `test` (the family on the held-out seeds: its column of the
main table) and `shifted` (its shifted task on the same seeds, every agent built for the training
family: tuned parameters, weights). Shifted tasks get no column of their own. Keys
`<family>.<split>.<agent>.mean` / `.ci95`, `<family>.<split>.best_rival` (best of RIVALS_TO_BEAT by
mean) and, where the learned policy (`ppo`) played, `<family>.<split>.learned_minus_best_rival` (+ `.ci95`).

Prints a markdown table (rows: agents; columns: tasks; cells: mean ± half-width of the 95 %
Student-t interval), then, as the last line, one flat JSON object with `<agent>.<task>.mean` and
`<agent>.<task>.ci95` for every cell played.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from llmserve_env.agents.autoscale import NotClusterTaskError
from llmserve_env.agents.family_table import best_rival, families_in, split_job, split_summary
from llmserve_env.agents.parallel import add_runner_arguments, runner_from_args
from llmserve_env.agents.planner import PLANNERS, rivals_for
from llmserve_env.agents.ppo_policy import WeightsNotFoundError
from llmserve_env.agents.registry import POLICIES, make_policy, registry_job
from llmserve_env.agents.routing import NotPrefixTaskError
from llmserve_env.agents.seeds import eval_seeds
from llmserve_env.agents.stats import mean_ci, paired_diff_ci
from llmserve_env.agents.tuned_static import NotTunedError
from llmserve_env.shared.day_shape import NotCycleTaskError
from llmserve_env.shared.splits import SHIFTED_TASKS
from llmserve_env.shared.tasks import TASKS
from llmserve_env.tools import cli

# Registry names that are another agent under a second name.
ALIASES = {"static": "vllm_default"}
# The agents the table always has first, in this order.
CORE = ("random", "starve", "vllm_default")


def available_agents() -> tuple[list[str], dict[str, str]]:
    """Agents to play, and the agents left out with why."""
    agents = list(CORE) + [a for a in POLICIES if a not in CORE and a not in ALIASES]
    skipped = {alias: f"same policy as {target}" for alias, target in ALIASES.items() if alias in POLICIES}
    if "llm" in agents and not os.environ.get("OPENAI_API_KEY"):
        agents.remove("llm")
        skipped["llm"] = "OPENAI_API_KEY not set"
    for planner in PLANNERS:  # left out of 'all': they have their own table (--agents names them here)
        if planner in agents:
            agents.remove(planner)
            skipped[planner] = ("plans on forks (~0.1 s a decision on a single server, 4-26 s of CPU on a cluster task): "
                                "bench/headroom.py plays it")
    return agents, skipped


def play_table(agents: list[str], tasks: list[str], episodes: int, runner) -> tuple[
        dict[tuple[str, str], list[float]], dict[str, str]]:
    """Every (agent, task) cell's scores on the evaluation seeds, and the cells skipped with why."""
    seeds = eval_seeds(episodes)
    skipped: dict[str, str] = {}
    cells = []
    for agent in agents:
        for task_id in tasks:
            try:
                make_policy(agent, task_id)
            except (WeightsNotFoundError, NotTunedError, NotClusterTaskError, NotCycleTaskError,
                    NotPrefixTaskError) as exc:
                skipped[f"{agent}/{task_id}"] = str(exc)
                continue
            cells.append((agent, task_id))
    jobs = [registry_job(a, t, s) for a, t in cells for s in seeds]
    outcomes = runner.map(jobs)
    scores = {cell: [o.score for o in outcomes[i * len(seeds):(i + 1) * len(seeds)]]
              for i, cell in enumerate(cells)}
    return scores, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/score_table.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--episodes", type=cli.int_at_least(2), default=50,
                    help="held-out seeds per cell (the same for every agent)")
    ap.add_argument("--agents", type=cli.names_from(POLICIES, ["all"]), default="all",
                    help="comma-separated agent names, or 'all'")
    ap.add_argument("--tasks", type=cli.task_list, default="all", help="comma-separated task ids, or 'all'")
    add_runner_arguments(ap, default_workers=2)
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)

    agents, skipped = available_agents()
    if args.agents != ["all"]:
        agents = args.agents
    families = families_in(args.tasks)
    shifted = set(SHIFTED_TASKS.values())
    tasks = [t for t in args.tasks if t not in shifted] + [f for f in families if f not in args.tasks]
    seeds = eval_seeds(args.episodes)

    t_start = time.perf_counter()
    runner = runner_from_args(ap, args)
    try:
        cells, cell_skips = play_table(agents, tasks, args.episodes, runner)
        # the shifted split: every agent that played its family, built for the family, on the shifted task
        played = [(a, f) for a in agents for f in families if (a, f) in cells]
        outcomes = runner.map([split_job(a, f, "shifted", s) for a, f in played for s in seeds])
        shifted_cells = {cell: [o.score for o in outcomes[i * len(seeds):(i + 1) * len(seeds)]]
                         for i, cell in enumerate(played)}
    finally:
        runner.close()
    skipped.update(cell_skips)
    for (agent, task_id), scores in cells.items():
        print(f"  {agent:<13} {task_id:<24} {mean_ci(scores)}", file=sys.stderr)
    wall_s = time.perf_counter() - t_start

    print(f"Mean grader score ± 95 % CI over {len(seeds)} held-out seeds "
          f"({seeds[0]}..{seeds[-1]}, the same for every agent); `python bench/score_table.py "
          f"--episodes {args.episodes}`, {wall_s:.0f} s, {args.workers} workers ({runner.name} runner).\n")
    print("| agent | " + " | ".join(tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    for agent in agents:
        row = [str(mean_ci(cells[(agent, t)])) if (agent, t) in cells else "skipped" for t in tasks]
        print(f"| {agent} | " + " | ".join(row) + " |")
    for what, why in skipped.items():
        print(f"\nskipped {what}: {why}", end="")
    print()
    family_flat: dict[str, object] = {}
    if families:
        cols = [f"{f}.{split}" for f in families for split in ("test", "shifted")]
        print("\nScenario families, per split (the same held-out seeds; `shifted`: agents built for the training "
              "family, on its shifted task):\n")
        print("| agent | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        summaries = {}
        for f in families:
            for split, source in (("test", {a: cells[(a, f)] for a in agents if (a, f) in cells}),
                                  ("shifted", {a: shifted_cells[(a, f)] for a in agents if (a, f) in shifted_cells})):
                summaries[(f, split)] = (list(source), *split_summary(f, split, source))
                family_flat.update(summaries[(f, split)][2])
        for agent in agents:
            row = []
            for f in families:
                for split in ("test", "shifted"):
                    names, split_cells, _ = summaries[(f, split)]
                    row.append(split_cells[names.index(agent)] if agent in names else "skipped")
            print(f"| {agent} | " + " | ".join(row) + " |")
        for (f, split), (_, split_cells, _) in summaries.items():
            print(f"{f}.{split}: {split_cells[-1]}")

    flat: dict[str, float] = {}
    for (agent, task_id), scores in cells.items():
        ci = mean_ci(scores)
        flat[f"{agent}.{task_id}.mean"] = round(ci.mean, 4)
        flat[f"{agent}.{task_id}.ci95"] = round(ci.half_width, 4) if ci.n > 1 else None  # type: ignore[assignment]
    for task_id in tasks:
        # the prefix-caching tasks' rivals are the routing rules (agents/routing.py), with the day-plan rules where
        # the task publishes a day (agents/planner.rivals_for)
        rivals = rivals_for(TASKS[task_id])
        rival_scores = {a: cells[(a, task_id)] for a in rivals if (a, task_id) in cells}
        best = best_rival(rival_scores, rivals)
        if TASKS[task_id].is_cluster and best is not None:
            flat[f"{task_id}.best_rival"] = best  # type: ignore[assignment]
            flat[f"{task_id}.best_rival_mean"] = round(mean_ci(rival_scores[best]).mean, 4)
            for agent in ("ppo", *PLANNERS):  # the learner and, where --agents named them, the planners
                if (agent, task_id) in cells:
                    d = paired_diff_ci(cells[(agent, task_id)], rival_scores[best])
                    flat[f"{task_id}.{agent}_minus_best_rival"] = round(d.mean, 4)
                    flat[f"{task_id}.{agent}_minus_best_rival.ci95"] = round(d.half_width, 4)
                    print(f"{task_id}: {agent} minus the best rival ({best}), paired over {d.n} seeds: {d}")
    print(json.dumps({**flat, **family_flat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
