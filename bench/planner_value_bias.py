"""How far the sampled planner's values are from the grades that come: each base policy's own continuation,
valued on the planner's sampled futures at every window, against the grade that base really reaches.

    python bench/planner_value_bias.py [--task multitenant_family] [--seeds 10] [--follow operator,schedule]
        [--bases tuned_static,operator,schedule] [--samples 2] [--surprises 0] [--noise expected]

For each validation seed (500,000 + i; never a test seed) and each followed base F, the episode is played by F
alone. At every window a planner built with the `--bases` (F among them; no bridging variants, keep 0, not
fortified: each base's own proposal continued by itself, nothing else) values every base's continuation on its
sampled futures, and F's own proposal is committed. The simulator is deterministic, so F's grade G_F is the value
of F's continuation on the true future from every state F reaches: F's value at window k minus G_F is the
futures' error on it. Costs one rollout per base and future a window: ~40 s of CPU an episode with three
bases and two futures on multitenant_family.

Printed per seed and followed base: G_F, F's mean value over the day, its bias (mean value minus G_F) over
all windows, the first half and the second, and the mean difference between the first two followed bases'
values along F's path. Then each base's mean bias, and across seeds the correlation of the first two bases'
value gap (each valued along its own path) with their grade gap: how well the futures rank the two.
Last line: {"<task>.<F>.bias", "<task>.<F>.bias_first_half", "<task>.<F>.bias_second_half",
"<task>.value_gap_grade_gap_corr"}.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from llmserve_env.agents.forecast import NOISE_MODES
from llmserve_env.agents.planner import PlannerPolicy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.seeds import validation_seeds
from llmserve_env.agents.singles import SINGLES
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.tools import cli

FAMILIES = ("diurnal_family", "multitenant_family")


class Follow:
    """Plays base `follow`'s own proposals, recording the planner's value of every base's continuation."""

    def __init__(self, task_id: str, seed: int, follow: str, bases: list[str], **options: object):
        self.planner = PlannerPolicy(task_id, seed=seed, bases=bases, keep=0, bridging=False, fortify=False,
                                     **options)  # type: ignore[arg-type]
        self.j = bases.index(follow)
        self.name = f"follow_{follow}"
        self.values: list[list[float]] = []  # per window, per base

    def reset(self) -> None:
        self.planner.reset()

    def act(self, obs: ServeObservation) -> ServeAction:
        p = self.planner
        p.decide(obs)
        # keep 0, no variants: one value per base, its own proposal (candidate i) continued by itself
        by_base = {j: (i, v) for (i, j), v in p.last_decision.items()}
        self.values.append([by_base[j][1] for j in range(len(p.bases))])
        return p.commit(p.last_candidates[by_base[self.j][0]])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/planner_value_bias.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", choices=FAMILIES, default="multitenant_family", help="scenario family (%(default)s)")
    ap.add_argument("--seeds", type=cli.int_at_least(1), default=10, help="validation seeds (%(default)s)")
    ap.add_argument("--bases", type=cli.names_from(SINGLES), default=["tuned_static", "operator", "schedule"],
                    help="the planner's base policies, comma-separated (tuned_static,operator,schedule)")
    ap.add_argument("--follow", type=cli.names_from(SINGLES), default=["operator", "schedule"],
                    help="the bases whose episodes are played, comma-separated, each among --bases (operator,schedule)")
    ap.add_argument("--samples", type=cli.int_at_least(1), default=2, help="sampled futures a value (%(default)s)")
    ap.add_argument("--surprises", type=cli.int_at_least(0), default=0,
                    help="futures with a surprise ahead, stratified (the planner's `surprises`; %(default)s)")
    ap.add_argument("--noise", choices=NOISE_MODES, default="expected", help="the futures' noise ahead (%(default)s)")
    a = ap.parse_args(argv)
    missing = [f for f in a.follow if f not in a.bases]
    if missing:
        ap.error(f"argument --follow: {', '.join(missing)} not among --bases ({', '.join(a.bases)})")
    options = {"samples": a.samples, "surprises": a.surprises, "noise": a.noise, "pool": max(16, a.samples)}
    first = a.follow[:2]
    grades: dict[str, list[float]] = {f: [] for f in a.follow}
    means: dict[str, list[float]] = {f: [] for f in a.follow}
    bias: dict[str, list[np.ndarray]] = {f: [] for f in a.follow}
    gap_name = f"{first[0]}-{first[1]}" if len(first) == 2 else "-"
    print(f"{'seed':>7} {'followed':<14} {'grade':>6} {'value':>6} {'bias':>7} {'1st half':>8} {'2nd half':>8} "
          f"{'value ' + gap_name:>22} {'cpu s':>6}")
    for seed in validation_seeds(a.seeds):
        for f in a.follow:
            t0 = time.process_time()
            pol = Follow(a.task, seed, f, a.bases, **options)
            grade = play_episode(InProcessEnv(), pol, a.task, seed).score
            v = np.array(pol.values)
            own = v[:, a.bases.index(f)]
            b = own - grade
            half = len(b) // 2
            gap = (v[:, a.bases.index(first[0])] - v[:, a.bases.index(first[1])]).mean() if len(first) == 2 else np.nan
            grades[f].append(grade)
            means[f].append(float(own.mean()))
            bias[f].append(b)
            print(f"{seed:>7} {f:<14} {grade:>6.3f} {own.mean():>6.3f} {b.mean():>+7.3f} {b[:half].mean():>+8.3f} "
                  f"{b[half:].mean():>+8.3f} {gap:>+22.3f} {time.process_time() - t0:>6.1f}", flush=True)
    out: dict[str, float] = {}
    for f in a.follow:
        whole = float(np.mean([b.mean() for b in bias[f]]))
        h1 = float(np.mean([b[: len(b) // 2].mean() for b in bias[f]]))
        h2 = float(np.mean([b[len(b) // 2:].mean() for b in bias[f]]))
        print(f"{f}: mean bias {whole:+.4f} (first half {h1:+.4f}, second {h2:+.4f}) over {len(bias[f])} seeds")
        out[f"{a.task}.{f}.bias"] = round(whole, 4)
        out[f"{a.task}.{f}.bias_first_half"] = round(h1, 4)
        out[f"{a.task}.{f}.bias_second_half"] = round(h2, 4)
    if len(first) == 2 and a.seeds >= 3:
        grade_gap = np.subtract(grades[first[0]], grades[first[1]])
        value_gap = np.subtract(means[first[0]], means[first[1]])
        corr = float(np.corrcoef(grade_gap, value_gap)[0, 1])
        print(f"{gap_name}: value gap (each along its own path) against grade gap, correlation {corr:.2f} "
              f"over {a.seeds} seeds")
        out[f"{a.task}.value_gap_grade_gap_corr"] = round(corr, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
