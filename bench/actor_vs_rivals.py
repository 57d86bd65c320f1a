"""A trained actor from a run folder (not the shipped one) against rivals, paired on held-out seeds.

    python bench/actor_vs_rivals.py --task adversarial_multitenant \\
        --weights runs/adversarial_multitenant__s0/adversarial_multitenant.npz --rivals heuristic,planner --episodes 10

For a run that was not exported into weights/ (e.g. `train.py --teacher planner`): the actor plays
the evaluation seeds (`agents.seeds.eval_seeds`, the same as bench/score_table.py) beside each rival.
Prints each mean ± 95 % CI and the paired differences actor - rival, then on its last line one flat
JSON object: `actor.mean`, `actor.ci95`, `<rival>.mean`, `<rival>.ci95`, `actor_minus_<rival>` and
`actor_minus_<rival>.ci95`. Episodes run in this process, one after another (the planner is ~0.1-0.2 s
a decision).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmserve_env.agents.ppo_policy import PPOPolicy
from llmserve_env.agents.registry import POLICIES, make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.seeds import eval_seeds
from llmserve_env.agents.stats import mean_ci, paired_diff_ci
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.tools import cli


def _weights(text: str) -> Path:
    path = Path(text)
    if path.suffix != ".npz" or not path.is_file() or not path.with_suffix(".json").is_file():
        raise argparse.ArgumentTypeError(f"expected a trained actor's .npz with its .json beside it, got {text}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/actor_vs_rivals.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.task_id, required=True, help="the task the actor was trained on")
    ap.add_argument("--weights", type=_weights, required=True, help="the actor's .npz (its .json beside it)")
    ap.add_argument("--rivals", type=cli.names_from(POLICIES), default="heuristic",
                    help="comma-separated policies to compare with")
    ap.add_argument("--episodes", type=cli.int_at_least(2), default=50, help="held-out seeds")
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    try:
        actor = PPOPolicy(args.task, args.weights)
    except ValueError as exc:  # weights for another task's grid
        ap.error(f"argument --weights: {exc}")

    env, seeds, t0 = InProcessEnv(), eval_seeds(args.episodes), time.perf_counter()
    scores = {"actor": [play_episode(env, actor, args.task, s).score for s in seeds]}  # reset each episode
    for rival in args.rivals:
        scores[rival] = [play_episode(env, make_policy(rival, args.task, seed=s), args.task, s).score for s in seeds]
    print(f"{args.task}, {len(seeds)} held-out seeds ({seeds[0]}..{seeds[-1]}), {time.perf_counter() - t0:.0f} s; "
          f"actor {args.weights}\n")
    print("| policy | mean ± 95 % CI | actor - policy (paired) |\n|---|---|---|")
    flat: dict[str, float] = {}
    for name, xs in scores.items():
        ci = mean_ci(xs)
        flat[f"{name}.mean"], flat[f"{name}.ci95"] = round(ci.mean, 4), round(ci.half_width, 4)
        diff = ""
        if name != "actor":
            d = paired_diff_ci(scores["actor"], xs)
            flat[f"actor_minus_{name}"], flat[f"actor_minus_{name}.ci95"] = round(d.mean, 4), round(d.half_width, 4)
            diff = str(d)
        print(f"| {name} | {ci} | {diff} |")
    print(json.dumps(flat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
