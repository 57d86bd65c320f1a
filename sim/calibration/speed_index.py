"""The machine's speed around each recorded episode, and a fitted profile carried to that speed.

A step model fitted on some episodes of a CPU engine is checked on others played minutes later. On this
project's shared 2-core machine the engine's one-slot decode step moved 8-29 % between the fit seeds and
the held-out seeds of one run, with nothing else running (issue 29, docs/real-mode.md): no step model
fitted on the first can meet a 15 % error on the second, whatever its shape. A speed probe separates the
two. Lone requests (one at a time, a short fresh prompt, a fixed number of tokens) are sent at every
boundary between episodes (before the first, between each two, after the last), and each gives the
engine's one-slot decode step from its token stream. An episode's speed index is the mean of the probes
on either side of it; a held-out episode is then also replayed on the fitted profile with every
measured time multiplied by its index over the fit episodes' mean index.

That replay is a second reading, not the check: it says how much of the held-out error is the machine
moving (what the probes saw) and how much the step model's shape. The probes are requests of their own,
sent outside every episode, so nothing of a held-out episode's records goes into its own prediction.
One factor scales every time term alike (prefill, decode, context, fixed cost): a CPU engine's step
slows as a whole when its core is shared or clocked down.
"""

from __future__ import annotations

import copy
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# seconds-valued terms of the two measured step models (sim/measured_step.py, sim/step_table.py)
AFFINE_TIMES = ("step_s", "seq_s", "token_s", "ctx_s")
TABLE_TIMES = ("step_s", "ctx_s", "decode_s", "prefill_s", "ctx_by_slots_s", "prefill_ctx_s")


@dataclass(frozen=True, slots=True)
class Probe:
    """The probes at one boundary: `after_seed` None before the first episode, else the episode it follows."""

    boundary: int
    after_seed: int | None
    step_ms: float  # median one-slot decode step of the lone requests sent there


def episode_indices(probes: list[Probe], seeds: list[int]) -> dict[int, float]:
    """Each episode's speed index (ms a one-slot step): the mean of the probes before and after it."""
    by_boundary = {p.boundary: p.step_ms for p in probes}
    if sorted(by_boundary) != list(range(len(seeds) + 1)):
        raise ValueError(f"speed probes at boundaries {sorted(by_boundary)}; {len(seeds)} episodes need "
                         f"0..{len(seeds)}")
    return {s: 0.5 * (by_boundary[i] + by_boundary[i + 1]) for i, s in enumerate(seeds)}


def scale_factors(indices: dict[int, float], fit_seeds: list[int], held_seeds: list[int]) -> dict[int, float]:
    """Each held-out episode's index over the fit episodes' mean index (> 1: the engine was slower)."""
    ref = sum(indices[s] for s in fit_seeds) / len(fit_seeds)
    return {s: indices[s] / ref for s in held_seeds}


def scaled_profile_dict(prof: dict[str, Any], factor: float) -> dict[str, Any]:
    """A copy of profile JSON `prof` (one a records fit wrote) whose measured step times are all multiplied
    by `factor`, under an id that says so."""
    if not factor > 0:
        raise ValueError(f"speed factor must be > 0, got {factor}")
    out = copy.deepcopy(prof)
    blocks = [(out["engine"][key], names) for key, names in (("measured_step", AFFINE_TIMES),
                                                              ("measured_table", TABLE_TIMES))
              if isinstance(out["engine"].get(key), dict)]
    if not blocks:
        raise ValueError(f"profile {prof['id']!r} has no measured step model to scale (engine.measured_step or "
                         "engine.measured_table: a records fit writes them)")
    for block, names in blocks:
        for name in names:
            v = block.get(name)
            if isinstance(v, list):
                block[name] = [float(x) * factor for x in v]
            elif isinstance(v, (int, float)):
                block[name] = float(v) * factor
    out["id"] = f"{prof['id']}@x{factor:.4f}"
    return out


FIELDS = ("boundary", "after_seed", "step_ms")


def write_probes(path: Path, probes: list[Probe]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for p in probes:
            w.writerow([p.boundary, "" if p.after_seed is None else p.after_seed, f"{p.step_ms:.4f}"])


def read_probes(path: Path) -> list[Probe]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or set(rows[0]) != set(FIELDS):
        raise ValueError(f"{path}: expected the columns {', '.join(FIELDS)}")
    return [Probe(int(r["boundary"]), int(r["after_seed"]) if r["after_seed"] else None, float(r["step_ms"]))
            for r in rows]
