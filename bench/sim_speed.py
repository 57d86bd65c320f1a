"""Simulator speed: steps/s and simulated requests/s per task, fixed policy and random actions.

    python bench/sim_speed.py [--episodes 3] [--seed 0] [--repeats 5]

For every task in shared.tasks.TASKS: the same episodes (arrivals from shared.workloads) are
served once with a fixed policy and once with uniformly random actions. Only `run_window` is
timed (arrival generation is the workload's cost, not the simulator's). One process, one core.
Each measurement is repeated `--repeats` times and the fastest kept (as timeit does: on a
shared machine the slower runs measure the neighbours, not the simulator).
The fixed policy is vLLM's defaults (256 sequences, 90 % of memory, FP16, no speculation).
Prints a table, then (last line) one JSON object with `<task>_steps_per_s`,
`<task>_requests_per_s` and `<task>_random_steps_per_s` for every single-server task.

Cluster tasks (`shared.tasks.CLUSTER_TASKS`) are timed as whole episodes in process (the cluster
backend, metrics, reward and the policy itself), one per rival (tuned_static, hpa, dynamo_planner)
and seed, fastest of `--repeats`: keys `<task>_<rival>_episode_s` and `<task>_<rival>_requests_per_s`.
The target is a cluster episode with the best rival under 2 s on one core.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from llmserve_env import cli
from llmserve_env.agents.static import VLLM_DEFAULT
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction
from llmserve_env.shared.splits import SHIFTED_TASKS
from llmserve_env.shared.tasks import CLUSTER_TASKS, SINGLE_SERVER_TASKS, TaskSpec
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.backend import SimBackend

FIXED = VLLM_DEFAULT


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
        t0 = time.perf_counter()
        for k, (w, a) in enumerate(zip(wins, actions, strict=True)):
            backend.run_window(a, w, k * task.window_s, task.window_s)
        elapsed += time.perf_counter() - t0
        steps += len(wins)
        reqs += sum(len(w) for w in wins)
    return elapsed, steps, reqs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/sim_speed.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--episodes", type=cli.int_at_least(1), default=3, help="episodes per task and policy")
    ap.add_argument("--seed", type=cli.int_at_least(0), default=0, help="first episode seed")
    ap.add_argument("--repeats", type=cli.int_at_least(1), default=5, help="timed repeats (the fastest is kept)")
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    out: dict[str, float] = {}
    print(f"{'task':<26} {'policy':<7} {'steps':>6} {'requests':>9} {'steps/s':>9} {'requests/s':>11}")
    for tid, task in cli.progress(SINGLE_SERVER_TASKS.items(), total=len(SINGLE_SERVER_TASKS), desc="tasks",
                                  quiet=args.quiet):
        episodes = [windows(generate_arrivals(task, args.seed + e), task) for e in range(args.episodes)]
        serve(task, episodes[:1], args.seed, "fixed")  # warm the step-time tables
        for policy in ("fixed", "random"):
            runs = [serve(task, episodes, args.seed, policy) for _ in range(args.repeats)]
            el, steps, reqs = min(runs)
            sps, rps = steps / el, reqs / el
            print(f"{tid:<26} {policy:<7} {steps:>6} {reqs:>9} {sps:>9.0f} {rps:>11.0f}")
            if policy == "fixed":
                out[f"{tid}_steps_per_s"] = round(sps, 1)
                out[f"{tid}_requests_per_s"] = round(rps, 1)
            else:
                out[f"{tid}_random_steps_per_s"] = round(sps, 1)
    print(f"\n{'cluster task':<26} {'rival':<15} {'requests':>9} {'episode s':>10} {'requests/s':>11}")
    for tid in (t for t in CLUSTER_TASKS if t not in SHIFTED_TASKS.values()):  # shifted tests: never tuned
        for rival in ("tuned_static", "hpa", "dynamo_planner"):
            runs = [cluster_episode(tid, rival, args.seed) for _ in range(args.repeats)]
            el, reqs = min(runs)
            print(f"{tid:<26} {rival:<15} {reqs:>9} {el:>10.2f} {reqs / el:>11.0f}")
            out[f"{tid}_{rival}_episode_s"] = round(el, 3)
            out[f"{tid}_{rival}_requests_per_s"] = round(reqs / el, 1)
    print(json.dumps(out))


def cluster_episode(task_id: str, rival: str, seed: int) -> tuple[float, int]:
    """(seconds, requests) of one whole in-process episode of `rival` on a cluster task."""
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.agents.rollout import play_episode
    from llmserve_env.runtime.inprocess import InProcessEnv

    env, policy = InProcessEnv(), make_policy(rival, task_id)
    t0 = time.perf_counter()
    play_episode(env, policy, task_id, seed)
    el = time.perf_counter() - t0
    return el, sum(s.metrics["arrivals"] for s in env.episode.steps)


if __name__ == "__main__":
    main()
