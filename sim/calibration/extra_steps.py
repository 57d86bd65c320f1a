"""The step-time model's forms checked on GPU iterations none of its fits saw.

`scripts/measure_gpu_steps.py --extras` times, on the profile's model shape with random weights, what
the simulator prices from forms and assumptions rather than from a measured iteration of that kind:
speculative decoding's verify pass and the draft model's step, a prefill after a prefix-cache hit, a
chunked-prefill iteration mixing decodes and a prompt chunk, and the INT8 and INT4 tiers' linear layers
and whole iterations. Each row is predicted here by `StepTimeModel` exactly as the engine would ask
for it (`iteration_s`, `draft_s`), from

- the shipped profile, and
- the profile re-fitted (t_fixed, gpu_time_scale) to the same GPU's plain decode and prefill rows
  (`sim.calibration.step_fit`), so a row's error is the form's, not stock PyTorch's overall speed
  against vLLM's.

The measurement keeps a bf16 KV cache in every tier (PyTorch's SDPA has no FP8 cache), so tier rows are
predicted with a bf16 cache too. `linear` rows are the linear layers alone: the dense table less its
elementwise kernels. The INT4 rows ran PyTorch's tinygemm kernel, which is built for decode (small m);
vLLM serves W4A16 with Marlin, so INT4 rows past m = 16 measure that kernel, not the tier's intent.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llmserve_env.sim.calibration.step_fit import as_measured, fit_steps, ran_allreduce, read_steps, sidecar
from llmserve_env.sim.profiles import Profile
from llmserve_env.sim.step_time import StepTimeModel, elementwise_s

PHASES = ("linear", "decode", "cached_prefill", "verify", "draft", "mixed")
TIERS = ("FP16", "INT8", "INT4")


@dataclass(frozen=True, slots=True)
class ExtraStep:
    phase: str
    tier: str
    depth: int
    batch: int
    context: int
    prompt: int
    latency_s: float


def read_extra_steps(path: Path) -> list[ExtraStep]:
    """Rows of a `--extras` CSV (ValueError naming the line on malformed input)."""
    rows: list[ExtraStep] = []
    with open(path, newline="") as f:
        for lineno, r in enumerate(csv.DictReader(f), 2):
            try:
                s = ExtraStep(r["phase"], r["tier"], int(r["depth"]), int(r["batch"]), int(r["context"]),
                              int(r["prompt"]), float(r["latency_ms"]) * 1e-3)
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}:{lineno}: needs phase, tier, depth, batch, context, prompt and "
                                 f"latency_ms") from None
            if s.phase not in PHASES or s.tier not in TIERS:
                raise ValueError(f"{path}:{lineno}: phase must be one of {PHASES} and tier one of {TIERS}")
            rows.append(s)
    return rows


def bf16_cache(profile: Profile) -> Profile:
    """The profile with every tier serving a bf16 KV cache, as the measurement did."""
    tiers = {k: dataclasses.replace(t, kv_dtype="bfloat16") for k, t in profile.tiers.items()}
    return dataclasses.replace(profile, tiers=tiers)


def predict_extra(models: dict[str, StepTimeModel], s: ExtraStep) -> float:
    """The model's seconds for a measured row, asked as the engine asks."""
    m = models[s.tier]
    ctx = float(s.batch * s.context)
    if s.phase == "linear":
        return m.dense[s.batch] - elementwise_s(m.profile, s.batch) * m.gpu_scale
    if s.phase == "decode":
        return m.iteration_s(s.batch, ctx, 0, [], 0, 0)
    if s.phase == "cached_prefill":
        return m.iteration_s(0, 0.0, 0, [(s.prompt, s.context)], s.prompt, 1)
    if s.phase == "verify":  # the target's pass alone: the draft's steps are the `draft` rows
        return m.iteration_s(s.batch, ctx, s.depth, [], 0, 0) - m.draft_s(s.batch, ctx, s.depth)
    if s.phase == "draft":
        return m.draft_s(s.batch, ctx, 1)
    return m.iteration_s(s.batch, ctx, 0, [(s.prompt, 0)], s.prompt, 1)  # mixed


def tier_models(profile: Profile, allreduce: bool = True) -> dict[str, StepTimeModel]:
    """A model per tier, as the measurement ran: a bf16 KV cache, and no all-reduces for a shard that had none."""
    p = as_measured(bf16_cache(profile), allreduce)
    return {t: StepTimeModel(p, t) for t in TIERS if t in p.tiers}


@dataclass(frozen=True, slots=True)
class ExtraCheck:
    """Per (phase, tier): rows, median |model / measured - 1| % and the geometric-mean ratio."""

    rows: list[tuple[ExtraStep, float]]  # (row, model seconds)

    def groups(self) -> dict[tuple[str, str], tuple[int, float, float]]:
        out: dict[tuple[str, str], tuple[int, float, float]] = {}
        for key in dict.fromkeys((s.phase, s.tier) for s, _ in self.rows):
            r = np.array([p / s.latency_s for s, p in self.rows if (s.phase, s.tier) == key])
            out[key] = (len(r), float(np.median(np.abs(r - 1)) * 100), float(np.exp(np.mean(np.log(r)))))
        return out


def check_extras(profile: Profile, steps: list[ExtraStep], allreduce: bool = True) -> ExtraCheck:
    """Each row against the model; `allreduce` False for a tensor-parallel shard measured on one GPU. A
    shard's `draft` rows are left out: they ran the whole draft model on one GPU, where the profile prices
    it sharded at the target's tensor parallelism (vLLM's default draft_tensor_parallel_size)."""
    models = tier_models(profile, allreduce)
    return ExtraCheck([(s, predict_extra(models, s)) for s in steps
                       if s.tier in models and (allreduce or s.phase != "draft")])


def extras_allreduce(path: Path) -> bool:
    """Whether a `--extras` CSV's iterations ran the all-reduces (its sidecar; a tp shard's did not)."""
    return ran_allreduce(sidecar(path))


def refitted(profile: Profile, base_steps: Path) -> Profile:
    """The profile with (t_fixed, gpu_time_scale) fitted to the same GPU's plain decode/prefill rows."""
    fit = fit_steps(profile, read_steps(base_steps))
    return dataclasses.replace(profile, t_fixed_s=fit.t_fixed_s, gpu_time_scale=fit.gpu_time_scale)
