"""The step-time model: how long one engine iteration takes for a given batch.

One iteration of a vLLM-style engine runs every scheduled token through the model once:

    t = t_fixed                                   host overhead + small kernels (fitted, see calibrate)
      + dense[m]                                  m tokens through every linear layer (fitted GEMM roofline),
                                                  the elementwise kernels (norms, rotary, SiLU: bytes / bw)
                                                  and, with tensor parallelism, 2 all-reduces per layer
      + head[r]                                   LM head + sampling for the r rows that sample a token
      + L * (c0 + c1 * seqs * kv_heads) + ctx_coef * sum(context)    decode attention (streams the KV cache)
      + L * roofline(bytes, flops of the prefill chunks)              prefill attention
      + g * (draft step)                          speculation: g draft-model steps before verifying

All GPU terms are per GPU of the tensor-parallel group, multiplied by the profile's
`gpu_time_scale` (1.0 unless calibrated from measured request records). Under prefill/decode
disaggregation each lane owns a compute share and a bandwidth share of the GPU: its kernels run
at those fractions of the fitted FLOP rate and bandwidth (launch latencies unchanged).

Decode attention is affine in the summed context, so a run of identical decode iterations has
step times t_j = A + B * j and the engine sums them in closed form.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import numpy as np
from llmserve_env.sim.forms import (
    BF16_BYTES,
    KV_ELEM_BYTES,
    DecodeAttentionFit,
    RooflineFit,
    gemm_work,
    ratio_gemm_us,
)
from llmserve_env.sim.lanes import lane_shares
from llmserve_env.sim.profiles import ModelShape, Profile, load_profile

MAX_BATCH = 512
MAX_SPEC_DEPTH = 8
# fp32 logits: write, read for softmax/top-p, read for sampling
SAMPLING_BYTES_PER_LOGIT = 12.0


def _elementwise_bytes_per_token(shape: ModelShape, tp: int) -> float:
    """Bytes per token per layer of the non-GEMM kernels: two RMSNorms (read+write hidden), two
    residual adds (read 2, write 1), rotary on q and k (read+write), SiLU-and-mul (read 2I, write I)."""
    elems = (4 + 6) * shape.hidden + 3 * shape.intermediate / tp + 2 * (shape.heads + shape.kv_heads) * shape.head_dim / tp
    return elems * BF16_BYTES


def elementwise_s(p: Profile, tokens: int) -> float:
    """Seconds (gpu_time_scale 1, whole GPU) of the elementwise kernels for `tokens` tokens, all layers."""
    return p.model.layers * tokens * _elementwise_bytes_per_token(p.model, p.tp) / (p.gemm["bfloat16"].bw_gbs * 1e9)


def _lane(fit: RooflineFit, cs: float, bs: float) -> RooflineFit:
    """The fit as seen by a lane with compute share `cs` and bandwidth share `bs`."""
    return RooflineFit(fit.c0_us, fit.bw_gbs * bs, fit.tflops * cs, fit.p)


def _dense_table(p: Profile, shape: ModelShape, tier: str, size: int, cs: float, bs: float) -> np.ndarray:
    """Seconds for m = 0..size-1 tokens through all linear layers, elementwise kernels and all-reduces."""
    spec = p.tiers[tier] if shape is p.model else None
    ratio = p.gemm_ratio.get(spec.gemm) if spec else None
    m = np.arange(size, dtype=float)
    per_layer_us = np.zeros(size)
    if spec is not None and ratio is not None:  # the measured kernels: small-m fit, then bf16 x ratio
        base, small = _lane(p.gemm[ratio.base], cs, bs), _lane(p.gemm[spec.gemm], cs, bs)
        for n, k in shape.linear_shapes(p.tp):
            per_layer_us += ratio_gemm_us(m, n, k, base, ratio, small, spec.weight_bytes, spec.act_bytes)
    else:
        fit = _lane(p.gemm[spec.gemm] if spec else p.gemm["bfloat16"], cs, bs)
        wb = spec.weight_bytes if spec else 2.0
        ab = spec.act_bytes if spec else 2.0
        fscale = spec.flops_scale if spec else 1.0
        for n, k in shape.linear_shapes(p.tp):
            nbytes, flops = gemm_work(m, n, k, wb, ab)
            per_layer_us += fit.us(nbytes, flops / fscale)
    bw = p.gemm["bfloat16"].bw_gbs * bs * 1e3  # bytes per us
    per_layer_us += m * _elementwise_bytes_per_token(shape, p.tp) / bw
    if p.tp > 1 and p.allreduce is not None:
        per_layer_us += 2.0 * p.allreduce.us(m * shape.hidden * BF16_BYTES)
    out = shape.layers * per_layer_us * 1e-6
    out[0] = 0.0
    return out


def _head_table(p: Profile, shape: ModelShape, size: int, cs: float, bs: float) -> np.ndarray:
    """Seconds for the LM head (bf16 in every tier) and sampling over r = 0..size-1 rows."""
    r = np.arange(size, dtype=float)
    fit = _lane(p.gemm["bfloat16"], cs, bs)
    nbytes, flops = gemm_work(r, shape.vocab // p.tp, shape.hidden, 2.0, 2.0)
    us = fit.us(nbytes, flops) + r * shape.vocab * SAMPLING_BYTES_PER_LOGIT / (fit.bw_gbs * 1e3)
    out = us * 1e-6
    out[0] = 0.0
    return out


class StepTimeModel:
    """Iteration times for one (profile, quantization tier, capacity share); build with `step_model`."""

    __slots__ = ("profile", "tier", "share", "t_fixed", "t_fixed_draft", "dense", "head", "draft_dense",
                 "draft_head", "dec_c0", "dec_seq", "dec_ctx", "ddec_c0", "ddec_seq", "ddec_ctx", "pre_layers",
                 "pre_fit", "heads", "kv_heads", "head_dim", "xfer_c0", "xfer_per_token", "gpu_scale", "kv_dtype",
                 "attn_elem_bytes")

    def __init__(self, p: Profile, tier: str, compute_share: float = 1.0, bandwidth_share: float = 1.0):
        if tier not in p.tiers:
            raise KeyError(f"profile {p.id} has no tier {tier!r}")
        self.profile, self.tier, self.share = p, tier, compute_share
        cs, bs = compute_share, bandwidth_share
        scale = p.gpu_time_scale
        self.gpu_scale = scale
        size = max(p.token_budget, MAX_BATCH * (MAX_SPEC_DEPTH + 1)) + MAX_BATCH + 1
        self.t_fixed = p.t_fixed_s
        # the draft's own host overhead, assumed proportional to its depth
        self.t_fixed_draft = p.t_fixed_s * p.draft.layers / p.model.layers
        self.dense = (_dense_table(p, p.model, tier, size, cs, bs) * scale).tolist()
        self.head = (_head_table(p, p.model, size, cs, bs) * scale).tolist()
        self.draft_dense = (_dense_table(p, p.draft, tier, MAX_BATCH + 1, cs, bs) * scale).tolist()
        self.draft_head = (_head_table(p, p.draft, MAX_BATCH + 1, cs, bs) * scale).tolist()
        # the tier's KV dtype: the cache's bytes and the attention kernels measured with it (the draft's
        # cache too: vLLM's kv_cache_dtype covers every attention layer it runs)
        kv = self.kv_dtype = p.tiers[tier].kv_dtype
        self.attn_elem_bytes = KV_ELEM_BYTES[kv]
        ad = p.decode_attention(kv)
        a = DecodeAttentionFit(ad.c0_us, ad.per_item_us / cs, ad.bw_gbs * bs)
        bw = a.bw_gbs * 1e9  # bytes per s
        # decode attention of the model (dec_) and of the draft (ddec_): fixed, per sequence, per context token
        coeffs = {}
        for prefix, shape in (("dec", p.model), ("ddec", p.draft)):
            kvh = max(1, shape.kv_heads // p.tp)
            coeffs[prefix] = (shape.layers * a.c0_us * 1e-6 * scale, shape.layers * a.per_item_us * kvh * 1e-6 * scale,
                              shape.kv_bytes_per_token(p.tp, kv) / bw * scale)
        self.dec_c0, self.dec_seq, self.dec_ctx = coeffs["dec"]
        self.ddec_c0, self.ddec_seq, self.ddec_ctx = coeffs["ddec"]
        self.pre_layers = p.model.layers * scale * 1e-6
        self.pre_fit = _lane(p.prefill_attention(kv), cs, bs)
        self.heads = max(1, p.model.heads // p.tp)
        self.kv_heads = max(1, p.model.kv_heads // p.tp)
        self.head_dim = p.model.head_dim
        x = p.kv_transfer
        self.xfer_c0 = x.c0_us * 1e-6
        self.xfer_per_token = p.model.kv_bytes_per_token(p.tp, kv) / (x.bw_gbs * 1e9)

    def decode_attention_s(self, seqs: int, ctx_sum: float) -> float:
        if seqs <= 0:
            return 0.0
        return self.dec_c0 + self.dec_seq * seqs + self.dec_ctx * ctx_sum

    def draft_s(self, seqs: int, ctx_sum: float, depth: int) -> float:
        """`depth` sequential draft-model steps proposing one token for each of `seqs` sequences."""
        if seqs <= 0 or depth <= 0:
            return 0.0
        one = (self.t_fixed_draft + self.draft_dense[seqs] + self.draft_head[seqs] + self.ddec_c0
               + self.ddec_seq * seqs + self.ddec_ctx * ctx_sum)
        return depth * one

    def prefill_attention_s(self, chunks: list[tuple[int, int]]) -> float:
        """Causal attention for prefill chunks given as (new tokens, tokens already cached)."""
        if not chunks:
            return 0.0
        # scalar form of forms.prefill_attention_work (numpy on scalars is slow on this path)
        q_elems = kv_elems = flop_units = 0.0
        for c, ctx in chunks:
            q_elems += c
            kv_elems += ctx + c
            flop_units += c * (ctx + (c + 1) * 0.5)
        h, kvh, hd = self.heads, self.kv_heads, self.head_dim
        nbytes = self.attn_elem_bytes * (2.0 * q_elems * h * hd + 2.0 * kv_elems * kvh * hd)
        flops = 4.0 * h * hd * flop_units
        return self.pre_layers * self.pre_fit.us(nbytes, flops)  # the fitted form itself, on floats

    def iteration_s(self, decode_seqs: int, ctx_sum: float, depth: int, chunks: list[tuple[int, int]],
                    prefill_tokens: int, sampled_prefills: int) -> float:
        """One iteration: `decode_seqs` decoding (verifying depth+1 tokens each) plus prefill chunks."""
        q = decode_seqs * (depth + 1)
        t = self.t_fixed + self.dense[q + prefill_tokens] + self.head[q + sampled_prefills]
        if decode_seqs:
            t += self.decode_attention_s(decode_seqs, ctx_sum) + self.draft_s(decode_seqs, ctx_sum, depth)
        if chunks:
            t += self.prefill_attention_s(chunks)
        return t

    def decode_slope(self, depth: int, decode_seqs: int = 1) -> float:
        """d(iteration time)/d(summed context) of a decode iteration (target + draft KV streams); the same
        for any batch (`decode_seqs`, which a measured table's context cost may depend on)."""
        return self.dec_ctx + (depth * self.ddec_ctx if depth > 0 else 0.0)

    def transfer_s(self, tokens: int) -> float:
        """Moving one request's KV (`tokens` tokens) from the prefill to the decode partition."""
        return self.xfer_c0 + tokens * self.xfer_per_token


class IterationModel(Protocol):
    """What the engine asks of an iteration-time model: `StepTimeModel` (kernel fits) or
    `sim.measured_step.MeasuredStepModel` (a profile fitted to another engine's records)."""

    def iteration_s(self, decode_seqs: int, ctx_sum: float, depth: int, chunks: list[tuple[int, int]],
                    prefill_tokens: int, sampled_prefills: int) -> float: ...

    def decode_slope(self, depth: int, decode_seqs: int = 1) -> float: ...

    def transfer_s(self, tokens: int) -> float: ...


@lru_cache(maxsize=64)
def step_model(profile_id: str, tier: str, lane: str = "unified") -> StepTimeModel:
    p = load_profile(profile_id)
    return StepTimeModel(p, tier, *lane_shares(p, lane))
