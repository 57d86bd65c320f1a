"""The scenario families' splits in the benchmark tables (bench/score_table.py, bench/headroom.py).

A family (shared/splits.py: `SHIFTED_TASKS`) is reported on two splits, both on the test seeds:

- `test`: the family task itself, days drawn from the training family's ranges;
- `shifted`: its shifted task, days drawn from outside those ranges. Every agent plays it exactly as
  it was built for the training family (its tuned parameters, its weights): the shift is what it was
  never shown (`split_job`; the planner too: built for the family, it samples the family's futures while
  it plays the shifted task, agents/planner.py).

`split_summary` pairs every agent with the best hand-made rival of the split (the best by mean of
`agents.planner.RIVALS_TO_BEAT` among those played, so rivals added there join the comparison) and
gives `<family>.<split>.<agent>.mean` / `.ci95`, `<family>.<split>.best_rival` (+ `_mean`), and the
paired differences `<family>.<split>.planner_minus_best_rival`, `.clairvoyant_minus_best_rival` and
`.learned_minus_best_rival` (the learned policy: `ppo`) with `.ci95`, for those that played.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from llmserve_env.agents.parallel import EpisodeJob
from llmserve_env.agents.planner import RIVALS_TO_BEAT
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.stats import mean_ci, paired_diff_ci
from llmserve_env.shared.splits import SHIFTED_TASKS, SPLITS, split_task

# what each difference key calls the agent it compares with the best rival
DIFFERENCES = {"planner": "planner", "clairvoyant": "clairvoyant", "ppo": "learned"}


def families_in(task_ids: Sequence[str]) -> list[str]:
    """The scenario families among `task_ids` (a shifted task id names its family)."""
    out: list[str] = []
    shifted_of = {v: k for k, v in SHIFTED_TASKS.items()}
    for t in task_ids:
        family = t if t in SHIFTED_TASKS else shifted_of.get(t)
        if family is not None and family not in out:
            out.append(family)
    return out


def split_job(agent: str, family: str, split: str, seed: int) -> EpisodeJob:
    """One episode of `agent`, built for the training family, on the split's task."""
    return EpisodeJob(functools.partial(make_policy, agent, family, seed=seed), split_task(family, split), seed)


def best_rival(scores: Mapping[str, Sequence[float]], rivals: Sequence[str] = RIVALS_TO_BEAT) -> str | None:
    """The hand-made rival (of `rivals`) with the highest mean among those in `scores`, ties to the later
    name; None when none played."""
    played = [a for a in rivals if a in scores]
    return max(played, key=lambda a: (mean_ci(list(scores[a])).mean, a)) if played else None


def split_summary(family: str, split: str, scores: dict[str, Sequence[float]]) -> tuple[list[str], dict[str, object]]:
    """(markdown cells: each agent's mean ± CI in the order of `scores`, then the best rival and every
    difference; the flat keys). `scores` maps agent -> its scores on the same seeds, in the same order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    prefix = f"{family}.{split}"
    flat: dict[str, object] = {}
    cells = []
    for agent, s in scores.items():
        ci = mean_ci(list(s))
        flat[f"{prefix}.{agent}.mean"] = round(ci.mean, 4)
        flat[f"{prefix}.{agent}.ci95"] = round(ci.half_width, 4) if ci.n > 1 else None
        cells.append(str(ci))
    best = best_rival(scores)
    if best is None:
        return cells + ["-"], flat
    flat[f"{prefix}.best_rival"] = best
    flat[f"{prefix}.best_rival_mean"] = round(mean_ci(list(scores[best])).mean, 4)
    diffs = [f"best rival {best}"]
    for agent, name in DIFFERENCES.items():
        if agent in scores:
            d = paired_diff_ci(list(scores[agent]), list(scores[best]))
            flat[f"{prefix}.{name}_minus_best_rival"] = round(d.mean, 4)
            flat[f"{prefix}.{name}_minus_best_rival.ci95"] = round(d.half_width, 4) if d.n > 1 else None
            diffs.append(f"{name} {d.mean:+.3f} ± {d.half_width:.3f}")
    return cells + ["; ".join(diffs)], flat
