"""The closed-form kernel-time models the step-time model is built from, shared by fit and runtime.

Each form maps a kernel's work (bytes moved, FLOPs) to microseconds with a few coefficients that
`sim.calibration.calibrate` fits to measured kernel latencies. The same functions run on numpy arrays (fitting,
table building) and on floats (the engine), so the fit and the simulator cannot drift apart.

- `roofline_us`: c0 + ((bytes/bw)^p + (flops/fl)^p)^(1/p). A smoothed roofline: p -> inf is the
  hard max(memory, compute); a finite p models the knee where neither fully dominates.
- `DecodeAttentionFit`: c0 + c1 * seqs * kv_heads + kv_bytes/bw. Decode attention streams the KV cache, so it
  is affine in the summed context; the engine relies on that to skip decode runs in closed form.
- `alpha_beta_us`: c0 + bytes/bw, for all-reduce and KV transfer.
- `LatencyRatio`: a GEMM dtype priced as the bf16 fit times its measured latency ratio to bf16 at
  the same m (the FP8 kernels: no single roofline fits both their small and large shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llmserve_env.shared import portable_math as pm

BF16_BYTES = 2
# bytes per element of a KV-cache dtype (vLLM's kv_cache_dtype: "auto" keeps bf16, "fp8" is e4m3)
KV_ELEM_BYTES = {"bfloat16": 2.0, "fp8": 1.0}


@dataclass(frozen=True, slots=True)
class RooflineFit:
    c0_us: float
    bw_gbs: float
    tflops: float
    p: float

    def us(self, nbytes, flops):
        mem = nbytes / (self.bw_gbs * 1e3)
        comp = flops / (self.tflops * 1e6)
        if isinstance(mem, float) and isinstance(comp, float):  # the engine's floats: ** is C's pow already
            return self.c0_us + (mem**self.p + comp**self.p) ** (1.0 / self.p)
        # tables: NumPy's power is the CPU's own kernel (shared/portable_math.py)
        return self.c0_us + pm.power(pm.power(mem, self.p) + pm.power(comp, self.p), 1.0 / self.p)

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


@dataclass(frozen=True, slots=True)
class LatencyRatio:
    """Latency of a GEMM dtype over the `base` dtype's at the same shape, by m (tokens), interpolated
    linearly in log m between the measured m values and held constant outside them. Below `blend_lo`
    tokens the dtype's own small-m fit prices it instead (weight-bound GEMMs: their ratio to bf16
    depends on the shape, not on m), blended geometrically into the ratio up to `blend_hi`."""

    base: str
    m: tuple[float, ...]
    ratio: tuple[float, ...]
    blend_lo: float = 64.0
    blend_hi: float = 256.0

    def at(self, m):
        """The ratio at m (array or float; m >= 1)."""
        return np.interp(pm.log(np.maximum(np.asarray(m, dtype=float), 1.0)), pm.log(np.asarray(self.m)), self.ratio)

    def large_weight(self, m):
        """Weight of the ratio pricing (against the small-m fit) at m: 0 up to blend_lo, 1 from blend_hi."""
        lm = pm.log(np.maximum(np.asarray(m, dtype=float), 1.0))
        return np.clip((lm - pm.log(self.blend_lo)) / (pm.log(self.blend_hi) - pm.log(self.blend_lo)), 0.0, 1.0)

    def to_dict(self) -> dict[str, object]:
        return {"base": self.base, "m": list(self.m), "ratio": [round(r, 4) for r in self.ratio],
                "blend_lo": self.blend_lo, "blend_hi": self.blend_hi}


def ratio_gemm_us(m, n, k, base: RooflineFit, ratio: LatencyRatio, small: RooflineFit, weight_bytes: float,
                  act_bytes: float):
    """Microseconds of (m x k) @ (k x n) GEMMs of a ratio-priced dtype: its small-m fit (at its own
    bytes) below ratio.blend_lo, the base dtype's fit x the measured ratio above ratio.blend_hi, and
    the geometric blend of the two between."""
    nbytes, flops = gemm_work(m, n, k, BF16_BYTES, BF16_BYTES)
    large = base.us(nbytes, flops) * ratio.at(m)
    nbytes, flops = gemm_work(m, n, k, weight_bytes, act_bytes)
    w = ratio.large_weight(m)
    return pm.exp((1.0 - w) * pm.log(small.us(nbytes, flops)) + w * pm.log(large))


def gemm_work(m, n, k, weight_bytes: float, act_bytes: float):
    """(bytes, flops) of an (m x k) @ (k x n) linear layer; output is bf16."""
    m = np.asarray(m, dtype=float)
    nbytes = weight_bytes * k * n + act_bytes * m * k + BF16_BYTES * m * n
    return nbytes, 2.0 * m * n * k


def prefill_attention_work(tokens, context, heads: int | np.ndarray, kv_heads: int | np.ndarray,
                           head_dim: int | np.ndarray, elem_bytes: float = BF16_BYTES):
    """(bytes, flops) of causal attention for `tokens` new queries after `context` cached tokens.

    Arrays broadcast; for a batch of equal prompts multiply by the batch size. `elem_bytes` is 1 with
    an fp8 KV cache (FA3 then runs the whole attention in fp8, queries included).
    """
    tokens = np.asarray(tokens, dtype=float)
    context = np.asarray(context, dtype=float)
    flops = 4.0 * heads * head_dim * tokens * (context + (tokens + 1.0) / 2.0)
    nbytes = elem_bytes * (2.0 * tokens * heads * head_dim + 2.0 * (context + tokens) * kv_heads * head_dim)
    return nbytes, flops


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, elem_bytes: float = BF16_BYTES) -> float:
    """KV-cache bytes one token occupies across `layers` layers (K and V, `elem_bytes` each)."""
    return float(2 * elem_bytes * layers * kv_heads * head_dim)
