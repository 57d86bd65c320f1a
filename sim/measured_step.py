"""A step-time model measured on an engine, not derived from GPU kernels: what a records fit writes.

The kernel-based model (sim/step_time.py) describes a vLLM-style engine on a datacenter GPU. Another
engine (llama.cpp on a CPU, say) has a different shape: there a 170-token prefill costs 45-92 decode
steps, where on the H100 profile it costs about one. A profile re-fitted from request records
(`python -m llmserve_env.tools.calibrate records`) therefore carries its own iteration time, affine in
the work of the iteration:

    t = step_s                                fixed cost of one iteration (scheduling, sampling set-up)
      + seq_s   * decoding sequences          batch growth: per-sequence cost of a decode step
      + token_s * tokens through the model    prefill per token (and each decoded/verified token)
      + ctx_s   * summed decode context        attention reading the KV cache
      (+ engine.cached_context_s * causal pairs of the prefill chunks: sim/cached_context.py)

stored in the profile as `engine.measured_step` (seconds). It honours the same calls the engine makes
on a StepTimeModel (`iteration_s`, `decode_slope`, `transfer_s`), so the event engine, its closed-form
decode runs and every knob work unchanged. What it cannot know: tiers and speculation are timed
like the measured model (one model was measured); a disaggregated lane with a share s of the machine
runs its iterations 1/s times slower; KV transfers use the base profile's link.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from llmserve_env.sim.cached_context import causal_pairs
from llmserve_env.sim.fitted_model import FittedStepModel
from llmserve_env.sim.lanes import lane_shares
from llmserve_env.sim.step_table import TableStepModel, table_models

if TYPE_CHECKING:  # annotations only: profiles.py imports this module to check a profile at load
    from llmserve_env.sim.profiles import Profile

KEY = "measured_step"
LANES = ("unified", "prefill", "decode")


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    step_s: float
    seq_s: float
    token_s: float
    ctx_s: float

    NAMES = ("step_s", "seq_s", "token_s", "ctx_s")

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.step_s, self.seq_s, self.token_s, self.ctx_s)

    def to_dict(self) -> dict[str, float]:
        return {k: float(f"{v:.6g}") for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepCoefficients:
        missing = [k for k in cls.NAMES if k not in d]
        if missing:
            raise ValueError(f"engine.{KEY} is missing {', '.join(missing)}")
        values = [float(d[k]) for k in cls.NAMES]
        if any(not v >= 0 for v in values):
            raise ValueError(f"engine.{KEY} coefficients must be >= 0, got {d}")
        return cls(*values)


class MeasuredStepModel(FittedStepModel):
    """Iteration times from fitted coefficients, with the interface the engine uses of StepTimeModel."""

    __slots__ = ("c",)

    def __init__(self, p: Profile, tier: str, coef: StepCoefficients, compute_share: float = 1.0):
        super().__init__(p, tier, compute_share)
        self.c = coef

    def iteration_s(self, decode_seqs: int, ctx_sum: float, depth: int, chunks: list[tuple[int, int]],
                    prefill_tokens: int, sampled_prefills: int) -> float:
        c = self.c
        t = c.step_s + c.token_s * (decode_seqs * (depth + 1) + prefill_tokens)
        if decode_seqs:
            t += c.seq_s * decode_seqs + c.ctx_s * ctx_sum
        if self.cached_ctx and chunks:
            t += self.cached_ctx * causal_pairs(chunks)
        return t * self.slow

    def decode_slope(self, depth: int, decode_seqs: int = 1) -> float:
        return self.c.ctx_s * self.slow


def coefficients(p: Profile) -> StepCoefficients | None:
    """The profile's measured step coefficients, None for a kernel-based profile."""
    d = p.raw.get("engine", {}).get(KEY)
    return StepCoefficients.from_dict(d) if d is not None else None


def measured_models(p: Profile) -> dict[tuple[str, str], MeasuredStepModel | TableStepModel]:
    """Every (tier, lane) model of a measured profile: its table (sim/step_table.py) when it has one, else
    its coefficients; {} for a kernel-based one (built lazily)."""
    table = table_models(p)
    if table:
        return dict(table)
    coef = coefficients(p)
    if coef is None:
        return {}
    out: dict[tuple[str, str], MeasuredStepModel | TableStepModel] = {}
    for tier in p.tiers:
        for lane in LANES:
            cs, _ = lane_shares(p, lane)
            out[(tier, lane)] = MeasuredStepModel(p, tier, coef, cs)
    return out
