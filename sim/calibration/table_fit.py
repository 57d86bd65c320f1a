"""Fitting the measured step table (sim/step_table.py) to request records, and choosing it or the affine
model by their error on held-out records.

The table's knots are read off the records: decode at 1, 2, 4, ... slots up to the largest batch the
records saw (within the actions' batch_cap); prefill at two token counts (the median and the largest prompt the engine counted).
Its values are fitted the way the affine coefficients are (sim/calibration/record_fit.py): replaying the recorded
episodes through the simulator and minimising the soft-L1 log error of every request's TTFT and TPOT,
by Nelder-Mead on the logs of the values, started from the affine fit (so the table starts where the
straight line ended and can only bend away from it where the records ask), or from a decode probe
(the engine's own step at b slots) when one is given.

`choose` replays held-out episodes on both fitted profiles and keeps the table only when it beats the
affine model there (the sum of the TTFT and TPOT median errors): a table has more values to fit, and
must earn them on episodes it never saw.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.calibration.record_fit import (
    RecordFit,
    fit_records,
    nelder_mead,
    replay_objective,
    with_coefficients,
)
from llmserve_env.sim.calibration.replay import Comparison, RecordedRun, pooled, replay
from llmserve_env.sim.measured_step import KEY as AFFINE_KEY
from llmserve_env.sim.measured_step import StepCoefficients
from llmserve_env.sim.profiles import Profile, profile_from_dict
from llmserve_env.sim.step_table import KEY, StepTable


def with_table(base: Profile, table: StepTable, out_id: str | None = None) -> Profile:
    """`base` timed by `table` (its affine coefficients, if any, removed: one step model per profile)."""
    d = json.loads(json.dumps(base.raw))
    d["engine"].pop(AFFINE_KEY, None)
    d["engine"][KEY] = table.to_dict()
    if out_id:
        d["id"] = out_id
    return profile_from_dict(d)


def most_in_flight(runs: list[RecordedRun]) -> int:
    """The most requests the engine held at once in the records (dispatch to finish)."""
    most = 0
    for run in runs:
        events = sorted(e for r in run.rows if r.get("dispatch_s") is not None and r.get("finish_s") is not None
                        for e in ((float(r["dispatch_s"]), 1), (float(r["finish_s"]), -1)))
        n = 0
        for _, d in events:
            n += d
            most = max(most, n)
    return most


def knots(runs: list[RecordedRun], actions: list[ServeAction]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(slots, prefill tokens) the table is measured at: powers of two up to the largest batch the records
    saw (at most the largest batch_cap played, and 64: a knot no record reaches would be fitted to
    nothing), and the median and largest prompt the engine counted."""
    cap = max(1, min(64, max(a.batch_cap for a in actions), most_in_flight(runs)))
    slots = [1]
    while slots[-1] * 2 <= cap:
        slots.append(slots[-1] * 2)
    if slots[-1] < cap:
        slots.append(cap)
    prompts = [a.prompt_tokens for run in runs for a in run.arrivals()]
    mid, top = float(np.median(prompts)), float(max(prompts))
    tokens = (mid, top) if top > mid else (top,)
    return tuple(float(s) for s in slots), tokens


def table_from_affine(c: StepCoefficients, slots: tuple[float, ...], tokens: tuple[float, ...]) -> StepTable:
    """The straight line as a table: decode(b) = (seq_s + token_s) b, prefill(m) = token_s m."""
    return StepTable(c.step_s, c.ctx_s, slots, tuple((c.seq_s + c.token_s) * b for b in slots), tokens,
                     tuple(c.token_s * m for m in tokens))


@dataclass(frozen=True, slots=True)
class TableFit:
    table: StepTable
    after: list[Comparison]   # the fitted table replaying each fitted run
    evaluations: int

    @property
    def after_summary(self) -> dict[str, float]:
        return pooled(self.after).summary()


def fit_table(base: Profile, runs: list[RecordedRun], start: StepTable, iters: int = 300) -> TableFit:
    """Fit every value of the table (step, decode at each slot count, prefill at each token count, the
    context coefficient) to `runs`, from `start`."""
    if not runs:
        raise ValueError("no recorded runs to fit")
    k, j = len(start.slots), len(start.prefill_tokens)

    def table(x: np.ndarray) -> StepTable:
        v = np.exp(x)
        return StepTable(float(v[0]), float(v[-1]), start.slots, tuple(float(y) for y in v[1:1 + k]),
                         start.prefill_tokens, tuple(float(y) for y in v[1 + k:1 + k + j]))

    f = replay_objective(runs, lambda x: with_table(base, table(x)))
    calls = 0

    def counted(x: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        return f(x)

    floor = 1e-7  # a value of 0 (the context term of an engine that shows none) has no logarithm
    x0 = np.log(np.maximum(floor, [start.step_s, *start.decode_s, *start.prefill_s, start.ctx_s]))
    x, _ = nelder_mead(counted, x0, step=0.3, iters=iters)
    x, _ = nelder_mead(counted, x, step=0.1, iters=iters)
    fitted = table(x)
    prof = with_table(base, fitted)
    return TableFit(fitted, [replay(r, prof) for r in runs], calls)


def probe_start(c: StepCoefficients, slots: tuple[float, ...], tokens: tuple[float, ...],
                probe: dict[int, float], probe_ctx: dict[int, float]) -> StepTable:
    """The affine table with its decode values replaced where a probe measured the engine's step at b
    slots (seconds, its context `probe_ctx[b]` summed): decode(b) = step - step_s - ctx_s * context."""
    base = table_from_affine(c, slots, tokens)
    decode = tuple(max(1e-6, probe[int(b)] - c.step_s - c.ctx_s * probe_ctx.get(int(b), 0.0))
                   if int(b) in probe else d for b, d in zip(slots, base.decode_s, strict=True))
    return StepTable(base.step_s, base.ctx_s, slots, decode, tokens, base.prefill_s)


PROBE_COLUMNS = ("slots", "step_ms", "context_tokens")


def read_probe(path: Path) -> tuple[dict[int, float], dict[int, float]]:
    """A decode probe (bench/real_engine.py --probe writes one): CSV rows of slots, the engine's step in ms
    at that many slots, and the decode context summed over them. ({slots: step s}, {slots: context});
    ValueError naming the line on malformed input."""
    steps: dict[int, float] = {}
    ctx: dict[int, float] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in PROBE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (want {', '.join(PROBE_COLUMNS)})")
        for lineno, row in enumerate(reader, 2):
            try:
                b, ms, c = int(row["slots"]), float(row["step_ms"]), float(row["context_tokens"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{lineno}: slots must be an integer, step_ms and context_tokens "
                                 f"numbers, got {row}") from None
            if b < 1 or not ms > 0 or not c >= 0:
                raise ValueError(f"{path}:{lineno}: want slots >= 1, step_ms > 0, context_tokens >= 0, got {row}")
            steps[b], ctx[b] = ms / 1e3, c
    if not steps:
        raise ValueError(f"{path}: no probe rows")
    return steps, ctx


def write_probe(path: Path, steps: dict[int, float], ctx: dict[int, float]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROBE_COLUMNS)
        for b in sorted(steps):
            w.writerow([b, f"{steps[b] * 1e3:.4f}", f"{ctx.get(b, 0.0):g}"])


def held_out_error(c: Comparison) -> float:
    s = c.summary()
    return s["ttft_err_pct"] + s["tpot_err_pct"]


@dataclass(frozen=True, slots=True)
class Choice:
    """The two fits and their held-out replays; `model` is "table" or "affine"."""

    affine: RecordFit
    table: TableFit
    held_affine: Comparison
    held_table: Comparison

    @property
    def model(self) -> str:
        return "table" if held_out_error(self.held_table) < held_out_error(self.held_affine) else "affine"

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.model,
                "held_out": {"affine": {k: round(v, 2) for k, v in self.held_affine.summary().items()},
                             "table": {k: round(v, 2) for k, v in self.held_table.summary().items()}},
                "table": self.table.table.to_dict(), "table_evaluations": self.table.evaluations}

    def line(self) -> str:
        a, t = self.held_affine.summary(), self.held_table.summary()
        return (f"step model chosen on held-out episodes: {self.model} (TTFT / TPOT median error: affine "
                f"{a['ttft_err_pct']:.1f} / {a['tpot_err_pct']:.1f} %, table {t['ttft_err_pct']:.1f} / "
                f"{t['tpot_err_pct']:.1f} %)")


def choose(base: Profile, fit_runs: list[RecordedRun], held_runs: list[RecordedRun], actions: list[ServeAction],
           probe: dict[int, float] | None = None, probe_ctx: dict[int, float] | None = None,
           iters: int = 300) -> Choice:
    """Fit both models to `fit_runs`, replay `held_runs` on each."""
    if not held_runs:
        raise ValueError("choosing a step model needs held-out episodes")
    affine = fit_records(base, fit_runs, iters=iters)
    slots, tokens = knots(fit_runs, actions)
    start = (probe_start(affine.coefficients, slots, tokens, probe, probe_ctx or {}) if probe
             else table_from_affine(affine.coefficients, slots, tokens))
    table = fit_table(base, fit_runs, start, iters=iters)
    a_prof, t_prof = with_coefficients(base, affine.coefficients), with_table(base, table.table)
    return Choice(affine, table, pooled([replay(r, a_prof) for r in held_runs]),
                  pooled([replay(r, t_prof) for r in held_runs]))
