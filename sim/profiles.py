"""Hardware x model profiles: what the simulator prices a batch with, and where each number came from.

A profile is one JSON file in `sim/profiles/` (written by `python -m llmserve_env.sim.calibrate`):
the model's shape, the GPU group (type, tensor-parallel degree, memory, price), the engine's
settings (token budget per iteration, memory reserve), the quantization tiers, the speculative
draft model and acceptance rates, the kernel-time coefficients fitted to measured latencies, their
fit errors, the provenance of every input, and the assumptions that no measurement backs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from llmserve_env.sim.forms import AlphaBetaFit, DecodeAttentionFit, RooflineFit, kv_bytes_per_token

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
GIB = float(2**30)


class UnknownProfileError(KeyError):
    def __init__(self, profile_id: str):
        super().__init__(profile_id)
        self.profile_id = profile_id

    def __str__(self) -> str:
        return f"unknown profile {self.profile_id!r}; available: {', '.join(list_profiles())}"


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A Llama-style decoder (GQA attention, SwiGLU MLP)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool

    def linear_shapes(self, tp: int) -> list[tuple[int, int]]:
        """(n, k) of one layer's linear GEMMs on one GPU of a `tp`-way tensor-parallel group."""
        q, kv, hd = self.heads, self.kv_heads, self.head_dim
        return [((q + 2 * kv) * hd // tp, self.hidden),  # fused QKV projection
                (self.hidden, q * hd // tp),              # attention output projection
                (2 * self.intermediate // tp, self.hidden),  # fused gate + up projection
                (self.hidden, self.intermediate // tp)]   # down projection

    def linear_params(self) -> int:
        """Parameters of all quantizable linear layers (the whole model, all GPUs)."""
        return self.layers * sum(n * k for n, k in self.linear_shapes(1))

    def embedding_params(self) -> int:
        """Input embedding plus LM head (shared when tied); kept in bf16 by every tier."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> int:
        return self.linear_params() + self.embedding_params() + self.layers * 2 * self.hidden + self.hidden

    def kv_bytes_per_token(self, tp: int) -> float:
        """KV-cache bytes per token on one GPU (KV heads are split across the TP group)."""
        return kv_bytes_per_token(self.layers, max(1, self.kv_heads // tp), self.head_dim)

    def weight_bytes(self, tp: int, linear_bytes_per_param: float) -> float:
        """Weight bytes on one GPU for a tier storing linear layers at `linear_bytes_per_param`."""
        other = self.embedding_params() * 2.0 + (self.layers * 2 + 1) * self.hidden * 2.0
        return (self.linear_params() * linear_bytes_per_param + other) / tp


@dataclass(frozen=True, slots=True)
class TierSpec:
    """How a quantization tier runs: which measured GEMM kernels, bytes per weight, compute scale."""

    name: str
    gemm: str                 # key into Profile.gemm ("bfloat16" or "fp8")
    weight_bytes: float       # bytes per linear-layer parameter (scales included)
    act_bytes: float          # activation bytes per element the GEMM reads
    flops_scale: float        # compute throughput relative to the fitted kernels
    quality: float            # relative output quality, FP16 = 1.0
    notes: str


@dataclass(frozen=True, slots=True)
class Profile:
    id: str
    description: str
    gpu: str                  # "h100" / "a100": which kernel tables
    gpu_name: str
    tp: int
    memory_gib: float         # per GPU
    price_per_gpu_hour: float
    gpu_memory_utilization: float
    activation_reserve_gib: float
    token_budget: int
    split_prefill_compute_share: float
    split_prefill_bandwidth_share: float
    t_fixed_s: float
    gpu_time_scale: float
    model: ModelShape
    draft: ModelShape
    tiers: dict[str, TierSpec]
    gemm: dict[str, RooflineFit]
    attn_decode: DecodeAttentionFit
    attn_prefill: RooflineFit
    allreduce: AlphaBetaFit | None
    kv_transfer: AlphaBetaFit
    spec_acceptance: dict[str, float]
    spec_concentration: float
    raw: dict[str, Any]

    def weights_gib(self, tier: str, speculation: bool) -> float:
        """Weights resident on one GPU: the target at `tier`, plus the bf16 draft model when speculating."""
        w = self.model.weight_bytes(self.tp, self.tiers[tier].weight_bytes)
        if speculation:
            w += self.draft.weight_bytes(self.tp, 2.0)
        return w / GIB

    def kv_bytes_per_token(self, speculation: bool) -> float:
        """KV bytes per token per GPU; the draft model keeps its own cache while speculating."""
        b = self.model.kv_bytes_per_token(self.tp)
        if speculation:
            b += self.draft.kv_bytes_per_token(self.tp)
        return b

    def kv_capacity_gib(self, tier: str, speculation: bool) -> float:
        """Memory one GPU can give the KV cache at kv_budget_fraction = 1."""
        usable = self.memory_gib * self.gpu_memory_utilization - self.activation_reserve_gib
        return max(0.0, usable - self.weights_gib(tier, speculation))

    def cold_start_s(self) -> float:
        """Seconds from requesting a replica to its serving: the FP16 checkpoint read at the profile's
        cited load bandwidth, plus engine start-up (figures and sources under `cluster` / provenance)."""
        c = self.raw["cluster"]
        return self.weights_gib("FP16", False) / c["weight_load_gib_per_s"] + c["engine_startup_s"]

    def replica_price_per_s(self) -> float:
        """USD per second one replica (its whole tensor-parallel group) is billed."""
        return self.tp * self.price_per_gpu_hour / 3600.0

    def acceptance_mean(self, tenant: str) -> float:
        return self.spec_acceptance.get(tenant, self.spec_acceptance["default"])


def _shape(d: dict[str, Any]) -> ModelShape:
    return ModelShape(d["name"], d["layers"], d["hidden"], d["heads"], d["kv_heads"], d["head_dim"],
                      d["intermediate"], d["vocab"], d["tied_embeddings"])


def profile_from_dict(d: dict[str, Any]) -> Profile:
    hw, eng, fits = d["hardware"], d["engine"], d["fits"]
    tiers = {name: TierSpec(name, t["gemm"], t["weight_bytes"], t["act_bytes"], t["flops_scale"], t["quality"],
                            t["notes"]) for name, t in d["quantization"].items()}
    gemm = {k: RooflineFit(v["c0_us"], v["bw_gbs"], v["tflops"], v["p"]) for k, v in fits["gemm"].items()}
    ad, ap, xf = fits["attn_decode"], fits["attn_prefill"], fits["kv_transfer"]
    ar = fits.get("allreduce")
    return Profile(
        id=d["id"], description=d["description"], gpu=hw["gpu"], gpu_name=hw["gpu_name"], tp=hw["tp"],
        memory_gib=hw["memory_gib"], price_per_gpu_hour=hw["price_per_gpu_hour_usd"],
        gpu_memory_utilization=eng["gpu_memory_utilization"], activation_reserve_gib=eng["activation_reserve_gib"],
        token_budget=eng["token_budget"], split_prefill_compute_share=eng["split_prefill_compute_share"],
        split_prefill_bandwidth_share=eng["split_prefill_bandwidth_share"],
        t_fixed_s=eng["t_fixed_s"], gpu_time_scale=eng["gpu_time_scale"],
        model=_shape(d["model"]), draft=_shape(d["draft_model"]), tiers=tiers, gemm=gemm,
        attn_decode=DecodeAttentionFit(ad["c0_us"], ad["per_item_us"], ad["bw_gbs"]),
        attn_prefill=RooflineFit(ap["c0_us"], ap["bw_gbs"], ap["tflops"], ap["p"]),
        allreduce=AlphaBetaFit(ar["c0_us"], ar["bw_gbs"]) if ar else None,
        kv_transfer=AlphaBetaFit(xf["c0_us"], xf["bw_gbs"]),
        spec_acceptance=dict(d["speculation"]["acceptance_mean"]),
        spec_concentration=d["speculation"]["acceptance_concentration"],
        raw=d,
    )


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


@lru_cache(maxsize=32)
def load_profile(profile_id: str) -> Profile:
    """The profile `profile_id` from sim/profiles/<id>.json (cached; profiles are immutable)."""
    path = PROFILE_DIR / f"{profile_id}.json"
    if "/" in profile_id or not path.is_file():
        raise UnknownProfileError(profile_id)
    return profile_from_dict(json.loads(path.read_text()))
