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
    __slots__ = ("total", "used_fixed", "block_bytes", "weights_gib", "gpus")

    def __init__(self) -> None:
        self.total = 0
        self.used_fixed = 0
        self.block_bytes = 0.0
        self.weights_gib = 0.0
        self.gpus = 1

    def configure(self, profile: Profile, tier: str, speculation: bool, kv_budget_fraction: float) -> None:
        """Resize the pool for a policy (blocks in use are kept; the engine preempts if they no longer fit)."""
        per_token = profile.kv_bytes_per_token(speculation, tier)  # the tier's KV dtype
        self.block_bytes = per_token * KV_BLOCK_TOKENS
        cap_bytes = kv_budget_fraction * profile.kv_capacity_gib(tier, speculation) * GIB
        self.total = max(1, int(cap_bytes // self.block_bytes))
        self.weights_gib = profile.weights_gib(tier, speculation)
        self.gpus = profile.tp

    def memory_gib(self, blocks_used: int) -> float:
        """Weights plus KV blocks in use, summed over the GPUs of the group."""
        return (self.weights_gib + blocks_used * self.block_bytes / GIB) * self.gpus
