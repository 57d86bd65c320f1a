"""Simulator speed: steps/s and simulated requests/s per task, fixed policy and random actions.

    python bench/sim_speed.py [--episodes 3] [--seed 0] [--repeats 5]
    python bench/sim_speed.py --against 9d1832e --episodes 2 --repeats 3   # before/after in one run

For every task in shared.tasks.TASKS: the same episodes (arrivals from shared.workloads) are
served once with a fixed policy and once with uniformly random actions. Only `run_window` is
timed (arrival generation is the workload's cost, not the simulator's). One process, one core.
Times are this process's CPU time (`time.process_time`), not wall-clock time: on a shared machine
the wall clock also counts the time the neighbours hold the cores. Each measurement is repeated
`--repeats` times and the fastest kept (as timeit does: the slower runs measure cache and
frequency interference, not the simulator).
The fixed policy is vLLM's defaults (256 sequences, 90 % of memory, FP16, no speculation).
Prints a table, then (last line) one JSON object with `<task>_steps_per_s`,
`<task>_requests_per_s` and `<task>_random_steps_per_s` for every single-server task.

Cluster tasks (`shared.tasks.CLUSTER_TASKS`) are timed as whole episodes in process (the cluster
backend, metrics, reward, grading and the policy itself), one per rival (tuned_static, hpa,
dynamo_planner) and seed, fastest of `--repeats`: keys `<task>_<rival>_episode_s` and
`<task>_<rival>_requests_per_s`.

`--planner-decisions N` (default 0: off) also times the rollout planner at its defaults on
diurnal_autoscale: CPU seconds (time.process_time) per decision over the first N decisions of
seed `--seed`'s episode, key `planner_cpu_s_per_decision`. `--planner-tasks` names other cluster tasks
to time it on too (issue 27's target is every cluster task): key `<task>_planner_cpu_s_per_decision`
each (the prefix-caching tasks' replicas run the Python engine: tens of seconds a decision).

`--against REV` measures the simulator of git revision REV in the same run (bench/against.py): the
measurements alternate between REV's package and this tree's, one child process each, `--repeats`
rounds (REV, this, REV, this, ...), each child timing once; every figure is the best of its rounds,
so both sides see the same machine load. The table then
has a before (REV), an after (this tree), a ratio and a paired column, and the JSON has every key as
measured here plus `<key>_before` (REV), `<key>_speedup` (best after over best before; episode and
decision times inverted, so above 1 is faster) and `<key>_paired` (the median of each round's after over
the before just ahead of it: the figure to read where the machine's speed drifts between rounds).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from against import alternate, check_rev, compare
from llmserve_env.agents.static import VLLM_DEFAULT
from llmserve_env.agents.tuned_static import NotTunedError
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction
from llmserve_env.shared.splits import SHIFTED_TASKS
from llmserve_env.shared.tasks import CLUSTER_TASKS, SINGLE_SERVER_TASKS, TaskSpec
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.backend import SimBackend
from llmserve_env.tools import cli

FIXED = VLLM_DEFAULT
CLUSTER_RIVALS = ("tuned_static", "hpa", "dynamo_planner")
PLANNER_TASK = "diurnal_autoscale"


def random_action(rng: random.Random) -> ServeAction:
    return ServeAction(batch_cap=rng.randint(1, 512), kv_budget_fraction=rng.uniform(0.1, 1.0),
                       speculation_depth=rng.randint(0, 8), quantization_tier=rng.choice(QUANTIZATION_TIERS),
                       prefill_decode_split=rng.random() < 0.5, priority_routing=rng.random() < 0.5)


def serve(task: TaskSpec, episodes: list[list], seed: int, policy: str) -> tuple[float, int, int]:
    """(seconds inside run_window, windows, requests) over `episodes`."""
    rng = random.Random(seed)
    backend = SimBackend(task.profile)
    elapsed = 0.0
    steps = reqs = 0
    for ep, wins in enumerate(episodes):
        backend.reset(seed + ep)
        actions = [FIXED if policy == "fixed" else random_action(rng) for _ in wins]
        t0 = time.process_time()
        for k, (w, a) in enumerate(zip(wins, actions, strict=True)):
            backend.run_window(a, w, k * task.window_s, task.window_s)
        elapsed += time.process_time() - t0
        steps += len(wins)
        reqs += sum(len(w) for w in wins)
    return elapsed, steps, reqs


def cluster_episode(task_id: str, rival: str, seed: int) -> tuple[float, int]:
    """(seconds, requests) of one whole in-process episode of `rival` on a cluster task."""
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.agents.rollout import play_episode
    from llmserve_env.core.inprocess import InProcessEnv

    env, policy = InProcessEnv(), make_policy(rival, task_id)
    t0 = time.process_time()
    play_episode(env, policy, task_id, seed)
    el = time.process_time() - t0
    return el, sum(len(w) for w in env.episode.windows)


def planner_decision_s(seed: int, decisions: int, task_id: str = PLANNER_TASK) -> float:
    """CPU seconds per decision of the planner at its defaults: the first `decisions` of seed's episode."""
    return planner_run(seed, decisions, task_id)[0]


def planner_run(seed: int, decisions: int, task_id: str = PLANNER_TASK,
                clock: Callable[[], float] = time.process_time) -> tuple[float, float]:
    """(seconds per decision by `clock`, simulated windows per decision) of the planner at its defaults over the
    first `decisions` of seed's episode (bench/planner_floor.py times it with timers around its parts)."""
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.core.inprocess import InProcessEnv

    env, policy = InProcessEnv(), make_policy("planner", task_id, seed=seed)
    policy.reset()
    obs = env.reset(task_id, seed)
    windows0 = policy.stats.simulated_windows  # type: ignore[attr-defined]
    spent = 0.0
    for _ in range(decisions):
        if obs.done:
            break
        c0 = clock()
        action = policy.act(obs)
        spent += clock() - c0
        obs = env.step(action)
    return spent / decisions, (policy.stats.simulated_windows - windows0) / decisions  # type: ignore[attr-defined]


def measure(args: argparse.Namespace, repeats: int, quiet: bool, table: bool) -> dict[str, float]:
    """Every figure, each the best of `repeats`; prints the table rows when `table`."""
    out: dict[str, float] = {}
    if table:
        print(f"{'task':<26} {'policy':<7} {'steps':>6} {'requests':>9} {'steps/s':>9} {'requests/s':>11}")
    for tid, task in cli.progress(SINGLE_SERVER_TASKS.items(), total=len(SINGLE_SERVER_TASKS), desc="tasks",
                                  quiet=quiet):
        episodes = [windows(generate_arrivals(task, args.seed + e), task) for e in range(args.episodes)]
        for policy in ("fixed", "random"):  # warm the step-time tables and every kernel either policy calls: numba
            serve(task, episodes[:1], args.seed, policy)  # loads each from its disk cache at its first call (~10-50 ms)
        for policy in ("fixed", "random"):
            runs = [serve(task, episodes, args.seed, policy) for _ in range(repeats)]
            el, steps, reqs = min(runs)
            sps, rps = steps / el, reqs / el
            if table:
                print(f"{tid:<26} {policy:<7} {steps:>6} {reqs:>9} {sps:>9.0f} {rps:>11.0f}")
            if policy == "fixed":
                out[f"{tid}_steps_per_s"] = round(sps, 1)
                out[f"{tid}_requests_per_s"] = round(rps, 1)
            else:
                out[f"{tid}_random_steps_per_s"] = round(sps, 1)
    if table:
        print(f"\n{'cluster task':<26} {'rival':<15} {'requests':>9} {'episode s':>10} {'requests/s':>11}")
    for tid in (t for t in CLUSTER_TASKS if t not in SHIFTED_TASKS.values()):  # shifted tests: never tuned
        for rival in CLUSTER_RIVALS:
            try:  # one untimed episode first, as for the single-server rows: the first call of each kernel,
                # table and policy in a process loads it (~30 ms on diurnal_autoscale's first row), which
                # a child of --against (one repeat) would otherwise time as the episode's
                cluster_episode(tid, rival, args.seed)
                episodes_run = [cluster_episode(tid, rival, args.seed) for _ in range(repeats)]
            except NotTunedError:  # the prefix tasks have no tuned static configuration (issue 32)
                if table:
                    print(f"{tid:<26} {rival:<15} {'not tuned for this task':>32}")
                continue
            el, reqs = min(episodes_run)
            if table:
                print(f"{tid:<26} {rival:<15} {reqs:>9} {el:>10.3f} {reqs / el:>11.0f}")
            out[f"{tid}_{rival}_episode_s"] = round(el, 4)
            out[f"{tid}_{rival}_requests_per_s"] = round(reqs / el, 1)
    if args.planner_decisions:
        planner_decision_s(args.seed, 1)  # untimed: the planner's first call in a process (as above)
        best = min(planner_decision_s(args.seed, args.planner_decisions) for _ in range(repeats))
        if table:
            print(f"\nplanner on {PLANNER_TASK}: {best:.3f} s CPU per decision (first {args.planner_decisions})")
        out["planner_cpu_s_per_decision"] = round(best, 4)
        for tid in args.planner_tasks:
            planner_decision_s(args.seed, 1, tid)  # untimed, as above
            best = min(planner_decision_s(args.seed, args.planner_decisions, tid) for _ in range(repeats))
            if table:
                print(f"planner on {tid}: {best:.3f} s CPU per decision (first {args.planner_decisions})")
            out[f"{tid}_planner_cpu_s_per_decision"] = round(best, 4)
    return out


def cluster_task_ids(spec: str) -> list[str]:
    """Cluster task ids from a comma-separated command-line value (bench/planner_floor.py's --tasks too)."""
    tids = [t for t in (x.strip() for x in spec.split(",")) if t]
    bad = [t for t in tids if t not in CLUSTER_TASKS]
    if bad or not tids:
        raise argparse.ArgumentTypeError(f"not cluster tasks: {', '.join(bad) or '(none)'}; choose from "
                                         f"{', '.join(CLUSTER_TASKS)}")
    return tids


def planner_tasks(spec: str) -> list[str]:
    """`--planner-tasks`' value: cluster task ids, comma-separated (PLANNER_TASK is always timed)."""
    return [t for t in cluster_task_ids(spec) if t != PLANNER_TASK]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/sim_speed.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--episodes", type=cli.int_at_least(1), default=3, help="episodes per task and policy")
    ap.add_argument("--seed", type=cli.int_at_least(0), default=0, help="first episode seed")
    ap.add_argument("--repeats", type=cli.int_at_least(1), default=5, help="timed repeats (the fastest is kept)")
    ap.add_argument("--planner-decisions", type=cli.int_at_least(0), default=0,
                    help="planner decisions to time on diurnal_autoscale (0: skip the planner)")
    ap.add_argument("--planner-tasks", type=planner_tasks, default=[], metavar="TASKS",
                    help=f"comma-separated cluster tasks to time the planner on too, beside {PLANNER_TASK} "
                         "(with --planner-decisions)")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="a git revision whose simulator is measured in the same run (before/after)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one --against side: JSON only
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    if args.against is not None:
        bad = check_rev(args.against)
        if bad:
            ap.error(f"argument --against: {bad}")
        rounds = alternate(__file__, ["--child", "--quiet", "--repeats", "1", "--episodes", str(args.episodes), "--seed", str(args.seed),
                                      "--planner-decisions", str(args.planner_decisions),
                                      *(["--planner-tasks", ",".join(args.planner_tasks)] if args.planner_tasks else [])],
                           args.against, args.repeats, args.quiet)
        out = compare(rounds, lower_is_better=("_episode_s", "_per_decision"), skip=("_requests_per_s",))
    else:
        out = measure(args, args.repeats, args.quiet, table=not args.child)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
