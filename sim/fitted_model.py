"""What every step-time model fitted to an engine's records shares (sim/measured_step.py's affine
coefficients, sim/step_table.py's table): the engine-facing fields beside the iteration time.

A fitted model times one measured engine: tiers are timed like the model that was measured, a
disaggregated lane with a share s of the machine runs its iterations 1/s times slower, KV transfers use
the base profile's link, and a cached prefix's attention is priced by `engine.cached_context_s`
(sim/cached_context.py). Subclasses add `iteration_s` and `decode_slope` (sim/step_time.py's
IterationModel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmserve_env.sim.cached_context import cached_context_s

if TYPE_CHECKING:  # annotations only: profiles.py imports the fitted models to check a profile at load
    from llmserve_env.sim.profiles import Profile


class FittedStepModel:
    """The lane's slowdown, the KV link and the cached-context price every fitted model reads; the tier is
    checked against the profile (a fitted model times every tier alike)."""

    __slots__ = ("slow", "xfer_c0", "xfer_per_token", "cached_ctx")

    def __init__(self, p: Profile, tier: str, compute_share: float):
        if tier not in p.tiers:
            raise KeyError(f"profile {p.id} has no tier {tier!r}")
        self.cached_ctx = cached_context_s(p.raw.get("engine", {}))
        self.slow = 1.0 / compute_share
        x = p.kv_transfer
        self.xfer_c0 = x.c0_us * 1e-6
        self.xfer_per_token = p.model.kv_bytes_per_token(p.tp) / (x.bw_gbs * 1e9)

    def transfer_s(self, tokens: int) -> float:
        return self.xfer_c0 + tokens * self.xfer_per_token
