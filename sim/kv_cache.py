"""The paged KV cache: a pool of 16-token blocks sized from the policy's KV budget.

Capacity = kv_budget_fraction x (GPU memory x utilization - weights - activation reserve), in
blocks of `KV_BLOCK_TOKENS` tokens (shared/admission.py). Blocks held by prefilling and in-transfer
requests are counted exactly in `used_fixed`; blocks of decoding requests follow from their context
lengths, which the engine sums (exactly, or as a cheap upper bound while memory is plentiful).
"""

from __future__ import annotations

from llmserve_env.shared.admission import KV_BLOCK_TOKENS
from llmserve_env.sim.profiles import GIB, Profile


class KVCache:
    __slots__ = ("total", "used_fixed", "block_bytes", "weights_gib", "gpus", "_sizes")

    def __init__(self) -> None:
        self.total = 0
        self.used_fixed = 0
        self.block_bytes = 0.0
        self.weights_gib = 0.0
        self.gpus = 1
        # (profile, block bytes, KV capacity GiB at a budget of 1, weights GiB) per (tier, speculation): a policy
        # may change every window, and the sizes are pure functions of the (frozen) profile
        self._sizes: dict[tuple[str, bool], tuple[Profile, float, float, float]] = {}

    def configure(self, profile: Profile, tier: str, speculation: bool, kv_budget_fraction: float) -> None:
        """Resize the pool for a policy (blocks in use are kept; the engine preempts if they no longer fit)."""
        got = self._sizes.get((tier, speculation))
        if got is None or got[0] is not profile:
            per_token = profile.kv_bytes_per_token(speculation, tier)  # the tier's KV dtype
            got = self._sizes[tier, speculation] = (profile, per_token * KV_BLOCK_TOKENS,
                                                    profile.kv_capacity_gib(tier, speculation),
                                                    profile.weights_gib(tier, speculation))
        _, block_bytes, capacity_gib, weights_gib = got
        self.block_bytes = block_bytes
        cap_bytes = kv_budget_fraction * capacity_gib * GIB
        self.total = max(1, int(cap_bytes // block_bytes))
        self.weights_gib = weights_gib
        self.gpus = profile.tp

    def memory_gib(self, blocks_used: int) -> float:
        """Weights plus KV blocks in use, summed over the GPUs of the group."""
        return kv_memory_gib(self.weights_gib, self.block_bytes, self.gpus, blocks_used)


def kv_memory_gib(weights_gib: float, block_bytes: float, gpus: int, blocks_used: int) -> float:
    """GPU memory (GiB) of a pool's figures with `blocks_used` blocks in use: `KVCache.memory_gib`, also what
    a window's resource samples are built with when read (sim/resource_samples.py)."""
    return (weights_gib + blocks_used * block_bytes / GIB) * gpus
