"""Every knob is a real trade-off: each one helps on some workload and hurts on another.

Workloads are small TaskSpecs served by `sim.calibration.experiment.play`, so SLO accounting is the project's
own (`core.metrics`). "Wins" compares `score = goodput (requests meeting every SLO per second) x
quality`, except for priority routing, which is judged by the worst tenant's SLO attainment (the
multi-tenant grader's concern) and by each tenant separately.
"""

from __future__ import annotations

from functools import cache

import pytest
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import TaskSpec, TenantSpec
from llmserve_env.sim.calibration.experiment import EpisodeSummary, play

BASE = dict(batch_cap=256, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
            prefill_decode_split=False, priority_routing=False)


def tenant(name: str, ttft_ms: float, tpot_ms: float, prompt: int, output: int, share: float = 1.0,
           priority: int = 1) -> TenantSpec:
    return TenantSpec(name, priority, share, ttft_ms, tpot_ms, (prompt, 0.3), (output, 0.3), prompt_clip=(8, 16384))


def poisson(name: str, rate: float, *tenants: TenantSpec, horizon: int = 24) -> TaskSpec:
    return TaskSpec(name, "test", name, tenants, workload={"kind": "poisson", "rate_rps": rate}, horizon=horizon)


WORKLOADS: dict[str, TaskSpec] = {
    # batch cap
    "steady_heavy_loose_tpot": poisson("steady_heavy_loose_tpot", 30, tenant("chat", 3000, 200, 512, 256)),
    "bursts_tight_tpot": TaskSpec("bursts_tight_tpot", "test", "lull/burst", (tenant("chat", 8000, 14, 256, 64),),
                                  workload={"kind": "mmpp", "rates_rps": [2.0, 100.0], "mean_dwell_windows": [8.0, 1.0]},
                                  horizon=48),
    # speculation
    "light_tight_tpot": poisson("light_tight_tpot", 1, tenant("chat", 2000, 6, 256, 128)),
    "heavy_decode": poisson("heavy_decode", 70, tenant("chat", 2000, 40, 256, 128)),
    # quantization
    "light_short": poisson("light_short", 5, tenant("chat", 1000, 50, 256, 8)),
    "decode_tight_tpot": poisson("decode_tight_tpot", 15, tenant("chat", 2000, 4, 128, 64)),
    "prefill_heavy": poisson("prefill_heavy", 22, tenant("rag", 3000, 100, 3000, 32)),
    # KV budget
    "long_context_moderate": poisson("long_context_moderate", 4, tenant("chat", 3000, 60, 4096, 512)),
    "overload_tight_tpot": poisson("overload_tight_tpot", 30, tenant("chat", 20000, 25, 2048, 256)),
    # prefill/decode split
    "light_tight_ttft": poisson("light_tight_ttft", 8, tenant("chat", 25, 30, 256, 32)),
    "long_prompts_interfere": poisson("long_prompts_interfere", 8, tenant("chat", 4000, 11, 256, 64, 0.8),
                                      tenant("docs", 30000, 200, 6000, 16, 0.2), horizon=32),
    "prefill_heavy_rag": poisson("prefill_heavy_rag", 12, tenant("rag", 3000, 100, 3000, 32)),
    # priority routing
    "vip_tight_overload": poisson("vip_tight_overload", 45, tenant("vip", 300, 40, 256, 64, 0.2, priority=0),
                                  tenant("bulk", 5000, 80, 1024, 128, 0.8)),
    "vip_loose_chat_tight": poisson("vip_loose_chat_tight", 40, tenant("vip", 10000, 200, 1024, 128, 0.6, priority=0),
                                    tenant("chat", 400, 30, 256, 64, 0.4)),
}

# knob -> (batch_cap used while testing it, values compared, {workload: the value that must win there})
KNOBS: dict[str, tuple[int, list, dict[str, object]]] = {
    "batch_cap": (0, [16, 32, 256], {"steady_heavy_loose_tpot": 256, "bursts_tight_tpot": 32}),
    "speculation_depth": (512, [0, 2, 8], {"light_tight_tpot": 2, "heavy_decode": 0}),
    "quantization_tier": (256, ["FP16", "INT8", "INT4"],
                          {"light_short": "FP16", "decode_tight_tpot": "INT4", "prefill_heavy": "INT8"}),
    "kv_budget_fraction": (512, [0.1, 1.0], {"long_context_moderate": 1.0, "overload_tight_tpot": 0.1}),
    "prefill_decode_split": (256, [False, True],
                             {"light_tight_ttft": False, "long_prompts_interfere": True, "prefill_heavy_rag": False}),
    "priority_routing": (64, [False, True], {"vip_tight_overload": True, "vip_loose_chat_tight": False}),
}


@cache
def summary(workload: str, knob: str, value) -> EpisodeSummary:
    cap = KNOBS[knob][0]
    kw = dict(BASE, batch_cap=cap or 256)
    kw[knob] = value
    return play(WORKLOADS[workload], ServeAction(**kw), seed=0)


def score(s: EpisodeSummary, knob: str) -> float:
    if knob == "priority_routing":
        return s.worst_tenant_attainment
    return s.goodput_rps * s.quality


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_no_value_of_a_knob_wins_on_every_workload(knob):
    _, values, winners = KNOBS[knob]
    beaten = set()
    for workload, winner in winners.items():
        scores = {v: score(summary(workload, knob, v), knob) for v in values}
        best = max(scores.values())
        assert scores[winner] == best, (workload, scores)
        for v in values:
            if scores[v] < best:
                beaten.add(v)
    assert beaten == set(values), f"{knob}: {set(values) - beaten} never lost"


def test_bigger_batch_raises_throughput_and_itl():
    small = summary("steady_heavy_loose_tpot", "batch_cap", 16)
    big = summary("steady_heavy_loose_tpot", "batch_cap", 256)
    assert big.throughput_tps > 2 * small.throughput_tps
    assert big.mean_itl_s > 1.5 * small.mean_itl_s


def test_speculation_helps_at_low_load_and_hurts_at_high_load():
    off, on = (summary("light_tight_tpot", "speculation_depth", g) for g in (0, 2))
    assert on.mean_tpot_s < 0.85 * off.mean_tpot_s
    assert 0.0 < on.spec_accepted < on.spec_proposed
    off, on = (summary("heavy_decode", "speculation_depth", g) for g in (0, 8))
    assert on.throughput_tps < 0.95 * off.throughput_tps
    assert on.mean_ttft_s > 2 * off.mean_ttft_s


def test_quantization_speeds_decode_saves_memory_and_costs_quality():
    fp16, int8, int4 = (summary("decode_tight_tpot", "quantization_tier", q) for q in ("FP16", "INT8", "INT4"))
    assert int4.mean_tpot_s < int8.mean_tpot_s < fp16.mean_tpot_s
    assert int4.max_memory_gb < int8.max_memory_gb < fp16.max_memory_gb
    assert fp16.quality > int8.quality > int4.quality
    fp16, int4 = (summary("prefill_heavy", "quantization_tier", q) for q in ("FP16", "INT4"))
    assert int4.mean_ttft_s > fp16.mean_ttft_s  # dequantization makes compute-bound prefill slower


def test_small_kv_budget_preempts_but_saves_memory():
    small, big = (summary("long_context_moderate", "kv_budget_fraction", f) for f in (0.1, 1.0))
    assert small.evictions > 0 and big.evictions == 0
    assert small.max_memory_gb < big.max_memory_gb
    small, big = (summary("overload_tight_tpot", "kv_budget_fraction", f) for f in (0.1, 1.0))
    assert small.mean_tpot_s < big.mean_tpot_s  # fewer sequences fit, each decodes faster


def test_split_removes_interference_but_costs_ttft():
    off, on = (summary("long_prompts_interfere", "prefill_decode_split", s) for s in (False, True))
    assert on.mean_tpot_s < 0.85 * off.mean_tpot_s
    assert on.mean_ttft_s > off.mean_ttft_s
    off, on = (summary("light_tight_ttft", "prefill_decode_split", s) for s in (False, True))
    assert on.mean_ttft_s > off.mean_ttft_s


def test_priority_routing_protects_the_priority_tenant_at_the_others_expense():
    off, on = (summary("vip_tight_overload", "priority_routing", p) for p in (False, True))
    assert on.tenant_attainment("vip") > off.tenant_attainment("vip") + 0.3
    assert on.tenant_attainment("bulk") < off.tenant_attainment("bulk")
    assert on.evictions > off.evictions
