"""Score policies on held-out episodes: mean grader score with a 95 % CI per task.

    python tools/evaluate.py --agent ppo --task all --episodes 20
    python tools/evaluate.py --agent random,static,tuned_static,heuristic,ppo --task bursty_workload --episodes 30

Every agent plays the same evaluation seeds (1,000,000 + i, never used by training or the
tuned-static search), so scores pair up episode by episode; with several agents the table also
gives each agent's paired difference to the first agent listed (`--agent ppo,...` puts PPO first).
The episodes run in the simulator, in process or in parallel (`--workers N`: a process pool, or Ray
when the `ray` extra is installed; `--ray-address auto|ray://host:10001` for an existing Ray
cluster); every runner gives the same scores (agents/parallel.py). The last line printed is one
JSON object.
`--agent all` plays every agent; `llm` only when OPENAI_API_KEY is set (otherwise listed as skipped).
`--planner-off-family BASE` gives the planner its off-family judge (agents/planner.py: once the day looks
outside the scenario family it follows BASE, one of its base policies); scenario-family tasks only.
`--planner-bases A,B,...` sets the planner's base policies (default: the task's rivals, agents/planner.py
`default_bases`), e.g. the rivals and the shipped actor (`ppo`). Only the clairvoyant bound is sure to match
its best base; on sampled futures the planner can fall below one (docs/benchmarks.md, Headroom).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from llmserve_env.agents.parallel import (
    Runner,
    SerialRunner,
    add_runner_arguments,
    runner_from_args,
)
from llmserve_env.agents.ppo_policy import WeightsNotFoundError
from llmserve_env.agents.registry import POLICIES, make_policy, registry_job
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.agents.seeds import eval_seeds
from llmserve_env.agents.singles import SINGLES
from llmserve_env.agents.stats import MeanCI, mean_ci, paired_diff_ci
from llmserve_env.agents.tuned_static import NotTunedError
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.tools import cli

AGENTS = ("random", "static", "tuned_static", "heuristic", "llm", "ppo")
# a planner base is played to the episode's end on every rollout: not the llm policy (a chat request a window)
PLANNER_BASES = tuple(n for n in SINGLES if n != "llm")


@dataclass
class AgentScores:
    agent: str
    task_id: str
    seeds: list[int]
    scores: list[float]
    wall_s: float
    extra: dict[str, Any]

    @property
    def ci(self) -> MeanCI:
        return mean_ci(self.scores)


def evaluate_agent(agent: str, task_id: str, episodes: int, env: EpisodeEnv | None = None,
                   runner: Runner | None = None, quiet: bool = True, **options: Any) -> AgentScores:
    """`agent` on the first `episodes` evaluation seeds of `task_id` (a progress bar unless `quiet`).

    Each episode is an independent job (a fresh policy; the random agent seeded by the episode's
    seed) played by `runner` (default: in this process). With `env` given, or for the `llm` agent
    (one client and one tally of its replies across episodes), the episodes play one after another
    on `env` with one policy instead."""
    seeds = eval_seeds(episodes)
    t0 = time.perf_counter()
    if env is None and agent != "llm":
        make_policy(agent, task_id, **options)  # fail here, with the registry's error, if it cannot be built
        runner = runner or SerialRunner()
        outcomes = runner.map([registry_job(agent, task_id, s, **options) for s in seeds])
        return AgentScores(agent, task_id, seeds, [o.score for o in outcomes], time.perf_counter() - t0, {})
    env = env or InProcessEnv()
    policy = make_policy(agent, task_id, **options)
    episodes_bar = cli.progress(seeds, desc=f"{agent} {task_id}", unit="ep", quiet=quiet)
    scores = [play_episode(env, policy, task_id, s).score for s in episodes_bar]
    extra = policy.stats.as_dict() if hasattr(policy, "stats") else {}
    return AgentScores(agent, task_id, seeds, scores, time.perf_counter() - t0, extra)


def _planner_options(ap: cli.ArgumentParser, off_family: str | None, bases: list[str] | None, agents: list[str],
                     tasks: list[str]) -> dict[str, Any]:
    """The planner's options from `--planner-off-family` and `--planner-bases`, refused here (not mid-run) where
    they cannot apply: the planner is built once per task with them, so its own checks decide (each base built, a
    learned one needing the task's weights; a scenario family and BASE among the bases for the judge)."""
    options: dict[str, Any] = {}
    if off_family is not None:
        options["off_family"] = off_family
    if bases is not None:
        options["bases"] = tuple(bases)
    if not options:
        return {}
    from llmserve_env.agents.planner import PlannerPolicy

    if "planner" not in agents:
        flag = "--planner-off-family" if off_family is not None else "--planner-bases"
        ap.error(f"argument {flag}: the planner is not among the agents (--agent planner,...)")
    # the bases first, alone, so a refusal names the flag that caused it
    checks = ([("--planner-bases", {"bases": options["bases"]})] if bases is not None else []) + \
        ([("--planner-off-family", options)] if off_family is not None else [])
    for task_id in tasks:
        for flag, given in checks:
            try:
                PlannerPolicy(task_id, **given)
            except ValueError as exc:
                ap.error(f"argument {flag}: {exc}")
    return options


def _skip_reason(agent: str) -> str | None:
    if agent == "llm" and not os.environ.get("OPENAI_API_KEY"):
        return "OPENAI_API_KEY not set"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(prog="python tools/evaluate.py", description=__doc__, formatter_class=cli.HelpFormatter)
    ap.add_argument("--agent", type=cli.names_from(POLICIES, AGENTS), default="ppo",
                    help=f"comma-separated from {', '.join(POLICIES)}, or 'all' ({', '.join(AGENTS)})")
    ap.add_argument("--task", type=cli.task_list, default="all", help="comma-separated task ids, or 'all'")
    ap.add_argument("--episodes", type=cli.int_at_least(1), default=20,
                    help="held-out episodes per agent and task (2 or more for a confidence interval)")
    ap.add_argument("--model", default=None, help="chat model for the llm agent")
    ap.add_argument("--output", type=cli.writable_file, default=None,
                    help="also write per-episode scores as JSON here (checked before the evaluation starts)")
    ap.add_argument("--planner-off-family", default=None, metavar="BASE",
                    help="the planner follows BASE (one of its bases, e.g. operator) where its judge says the day "
                         "has left the scenario family; scenario-family tasks only")
    ap.add_argument("--planner-bases", type=cli.names_from(PLANNER_BASES), default=None, metavar="A,B,...",
                    help="the planner's base policies, comma-separated (default: the task's rivals), e.g. "
                         "tuned_static,hpa,dynamo_planner,operator,schedule,ppo")
    add_runner_arguments(ap)
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)

    agents, tasks = args.agent, args.task
    planner_options = _planner_options(ap, args.planner_off_family, args.planner_bases, agents, tasks)
    runner = runner_from_args(ap, args)
    results: dict[str, dict[str, AgentScores]] = {}
    skipped: dict[str, str] = {}
    for agent in agents:
        reason = _skip_reason(agent)
        if reason:
            skipped[agent] = reason
            continue
        options = {"model": args.model} if agent == "llm" else planner_options if agent == "planner" else {}
        for task_id in tasks:
            try:
                r = evaluate_agent(agent, task_id, args.episodes, runner=runner, quiet=args.quiet, **options)
            except (WeightsNotFoundError, NotTunedError) as exc:
                skipped[f"{agent}/{task_id}"] = str(exc)
                continue
            results.setdefault(agent, {})[task_id] = r
            print(f"  {agent:<13} {task_id:<24} {r.ci}  ({r.wall_s:.1f} s)", file=sys.stderr)

    ref = next(iter(results), None)
    head = f"{'agent':<14}" + "".join(f"{t:>28}" for t in tasks)
    print(f"\nmean score ± 95 % CI over {args.episodes} held-out episodes (seeds {eval_seeds(1)[0]}..)")
    print(head)
    for agent, by_task in results.items():
        cells = "".join(f"{str(by_task[t].ci) if t in by_task else '-':>28}" for t in tasks)
        print(f"{agent:<14}{cells}")
    if ref is not None and len(results) > 1:
        print(f"\npaired difference {ref} - agent (same seeds), mean ± 95 % CI")
        print(head)
        for agent, by_task in results.items():
            if agent == ref:
                continue
            cells = "".join(
                f"{str(paired_diff_ci(results[ref][t].scores, by_task[t].scores)) if t in by_task and t in results[ref] else '-':>28}"
                for t in tasks
            )
            print(f"{agent:<14}{cells}")
    runner.close()
    for what, why in skipped.items():
        print(f"skipped {what}: {why}")

    out: dict[str, Any] = {"episodes": args.episodes, "seeds": eval_seeds(args.episodes), "skipped": skipped,
                           "scores": {a: {t: {"mean": r.ci.mean, "ci95": r.ci.finite_half_width, "n": r.ci.n}
                                          for t, r in by_task.items()} for a, by_task in results.items()}}
    if args.output:
        detail = {a: {t: {"scores": r.scores, "extra": r.extra} for t, r in by_task.items()}
                  for a, by_task in results.items()}
        with args.output.open("w") as f:
            json.dump(out | {"detail": detail}, f, indent=2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
