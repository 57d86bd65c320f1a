"""Checking and re-fitting a profile against whole engine iterations measured on a real GPU.

`scripts/measure_gpu_steps.py` times complete iterations (every layer, LM head and sampling) of a
model with the profile's shapes on a GPU: decode steps of `batch` sequences at `context` tokens,
and prefills of `batch` prompts of `prompt` tokens. Each row is a measurement the kernel-table
fit never saw, so the profile's prediction for it is an end-to-end check of the step-time model.

The same rows can re-fit the profile's two global coefficients,

    measured  ~  t_fixed + s * gpu(row)         gpu(row): the profile's GPU time at scale 1

by least squares on relative error (`sim.calibration.record_fit.solve_fixed_and_scale`, the solve the request
records use), which turns a profile fitted to one engine's kernels into one for the engine that
was measured.

A tensor-parallel shard measured on one GPU has no all-reduces; the sidecar JSON says so
(`includes_allreduce: false`) and the prediction then leaves them out too.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llmserve_env.sim.calibration.record_fit import solve_fixed_and_scale
from llmserve_env.sim.profiles import Profile
from llmserve_env.sim.step_time import StepTimeModel

PHASES = ("decode", "prefill")  # `prefill_eager` rows measure Python's launch overhead, not the GPU
COLUMNS = ("phase", "batch", "context", "prompt", "latency_ms")


@dataclass(frozen=True, slots=True)
class MeasuredStep:
    phase: str
    batch: int
    context: int
    prompt: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class StepSet:
    """Measured iterations plus what the sidecar says about how they were taken."""

    steps: list[MeasuredStep]
    includes_allreduce: bool
    meta: dict


def read_steps(path: Path) -> StepSet:
    """Rows of a measure_gpu_steps CSV (ValueError naming the line on malformed input) and its sidecar."""
    steps: list[MeasuredStep] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}:1: header lacks {', '.join(missing)}")
        for lineno, row in enumerate(reader, 2):
            if row["phase"] not in PHASES:
                continue
            try:
                s = MeasuredStep(row["phase"], int(row["batch"]), int(row["context"]), int(row["prompt"]),
                                 float(row["latency_ms"]) * 1e-3)
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{lineno}: batch/context/prompt must be integers and latency_ms a "
                                 f"number") from None
            if s.batch < 1 or s.latency_s <= 0 or (s.phase == "prefill" and s.prompt < 1):
                raise ValueError(f"{path}:{lineno}: batch and latency must be positive, prefill needs a prompt")
            steps.append(s)
    if not steps:
        raise ValueError(f"{path}: no decode or prefill rows")
    meta = sidecar(path)
    return StepSet(steps, ran_allreduce(meta), meta)


def sidecar(path: Path) -> dict:
    """The JSON that measure_gpu_steps writes beside its CSV (device, versions, date); {} where absent."""
    side = path.with_suffix(".json")
    return json.loads(side.read_text()) if side.is_file() else {}


def ran_allreduce(meta: dict) -> bool:
    """Whether the measured iterations ran tensor parallelism's all-reduces (a shard on one GPU did not)."""
    return bool(meta.get("includes_allreduce", True))


def as_measured(profile: Profile, includes_allreduce: bool) -> Profile:
    """The profile priced as the measurement ran: without all-reduces for a shard measured on one GPU."""
    return profile if includes_allreduce else dataclasses.replace(profile, allreduce=None)


def _model(profile: Profile, includes_allreduce: bool) -> StepTimeModel:
    return StepTimeModel(as_measured(profile, includes_allreduce), "FP16")


def predict(model: StepTimeModel, s: MeasuredStep) -> float | None:
    """The profile's iteration time for a measured row; None when the batch exceeds its tables."""
    if s.phase == "decode":
        if s.batch >= len(model.head):
            return None
        return model.iteration_s(s.batch, float(s.batch * s.context), 0, [], 0, 0)
    tokens = s.batch * s.prompt
    if tokens >= len(model.dense):
        return None
    return model.iteration_s(0, 0.0, 0, [(s.prompt, 0)] * s.batch, tokens, s.batch)


@dataclass(frozen=True, slots=True)
class StepFit:
    t_fixed_s: float
    gpu_time_scale: float
    n: int
    skipped: int
    before_median_abs_error_pct: float
    before_p90_abs_error_pct: float
    after_median_abs_error_pct: float
    before_by_phase: dict[str, float]
    mean_ratio: float  # model / measured, geometric mean (the bias direction)

    def to_dict(self) -> dict[str, object]:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}

    def report(self, profile_id: str, source: str) -> str:
        return "\n".join([
            f"# Measured-iteration fit: {profile_id}", "",
            f"Source: {source}; {self.n} iterations ({self.skipped} beyond the profile's tables skipped).", "",
            "| quantity | shipped profile | re-fitted |", "| --- | ---: | ---: |",
            f"| median abs error % | {self.before_median_abs_error_pct:.1f} | {self.after_median_abs_error_pct:.1f} |",
            f"| t_fixed (ms) | | {self.t_fixed_s * 1e3:.3f} |",
            f"| gpu_time_scale | | {self.gpu_time_scale:.4f} |", "",
            "| phase | shipped median abs error % |", "| --- | ---: |",
            *[f"| {k} | {v:.1f} |" for k, v in self.before_by_phase.items()],
            "", f"Model / measured, geometric mean: {self.mean_ratio:.3f}", ""])


def fit_steps(profile: Profile, data: StepSet) -> StepFit:
    """Score the profile on measured iterations and re-fit (t_fixed, gpu_time_scale) to them."""
    model = _model(profile, data.includes_allreduce)
    tf0, scale0 = profile.t_fixed_s, profile.gpu_time_scale
    preds, ys, phases = [], [], []
    for s in data.steps:
        p = predict(model, s)
        if p is not None:
            preds.append(p)
            ys.append(s.latency_s)
            phases.append(s.phase)
    if len(ys) < 2:
        raise ValueError("need at least two measured iterations within the profile's tables")
    pred, y, phase = np.asarray(preds), np.asarray(ys), np.asarray(phases)
    gpu = (pred - tf0) / scale0  # GPU seconds at scale 1
    t_fixed, scale = solve_fixed_and_scale(np.ones_like(y), gpu, y)
    before = np.abs(pred / y - 1) * 100
    after = np.abs((t_fixed + scale * gpu) / y - 1) * 100
    return StepFit(
        t_fixed, scale, len(y), len(data.steps) - len(y), float(np.median(before)),
        float(np.percentile(before, 90)), float(np.median(after)),
        {ph: float(np.median(before[phase == ph])) for ph in PHASES if (phase == ph).any()},
        float(np.exp(np.mean(np.log(pred / y)))))
