"""Measure real engine-iteration times on a GPU: a Llama-shaped decoder with random weights.

    python scripts/measure_gpu_steps.py --model llama3.1-8b --out steps.csv [--quick]

Why random weights: an iteration's time depends on the tensor shapes, not on the values, and no
checkpoint may be downloaded here. The model is built from the same shapes the simulator's
profiles use (layers, hidden, heads, KV heads, head dim, intermediate, vocab), in bf16, and runs
what one vLLM iteration runs: RMSNorm, fused QKV, rotary, attention against a KV cache, output
projection, SwiGLU MLP, final norm, LM head and greedy sampling for the rows that sample.

What is timed (CUDA events, median of repeated runs after warm-up):

- decode: `batch` sequences, each with `context` cached tokens, one new token each; replayed from
  a CUDA graph, as vLLM runs decode, so host overhead is what a graph replay costs.
- prefill: `batch` prompts of `prompt` tokens each (no cache), from a CUDA graph (vLLM V1 graphs
  prefill piecewise) and, as `prefill_eager`, eagerly: the gap is Python's launch overhead.

Attention is PyTorch's scaled_dot_product_attention (FlashAttention-2 backend for prefill), not
vLLM's paged kernels: the figures stand for "this GPU, these shapes, stock PyTorch kernels". The
`llama3.1-70b-tp4` shape is one tensor-parallel shard (a quarter of the heads and MLP) without the
all-reduces, which the simulator prices from its own kernel table.

`--extras` measures instead what the simulator prices from assumptions or other kernels' fits, each
from a CUDA graph (written to `--out` with a `tier` and `depth` column):

- `verify`: speculative decoding's target pass, `batch` sequences each verifying `depth`+1 tokens
  (causal among themselves) against `context` cached tokens, every row sampling.
- `draft`: one decode step of the draft model's shape (Llama-3.2-1B) at `batch` x `context`.
- `cached_prefill`: one prompt of `prompt` new tokens after `context` tokens served from the prefix
  cache (attention reads both; the GEMMs see only the new ones).
- `mixed`: one chunked-prefill iteration as vLLM schedules it: `batch` decodes at `context` plus one
  fresh prompt chunk of `prompt` tokens, the GEMMs over all rows, attention per part.
- `linear`: the linear layers alone (QKV, O, gate/up, down of every layer) for `batch` tokens in each
  quantization tier: FP16 (bf16 weights), INT8 (FP8 e4m3 weights and activations, per-tensor scales,
  `torch._scaled_mm`, rows padded to a multiple of 16), INT4 (4-bit weights, group 128, bf16
  activations: PyTorch's tinygemm `_weight_int4pack_mm`, not vLLM's Marlin).
- `decode` / `prefill` with `tier` INT8 or INT4: whole iterations with those linear layers (the KV
  cache stays bf16: SDPA has no FP8 cache).

Output: one CSV row per measurement (phase, batch, context, prompt, tokens, latency_ms, p10_ms,
p90_ms, repeats) and a JSON sidecar with the device, the software versions and the date.
torch is needed only here (on the GPU machine), never by the package.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


# Per-GPU shapes; the 70B entry is one of four tensor-parallel shards (heads, KV heads, MLP and
# vocab split four ways), matching sim/profiles/h100-llama3.1-70b-tp4.json.
SHAPES = {
    "llama3.1-8b": Shape(32, 4096, 32, 8, 128, 14336, 128256),
    "llama3.1-70b-tp4": Shape(80, 8192, 64 // 4, 8 // 4, 128, 28672 // 4, 128256 // 4),
    # the profiles' draft model (speculative decoding), Llama-3.2-1B
    "llama3.2-1b": Shape(16, 2048, 32, 8, 64, 8192, 128256),
}
LINEARS = ("qkv", "o", "gate_up", "down")
@functools.cache
def compiled_flex():
    """FlexAttention, compiled once (uncompiled it runs a slow reference path)."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = 64  # one compile per shape; the grid has 20
    return torch.compile(flex_attention, dynamic=False)
INT4_GROUP = 128


class Decoder:
    """The weights and one forward pass; the KV cache is passed in so graphs can capture it."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                 tiers: tuple[str, ...] = ()):
        self.s = s
        self.tier = "FP16"
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device=device, dtype=dtype) / math.sqrt(shape[-1]))

        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = [
            {
                "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(q + 2 * kv, s.hidden),
                "o": w(s.hidden, q),
                "ln2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            for _ in range(s.layers)
        ]
        # the other tiers' forms of each linear layer (values random: only the shapes and formats matter)
        self.forms: dict[str, list[dict[str, tuple]]] = {}
        for tier in tiers:
            self.forms[tier] = [{n: quantized(L[n], tier, g) for n in LINEARS} for L in self.layers]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)
        inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim))
        self.inv_freq = inv

    def lin(self, x: torch.Tensor, i: int, name: str) -> torch.Tensor:
        """x [..., k] through layer i's linear `name` in the current tier."""
        if self.tier == "FP16":
            return x @ self.layers[i][name].t()
        return quantized_mm(x, self.forms[self.tier][i][name], self.tier)

    def rotary(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: [b, h, t, d]; pos: [b, t]
        f = pos[..., None].float() * self.inv_freq  # [b, t, d/2]
        cos, sin = f.cos()[:, None].to(x.dtype), f.sin()[:, None].to(x.dtype)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def qkv(self, h: torch.Tensor, i: int, b: int, t: int, pos: torch.Tensor):
        s = self.s
        q, k, v = self.lin(h, i, "qkv").split([s.heads * s.head_dim, s.kv_heads * s.head_dim,
                                               s.kv_heads * s.head_dim], dim=-1)
        q = self.rotary(q.reshape(b, t, s.heads, s.head_dim).transpose(1, 2), pos)
        k = self.rotary(k.reshape(b, t, s.kv_heads, s.head_dim).transpose(1, 2), pos)
        v = v.reshape(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        return q, k, v

    def attend(self, q, k, v, cache, mask):
        """Attention of this pass's queries: within themselves (cache None, causal) or against a cache
        whose last t slots receive this pass's keys (`mask` [t, ctx + t] when t > 1: causal on the new
        tokens, every cached one visible)."""
        if cache is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        kc, vc = cache
        t = q.shape[2]
        kc[:, :, -t:].copy_(k)
        vc[:, :, -t:].copy_(v)
        if mask is not None and type(mask).__name__ == "BlockMask":
            return compiled_flex()(q, kc, vc, block_mask=mask, enable_gqa=True)
        return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)

    def mlp_residual(self, x: torch.Tensor, a: torch.Tensor, i: int) -> torch.Tensor:
        s = self.s
        x = x + self.lin(a, i, "o")
        h = F.rms_norm(x, (s.hidden,), self.layers[i]["ln2"], 1e-5)
        gate, up = self.lin(h, i, "gate_up").chunk(2, dim=-1)
        return x + self.lin(F.silu(gate) * up, i, "down")

    def sample(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        last = F.rms_norm(x.reshape(-1, self.s.hidden)[rows], (self.s.hidden,), self.norm, 1e-5)
        return torch.argmax((last @ self.lm_head.t()).float(), dim=-1)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]] | None,
                sample_rows: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids/pos: [b, t]. caches: per layer (k, v) of [b, kv_heads, ctx + t, d] whose last t slots
        receive this pass's keys (decode, verify, cached prefill), or None (prefill: attend within the
        prompt only)."""
        s = self.s
        b, t = ids.shape
        x = torch.nn.functional.embedding(ids % s.vocab, self.lm_head)  # [b, t, hidden]
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), L["ln1"], 1e-5)
            q, k, v = self.qkv(h, i, b, t, pos)
            a = self.attend(q, k, v, None if caches is None else caches[i], mask)
            x = self.mlp_residual(x, a.transpose(1, 2).reshape(b, t, -1), i)
        return self.sample(x, sample_rows)

    def forward_mixed(self, dec_ids: torch.Tensor, dec_pos: torch.Tensor, caches: list, pre_ids: torch.Tensor,
                      pre_pos: torch.Tensor, sample_rows: torch.Tensor) -> torch.Tensor:
        """One chunked-prefill iteration: b decode rows ([b, 1], against `caches`) and one fresh prompt
        chunk ([1, p]) share every linear layer; attention runs per part."""
        s = self.s
        b, p = dec_ids.shape[0], pre_ids.shape[1]
        x = torch.nn.functional.embedding(torch.cat([dec_ids.reshape(-1), pre_ids.reshape(-1)]) % s.vocab,
                                          self.lm_head)  # [b + p, hidden]
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), L["ln1"], 1e-5)
            hd, hp = h[:b].reshape(b, 1, -1), h[b:].reshape(1, p, -1)
            qd, kd, vd = self.qkv(hd, i, b, 1, dec_pos)
            qp, kp, vp = self.qkv(hp, i, 1, p, pre_pos)
            ad = self.attend(qd, kd, vd, caches[i], None).transpose(1, 2).reshape(b, -1)
            ap = self.attend(qp, kp, vp, None, None).transpose(1, 2).reshape(p, -1)
            x = self.mlp_residual(x, torch.cat([ad, ap]), i)
        return self.sample(x, sample_rows)


def quantized(w: torch.Tensor, tier: str, g: torch.Generator) -> tuple:
    """Layer weight w [n, k] (bf16) in `tier`'s storage format."""
    n, k = w.shape
    if tier == "INT8":  # FP8 e4m3, per-tensor scale; _scaled_mm wants the weight column-major: w.t()
        return (w.to(torch.float8_e4m3fn), torch.ones((), device=w.device, dtype=torch.float32))
    if tier == "INT4":  # random 4-bit codes packed two per byte, tinygemm's layout; scales and zeros per group
        codes = torch.randint(0, 256, (n, k // 2), generator=g, device=w.device, dtype=torch.uint8)
        packed = torch._convert_weight_to_int4pack(codes, 8)
        sz = torch.rand(k // INT4_GROUP, n, 2, generator=g, device=w.device).to(torch.bfloat16) * 0.01
        return (packed, sz)
    raise ValueError(f"unknown tier {tier!r}")


def quantized_mm(x: torch.Tensor, form: tuple, tier: str) -> torch.Tensor:
    """x [..., k] (bf16) times a quantized weight, out bf16 [..., n]."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if tier == "INT8":
        wq, scale = form
        pad = (-m) % 16  # _scaled_mm wants rows in multiples of 16
        if pad:
            x2 = F.pad(x2, (0, 0, 0, pad))
        y = torch._scaled_mm(x2.to(torch.float8_e4m3fn), wq.t(), scale_a=scale, scale_b=scale,
                             out_dtype=torch.bfloat16)[:m]
    else:
        packed, sz = form
        y = torch._weight_int4pack_mm(x2.contiguous(), packed, INT4_GROUP, sz)
    return y.reshape(*lead, y.shape[-1])


def timed(fn, repeats: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def row(phase: str, batch: int, context: int, prompt: int, ms: list[float], **extra: object) -> dict:
    ms = sorted(ms)
    q = statistics.quantiles(ms, n=10) if len(ms) >= 2 else [ms[0]] * 9
    # every row the GEMMs see (prefill_eager keeps the count its 2026-11-23 rows were written with)
    tokens = {"prefill": batch * prompt, "verify": batch * (int(extra.get("depth", 0)) + 1),
              "cached_prefill": prompt, "mixed": batch + prompt}.get(phase, batch)
    out = {"phase": phase, "batch": batch, "context": context, "prompt": prompt, "tokens": tokens}
    out.update(extra)
    out.update({"latency_ms": round(statistics.median(ms), 4), "p10_ms": round(q[0], 4),
                "p90_ms": round(q[-1], 4), "repeats": len(ms)})
    return out


def capture(fn) -> torch.cuda.CUDAGraph:
    """`fn` captured as a CUDA graph (after warm-up on a side stream, as capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def kv_caches(m: Decoder, batch: int, slots: int, dev: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    s = m.s
    return [(torch.randn(batch, s.kv_heads, slots, s.head_dim, device=dev, dtype=torch.bfloat16),
             torch.randn(batch, s.kv_heads, slots, s.head_dim, device=dev, dtype=torch.bfloat16))
            for _ in range(s.layers)]


def graphed_ms(fn, repeats: int) -> list[float]:
    graph = capture(fn)
    ms = timed(graph.replay, repeats)
    del graph
    return ms


def measure_decode(m: Decoder, batch: int, context: int, repeats: int, dev: torch.device, phase: str = "decode",
                   **extra: object) -> dict:
    caches = kv_caches(m, batch, context + 1, dev)
    ids = torch.randint(0, m.s.vocab, (batch, 1), device=dev)
    pos = torch.full((batch, 1), context, device=dev)
    rows = torch.arange(batch, device=dev)
    ms = graphed_ms(lambda: m.forward(ids, pos, caches, rows), repeats)
    caches.clear()
    return row(phase, batch, context, 0, ms, **extra)


def measure_prefill(m: Decoder, batch: int, prompt: int, repeats: int, dev: torch.device) -> list[dict]:
    ids = torch.randint(0, m.s.vocab, (batch, prompt), device=dev)
    pos = torch.arange(prompt, device=dev).expand(batch, prompt)
    rows = torch.arange(batch, device=dev) * prompt + (prompt - 1)  # the last token of each prompt samples
    eager = timed(lambda: m.forward(ids, pos, None, rows), repeats)
    ms = graphed_ms(lambda: m.forward(ids, pos, None, rows), repeats)
    return [row("prefill", batch, 0, prompt, ms), row("prefill_eager", batch, 0, prompt, eager)]


def new_token_mask(t: int, context: int, dev: torch.device, attention: str = "mask"):
    """Every cached key visible, causal among the t new tokens: a boolean [t, context + t] mask ("mask"),
    PyTorch's lower-right causal bias ("lower_right"), which SDPA runs on its flash / memory-efficient
    kernels without building a mask (as a serving engine's attention does), or a block mask for
    FlexAttention ("flex"), whose compiled kernel splits the KV cache for short queries (flex decoding)."""
    if attention == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        def visible(b, h, q, k):
            return k <= context + q

        return create_block_mask(visible, None, None, t, context + t, device=dev)
    if attention == "lower_right":
        return causal_lower_right(t, context + t)
    q = torch.arange(t, device=dev)[:, None]
    k = torch.arange(context + t, device=dev)[None, :]
    return k <= context + q


def measure_cached(m: Decoder, phase: str, batch: int, context: int, t: int, repeats: int, dev: torch.device,
                   attention: str = "mask", **extra: object) -> dict:
    """`batch` sequences, each running t new tokens after `context` cached ones: the verify pass
    (t = depth + 1, every row samples) or a cached prefill (batch 1, t = the prompt, one row samples)."""
    caches = kv_caches(m, batch, context + t, dev)
    ids = torch.randint(0, m.s.vocab, (batch, t), device=dev)
    pos = (context + torch.arange(t, device=dev)).expand(batch, t)
    mask = new_token_mask(t, context, dev, attention)
    rows = (torch.arange(batch * t, device=dev) if phase == "verify"
            else torch.arange(batch, device=dev) * t + (t - 1))
    ms = graphed_ms(lambda: m.forward(ids, pos, caches, rows, mask), repeats)
    caches.clear()
    return row(phase, batch, context, 0 if phase == "verify" else t, ms, **extra)


def measure_mixed(m: Decoder, batch: int, context: int, prompt: int, repeats: int, dev: torch.device) -> dict:
    caches = kv_caches(m, batch, context + 1, dev)
    dec_ids = torch.randint(0, m.s.vocab, (batch, 1), device=dev)
    dec_pos = torch.full((batch, 1), context, device=dev)
    pre_ids = torch.randint(0, m.s.vocab, (1, prompt), device=dev)
    pre_pos = torch.arange(prompt, device=dev)[None]
    rows = torch.cat([torch.arange(batch, device=dev), torch.tensor([batch + prompt - 1], device=dev)])
    ms = graphed_ms(lambda: m.forward_mixed(dec_ids, dec_pos, caches, pre_ids, pre_pos, rows), repeats)
    caches.clear()
    return row("mixed", batch, context, prompt, ms, tier="FP16", depth=0)


def measure_linear(m: Decoder, tokens: int, repeats: int, dev: torch.device) -> dict:
    """Every linear layer of every layer for `tokens` rows in the decoder's current tier."""
    s = m.s
    xh = torch.randn(tokens, s.hidden, device=dev, dtype=torch.bfloat16)
    xq = torch.randn(tokens, s.heads * s.head_dim, device=dev, dtype=torch.bfloat16)
    xi = torch.randn(tokens, s.intermediate, device=dev, dtype=torch.bfloat16)

    def stack() -> None:
        for i in range(s.layers):
            m.lin(xh, i, "qkv")
            m.lin(xq, i, "o")
            m.lin(xh, i, "gate_up")
            m.lin(xi, i, "down")

    return row("linear", tokens, 0, 0, graphed_ms(stack, repeats), tier=m.tier, depth=0)


def grid(quick: bool, kv_bytes_per_token: int, kv_room: float) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    batches = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    contexts = [512, 2048] if quick else [128, 512, 1024, 2048, 4096, 8192]
    decode = [(b, c) for b in batches for c in contexts if b * (c + 1) * kv_bytes_per_token <= kv_room]
    prompts = [128, 1024] if quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    prefill = [(1, p) for p in prompts] + ([] if quick else [(4, 512), (8, 256), (16, 128), (4, 1024), (2, 2048)])
    return decode, prefill


EXTRA_PHASES = ("linear", "tier_decode", "tier_prefill", "verify", "draft", "cached_prefill", "mixed")
EXTRA_FIELDS = ["phase", "tier", "depth", "batch", "context", "prompt", "tokens", "latency_ms", "p10_ms", "p90_ms",
                "repeats"]


def extras(m: Decoder, draft: Decoder | None, repeats: int, quick: bool, dev: torch.device, emit,
           phases: frozenset[str] = frozenset(EXTRA_PHASES), attention: str = "mask") -> None:
    """The extra phases, most wanted first (a run cut short keeps what it measured); a phase whose kernel
    this GPU or PyTorch lacks is reported and skipped."""
    ctx = 1024
    tokens = [1, 32, 512] if quick else [1, 8, 32, 128, 512, 2048]
    batches = [1, 32] if quick else [1, 8, 32, 128]

    def attempt(label: str, fn, *args: object, **kw: object) -> None:
        if label.split()[0] not in phases:
            return
        try:
            emit(fn(*args, **kw))
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
            print(f"skipped {label}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        torch.cuda.empty_cache()

    for tier in ("FP16", *m.forms):
        m.tier = tier
        for n in tokens:
            attempt(f"linear {tier} m={n}", measure_linear, m, n, repeats, dev)
        for b in batches:
            attempt(f"tier_decode {tier} b={b}", measure_decode, m, b, ctx, repeats, dev, tier=tier, depth=0)
        for n in [512] if quick else [512, 2048]:
            attempt(f"tier_prefill {tier} p={n}", measure_cached, m, "cached_prefill", 1, 0, n, repeats, dev, attention,
                    tier=tier, depth=0)
    m.tier = "FP16"
    flexed = attention == "flex"  # depth 0 too: the decode baseline through the same kernel
    for b in [1, 32] if quick else [1, 8, 32, 64]:
        for d in [1, 4] if quick else [0, 1, 2, 4, 8] if flexed else [1, 2, 4, 8]:
            attempt(f"verify b={b} depth={d}", measure_cached, m, "verify", b, ctx, d + 1, repeats, dev, attention,
                    tier="FP16", depth=d)
    if draft is not None:
        for b, c in [(1, ctx), (32, ctx)] if quick else [(1, ctx), (8, ctx), (32, ctx), (64, ctx), (128, ctx),
                                                         (1, 4096), (32, 4096)]:
            attempt(f"draft b={b} ctx={c}", measure_decode, draft, b, c, repeats, dev, tier="FP16", depth=0,
                    phase="draft")
    for n in [512] if quick else [128, 512, 2048]:
        for c in [0, 4096] if quick else [1024, 4096, 16384]:
            attempt(f"cached_prefill p={n} ctx={c}", measure_cached, m, "cached_prefill", 1, c, n, repeats, dev,
                    attention, tier="FP16", depth=0)
    for b, n in [(32, 512)] if quick else [(8, 2040), (32, 2016), (128, 1920), (8, 512), (32, 512), (128, 512)]:
        attempt(f"mixed b={b} p={n}", measure_mixed, m, b, ctx, n, repeats, dev)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default="llama3.1-8b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a small grid (smoke test)")
    ap.add_argument("--extras", action="store_true",
                    help="the extra phases (verify, draft, cached_prefill, mixed, linear and the INT8/INT4 tiers)")
    ap.add_argument("--draft-model", choices=sorted(SHAPES), default="llama3.2-1b")
    ap.add_argument("--phases", default=",".join(EXTRA_PHASES),
                    help=f"with --extras, which of {', '.join(EXTRA_PHASES)} (comma-separated)")
    how = ap.add_mutually_exclusive_group()  # how verify and cached_prefill attend (default: a boolean mask)
    how.add_argument("--lower-right", dest="attention", action="store_const", const="lower_right", default="mask",
                     help="with --extras, verify and cached_prefill attend through PyTorch's lower-right causal bias "
                          "(flash / memory-efficient kernels) instead of a boolean mask")
    how.add_argument("--flex", dest="attention", action="store_const", const="flex",
                     help="with --extras, verify and cached_prefill attend through compiled FlexAttention (split-KV "
                          "decoding kernel for short queries); verify also at depth 0, the decode baseline")
    args = ap.parse_args(argv)
    unknown = set(args.phases.split(",")) - set(EXTRA_PHASES)
    if unknown:
        ap.error(f"--phases: unknown {', '.join(sorted(unknown))}; allowed: {', '.join(EXTRA_PHASES)}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    s = SHAPES[args.model]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        if args.extras:
            m = Decoder(s, dev, tiers=("INT8", "INT4"))
            draft = Decoder(SHAPES[args.draft_model], dev)
            total = torch.cuda.mem_get_info()[1]
            with args.out.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=EXTRA_FIELDS)
                w.writeheader()
                count = 0

                def emit(r: dict) -> None:
                    nonlocal count
                    w.writerow(r)
                    f.flush()
                    count += 1
                    print(f"{r['phase']:15s} {r['tier']:5s} b={r['batch']:4d} ctx={r['context']:6d} "
                          f"prompt={r['prompt']:5d} depth={r['depth']}: {r['latency_ms']:9.3f} ms", flush=True)

                extras(m, draft, args.repeats, args.quick, dev, emit, frozenset(args.phases.split(",")),
                       args.attention)
            rows_written = count
        else:
            m = Decoder(s, dev)
            free, total = torch.cuda.mem_get_info()
            kv_bytes = 2 * 2 * s.layers * s.kv_heads * s.head_dim
            decode, prefill = grid(args.quick, kv_bytes, 0.8 * free - 4 * 2**30)
            rows = []
            for b, p in prefill:
                graphed, eager = measure_prefill(m, b, p, args.repeats, dev)
                rows += [graphed, eager]
                print(f"prefill b={b:4d} prompt={p:5d}: {graphed['latency_ms']:9.3f} ms "
                      f"(eager {eager['latency_ms']:.3f} ms)", flush=True)
                torch.cuda.empty_cache()
            for b, c in decode:
                rows.append(measure_decode(m, b, c, args.repeats, dev))
                print(f"decode  b={b:4d} ctx={c:5d}: {rows[-1]['latency_ms']:9.3f} ms", flush=True)
                torch.cuda.empty_cache()
            with args.out.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            rows_written = len(rows)
    meta = {
        "model_shape": args.model, "shape": asdict(s), "dtype": "bfloat16", "weights": "random (seed 0)",
        "device": torch.cuda.get_device_name(), "memory_total_gib": round(total / 2**30, 2),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "attention": "torch.nn.functional.scaled_dot_product_attention (enable_gqa)",
        "decode": "CUDA graph replay", "prefill": "CUDA graph replay; prefill_eager rows: eager",
        "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
        # a tensor-parallel shard on one GPU runs no all-reduce (sim.calibration.step_fit leaves them out too)
        "includes_allreduce": not args.model.endswith(tuple(f"-tp{n}" for n in (2, 4, 8))),
    }
    if args.extras:
        meta.update({
            "prefill": "CUDA graph replay", "draft_model_shape": args.draft_model,
            "draft_shape": asdict(SHAPES[args.draft_model]),
            "tiers": {"INT8": "FP8 e4m3 weights and activations, per-tensor scales, torch._scaled_mm",
                      "INT4": f"4-bit weights, group {INT4_GROUP}, bf16 activations, torch._weight_int4pack_mm"},
            "kv_cache": "bfloat16 in every tier",
            "masked_attention": {
                "flex": "verify and cached_prefill: compiled FlexAttention with a block mask",
                "lower_right": "verify and cached_prefill: torch.nn.attention.bias.causal_lower_right",
                "mask": "verify and cached_prefill pass a boolean [t, ctx + t] mask to SDPA"}[args.attention],
            "phases": args.phases,
        })
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {rows_written} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
