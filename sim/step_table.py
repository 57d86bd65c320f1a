"""A step-time model measured as a table: what `calibrate records` writes when it follows the engine better.

The affine measured model (sim/measured_step.py) charges one cost per decoding sequence. An engine whose
decode step stops growing with the batch defeats it: llama-server with gemma-3-270m on one CPU thread
took 17.7 / 37.8 / 98.4 / 94.2 ms per step at 1 / 2 / 4 / 8 slots, where the fitted straight line gave
21.6 / 39.0 / 73.7 / 143.4 (issue 29). The table model keeps the terms that are affine on every engine
measured and tabulates the one that is not:

    t = step_s                          fixed cost of one iteration
      + decode(b)                       b = decoding rows (sequences x (depth + 1)); piecewise linear
                                        between the measured slot counts, 0 at b = 0, and past the last
                                        one extended along its last segment (never below its last value)
      + prefill(m)                      m = prompt tokens through the model; piecewise linear between
                                        the measured token counts, 0 at m = 0, and past the last one at
                                        its mean cost per token (prefill_s / tokens there): the knots are
                                        one prompt's sizes, an iteration past them holds several prompts,
                                        and the records' prompts are too alike (92-96 tokens) for the last
                                        segment's slope to mean anything (one fit's fell: past 96 tokens
                                        two prompts then cost one). Prefill on these engines is linear in
                                        tokens: llama-server with SmolLM2 took 5.1-5.3 ms a token from 20
                                        to 520 tokens, alone
      + ctx(b) * summed decode context  attention reading the KV cache: one coefficient ctx_s, or (a
                                        table with `ctx_by_slots_s`) a coefficient per slot count,
                                        piecewise linear in b like decode(b)
      + prefill_ctx_s * m * summed decode context   (optional, 0 without) a prompt processed beside
                                        decoding sequences costs more than alone plus their decode step:
                                        llama-server with gemma-3-270m took 364 ms for a ~93-token prompt
                                        alone and 421 / 542 / 671 ms with 1 / 2-3 / 4+ others decoding, its
                                        own log says (~70 ms an other sequence beyond its decode step;
                                        SmolLM2 shows a few ms). The records cannot tell this form from
                                        m x sequences or a cost per sequence (the prompts are all ~the same
                                        length). Gemma's mechanism was found later: llama-server's context
                                        checkpoints split its prompt over three iterations, each with the
                                        decoding slots (sim/prompt_breaks.py); docs/real-mode.md has the
                                        numbers.
      (+ engine.cached_context_s * pairs of a chunk's tokens with the cached tokens before it:
         sim/cached_context.py)

stored in the profile as `engine.measured_table`:

    {"step_s": s, "ctx_s": c, "slots": [1, 2, 4, 8], "decode_s": [...], "prefill_tokens": [...], "prefill_s": [...]}
    (+ "ctx_by_slots_s": [...], one per slot count, when the context cost depends on the batch;
     + "prefill_ctx_s": k, when a prompt's tokens pay for the context decoding beside them)

The context cost by slots is for an engine whose attention cost per context token changes with the
batch (issue 29 suspected llama-server of it; read from its token streams, SmolLM2's cost stayed 11-22 us
a token at 1-8 slots, docs/real-mode.md), and held-out replay keeps it only where it replays better. It
stays compatible with the engine's closed form for runs of identical decode iterations (t_j = A + B * j):
within a run the batch does not change, so the step is affine in context with the slope ctx(b)
(`decode_slope(depth, decode_seqs)`).
The interface is the engine's IterationModel (sim/step_time.py), so every knob works unchanged, with the
measured model's limits (one model measured: tiers and speculation are timed like it; a lane with share
s runs 1/s slower; KV transfers use the base profile's link).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from llmserve_env.sim.cached_context import cached_pairs
from llmserve_env.sim.fitted_model import FittedStepModel
from llmserve_env.sim.lanes import lane_shares

if TYPE_CHECKING:  # annotations only: profiles.py imports this module to check a profile at load
    from llmserve_env.sim.profiles import Profile

KEY = "measured_table"
LANES = ("unified", "prefill", "decode")


def _points(d: dict[str, Any], xs_key: str, ys_key: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    xs, ys = d.get(xs_key), d.get(ys_key)
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys) or not xs:
        raise ValueError(f"engine.{KEY}.{xs_key} and .{ys_key} must be lists of the same, non-zero length")
    xf, yf = tuple(float(x) for x in xs), tuple(float(y) for y in ys)
    if any(not x > 0 for x in xf) or any(b <= a for a, b in zip(xf, xf[1:], strict=False)):
        raise ValueError(f"engine.{KEY}.{xs_key} must be positive and increasing, got {xs}")
    if any(not y >= 0 for y in yf):
        raise ValueError(f"engine.{KEY}.{ys_key} must be >= 0, got {ys}")
    return xf, yf


@dataclass(frozen=True, slots=True)
class StepTable:
    step_s: float
    ctx_s: float
    slots: tuple[float, ...]
    decode_s: tuple[float, ...]
    prefill_tokens: tuple[float, ...]
    prefill_s: tuple[float, ...]
    ctx_by_slots_s: tuple[float, ...] = ()  # empty: ctx_s for every batch
    prefill_ctx_s: float = 0.0              # per prompt token per token of decode context in the iteration

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepTable:
        for k in ("step_s", "ctx_s"):
            if k not in d or not float(d[k]) >= 0:
                raise ValueError(f"engine.{KEY}.{k} must be a number >= 0, got {d.get(k)!r}")
        slots, decode = _points(d, "slots", "decode_s")
        tokens, prefill = _points(d, "prefill_tokens", "prefill_s")
        by_slots: tuple[float, ...] = ()
        if d.get("ctx_by_slots_s") is not None:
            _, by_slots = _points({"slots": d["slots"], "ctx_by_slots_s": d["ctx_by_slots_s"]}, "slots",
                                  "ctx_by_slots_s")
        pctx = float(d.get("prefill_ctx_s", 0.0))
        if not pctx >= 0:
            raise ValueError(f"engine.{KEY}.prefill_ctx_s must be a number >= 0, got {d.get('prefill_ctx_s')!r}")
        return cls(float(d["step_s"]), float(d["ctx_s"]), slots, decode, tokens, prefill, by_slots, pctx)

    def ctx_at(self, rows: float) -> float:
        """Seconds per token of summed decode context with `rows` decoding rows."""
        return interpolate(rows, self.slots, self.ctx_by_slots_s) if self.ctx_by_slots_s else self.ctx_s

    def to_dict(self) -> dict[str, Any]:
        def r(v: float) -> float:
            return float(f"{v:.6g}")

        return {"step_s": r(self.step_s), "ctx_s": r(self.ctx_s), "slots": [r(x) for x in self.slots],
                "decode_s": [r(y) for y in self.decode_s], "prefill_tokens": [r(x) for x in self.prefill_tokens],
                "prefill_s": [r(y) for y in self.prefill_s]} | (
                    {"ctx_by_slots_s": [r(y) for y in self.ctx_by_slots_s]} if self.ctx_by_slots_s else {}) | (
                    {"prefill_ctx_s": r(self.prefill_ctx_s)} if self.prefill_ctx_s else {})


def interpolate(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """Piecewise linear through (0, 0) and the points; past the last point along the last segment, never
    below the last value (an engine's step does not shrink with more work)."""
    if x <= 0:
        return 0.0
    if x <= xs[-1]:
        return float(np.interp(x, (0.0, *xs), (0.0, *ys)))
    x0, y0 = (xs[-2], ys[-2]) if len(xs) > 1 else (0.0, 0.0)
    slope = (ys[-1] - y0) / (xs[-1] - x0)
    return ys[-1] + max(0.0, slope) * (x - xs[-1])


def prefill_at(m: float, tokens: tuple[float, ...], seconds: tuple[float, ...]) -> float:
    """The table's prefill of `m` tokens: `interpolate` up to the last knot, past it the last knot's mean
    cost per token (a straight line from the origin through it)."""
    if m <= tokens[-1]:
        return interpolate(m, tokens, seconds)
    return seconds[-1] * m / tokens[-1]


class TableStepModel(FittedStepModel):
    """Iteration times from a measured table, with the interface the engine uses of StepTimeModel."""

    __slots__ = ("table",)

    def __init__(self, p: Profile, tier: str, table: StepTable, compute_share: float = 1.0):
        super().__init__(p, tier, compute_share)
        self.table = table

    def iteration_s(self, decode_seqs: int, ctx_sum: float, depth: int, chunks: list[tuple[int, int]],
                    prefill_tokens: int, sampled_prefills: int) -> float:
        tb = self.table
        t = tb.step_s + prefill_at(prefill_tokens, tb.prefill_tokens, tb.prefill_s)
        if decode_seqs:
            rows = decode_seqs * (depth + 1)
            t += interpolate(rows, tb.slots, tb.decode_s) + tb.ctx_at(rows) * ctx_sum
            if prefill_tokens and tb.prefill_ctx_s:
                t += tb.prefill_ctx_s * prefill_tokens * ctx_sum
        if self.cached_ctx and chunks:
            t += self.cached_ctx * cached_pairs(chunks)
        return t * self.slow

    def decode_slope(self, depth: int, decode_seqs: int = 1) -> float:
        """d(iteration time)/d(summed context) of a decode iteration of `decode_seqs` sequences."""
        return self.table.ctx_at(decode_seqs * (depth + 1)) * self.slow


def table_of(p: Profile) -> StepTable | None:
    """The profile's measured step table, None when it has none."""
    d = p.raw.get("engine", {}).get(KEY)
    return StepTable.from_dict(d) if d is not None else None


def table_models(p: Profile) -> dict[tuple[str, str], TableStepModel]:
    """Every (tier, lane) model of a profile with a measured table; {} otherwise."""
    table = table_of(p)
    if table is None:
        return {}
    return {(tier, lane): TableStepModel(p, tier, table, lane_shares(p, lane)[0]) for tier in p.tiers for lane in LANES}
