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

Output: one CSV row per measurement (phase, batch, context, prompt, tokens, latency_ms, p10_ms,
p90_ms, repeats) and a JSON sidecar with the device, the software versions and the date.
torch is needed only here (on the GPU machine), never by the package.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


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
}


class Decoder:
    """The weights and one forward pass; the KV cache is passed in so graphs can capture it."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype = torch.bfloat16):
        self.s = s
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
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)
        inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim))
        self.inv_freq = inv

    def rotary(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: [b, h, t, d]; pos: [b, t]
        f = pos[..., None].float() * self.inv_freq  # [b, t, d/2]
        cos, sin = f.cos()[:, None].to(x.dtype), f.sin()[:, None].to(x.dtype)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]] | None,
                sample_rows: torch.Tensor) -> torch.Tensor:
        """ids/pos: [b, t]. caches: per layer (k, v) of [b, kv_heads, ctx + t, d] whose last t slots
        receive this pass's keys (decode), or None (prefill: attend within the prompt only)."""
        s = self.s
        b, t = ids.shape
        x = torch.nn.functional.embedding(ids % s.vocab, self.lm_head)  # [b, t, hidden]
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), L["ln1"], 1e-5)
            qkv = h @ L["qkv"].t()
            q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
            q = self.rotary(q.view(b, t, s.heads, s.head_dim).transpose(1, 2), pos)
            k = self.rotary(k.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2), pos)
            v = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            if caches is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                kc, vc = caches[i]
                kc[:, :, -t:].copy_(k)
                vc[:, :, -t:].copy_(v)
                a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, t, -1) @ L["o"].t()
            h = F.rms_norm(x, (s.hidden,), L["ln2"], 1e-5)
            gu = h @ L["gate_up"].t()
            gate, up = gu.chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ L["down"].t()
        last = F.rms_norm(x.reshape(b * t, -1)[sample_rows], (s.hidden,), self.norm, 1e-5)
        logits = last @ self.lm_head.t()
        return torch.argmax(logits.float(), dim=-1)


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


def row(phase: str, batch: int, context: int, prompt: int, ms: list[float]) -> dict:
    ms = sorted(ms)
    q = statistics.quantiles(ms, n=10) if len(ms) >= 2 else [ms[0]] * 9
    return {"phase": phase, "batch": batch, "context": context, "prompt": prompt,
            "tokens": batch * (prompt if phase == "prefill" else 1),
            "latency_ms": round(statistics.median(ms), 4), "p10_ms": round(q[0], 4), "p90_ms": round(q[-1], 4),
            "repeats": len(ms)}


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


def measure_decode(m: Decoder, batch: int, context: int, repeats: int, dev: torch.device) -> dict:
    s = m.s
    caches = [
        (torch.randn(batch, s.kv_heads, context + 1, s.head_dim, device=dev, dtype=torch.bfloat16),
         torch.randn(batch, s.kv_heads, context + 1, s.head_dim, device=dev, dtype=torch.bfloat16))
        for _ in range(s.layers)
    ]
    ids = torch.randint(0, s.vocab, (batch, 1), device=dev)
    pos = torch.full((batch, 1), context, device=dev)
    rows = torch.arange(batch, device=dev)
    graph = capture(lambda: m.forward(ids, pos, caches, rows))
    ms = timed(graph.replay, repeats)
    del graph
    caches.clear()
    return row("decode", batch, context, 0, ms)


def measure_prefill(m: Decoder, batch: int, prompt: int, repeats: int, dev: torch.device) -> dict:
    ids = torch.randint(0, m.s.vocab, (batch, prompt), device=dev)
    pos = torch.arange(prompt, device=dev).expand(batch, prompt)
    rows = torch.arange(batch, device=dev) * prompt + (prompt - 1)  # the last token of each prompt samples
    eager = timed(lambda: m.forward(ids, pos, None, rows), repeats)
    graph = capture(lambda: m.forward(ids, pos, None, rows))
    ms = timed(graph.replay, repeats)
    del graph
    return [row("prefill", batch, 0, prompt, ms), row("prefill_eager", batch, 0, prompt, eager)]


def grid(quick: bool, kv_bytes_per_token: int, kv_room: float) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    batches = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    contexts = [512, 2048] if quick else [128, 512, 1024, 2048, 4096, 8192]
    decode = [(b, c) for b in batches for c in contexts if b * (c + 1) * kv_bytes_per_token <= kv_room]
    prompts = [128, 1024] if quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    prefill = [(1, p) for p in prompts] + ([] if quick else [(4, 512), (8, 256), (16, 128), (4, 1024), (2, 2048)])
    return decode, prefill


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default="llama3.1-8b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a small grid (smoke test)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    s = SHAPES[args.model]
    with torch.inference_mode():
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
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
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
