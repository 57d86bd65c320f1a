"""Prefix caching: the simulator's hit rate on Mooncake's trace against the paper's, TTFT with and without
the cache, and what caching costs the simulator's speed.

    python bench/prefix_cache.py [--speedup 0.5] [--repeats 3] [--window-s 10]

1. Hit rate. The whole Mooncake conversation trace (12,031 requests, shared/data, its 512-token
   `hash_ids`) replayed through one replica of `h100-llama3.1-8b` (vLLM-like defaults: 256 sequences,
   FP16, no speculation, 90 % of memory), at `--speedup` times its own pace (the trace offers ~42k
   prompt tokens/s at 1x; at 0.5x one 8B replica keeps up only with the cache), under three KV pools:
   - "enough memory": the GPU's memory scaled (a counterfactual profile) until the pool holds 50M
     tokens, the capacity at which the paper's Figure 9 says its workloads nearly reach their
     theoretical maximum hit rate;
   - 3M tokens: the paper's per-node local cache (its Figure 9's dashed line);
   - the real H100 80GB pool (~0.45M tokens).
   Hit rate = prompt tokens served from cache / prompt tokens, over every request's first admission.
   Against: Qin et al., "Mooncake: Trading More Storage for Less Computation - A KVCache-centric
   Architecture for Serving LLM Chatbot", FAST 2025 (kvcache-ai/Mooncake FAST25-release), Table 2
   "Workload Statistics": Conversation cache ratio 40 % (avg input 12035, output 343, 12031
   requests). And the ceiling an infinite cache gives on the same trace (shared.prefix.ideal_hit_rate).
2. TTFT with the cache on and off: the same Mooncake replay (enough memory) and the synthetic
   multi-turn chat (shared.prefix.MultiTurnSpec defaults, 600 s), mean and p50 TTFT; and one request
   with a 2,048-token shared prefix + 200 new tokens, alone on the GPU, cold and warm.
3. Speed: CPU time (time.process_time, best of `--repeats`) of `run_window` over the same arrivals with
   prefix ids (cache on) and without (None: the seed's path), on a 900 s Mooncake stretch and the
   multi-turn workload at the real H100 pool; plus unique ids (the cache's bookkeeping with no hit,
   so no work saved) against none. speed ratio = CPU time off / CPU time on (1 = as fast; 0.8 = 20 %
   slower).
4. Routing: the Mooncake trace at `--cluster-speedup` pace on 4 replicas (H100 pools), routed by least
   outstanding work (cache_affinity None) and by cache affinity 0.25 / 0.5 / 1.0
   (shared/prefix_routing.py): cluster hit rate, mean and p99 TTFT.

Prints a table, then (last line) one flat JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence

import numpy as np
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.prefix import (
    MOONCAKE_PACKAGED,
    MultiTurnSpec,
    ideal_hit_rate,
    load_prefix_trace,
    multiturn_arrivals,
    packaged_path,
)
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.cluster import ClusterBackend
from llmserve_env.sim.profiles import GIB, load_profile

PUBLISHED_HIT_RATE = 0.40  # Mooncake FAST'25, Table 2, Conversation "Cache Ratio"
ENOUGH_TOKENS = 50_000_000  # Mooncake FAST'25, §5.3.1 / Figure 9: 50M tokens nearly reach the maximum
LOCAL_TOKENS = 3_000_000  # Mooncake FAST'25, Figure 9: a node's local DRAM cache
ACTION = ServeAction(batch_cap=256, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                     prefill_decode_split=False, priority_routing=False)


def mooncake_arrivals(speedup: float, duration_s: float | None = None, ids: bool = True) -> list[Arrival]:
    pt = load_prefix_trace(packaged_path(MOONCAKE_PACKAGED))
    tr = pt.trace
    out = []
    for i, (t, p, o, h) in enumerate(zip(tr.arrival_s.tolist(), tr.prompt_tokens.tolist(),
                                         tr.output_tokens.tolist(), pt.ids, strict=True)):
        if duration_s is not None and t / speedup >= duration_s:
            break
        out.append(Arrival(i, t / speedup, int(p), int(o), "trace", 1, h if ids else None, pt.block_tokens if ids else 0))
    return out


def profile_with_tokens(tokens: int | None):
    """h100-llama3.1-8b, its memory scaled so the pool (at ACTION's 90 %) holds `tokens` KV tokens (None: as is)."""
    p = load_profile("h100-llama3.1-8b")
    if tokens is None:
        return p
    per_token = p.kv_bytes_per_token(False, "FP16")
    need_gib = tokens * per_token / GIB / ACTION.kv_budget_fraction
    extra = need_gib - p.kv_capacity_gib("FP16", False)
    mem = p.memory_gib + max(0.0, extra) / p.gpu_memory_utilization
    return dataclasses.replace(p, memory_gib=mem)


def serve(arrivals: Sequence[Arrival], profile, window_s: float) -> tuple[dict, float]:
    """Serve every arrival (then drain); returns the totals and the CPU seconds run_window took."""
    b = SimBackend(profile)
    b.reset(0)
    end = max(a.arrival_s for a in arrivals)
    n_win = int(end // window_s) + 1
    per: list[list[Arrival]] = [[] for _ in range(n_win)]
    for a in arrivals:
        per[int(a.arrival_s // window_s)].append(a)
    hit = query = prompt = done = 0
    ttfts: list[float] = []
    cpu = 0.0
    k = 0
    while True:
        w = per[k] if k < n_win else []
        c0 = time.process_time()
        rep = b.run_window(ACTION, w, k * window_s, window_s)
        cpu += time.process_time() - c0
        hit += rep.prefix_hit_tokens
        query += rep.prefix_query_tokens
        prompt += rep.prompt_tokens
        ttfts += [x[2] for x in rep.first_tokens]
        done += len(rep.finished)
        k += 1
        if k >= n_win and not rep.pending:
            break
        if k > n_win + 2000:
            raise RuntimeError("the replica did not drain")
    return {"hit_rate": hit / query if query else 0.0, "prefilled": prompt, "finished": done,
            "ttft_mean_s": statistics.fmean(ttfts), "ttft_p50_s": float(np.median(ttfts)),
            "blocks": b._engine.kv.total, "evicted_units": b._engine.pcache.evicted}, cpu


def best_cpu(arrivals: Sequence[Arrival], profile, window_s: float, repeats: int) -> float:
    return min(serve(arrivals, profile, window_s)[1] for _ in range(repeats))


def strip(arrivals: Sequence[Arrival]) -> list[Arrival]:
    return [dataclasses.replace(a, prefix_ids=None, prefix_block_tokens=0) for a in arrivals]


def unique(arrivals: Sequence[Arrival]) -> list[Arrival]:
    """Ids nobody shares, at the engine's 16-token granularity: the cache's bookkeeping, no hit."""
    return [dataclasses.replace(a, prefix_ids=tuple(range(a.request_id << 20, (a.request_id << 20)
                                                          + (a.prompt_tokens + a.output_tokens) // 16)),
                                prefix_block_tokens=16) for a in arrivals]


def lone_ttft() -> tuple[float, float]:
    """TTFT of one 2,248-token request (2,048 shared + 200 new) alone: cold, then warm."""
    shared = tuple(range(128))
    b = SimBackend()
    b.reset(0)
    cold = Arrival(0, 0.0, 2248, 1, prefix_ids=shared + tuple(range(1000, 1012)), prefix_block_tokens=16)
    warm = Arrival(1, 5.0, 2248, 1, prefix_ids=shared + tuple(range(2000, 2012)), prefix_block_tokens=16)
    r1 = b.run_window(ACTION, [cold], 0.0, 5.0)
    r2 = b.run_window(ACTION, [warm], 5.0, 5.0)
    return r1.first_tokens[0][2], r2.first_tokens[0][2]


def route(arrivals: Sequence[Arrival], affinity: float | None, replicas: int, window_s: float) -> dict[str, float]:
    """The arrivals served by `replicas` replicas under one routing rule (then drained)."""
    b = ClusterBackend("h100-llama3.1-8b", replicas=(replicas, replicas), initial=replicas)
    b.reset(0)
    action = ACTION.model_copy(update={"replicas": replicas, "cache_affinity": affinity})
    end = max(a.arrival_s for a in arrivals)
    n_win = int(end // window_s) + 1
    per: list[list[Arrival]] = [[] for _ in range(n_win)]
    for a in arrivals:
        per[int(a.arrival_s // window_s)].append(a)
    hit = query = 0
    ttfts: list[float] = []
    k = 0
    while True:
        rep = b.run_window(action, per[k] if k < n_win else [], k * window_s, window_s)
        hit += rep.prefix_hit_tokens
        query += rep.prefix_query_tokens
        ttfts += [x[2] for x in rep.first_tokens]
        k += 1
        if k >= n_win and not rep.pending:
            break
        if k > n_win + 2000:
            raise RuntimeError("the cluster did not drain")
    return {"hit_rate": hit / query if query else 0.0, "ttft_mean_s": statistics.fmean(ttfts),
            "ttft_p99_s": float(np.percentile(ttfts, 99))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speedup", type=float, default=0.5, help="Mooncake replay pace (0.5: half its speed)")
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3, help="speed measurements: best of this many")
    ap.add_argument("--cluster-speedup", type=float, default=1.0, help="Mooncake pace for the routing runs")
    ap.add_argument("--cluster-s", type=float, default=1800.0, help="seconds of the trace the routing runs replay")
    args = ap.parse_args(argv)
    out: dict[str, float] = {}

    whole = mooncake_arrivals(args.speedup)
    ideal = ideal_hit_rate(whole)
    rows = []
    for label, tokens in (("enough memory (50M tokens)", ENOUGH_TOKENS), ("local cache (3M tokens)", LOCAL_TOKENS),
                          ("H100 80GB pool", None)):
        res, cpu = serve(whole, profile_with_tokens(tokens), args.window_s)
        rows.append((label, res["blocks"] * 16, res["hit_rate"], res["ttft_mean_s"], res["ttft_p50_s"], cpu))
        key = {ENOUGH_TOKENS: "", LOCAL_TOKENS: "_3m_tokens", None: "_h100"}[tokens]
        out[f"mooncake_hit_rate{key}"] = round(res["hit_rate"], 4)
        out[f"mooncake_pool_tokens{key}"] = res["blocks"] * 16
        if tokens == ENOUGH_TOKENS:
            out["mooncake_ttft_mean_s_on"] = round(res["ttft_mean_s"], 3)
            out["mooncake_ttft_p50_s_on"] = round(res["ttft_p50_s"], 3)
    off, _ = serve(strip(whole), profile_with_tokens(ENOUGH_TOKENS), args.window_s)
    out["mooncake_ttft_mean_s_off"] = round(off["ttft_mean_s"], 3)
    out["mooncake_ttft_p50_s_off"] = round(off["ttft_p50_s"], 3)
    out["mooncake_ideal_hit_rate"] = round(ideal, 4)
    out["published_hit_rate"] = PUBLISHED_HIT_RATE
    out["hit_rate_gap_points"] = round(100 * (out["mooncake_hit_rate"] - PUBLISHED_HIT_RATE), 2)

    print(f"Mooncake conversation trace, {len(whole)} requests at {args.speedup:g}x pace, one h100-llama3.1-8b replica")
    print(f"{'KV pool':<30} {'tokens':>12} {'hit rate':>9} {'TTFT mean s':>12} {'TTFT p50 s':>11} {'CPU s':>7}")
    for label, tokens, hr, tm, tp, cpu in rows:
        print(f"{label:<30} {tokens:>12,} {hr:>9.3f} {tm:>12.3f} {tp:>11.3f} {cpu:>7.2f}")
    print(f"{'cache off (enough memory)':<30} {'':>12} {'':>9} {off['ttft_mean_s']:>12.3f} {off['ttft_p50_s']:>11.3f}")
    print(f"infinite cache (ideal): {ideal:.3f}; published (Mooncake FAST'25 Table 2): {PUBLISHED_HIT_RATE:.2f}")

    spec = MultiTurnSpec()
    mt = multiturn_arrivals(spec, 600.0, 0)
    h100 = profile_with_tokens(None)
    mt_on, _ = serve(mt, h100, args.window_s)
    mt_off, _ = serve(strip(mt), h100, args.window_s)
    out["multiturn_ideal_hit_rate"] = round(ideal_hit_rate(mt), 4)
    out["multiturn_hit_rate"] = round(mt_on["hit_rate"], 4)
    out["multiturn_ttft_mean_s_on"] = round(mt_on["ttft_mean_s"], 4)
    out["multiturn_ttft_mean_s_off"] = round(mt_off["ttft_mean_s"], 4)
    cold, warm = lone_ttft()
    out["lone_ttft_cold_ms"], out["lone_ttft_warm_ms"] = round(1e3 * cold, 2), round(1e3 * warm, 2)
    print(f"\nmulti-turn chat ({len(mt)} requests in 600 s, H100 pool): hit rate {mt_on['hit_rate']:.3f} "
          f"(ideal {ideal_hit_rate(mt):.3f}); TTFT mean {mt_on['ttft_mean_s']:.3f} s on, {mt_off['ttft_mean_s']:.3f} s off")
    print(f"one 2,248-token request alone (2,048 cached): TTFT cold {1e3 * cold:.1f} ms, warm {1e3 * warm:.1f} ms")

    stretch = mooncake_arrivals(1.0, 900.0)
    speed_rows = []
    for name, arr, prof in (("mooncake 900 s", stretch, h100), ("multi-turn 600 s", mt, h100)):
        t_on = best_cpu(arr, prof, args.window_s, args.repeats)
        t_off = best_cpu(strip(arr), prof, args.window_s, args.repeats)
        t_uniq = best_cpu(unique(arr), prof, args.window_s, args.repeats)
        speed_rows.append((name, len(arr), t_off, t_on, t_uniq))
    (_, _, m_off, m_on, m_uniq), (_, _, t_off, t_on, t_uniq) = speed_rows
    out["speed_ratio_on_vs_off"] = round(m_off / m_on, 3)
    out["speed_ratio_multiturn_on_vs_off"] = round(t_off / t_on, 3)
    out["speed_ratio_unique_ids_vs_off"] = round(min(m_off / m_uniq, t_off / t_uniq), 3)
    print(f"\nspeed (CPU s of run_window, best of {args.repeats})")
    print(f"{'workload':<18} {'requests':>8} {'off':>7} {'on':>7} {'unique ids':>10} {'off/on':>7} {'off/unique':>10}")
    for name, n, a, b, c in speed_rows:
        print(f"{name:<18} {n:>8} {a:>7.2f} {b:>7.2f} {c:>10.2f} {a / b:>7.3f} {a / c:>10.3f}")

    trace = mooncake_arrivals(args.cluster_speedup, args.cluster_s)
    print(f"\nrouting: Mooncake, first {args.cluster_s:g} s at {args.cluster_speedup:g}x ({len(trace)} requests), "
          "4 h100-llama3.1-8b replicas")
    print(f"{'router':<28} {'hit rate':>9} {'TTFT mean s':>12} {'TTFT p99 s':>11}")
    for aff in (None, 0.25, 0.5, 1.0):
        res = route(trace, aff, 4, args.window_s)
        name = "least outstanding work" if aff is None else f"cache_affinity {aff:g}"
        print(f"{name:<28} {res['hit_rate']:>9.3f} {res['ttft_mean_s']:>12.3f} {res['ttft_p99_s']:>11.3f}")
        key = "low" if aff is None else f"affinity_{aff:g}".replace(".", "_")
        out[f"route_{key}_hit_rate"] = round(res["hit_rate"], 4)
        out[f"route_{key}_ttft_mean_s"] = round(res["ttft_mean_s"], 3)
        out[f"route_{key}_ttft_p99_s"] = round(res["ttft_p99_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
