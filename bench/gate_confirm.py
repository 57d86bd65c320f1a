"""Two actors behind the off-family gate, against every rival, on a seed range of a family's two splits.

    python bench/gate_confirm.py --family multitenant_family --inside candidates/multitenant_family_planner_student.npz \
        --outside weights/multitenant_family.npz --first-seed 1000050 --episodes 50 --workers 2

`--inside` and `--outside` each name an actor's weights (a `.npz` beside its `.json`, played as `ppo` plays
shipped weights) or a registered policy (`operator`). Played on the same seeds, built for the family
(agents/family_table.py's convention: the shifted split is the family's shifted task, everything built
for the training family): `gated` (agents/gated.py), `inside` and `outside` alone, and every rival
(`RIVALS_TO_BEAT`). `--first-seed` picks the seeds: the score table's are 1,000,000-1,000,049, so a
composition chosen by looking at those is confirmed on later ones, never played before.

Prints per split each agent's mean ± 95 % CI, then gated, inside and outside minus the best rival by mean
(paired per seed, Student-t), and on how many episodes the gate fired. Last line: one flat JSON object,
`<split>.<agent>.mean` / `.ci95`, `<split>.best_rival`, `<split>.<agent>_minus_best_rival` / `.ci95`,
`<split>.gate_fired_episodes`.
"""

from __future__ import annotations

import argparse
import functools
import json

from llmserve_env.agents.base import Policy
from llmserve_env.agents.family_table import best_rival
from llmserve_env.agents.gated import GatedPolicy
from llmserve_env.agents.parallel import EpisodeJob, add_runner_arguments, runner_from_args
from llmserve_env.agents.planner import RIVALS_TO_BEAT
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.stats import mean_ci, paired_diff_ci
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.splits import SHIFTED_TASKS, SPLITS, split_task
from llmserve_env.tools import cli

OWN = ("gated", "inside", "outside")


def actor(spec: str, family: str, seed: int) -> Policy:
    """A weights file (`.npz`) played as the learned policy, or a registered policy by name."""
    if spec.endswith(".npz"):
        return make_policy("ppo", family, weights_path=spec)
    return make_policy(spec, family, seed=seed)


def build(agent: str, family: str, inside: str, outside: str, seed: int) -> Policy:
    if agent == "gated":
        return GatedPolicy(family, actor(inside, family, seed), actor(outside, family, seed), seed)
    return actor({"inside": inside, "outside": outside}.get(agent, agent), family, seed)


def play_gated(env: InProcessEnv, family: str, inside: str, outside: str, task_id: str, seed: int) -> tuple[float, int]:
    """(score, windows the gate handed to the outside actor) of one gated episode, in this process."""
    policy = build("gated", family, inside, outside, seed)
    assert isinstance(policy, GatedPolicy)
    score = play_episode(env, policy, task_id, seed).score
    return score, policy.stats.outside


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(prog="python bench/gate_confirm.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--family", required=True, choices=list(SHIFTED_TASKS), help="the scenario family")
    ap.add_argument("--inside", required=True, help="the in-family actor: weights .npz or a registered policy")
    ap.add_argument("--outside", required=True, help="the off-family actor: weights .npz or a registered policy")
    ap.add_argument("--first-seed", type=cli.int_at_least(0), default=1_000_050, help="the first seed played")
    ap.add_argument("--episodes", type=cli.int_at_least(2), default=50, help="seeds per split")
    ap.add_argument("--splits", type=cli.names_from(SPLITS), default=list(SPLITS), help="comma-separated splits")
    add_runner_arguments(ap, default_workers=1)
    args = ap.parse_args(argv)
    for flag, spec in (("--inside", args.inside), ("--outside", args.outside)):
        try:  # refuse a missing file or an unknown name before any episode
            actor(spec, args.family, 0)
        except (FileNotFoundError, KeyError, ValueError) as exc:
            ap.error(f"argument {flag}: {exc}")
    splits = args.splits
    seeds = list(range(args.first_seed, args.first_seed + args.episodes))
    agents = [*OWN, *RIVALS_TO_BEAT]
    runner = runner_from_args(ap, args)
    flat: dict[str, object] = {}
    env = InProcessEnv()
    try:
        for split in splits:
            task_id = split_task(args.family, split)
            # the gated episodes here (their gate counts stay in this process), the others on the runner
            gated = [play_gated(env, args.family, args.inside, args.outside, task_id, s) for s in seeds]
            others = agents[1:]
            jobs = [EpisodeJob(functools.partial(build, a, args.family, args.inside, args.outside, s), task_id, s)
                    for a in others for s in seeds]
            outcomes = runner.map(jobs)
            scores = {"gated": [g[0] for g in gated],
                      **{a: [o.score for o in outcomes[i * len(seeds):(i + 1) * len(seeds)]] for i, a in enumerate(others)}}
            n_fired = sum(g[1] > 0 for g in gated)
            print(f"\n{args.family}.{split}: seeds {seeds[0]}-{seeds[-1]}")
            for a, s in scores.items():
                ci = mean_ci(s)
                flat[f"{split}.{a}.mean"], flat[f"{split}.{a}.ci95"] = round(ci.mean, 4), round(ci.half_width, 4)
                print(f"  {a:16s} {ci}")
            best = best_rival(scores)
            assert best is not None  # every rival played
            flat[f"{split}.best_rival"] = best
            for a in OWN:
                d = paired_diff_ci(scores[a], scores[best])
                above = sum(x > y for x, y in zip(scores[a], scores[best], strict=True))
                flat[f"{split}.{a}_minus_best_rival"] = round(d.mean, 4)
                flat[f"{split}.{a}_minus_best_rival.ci95"] = round(d.half_width, 4)
                print(f"  {a} minus {best}: {d.mean:+.3f} ± {d.half_width:.3f} (above on {above} of {len(seeds)})")
            flat[f"{split}.gate_fired_episodes"] = n_fired
            print(f"  the gate fired on {n_fired} of {len(seeds)} episodes")
    finally:
        runner.close()
    print(json.dumps(flat))
    return flat


if __name__ == "__main__":
    main()
