"""Hardware x model profiles: what the simulator prices a batch with, and where each number came from.

A profile is one JSON file in `sim/profiles/` (written by `python -m llmserve_env.tools.calibrate`):
the model's shape, the GPU group (type, tensor-parallel degree, memory, price), the engine's
settings (token budget per iteration, memory reserve), the quantization tiers, the speculative
draft model and acceptance rates, the kernel-time coefficients fitted to measured latencies, their
fit errors, the provenance of every input, and the assumptions that no measurement backs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from llmserve_env.sim.forms import (
    KV_ELEM_BYTES,
    AlphaBetaFit,
    DecodeAttentionFit,
    LatencyRatio,
    RooflineFit,
    kv_bytes_per_token,
)

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

    def kv_bytes_per_token(self, tp: int, kv_dtype: str = "bfloat16") -> float:
        """KV-cache bytes per token on one GPU (KV heads are split across the TP group)."""
        return kv_bytes_per_token(self.layers, max(1, self.kv_heads // tp), self.head_dim, KV_ELEM_BYTES[kv_dtype])

    def weight_bytes(self, tp: int, linear_bytes_per_param: float) -> float:
        """Weight bytes on one GPU for a tier storing linear layers at `linear_bytes_per_param`."""
        other = self.embedding_params() * 2.0 + (self.layers * 2 + 1) * self.hidden * 2.0
        return (self.linear_params() * linear_bytes_per_param + other) / tp


@dataclass(frozen=True, slots=True)
class TierSpec:
    """How a quantization tier runs: which measured GEMM kernels, bytes per weight, compute scale, and
    the KV-cache dtype it serves with."""

    name: str
    gemm: str                 # key into Profile.gemm ("bfloat16") or Profile.gemm_ratio ("fp8")
    weight_bytes: float       # bytes per linear-layer parameter (scales included)
    act_bytes: float          # activation bytes per element the GEMM reads
    flops_scale: float        # compute throughput relative to the fitted kernels
    quality: float            # relative output quality, FP16 = 1.0 (weights x KV cache)
    notes: str
    kv_dtype: str = "bfloat16"  # vLLM kv_cache_dtype: "bfloat16" ("auto") or "fp8"


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
    attn_fp8kv: tuple[DecodeAttentionFit, RooflineFit] | None  # measured FA3 with an fp8 KV cache
    gemm_ratio: dict[str, LatencyRatio]  # GEMM dtypes priced as a bf16 fit x measured ratio (gemm[dtype]:
    # their small-m fit)
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

    def kv_bytes_per_token(self, speculation: bool, tier: str = "FP16") -> float:
        """KV bytes per token per GPU at the tier's KV dtype; the draft model keeps its own cache (same
        dtype: vLLM's kv_cache_dtype applies to every attention layer it runs) while speculating."""
        kv = self.tiers[tier].kv_dtype
        b = self.model.kv_bytes_per_token(self.tp, kv)
        if speculation:
            b += self.draft.kv_bytes_per_token(self.tp, kv)
        return b

    def decode_attention(self, kv_dtype: str) -> DecodeAttentionFit:
        """The decode-attention fit for a KV dtype (fp8 without measured kernels: KeyError)."""
        if kv_dtype == "bfloat16":
            return self.attn_decode
        if kv_dtype == "fp8" and self.attn_fp8kv is not None:
            return self.attn_fp8kv[0]
        raise KeyError(f"profile {self.id} has no decode-attention fit for kv dtype {kv_dtype!r}")

    def prefill_attention(self, kv_dtype: str) -> RooflineFit:
        if kv_dtype == "bfloat16":
            return self.attn_prefill
        if kv_dtype == "fp8" and self.attn_fp8kv is not None:
            return self.attn_fp8kv[1]
        raise KeyError(f"profile {self.id} has no prefill-attention fit for kv dtype {kv_dtype!r}")

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
                            t["notes"], t.get("kv_cache_dtype", "bfloat16"))
             for name, t in d["quantization"].items()}
    gemm = {k: RooflineFit(v["c0_us"], v["bw_gbs"], v["tflops"], v["p"]) for k, v in fits["gemm"].items()}
    ratios = {k: LatencyRatio(v["base"], tuple(v["m"]), tuple(v["ratio"]), v["blend_lo"], v["blend_hi"])
              for k, v in fits.get("gemm_ratio", {}).items()}
    ad, ap, xf = fits["attn_decode"], fits["attn_prefill"], fits["kv_transfer"]
    ad8, ap8 = fits.get("attn_decode_fp8kv"), fits.get("attn_prefill_fp8kv")
    fp8kv = ((DecodeAttentionFit(ad8["c0_us"], ad8["per_item_us"], ad8["bw_gbs"]),
              RooflineFit(ap8["c0_us"], ap8["bw_gbs"], ap8["tflops"], ap8["p"])) if ad8 and ap8 else None)
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
        attn_fp8kv=fp8kv, gemm_ratio=ratios,
        allreduce=AlphaBetaFit(ar["c0_us"], ar["bw_gbs"]) if ar else None,
        kv_transfer=AlphaBetaFit(xf["c0_us"], xf["bw_gbs"]),
        spec_acceptance=dict(d["speculation"]["acceptance_mean"]),
        spec_concentration=d["speculation"]["acceptance_concentration"],
        raw=d,
    )


def with_engine(base: Profile, fields: dict[str, Any], drop: tuple[str, ...] = (),
                out_id: str | None = None) -> Profile:
    """`base` with `fields` set in its `engine` section and `drop` taken out of it (and `out_id` as its id)."""
    d = json.loads(json.dumps(base.raw))
    for k in drop:
        d["engine"].pop(k, None)
    d["engine"].update(fields)
    if out_id:
        d["id"] = out_id
    return profile_from_dict(d)


PROFILE_PATH_ENV = "LLMSERVE_PROFILE_PATH"
PROFILE_PATH_HELP = ("folders (separated by `:`) searched for `<id>.json` profiles after the package's own and "
                     "before the user folder (~/.local/share/llmserve_env/profiles); a built-in id cannot be shadowed")


def user_profile_dir() -> Path:
    """Where calibration writes profiles unless told otherwise: $XDG_DATA_HOME/llmserve_env/profiles
    (~/.local/share/llmserve_env/profiles), never the source tree; searched after LLMSERVE_PROFILE_PATH."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmserve_env" / "profiles"


def profile_dirs() -> list[Path]:
    """Folders searched for `<id>.json`, in order: the package's (built-in ids cannot be shadowed), each
    folder of LLMSERVE_PROFILE_PATH (os.pathsep-separated), the user folder."""
    extra = [Path(d).expanduser() for d in os.environ.get(PROFILE_PATH_ENV, "").split(os.pathsep) if d]
    return [PROFILE_DIR, *extra, user_profile_dir()]


def list_profiles() -> list[str]:
    seen: dict[str, None] = {}
    for d in profile_dirs():
        if d.is_dir():
            seen.update(dict.fromkeys(p.stem for p in d.glob("*.json")))
    return sorted(seen)


def _is_path(ref: str) -> bool:
    return ref.endswith(".json") or "/" in ref or os.sep in ref


def resolve_profile_path(ref: str) -> Path:
    """The file of profile `ref`: a path to a .json file, or an id looked up in `profile_dirs()`."""
    if _is_path(ref):
        path = Path(ref).expanduser()
        if path.suffix != ".json" or not _is_file(path):
            raise UnknownProfileError(ref)
        return path.resolve()
    for d in profile_dirs():
        path = d / f"{ref}.json"
        if _is_file(path):
            return path
    raise UnknownProfileError(ref)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte: no such profile
        return False


def load_profile(ref: str) -> Profile:
    """Profile `ref`: a built-in id, an id in LLMSERVE_PROFILE_PATH or the user folder, or a path to a
    profile JSON file (what `calibrate records --out PATH` writes). Cached per file and modification time."""
    path = resolve_profile_path(ref)
    return _load_file(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=32)
def _load_file(path: str, mtime_ns: int) -> Profile:
    try:
        d = json.loads(Path(path).read_text())
        prof = profile_from_dict(d)
        from llmserve_env.sim.cached_context import KEY as CACHED_KEY
        from llmserve_env.sim.measured_step import measured_models  # lazily: it loads the step-time models

        measured = measured_models(prof)  # a measured step model (table or coefficients) is checked at load
        if not measured and CACHED_KEY in d.get("engine", {}):
            raise ValueError(f"engine.{CACHED_KEY} is a measured step model's term (engine.measured_step or "
                             "engine.step_table); a kernel-based profile prices attention over the cache itself")
        return prof
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidProfileError(path, exc) from None


class InvalidProfileError(ValueError):
    def __init__(self, path: str, cause: Exception):
        super().__init__(f"profile file {path} is not a valid profile: {type(cause).__name__}: {cause}")

