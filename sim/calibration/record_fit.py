"""Fitting a profile's iteration time to request records measured on a real engine.

A recording of real mode (gateway/recorder.py) holds, per request, its arrival, the prompt and
completion tokens the server counted (`usage_prompt_tokens`, `output_tokens`), and when its first
token and its end came. The engine behind it may be nothing like the profile's (llama.cpp on a
CPU against a vLLM-on-H100 profile), so the fit does not rescale the kernel model: it fits the
affine iteration time of sim/measured_step.py (fixed per iteration, per decoding sequence, per
token through the model, per token of decode context) by replaying the recorded episodes through
the simulator itself (sim/calibration/replay.py: same arrivals, actions and caps) and minimising the log error
of every request's TTFT and TPOT. The simulator's scheduler is part of the fit: queueing behind
other requests' prefills is predicted, not absorbed into the coefficients.

The optimiser is Nelder-Mead on the logs of the four coefficients (positive, scale-free), started
from what the records say directly (prefill seconds per prompt token, the median TPOT). A fit is
only worth writing when its replay beats the profile it started from (`RecordFit.improved`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.calibration.replay import (
    Comparison,
    RecordedRun,
    engine_prompt,
    pooled,
    real_side,
    replay,
    sim_side,
)
from llmserve_env.sim.caps import RequestCaps
from llmserve_env.sim.measured_step import KEY, StepCoefficients
from llmserve_env.sim.profiles import Profile, with_engine

REQUIRED = ("request_id", "arrival_s", "status", "prompt_tokens", "target_output_tokens")
REQUIRED_OK = ("dispatch_s", "first_token_s", "finish_s", "output_tokens")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The request rows of a recording; ValueError naming the line on malformed input."""
    out: list[dict[str, Any]] = []
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
            need = REQUIRED + (REQUIRED_OK if d.get("status") == "ok" else ())
            missing = [k for k in need if d.get(k) is None]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing {', '.join(missing)}")
            out.append(d)
    # A window withdrawn while the endpoint was unreachable is sent again with the same request ids:
    # a request's last row is its outcome (gateway/dispatcher.py's _withdraw).
    last = {(episode_key(d), d["request_id"]): i for i, d in enumerate(out)}
    out = [d for i, d in enumerate(out) if last[(episode_key(d), d["request_id"])] == i]
    if not any(d["status"] == "ok" for d in out):
        raise ValueError(f"{path}: no completed requests")
    return out


def episode_key(row: dict[str, Any]) -> str:
    """Records of one episode share an `episode_id` (newer recorders) or an (episode, seed) pair."""
    if row.get("episode_id"):
        return str(row["episode_id"])
    return f"{row.get('episode', 0)}:{row.get('seed', 0)}"


def read_actions(path: Path) -> list[ServeAction]:
    """One ServeAction JSON object a line (one per window, or a single line for all windows)."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(ServeAction.model_validate_json(line))
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not a ServeAction ({e})") from None
    if not out:
        raise ValueError(f"{path}: no actions")
    return out


def load_runs(path: Path, actions: list[ServeAction], *, window_s: float = 1.0, windows: int | None = None,
              caps: RequestCaps | None = None,
              episode: str | None = None) -> list[RecordedRun]:
    """The episodes of a recording as runs to replay. `windows` defaults to the length of `actions`
    (when one per window) or to the window of the last event recorded."""
    rows = read_rows(path)
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(episode_key(row), []).append(row)
    if episode is not None:
        if episode not in groups:
            raise ValueError(f"{path}: no episode {episode!r}; recorded: {', '.join(groups)}")
        groups = {episode: groups[episode]}
    if not actions:
        raise ValueError("a replay needs the actions played: one, or one per window")
    acts = actions
    runs = []
    for key, grp in groups.items():
        n = windows or (len(acts) if len(acts) > 1 else None)
        if n is None:
            last = max(max(r["arrival_s"], r.get("finish_s") or 0.0) for r in grp)
            n = int(last // window_s) + 1
        runs.append(RecordedRun(key, grp, window_s, n, acts, caps or RequestCaps(), int(grp[0].get("seed", 0))))
    return runs


PROMPT_KEY = "prompt_tokens"  # engine.prompt_tokens: how the engine counts a prompt the gateway counted


def fit_prompt_counting(runs: list[RecordedRun]) -> dict[str, Any] | None:
    """How the engine counts prompts, from the records: its count (usage_prompt_tokens) against the
    gateway's o200k_base count of the message text (prompt_tokens), least squares usage = per_token *
    prompt + chat_overhead (the tokenizer's ratio and the chat template's tokens), overhead >= 0. None
    when no record carries the engine's count."""
    pairs = [(float(r["prompt_tokens"]), float(r["usage_prompt_tokens"])) for run in runs for r in run.rows
             if r.get("usage_prompt_tokens") and r.get("prompt_tokens")]
    if not pairs:
        return None
    x, y = np.array(pairs).T
    if len(pairs) >= 2 and np.ptp(x) > 0:
        per_token, overhead = np.polyfit(x, y, 1)
    else:
        per_token, overhead = float(np.median(y / x)), 0.0
    if overhead < 0:  # never fewer tokens than the text's own at length 0: refit through the origin
        per_token, overhead = float(x @ y / (x @ x)), 0.0
    return {"tokenizer": "o200k_base", "per_token": float(f"{per_token:.6g}"), "chat_overhead": round(float(overhead), 2),
            "requests": len(pairs)}


def solve_fixed_and_scale(iterations: np.ndarray, gpu_s: np.ndarray, measured_s: np.ndarray) -> tuple[float, float]:
    """(t_fixed, gpu_time_scale) minimising the relative error of iterations * t_fixed + scale * gpu_s
    against `measured_s`, by least squares, both >= 0: when one comes out negative it is set to 0
    and the other is re-fitted alone (keeping the value fitted beside a negative one was wrong)."""
    a = np.stack([iterations, gpu_s], axis=1) / measured_s[:, None]  # relative: each row over its measurement
    ones = np.ones_like(measured_s)
    sol, *_ = np.linalg.lstsq(a, ones, rcond=None)
    t_fixed, scale = float(sol[0]), float(sol[1])
    if t_fixed < 0:
        t_fixed, scale = 0.0, float(a[:, 1] @ ones / (a[:, 1] @ a[:, 1]))
    elif scale <= 0:
        t_fixed, scale = float(a[:, 0] @ ones / (a[:, 0] @ a[:, 0])), 0.0
    return max(t_fixed, 0.0), max(scale, 1e-6)


def with_coefficients(base: Profile, coef: StepCoefficients, out_id: str | None = None) -> Profile:
    return with_engine(base, {KEY: coef.to_dict()}, out_id=out_id)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.7, iters: int = 400,
                tol: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimise f from x0 (standard reflection / expansion / contraction / shrink coefficients)."""
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + 1e-12):
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2.0 * (centroid - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def initial_guess(runs: list[RecordedRun]) -> StepCoefficients:
    """Read off the records: seconds per prompt token of the quickest prefills, a share of the median TPOT."""
    per_token, tpots = [], []
    for run in runs:
        ratio = run.prompt_ratio()
        for r in run.rows:
            if r["status"] != "ok":
                continue
            prompt = engine_prompt(r, ratio)
            if r["first_token_s"] > r["dispatch_s"]:
                per_token.append((r["first_token_s"] - r["dispatch_s"]) / prompt)
            if r["output_tokens"] >= 2 and r["finish_s"] > r["first_token_s"]:
                tpots.append((r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1))
    tok = float(np.percentile(per_token, 25)) if per_token else 1e-4
    tpot = float(np.median(tpots)) if tpots else 0.02
    return StepCoefficients(step_s=0.4 * tpot, seq_s=0.1 * tpot, token_s=tok, ctx_s=1e-3 * tok)


def replay_objective(runs: list[RecordedRun], build: Callable[[np.ndarray], Profile]) -> Callable[[np.ndarray], float]:
    """Mean soft-L1 loss of log(sim / real) over every request's TTFT and TPOT, replaying `runs` on the
    profile `build(x)` (the affine fit's and the table fit's (sim/calibration/table_fit.py) one objective)."""
    reals = [real_side(r) for r in runs]

    def f(x: np.ndarray) -> float:
        prof = build(x)
        res = []
        for run, real in zip(runs, reals, strict=True):
            sim = sim_side(run, prof)
            for kind_real, kind_sim in ((real.ttft, sim.ttft), (real.tpot, sim.tpot)):
                for rid, v in kind_real.items():
                    s = kind_sim.get(rid)
                    res.append(math.log(s / v) if s and v > 0 else 3.0)  # never served: a large miss
        r = np.asarray(res)
        return float(np.mean(2.0 * (np.sqrt(1.0 + (r / 0.1) ** 2) - 1.0))) if len(r) else 0.0

    return f


@dataclass(frozen=True, slots=True)
class RecordFit:
    coefficients: StepCoefficients
    before: list[Comparison]   # the starting profile replaying each run
    after: list[Comparison]    # the fitted one
    evaluations: int

    @property
    def before_summary(self) -> dict[str, float]:
        """Medians over every request of every run (not a mean of per-run medians)."""
        return pooled(self.before).summary()

    @property
    def after_summary(self) -> dict[str, float]:
        return pooled(self.after).summary()

    @property
    def improved(self) -> bool:
        """The fit beats the starting profile on the mean of its TTFT and TPOT median errors."""
        b, a = self.before_summary, self.after_summary
        return a["ttft_err_pct"] + a["tpot_err_pct"] < b["ttft_err_pct"] + b["tpot_err_pct"]

    def to_dict(self) -> dict[str, Any]:
        return {KEY: self.coefficients.to_dict(), "runs": len(self.after),
                "requests": sum(c.n_ttft for c in self.after), "evaluations": self.evaluations,
                "before": {k: round(v, 2) for k, v in self.before_summary.items()},
                "after": {k: round(v, 2) for k, v in self.after_summary.items()}}

    def report(self, profile_id: str, base_id: str, source: str) -> str:
        b, a = self.before_summary, self.after_summary
        c = self.coefficients
        return "\n".join([
            f"# Records fit: {profile_id}", "",
            f"Source: {source}; {len(self.after)} episode(s), {sum(x.n_ttft for x in self.after)} requests with "
            f"a first token, replayed through the simulator ({self.evaluations} replays).", "",
            "| iteration-time term | fitted |", "| --- | ---: |",
            f"| fixed per iteration (ms) | {c.step_s * 1e3:.3f} |",
            f"| per decoding sequence (ms) | {c.seq_s * 1e3:.3f} |",
            f"| per token through the model (ms) | {c.token_s * 1e3:.4f} |",
            f"| per token of decode context (us) | {c.ctx_s * 1e6:.4f} |", "",
            f"| replay error % | {base_id} | {profile_id} |", "| --- | ---: | ---: |",
            f"| TTFT (median over requests) | {b['ttft_err_pct']:.1f} | {a['ttft_err_pct']:.1f} |",
            f"| TPOT (median over requests) | {b['tpot_err_pct']:.1f} | {a['tpot_err_pct']:.1f} |",
            f"| throughput (tokens in the played windows) | {b['throughput_err_pct']:.1f} | "
            f"{a['throughput_err_pct']:.1f} |", ""])


def fit_records(base: Profile, runs: list[RecordedRun], iters: int = 300) -> RecordFit:
    """Fit the measured step coefficients to `runs`, scored against `base` as it stands."""
    if not runs:
        raise ValueError("no recorded runs to fit")
    f = replay_objective(runs, lambda x: with_coefficients(base, StepCoefficients(*np.exp(x))))
    calls = 0

    def counted(x: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        return f(x)

    x0 = np.log(np.asarray(initial_guess(runs).as_tuple()))
    x, _ = nelder_mead(counted, x0, iters=iters)
    x, _ = nelder_mead(counted, x, step=0.2, iters=iters)  # a restart: Nelder-Mead can stall on a ridge
    coef = StepCoefficients(*(float(v) for v in np.exp(x)))
    fitted = with_coefficients(base, coef)
    return RecordFit(coef, [replay(r, base) for r in runs], [replay(r, fitted) for r in runs], calls)
