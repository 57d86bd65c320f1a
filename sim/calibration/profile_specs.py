"""The hand-set half of each built-in profile: hardware, model shapes, engine settings, tiers.

`sim.calibration.calibrate` joins these with the coefficients it fits to the kernel tables and writes
sim/profiles/<id>.json. Every number here is either a published specification (model shapes from
the models' config.json, vLLM defaults), a cited figure, or listed under `assumptions`.
"""

from __future__ import annotations

from typing import Any

LLAMA_31_8B = {"name": "meta-llama/Llama-3.1-8B-Instruct", "layers": 32, "hidden": 4096, "heads": 32,
               "kv_heads": 8, "head_dim": 128, "intermediate": 14336, "vocab": 128256, "tied_embeddings": False}
LLAMA_3_8B = dict(LLAMA_31_8B, name="meta-llama/Meta-Llama-3-8B-Instruct")
LLAMA_31_70B = {"name": "meta-llama/Llama-3.1-70B-Instruct", "layers": 80, "hidden": 8192, "heads": 64,
                "kv_heads": 8, "head_dim": 128, "intermediate": 28672, "vocab": 128256, "tied_embeddings": False}
LLAMA_32_1B = {"name": "meta-llama/Llama-3.2-1B-Instruct", "layers": 16, "hidden": 2048, "heads": 32,
               "kv_heads": 8, "head_dim": 64, "intermediate": 8192, "vocab": 128256, "tied_embeddings": True}

QUALITY_SOURCE = ("Kurtic et al. 2024, 'Give Me BF16 or Give Me Death? Accuracy-Performance Trade-Offs in LLM "
                  "Quantization' (arXiv:2411.02355, ACL 2025): on Llama-3.1, W8A8-INT loses 1-3 % accuracy and "
                  "W4A16-INT is competitive with it; INT8 takes the low end (0.99), INT4 the high end (0.97)")
INT4_WEIGHT_BYTES = 0.5 + 2.0 / 128  # 4-bit weights plus one bf16 scale per group of 128
# An fp8 (e4m3) KV cache, as vLLM's --kv-cache-dtype fp8 runs it (FA3 does the attention in fp8 too).
FP8_KV_QUALITY = 0.99
FP8_KV_SOURCE = ("vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' (blog.vllm.ai, "
                 "fp8-kvcache): on the validated FA3 path the fp8 KV cache recovers 94-99 % of the bf16-cache "
                 "accuracy across Llama, Qwen3 and MoE models; dense Llama-3.1 with head_dim 128 sits at the top "
                 "of that range, so the cache costs a factor 0.99 on top of the weights' quality")


def _tiers(gpu: str) -> dict[str, dict[str, Any]]:
    fp16 = {"gemm": "bfloat16", "weight_bytes": 2.0, "act_bytes": 2.0, "flops_scale": 1.0, "quality": 1.0,
            "notes": "bf16 weights and activations: the measured bf16 GEMM kernels."}
    # H100: the quantized tiers serve with an fp8 KV cache (half the bytes per token: twice the tokens in
    # the same memory, half the decode-attention stream), timed by the FA3 kernels measured with it.
    # A100: bf16 KV (no FP8 hardware and no fp8-KV kernels in its tables).
    kv = "fp8" if gpu == "h100" else "bfloat16"
    kvq = FP8_KV_QUALITY if kv == "fp8" else 1.0
    kv_note = (f" KV cache fp8 (e4m3, vLLM kv_cache_dtype=fp8): quality x{FP8_KV_QUALITY}, " + FP8_KV_SOURCE
               if kv == "fp8" else " KV cache bf16: the A100 tables measure no fp8-KV attention.")
    fp16 = {"gemm": "bfloat16", "weight_bytes": 2.0, "act_bytes": 2.0, "flops_scale": 1.0, "quality": 1.0,
            "kv_cache_dtype": "bfloat16", "notes": "bf16 weights, activations and KV cache: the measured bf16 kernels."}
    if gpu == "h100":
        int8 = {"gemm": "fp8", "weight_bytes": 1.0, "act_bytes": 4.0, "flops_scale": 1.0,
                "quality": round(0.99 * kvq, 4), "kv_cache_dtype": kv,
                "notes": "W8A8: timed as the bf16 GEMM fit times the measured latency ratio of the FP8 CUTLASS "
                         "scaled-mm kernels to bf16 at the same m (fits.gemm_ratio.fp8; H100's INT8 and FP8 "
                         "tensor-core peaks are equal). Weights' quality 0.99: " + QUALITY_SOURCE + "." + kv_note}
    else:
        int8 = {"gemm": "bfloat16", "weight_bytes": 1.0, "act_bytes": 4.0, "flops_scale": 2.0,
                "quality": round(0.99 * kvq, 4), "kv_cache_dtype": kv,
                "notes": "W8A8-INT: no measured int8 kernels for A100; the bf16 fit with half the weight bytes "
                         "and twice the compute (A100's INT8 tensor-core peak is 2x its bf16 peak). "
                         "Weights' quality 0.99: " + QUALITY_SOURCE + "." + kv_note}
    int4 = {"gemm": "bfloat16", "weight_bytes": INT4_WEIGHT_BYTES, "act_bytes": 2.0, "flops_scale": 0.75,
            "quality": round(0.97 * kvq, 4), "kv_cache_dtype": kv,
            "notes": "W4A16 (group 128): a quarter of the weight bytes; bf16 tensor-core math after in-kernel "
                     "dequantization, assumed to cost 1/3 more compute than bf16 (flops_scale 0.75), so it wins "
                     "memory-bound decode and loses compute-bound prefill. Weights' quality 0.97: "
                     + QUALITY_SOURCE + "." + kv_note}
    return {"FP16": fp16, "INT8": int8, "INT4": int4}


SPECULATION = {
    # Mean per-request acceptance rate of the draft's tokens, by tenant (Beta-distributed per request).
    "acceptance_mean": {"default": 0.65, "chat": 0.65, "interactive": 0.65, "rag": 0.75, "batch": 0.75,
                        "code": 0.8},
    "acceptance_concentration": 20.0,
    "source": "assumed; inside the 0.5-0.9 range of acceptance rates Leviathan et al. 2023 (ICML, Table 3) report "
              "across tasks and draft sizes; summarisation/RAG and code set higher because their outputs copy "
              "from the prompt. Tokens per verification step: (1 - a^(g+1)) / (1 - a).",
}

PRICE_SOURCE = ("typical on-demand list price, early 2026 (pricegpu.pages.dev 'H100 vs A100 Cloud Pricing': "
                "H100 SXM $2.49-3.99/h, A100 80GB SXM $1.49-2.49/h; Lambda, CoreWeave, RunPod)")

COMMON_ASSUMPTIONS = [
    "gpu_memory_utilization 0.9 is vLLM's default; activation_reserve_gib (activations at the 2,048-token "
    "budget, CUDA graphs, workspaces) is assumed, not measured.",
    "t_fixed_s (host overhead + small kernels per iteration) is fitted to the measured batch-1 decode step of "
    "Llama-3.1-8B on one H100 under vLLM (6.5 ms at 1k context) and scaled by layer count for the other "
    "profiles (same kernels per layer); the host's speed is assumed the same on every GPU type.",
    "Elementwise kernels (norms, rotary, SiLU) are priced as bytes moved at the fitted GEMM bandwidth.",
    "prefill_decode_split partitions the GPU(s) statically: the prefill lane gets split_prefill_compute_share "
    "of the SMs and split_prefill_bandwidth_share of the HBM bandwidth, the decode lane the rest (assumed "
    "0.5/0.5 compute and 0.25/0.75 bandwidth: decode is the bandwidth-bound phase). KV moves between the "
    "lanes at the 2-GPU all-reduce fit's bandwidth (a peer copy).",
    "Speculation uses a Llama-3.2-1B draft in bf16 with the target's tensor parallelism; its host overhead per "
    "step is t_fixed scaled by its depth (16/L layers).",
    "Decode tokens are always scheduled; prefill chunks get what is left of the token budget.",
]

SPECS: dict[str, dict[str, Any]] = {
    "h100-llama3.1-8b": {
        "description": "Llama-3.1-8B-Instruct (bf16) on one NVIDIA H100 80GB SXM under vLLM: continuous "
                       "batching, chunked prefill with a 2,048-token budget.",
        "hardware": {"gpu": "h100", "gpu_name": "NVIDIA H100 80GB HBM3 (SXM5)", "tp": 1, "memory_gib": 79.65,
                     "price_per_gpu_hour_usd": 2.99},
        "model": LLAMA_31_8B,
        "anchor": True,
    },
    "a100-llama3-8b": {
        "description": "Meta-Llama-3-8B-Instruct (bf16) on one NVIDIA A100-SXM4-80GB under vLLM: continuous "
                       "batching, chunked prefill with a 2,048-token budget.",
        "hardware": {"gpu": "a100", "gpu_name": "NVIDIA A100-SXM4-80GB", "tp": 1, "memory_gib": 80.0,
                     "price_per_gpu_hour_usd": 1.79},
        "model": LLAMA_3_8B,
    },
    "h100-llama3.1-70b-tp4": {
        "description": "Llama-3.1-70B-Instruct (bf16) on four NVIDIA H100 80GB SXM GPUs, tensor parallel 4 over "
                       "NVLink, under vLLM: continuous batching, chunked prefill with a 2,048-token budget.",
        "hardware": {"gpu": "h100", "gpu_name": "4x NVIDIA H100 80GB HBM3 (SXM5), NVLink", "tp": 4,
                     "memory_gib": 79.65, "price_per_gpu_hour_usd": 2.99},
        "model": LLAMA_31_70B,
    },
}

# Replica life cycle for the cluster tasks (sim/cluster.py): cold start = FP16 checkpoint bytes / weight_load_gib_per_s
# + engine_startup_s. Both figures are vLLM start-up logs from public issues, one figure each, so they are
# single measurements, not distributions.
CLUSTER_SCALING = {
    "weight_load_gib_per_s": 0.51,
    "engine_startup_s": 58.1,
    "source": "weight_load_gib_per_s: vLLM's log in vllm-project/vllm#38820 (safetensors from local disk, "
              "default loader): 'Loading weights took 24.84 seconds', 'Model loading took 12.66 GiB' -> "
              "12.66 / 24.84 = 0.51 GiB/s. engine_startup_s: vllm-project/vllm#20264 (torch.compile cache "
              "reused between pod scalings): weights loaded in 0.90 s, 'init engine (profile, create kv cache, "
              "warmup model) took 34.11 seconds', CUDA graph capture 17 s of it, and the first response came "
              "59 s after start; 59 - 0.90 = 58.1 s of process start, imports, compilation, KV set-up, graph "
              "capture and warm-up that do not scale with the weight bytes. Cost is per replica-second at "
              "hardware.price_per_gpu_hour_usd x tp from the moment a replica is requested until it is gone.",
}

ENGINE_DEFAULTS = {"token_budget": 2048, "gpu_memory_utilization": 0.9, "activation_reserve_gib": 2.0,
                   "split_prefill_compute_share": 0.5, "split_prefill_bandwidth_share": 0.25,
                   "gpu_time_scale": 1.0}


def base_profile(profile_id: str) -> dict[str, Any]:
    """The profile dict before fitting: everything except `fits`, `fit_error` and `engine.t_fixed_s`."""
    spec = SPECS[profile_id]
    hw = dict(spec["hardware"], price_source=PRICE_SOURCE,
              memory_source="total memory nvidia-smi reports for the card (H100 SXM5 80GB: 81,559 MiB; "
                            "A100-SXM4-80GB: 81,920 MiB)")
    return {
        "id": profile_id,
        "description": spec["description"],
        "hardware": hw,
        "model": dict(spec["model"]),
        "draft_model": dict(LLAMA_32_1B),
        "engine": dict(ENGINE_DEFAULTS),
        "quantization": _tiers(spec["hardware"]["gpu"]),
        "speculation": dict(SPECULATION),
        "cluster": dict(CLUSTER_SCALING),
        "assumptions": list(COMMON_ASSUMPTIONS),
    }
