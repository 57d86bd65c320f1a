"""The paged KV cache: a pool of 16-token blocks sized from the policy's KV budget.

Capacity = kv_budget_fraction x (GPU memory x utilization - weights - activation reserve), in
blocks of `KV_BLOCK_TOKENS` tokens (shared/admission.py). Blocks held by prefilling and in-transfer
requests are counted exactly in `used_fixed`; blocks of decoding requests follow from their context
lengths, which the engine sums (exactly, or as a cheap upper bound while memory is plentiful).
"""

from __future__ import annotations

from llmserve_env.shared.admission import KV_BLOCK_TOKENS
from llmserve_env.sim.profiles import GIB, Profile

# (profile, block bytes, KV capacity GiB at a budget of 1, weights GiB) per (profile object, tier, speculation):
# a policy may change every window, and the sizes are pure functions of a (frozen) profile. Keyed by the
# profile's id, the profile kept beside them (a new object at a reused id is recomputed).
_SIZES: dict[tuple[int, str, bool], tuple[Profile, float, float, float]] = {}


def _sizes(profile: Profile, tier: str, speculation: bool) -> tuple[Profile, float, float, float]:
    key = (id(profile), tier, speculation)
    got = _SIZES.get(key)
    if got is None or got[0] is not profile:
        per_token = profile.kv_bytes_per_token(speculation, tier)  # the tier's KV dtype
        got = _SIZES[key] = (profile, per_token * KV_BLOCK_TOKENS, profile.kv_capacity_gib(tier, speculation),
                             profile.weights_gib(tier, speculation))
    return got


class KVCache:
    __slots__ = ("total", "used_fixed", "block_bytes", "weights_gib", "gpus")

    def __init__(self) -> None:
        self.total = 0
        self.used_fixed = 0
        self.block_bytes = 0.0
        self.weights_gib = 0.0
        self.gpus = 1

    def configure(self, profile: Profile, tier: str, speculation: bool, kv_budget_fraction: float) -> None:
        """Resize the pool for a policy (blocks in use are kept; the engine preempts if they no longer fit)."""
        _, block_bytes, capacity_gib, weights_gib = _sizes(profile, tier, speculation)
        self.block_bytes = block_bytes
        cap_bytes = kv_budget_fraction * capacity_gib * GIB
        self.total = max(1, int(cap_bytes // block_bytes))
        self.weights_gib = weights_gib
        self.gpus = profile.tp

    def memory_gib(self, blocks_used: int) -> float:
        """Weights plus KV blocks in use, summed over the GPUs of the group."""
        return (self.weights_gib + blocks_used * self.block_bytes / GIB) * self.gpus
