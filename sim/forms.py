"""The closed-form kernel-time models the step-time model is built from, shared by fit and runtime.

Each form maps a kernel's work (bytes moved, FLOPs) to microseconds with a few coefficients that
`sim.calibrate` fits to measured kernel latencies. The same functions run on numpy arrays (fitting,
table building) and on floats (the engine), so the fit and the simulator cannot drift apart.

- `roofline_us`: c0 + ((bytes/bw)^p + (flops/fl)^p)^(1/p). A smoothed roofline: p -> inf is the
  hard max(memory, compute); a finite p models the knee where neither fully dominates.
- `DecodeAttentionFit`: c0 + c1 * seqs * kv_heads + kv_bytes/bw. Decode attention streams the KV cache, so it
  is affine in the summed context; the engine relies on that to skip decode runs in closed form.
- `alpha_beta_us`: c0 + bytes/bw, for all-reduce and KV transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BF16_BYTES = 2


@dataclass(frozen=True, slots=True)
class RooflineFit:
    c0_us: float
    bw_gbs: float
    tflops: float
    p: float

    def us(self, nbytes, flops):
        mem = nbytes / (self.bw_gbs * 1e3)
        comp = flops / (self.tflops * 1e6)
        return self.c0_us + (mem**self.p + comp**self.p) ** (1.0 / self.p)

    def to_dict(self) -> dict[str, float]:
        return {"c0_us": self.c0_us, "bw_gbs": self.bw_gbs, "tflops": self.tflops, "p": self.p}


@dataclass(frozen=True, slots=True)
class DecodeAttentionFit:
    """Per (sequence x KV head) work-item cost plus the KV stream; measured cost grows with both."""

    c0_us: float
    per_item_us: float
    bw_gbs: float

    def us(self, items, nbytes):
        return self.c0_us + self.per_item_us * items + nbytes / (self.bw_gbs * 1e3)

    def to_dict(self) -> dict[str, float]:
        return {"c0_us": self.c0_us, "per_item_us": self.per_item_us, "bw_gbs": self.bw_gbs}


@dataclass(frozen=True, slots=True)
class AlphaBetaFit:
    c0_us: float
    bw_gbs: float

    def us(self, nbytes):
        return self.c0_us + nbytes / (self.bw_gbs * 1e3)

    def to_dict(self) -> dict[str, float]:
        return {"c0_us": self.c0_us, "bw_gbs": self.bw_gbs}


def gemm_work(m, n, k, weight_bytes: float, act_bytes: float):
    """(bytes, flops) of an (m x k) @ (k x n) linear layer; output is bf16."""
    m = np.asarray(m, dtype=float)
    nbytes = weight_bytes * k * n + act_bytes * m * k + BF16_BYTES * m * n
    return nbytes, 2.0 * m * n * k


def prefill_attention_work(tokens, context, heads: int | np.ndarray, kv_heads: int | np.ndarray,
                           head_dim: int | np.ndarray):
    """(bytes, flops) of causal attention for `tokens` new queries after `context` cached tokens.

    Arrays broadcast; for a batch of equal prompts multiply by the batch size.
    """
    tokens = np.asarray(tokens, dtype=float)
    context = np.asarray(context, dtype=float)
    flops = 4.0 * heads * head_dim * tokens * (context + (tokens + 1.0) / 2.0)
    nbytes = BF16_BYTES * (2.0 * tokens * heads * head_dim + 2.0 * (context + tokens) * kv_heads * head_dim)
    return nbytes, flops


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int) -> float:
    """KV-cache bytes one token occupies across `layers` layers (K and V, bf16)."""
    return float(2 * BF16_BYTES * layers * kv_heads * head_dim)
