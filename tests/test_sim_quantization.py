"""Quantization tiers are priced from the kernels they run, each with its KV-cache dtype."""

from __future__ import annotations

import pytest
from llmserve_env.sim.calibration import fitting
from llmserve_env.sim.calibration.calibrate import gemm_heldout_rows, gemm_prediction
from llmserve_env.sim.kv_cache import KVCache
from llmserve_env.sim.profiles import load_profile
from llmserve_env.sim.step_time import StepTimeModel

H100 = "h100-llama3.1-8b"


def prefill_256(tier: str, profile: str = H100) -> float:
    return StepTimeModel(load_profile(profile), tier).iteration_s(0, 0.0, 0, [(256, 0)], 256, 1)


def test_int8_prefill_is_faster_than_fp16_at_256_tokens():
    """The measured FP8 GEMMs are 1.3x faster than bf16 at m = 256 on the shapes the profiles run (the
    single FP8 roofline priced a 256-token INT8 prefill the same as FP16: 9.68 vs 9.70 ms)."""
    for pid in ("h100-llama3.1-8b", "h100-llama3.1-70b-tp4"):
        assert prefill_256("INT8", pid) < 0.9 * prefill_256("FP16", pid), pid


def test_fp8_gemm_pricing_tracks_the_measured_kernels_where_batches_and_chunks_live():
    p = load_profile(H100)
    rows = gemm_heldout_rows(p, "fp8")
    bands = fitting.band_errors(gemm_prediction(p, "fp8", rows), rows["latency"] * 1e3, rows["m"])
    assert bands["m128-2048"] < 15.0, bands  # 12.1; the single FP8 roofline: 18.5 % on these shapes
    assert bands["m1-16"] < 8.0, bands  # 5.4: the weight-bound small batches keep their own fit


def test_quantized_tiers_on_h100_serve_an_fp8_kv_cache():
    p = load_profile(H100)
    assert [p.tiers[t].kv_dtype for t in ("FP16", "INT8", "INT4")] == ["bfloat16", "fp8", "fp8"]
    assert p.kv_bytes_per_token(False, "INT8") == p.kv_bytes_per_token(False, "FP16") / 2
    fp16, int8 = KVCache(), KVCache()
    fp16.configure(p, "FP16", False, 0.5)
    int8.configure(p, "INT8", False, 0.5)
    # half the bytes per token, and more memory left by 1-byte weights: over twice the blocks
    assert int8.total > 2 * fp16.total
    # decode attention streams half the bytes per cached token; the measured fp8-KV kernels reach a
    # lower bandwidth (dequantizing), so a cached token costs 0.63x, not 0.5x (vLLM's FP8 KV-cache
    # study: 54 % of bf16's per-token ITL slope at best)
    m16, m8 = StepTimeModel(p, "FP16"), StepTimeModel(p, "INT8")
    assert 0.5 < m8.decode_slope(0) / m16.decode_slope(0) < 0.7
    # and the cache's quality cost is in the tier's quality (weights 0.99 x fp8 KV 0.99)
    assert p.tiers["INT8"].quality == pytest.approx(0.99 * 0.99)


def test_a100_keeps_a_bf16_cache_without_measured_fp8_kv_kernels():
    p = load_profile("a100-llama3-8b")
    assert {t.kv_dtype for t in p.tiers.values()} == {"bfloat16"}
    with pytest.raises(KeyError, match="kv dtype 'fp8'"):
        p.decode_attention("fp8")


def test_host_overhead_scales_with_layer_count():
    """t_fixed is anchored on the 32-layer 8B and scaled by layers (same kernels per layer)."""
    p8, p70 = load_profile(H100), load_profile("h100-llama3.1-70b-tp4")
    assert p70.t_fixed_s / p8.t_fixed_s == pytest.approx(p70.model.layers / p8.model.layers, rel=1e-3)
    assert load_profile("a100-llama3-8b").t_fixed_s == p8.t_fixed_s
