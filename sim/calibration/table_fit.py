"""Fitting the measured step table (sim/step_table.py) to request records, and choosing it or the affine
model by their error on held-out records.

The table's knots are read off the records: decode at 1, 2, 4, ... slots up to the largest batch the
records saw (within the actions' batch_cap); prefill at two token counts (the median and the largest prompt the engine counted).
Its values are fitted the way the affine coefficients are (sim/calibration/record_fit.py): replaying the recorded
episodes through the simulator and minimising the soft-L1 log error of every request's TTFT and TPOT,
by Nelder-Mead on the logs of the values, started from the affine fit (so the table starts where the
straight line ended and can only bend away from it where the records ask), or from a decode probe
(the engine's own step at b slots) when one is given.

The table comes in two forms: one context coefficient for every batch, or a context coefficient per
slot count (`ctx_by_slots_s`: llama-server's cost per context token grows with the slots decoding). The
second is fitted from the one-coefficient table's result, or, given a decode probe at two context
sizes per slot count (bench/real_engine.py --probe), started from the probe's own slope and level at
each slot count, and fitted to the records and the probe together (the probe's steps are a second term
of the objective: each slot count's step at each context, the soft-L1 log error as for requests).

A third form adds to the one-coefficient table a cost per prompt token per token of decoding context in
the same iteration (`prefill_ctx_s`: a prompt processed beside decoding sequences is slower than alone
plus their decode step on llama-server).

`choose` replays held-out episodes on the four fitted profiles and keeps a table only when it beats the
affine model there (the sum of the TTFT and TPOT median errors), and a table with more values (context
by slots, prefill context) only when it beats the one-coefficient table: more values to fit must be
earned on episodes the fit never saw.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
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
from llmserve_env.sim.profiles import Profile, with_engine
from llmserve_env.sim.step_table import KEY, StepTable, interpolate

ProbePoint = tuple[int, float, float]  # (slots decoding, decode context summed over them, the engine's step s)


def with_table(base: Profile, table: StepTable, out_id: str | None = None) -> Profile:
    """`base` timed by `table` (its affine coefficients, if any, removed: one step model per profile)."""
    return with_engine(base, {KEY: table.to_dict()}, drop=(AFFINE_KEY,), out_id=out_id)


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


def probe_loss(table: StepTable, points: list[ProbePoint]) -> float:
    """Mean soft-L1 log error of the table's decode step against a probe's measured steps (the scale of
    replay_objective's request term)."""
    if not points:
        return 0.0
    res = []
    for b, ctx, step in points:
        t = table.step_s + interpolate(b, table.slots, table.decode_s) + table.ctx_at(b) * ctx
        res.append(math.log(t / step) if t > 0 and step > 0 else 3.0)
    r = np.asarray(res)
    return float(np.mean(2.0 * (np.sqrt(1.0 + (r / 0.1) ** 2) - 1.0)))


def fit_table(base: Profile, runs: list[RecordedRun], start: StepTable, iters: int = 300,
              probe_points: list[ProbePoint] | None = None) -> TableFit:
    """Fit every value of the table (step, decode at each slot count, prefill at each token count, the
    context coefficient, or one per slot count when `start` has them) to `runs`, from `start`; with
    `probe_points` (the engine's step at b slots and a summed context), to those steps as well."""
    if not runs:
        raise ValueError("no recorded runs to fit")
    k, j = len(start.slots), len(start.prefill_tokens)
    by_slots = bool(start.ctx_by_slots_s)
    pctx = start.prefill_ctx_s > 0  # fitted too when the start has one
    n_ctx = k if by_slots else 1
    points = list(probe_points or [])

    def table(x: np.ndarray) -> StepTable:
        v = np.exp(x)
        ctx = tuple(float(y) for y in v[1 + k + j:1 + k + j + n_ctx]) if by_slots else ()
        return StepTable(float(v[0]), float(v[1 + k + j]), start.slots, tuple(float(y) for y in v[1:1 + k]),
                         start.prefill_tokens, tuple(float(y) for y in v[1 + k:1 + k + j]), ctx,
                         float(v[1 + k + j + n_ctx]) if pctx else 0.0)

    f = replay_objective(runs, lambda x: with_table(base, table(x)))
    calls = 0

    def counted(x: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        return f(x) + (probe_loss(table(x), points) if points else 0.0)

    floor = 1e-7  # a value of 0 (the context term of an engine that shows none) has no logarithm
    ctx0 = list(start.ctx_by_slots_s) if by_slots else [start.ctx_s]
    x0 = np.log(np.maximum(floor, [start.step_s, *start.decode_s, *start.prefill_s, *ctx0,
                                   *([start.prefill_ctx_s] if pctx else [])]))
    # the context-by-slots table starts from a fitted table or a probe: it is searched near its start
    for step in ((0.1, 0.03) if by_slots else (0.3, 0.1)):
        x, _ = nelder_mead(counted, x0, step=step, iters=iters)
        x0 = x
    fitted = table(x)
    if by_slots:  # ctx_s is unused beside ctx_by_slots_s: the one-slot value, for a reader
        fitted = replace(fitted, ctx_s=fitted.ctx_by_slots_s[0])
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


def ctx_by_slots_start(table: StepTable, points: list[ProbePoint] | None = None) -> StepTable:
    """`table` with a context coefficient per slot count: its own one everywhere, or, at each slot count a
    probe measured at two contexts or more, the probe's slope (least squares, >= 0) and its decode value
    the probe's step at no context less the fixed cost. The records alone do not split the fixed cost from
    decode(b) (both are paid by every decode iteration), so a fixed cost above half the probe's smallest
    step at no context is lowered to that half and the prefill values raised by as much (a prefill-only
    iteration keeps its time)."""
    ctx = [table.ctx_at(b) for b in table.slots]
    level: dict[int, float] = {}
    for i, b in enumerate(table.slots):
        pts = [(c, s) for n, c, s in points or [] if n == int(b)]
        if len({c for c, _ in pts}) < 2:
            continue
        cs, ss = np.array(pts).T
        slope = max(0.0, float(np.polyfit(cs, ss, 1)[0]))
        ctx[i], level[i] = slope, float(np.mean(ss - slope * cs))
    step = table.step_s
    if level and step > 0.5 * min(level.values()):
        step = 0.5 * min(level.values())
    lift = table.step_s - step
    decode = tuple(max(1e-6, level[i] - step) if i in level else d for i, d in enumerate(table.decode_s))
    return replace(table, step_s=step, decode_s=decode, prefill_s=tuple(p + lift for p in table.prefill_s),
                   ctx_by_slots_s=tuple(ctx))


PROBE_COLUMNS = ("slots", "step_ms", "context_tokens")


def read_probe_points(path: Path) -> list[ProbePoint]:
    """A decode probe (bench/real_engine.py --probe writes one): CSV rows of slots, the engine's step in ms
    at that many slots, and the decode context summed over them, one row or more per slot count (one per
    prompt size probed). [(slots, context, step s)]; ValueError naming the line on malformed input."""
    out: list[ProbePoint] = []
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
            out.append((b, c, ms / 1e3))
    if not out:
        raise ValueError(f"{path}: no probe rows")
    return out


def probe_dicts(points: list[ProbePoint]) -> tuple[dict[int, float], dict[int, float]]:
    """({slots: step s}, {slots: context}) at the smallest context probed per slot count (what starts the
    one-coefficient table)."""
    steps: dict[int, float] = {}
    ctx: dict[int, float] = {}
    for b, c, s in sorted(points, key=lambda p: (p[0], p[1])):
        if b not in steps:
            steps[b], ctx[b] = s, c
    return steps, ctx


def read_probe(path: Path) -> tuple[dict[int, float], dict[int, float]]:
    """A decode probe's ({slots: step s}, {slots: context}), the smallest context per slot count;
    ValueError naming the line on malformed input."""
    return probe_dicts(read_probe_points(path))


def write_probe(path: Path, steps: dict[int, float], ctx: dict[int, float]) -> None:
    write_probe_points(path, [(b, ctx.get(b, 0.0), steps[b]) for b in sorted(steps)])


def write_probe_points(path: Path, points: list[ProbePoint]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROBE_COLUMNS)
        for b, c, s in sorted(points, key=lambda p: (p[0], p[1])):
            w.writerow([b, f"{s * 1e3:.4f}", f"{c:g}"])


def held_out_error(c: Comparison) -> float:
    s = c.summary()
    return s["ttft_err_pct"] + s["tpot_err_pct"]


@dataclass(frozen=True, slots=True)
class Choice:
    """The four fits and their held-out replays; `model` is "table" or "affine", `context` which table
    ("one": one context coefficient, "by slots": one per slot count, "prefill context": one context
    coefficient and the prompt tokens' cost over the decoding requests' context) is kept when it is the
    table: the first in that order of the best held-out error (a table with more values must do better)."""

    affine: RecordFit
    table_one: TableFit
    table_slots: TableFit
    table_pctx: TableFit
    held_affine: Comparison
    held_one: Comparison
    held_slots: Comparison
    held_pctx: Comparison

    def _tables(self) -> list[tuple[str, TableFit, Comparison]]:
        return [("one", self.table_one, self.held_one), ("by slots", self.table_slots, self.held_slots),
                ("prefill context", self.table_pctx, self.held_pctx)]

    def _best(self) -> tuple[str, TableFit, Comparison]:
        return min(self._tables(), key=lambda t: held_out_error(t[2]))  # min keeps the first of equals

    @property
    def context(self) -> str:
        return self._best()[0]

    @property
    def table(self) -> TableFit:
        """The better table on the held-out episodes."""
        return self._best()[1]

    @property
    def held_table(self) -> Comparison:
        return self._best()[2]

    @property
    def model(self) -> str:
        return "table" if held_out_error(self.held_table) < held_out_error(self.held_affine) else "affine"

    @property
    def kept(self) -> str:
        """What is kept, in words: affine, table (one context cost), table (context cost by slots) or table
        (prefill context cost)."""
        if self.model == "affine":
            return "affine"
        return {"one": "table (one context cost)", "by slots": "table (context cost by slots)",
                "prefill context": "table (prefill context cost)"}[self.context]

    def to_dict(self) -> dict[str, Any]:
        def r(c: Comparison) -> dict[str, float]:
            return {k: round(v, 2) for k, v in c.summary().items()}

        return {"chosen": self.model, "table_context": self.context,
                "held_out": {"affine": r(self.held_affine), "table": r(self.held_table),
                             "table_one_context": r(self.held_one), "table_context_by_slots": r(self.held_slots),
                             "table_prefill_context": r(self.held_pctx)},
                "table": self.table.table.to_dict(),
                "table_evaluations": sum(t.evaluations for _, t, _ in self._tables())}

    def line(self) -> str:
        a, o, t, q = (c.summary() for c in (self.held_affine, self.held_one, self.held_slots, self.held_pctx))
        return (f"step model chosen on held-out episodes: {self.kept} (TTFT / TPOT median error: affine "
                f"{a['ttft_err_pct']:.1f} / {a['tpot_err_pct']:.1f} %, table with one context cost "
                f"{o['ttft_err_pct']:.1f} / {o['tpot_err_pct']:.1f} %, table with a context cost by slots "
                f"{t['ttft_err_pct']:.1f} / {t['tpot_err_pct']:.1f} %, table with a prefill context cost "
                f"{q['ttft_err_pct']:.1f} / {q['tpot_err_pct']:.1f} %)")


def choose(base: Profile, fit_runs: list[RecordedRun], held_runs: list[RecordedRun], actions: list[ServeAction],
           probe: dict[int, float] | None = None, probe_ctx: dict[int, float] | None = None,
           iters: int = 300, probe_points: list[ProbePoint] | None = None) -> Choice:
    """Fit the three models to `fit_runs`, replay `held_runs` on each. `probe`/`probe_ctx` start the
    one-coefficient table's decode values; `probe_points` (the probe at every context it measured) start
    the context-by-slots table and are fitted beside the records."""
    if not held_runs:
        raise ValueError("choosing a step model needs held-out episodes")
    if probe is None and probe_points:
        probe, probe_ctx = probe_dicts(probe_points)
    affine = fit_records(base, fit_runs, iters=iters)
    slots, tokens = knots(fit_runs, actions)
    start = (probe_start(affine.coefficients, slots, tokens, probe, probe_ctx or {}) if probe
             else table_from_affine(affine.coefficients, slots, tokens))
    one = fit_table(base, fit_runs, start, iters=iters)
    slots_fit = fit_table(base, fit_runs, ctx_by_slots_start(one.table, probe_points), iters=iters,
                          probe_points=probe_points)
    # the prompt tokens' cost over the decoding requests' context (sim/step_table.py) starts at the decode
    # context cost, the cost of one token over one cached token that the records already measured
    pctx_fit = fit_table(base, fit_runs, replace(one.table, prefill_ctx_s=max(one.table.ctx_s, 1e-7)), iters=iters)
    a_prof = with_coefficients(base, affine.coefficients)
    profs = [with_table(base, t.table) for t in (one, slots_fit, pctx_fit)]
    o_held, s_held, p_held = (pooled([replay(r, prof) for r in held_runs]) for prof in profs)
    return Choice(affine, one, slots_fit, pctx_fit, pooled([replay(r, a_prof) for r in held_runs]),
                  o_held, s_held, p_held)
