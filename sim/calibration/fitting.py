"""Fitting the kernel-time forms (sim.forms) to measured latencies, and scoring them.

Least squares on log(latency): relative error is what matters for a step time, and log space keeps
the 1 us kernels from being drowned by the 100 ms ones. A small Levenberg-Marquardt (numpy only)
fits the log of each positive coefficient, so coefficients stay positive without bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llmserve_env.sim.calibration import kernel_data as kd
from llmserve_env.sim.forms import (
    KV_ELEM_BYTES,
    AlphaBetaFit,
    DecodeAttentionFit,
    LatencyRatio,
    RooflineFit,
    gemm_work,
    prefill_attention_work,
    ratio_gemm_us,
)


def levenberg_marquardt(model: Callable[[np.ndarray], np.ndarray], y: np.ndarray, p0: list[float],
                        iters: int = 300) -> np.ndarray:
    """Coefficients q (positive) minimising sum((log model(q) - log y)^2); q is searched as log q."""
    theta = np.log(np.asarray(p0, dtype=float))
    logy = np.log(y)

    def residual(th: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            r = np.log(model(np.exp(th))) - logy
        return np.where(np.isfinite(r), r, 1e3)

    r = residual(theta)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(iters):
        jac = np.empty((len(r), len(theta)))
        for j in range(len(theta)):
            d = np.zeros_like(theta)
            d[j] = 1e-6
            jac[:, j] = (residual(theta + d) - r) / 1e-6
        a = jac.T @ jac
        g = jac.T @ r
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(a + lam * (np.diag(np.diag(a)) + 1e-12 * np.eye(len(theta))), -g)
            rn = residual(theta + step)
            cn = float(rn @ rn)
            if cn < cost:
                theta, r, improved = theta + step, rn, True
                rel = (cost - cn) / max(cost, 1e-300)
                cost = cn
                lam = max(lam / 3.0, 1e-12)
                break
            lam *= 4.0
        if not improved or rel < 1e-12:
            break
    return np.exp(theta)


@dataclass(frozen=True, slots=True)
class FitScore:
    n_train: int
    n_test: int
    train_median_abs_err_pct: float
    test_median_abs_err_pct: float
    test_p90_abs_err_pct: float

    def to_dict(self) -> dict[str, float]:
        return {"n_train": self.n_train, "n_test": self.n_test,
                "train_median_abs_err_pct": round(self.train_median_abs_err_pct, 2),
                "test_median_abs_err_pct": round(self.test_median_abs_err_pct, 2),
                "test_p90_abs_err_pct": round(self.test_p90_abs_err_pct, 2)}


def abs_err_pct(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(pred / y - 1.0) * 100.0


def score(pred: np.ndarray, y: np.ndarray, test: np.ndarray) -> FitScore:
    e = abs_err_pct(pred, y)
    et, eh = e[~test], e[test]
    return FitScore(int((~test).sum()), int(test.sum()), float(np.median(et)),
                    float(np.median(eh)) if len(eh) else float("nan"),
                    float(np.percentile(eh, 90)) if len(eh) else float("nan"))


# --- GEMM ---------------------------------------------------------------------------------------

# (weight bytes, activation bytes) per element. FP8 GEMMs quantize their bf16 input first (read 2 bytes,
# write 1) and then read it (1): 4 bytes of activation traffic per element.
GEMM_BYTES = {"bfloat16": (2.0, 2.0), "fp8": (1.0, 4.0)}


def gemm_rows(gpu: str, dtype: str) -> dict[str, np.ndarray]:
    t = kd.load_table(gpu, "gemm")
    return kd.select(t, t["gemm_dtype"] == dtype)


def gemm_predict(fit: RooflineFit, rows: dict[str, np.ndarray], dtype: str) -> np.ndarray:
    wb, ab = GEMM_BYTES[dtype]
    nbytes, flops = gemm_work(rows["m"], rows["n"], rows["k"], wb, ab)
    return fit.us(nbytes, flops)


def fit_gemm(gpu: str, dtype: str) -> tuple[RooflineFit, FitScore]:
    rows = gemm_rows(gpu, dtype)
    test = kd.heldout_mask(rows["n"], rows["k"])
    wb, ab = GEMM_BYTES[dtype]
    nbytes, flops = gemm_work(rows["m"], rows["n"], rows["k"], wb, ab)
    y = rows["latency"] * 1e3  # ms -> us
    tr = ~test

    def model(q: np.ndarray) -> np.ndarray:
        return RooflineFit(q[0], q[1], q[2], q[3]).us(nbytes[tr], flops[tr])

    q = levenberg_marquardt(model, y[tr], [5.0, 2000.0, 500.0, 2.0])
    fit = RooflineFit(*(float(v) for v in q))
    return fit, score(fit.us(nbytes, flops), y, test)


# The linear layers the profiles run: n * k >= 2^24 (the smallest, 8B's 4096 x 4096 and the 70B TP4
# shard's 8192 x 2048, are exactly 2^24). A GEMM dtype priced by its ratio to bf16 is fitted and
# scored on these shapes: smaller ones have another ratio (launch-bound) that no profile meets.
GEMM_RATIO_MIN_NK = 2**24
# m ranges the fidelity bench reports fit errors over: decode batches, mid-size batches and prefill
# chunks up to the 2,048-token budget (where INT8's prefill gain is decided), larger prefills
M_BANDS = ((1, 16), (17, 127), (128, 2048), (2049, 16384))


def ratio_regime_rows(gpu: str, dtype: str) -> dict[str, np.ndarray]:
    rows = gemm_rows(gpu, dtype)
    return kd.select(rows, rows["n"] * rows["k"] >= GEMM_RATIO_MIN_NK)


def ratio_predict(base: RooflineFit, ratio: LatencyRatio, small: RooflineFit, rows: dict[str, np.ndarray],
                  dtype: str) -> np.ndarray:
    """Microseconds of `rows` priced as `ratio_gemm_us` does (small-m fit, then base fit x ratio)."""
    wb, ab = GEMM_BYTES[dtype]
    return ratio_gemm_us(rows["m"], rows["n"], rows["k"], base, ratio, small, wb, ab)


def fit_gemm_small_m(gpu: str, dtype: str, m_max: float = 128.0) -> RooflineFit:
    """The dtype's own roofline over m <= m_max on the shapes the profiles run, additive (p = 1): at
    small m the weights' bytes dominate and the ratio to bf16 depends on the shape."""
    rows = ratio_regime_rows(gpu, dtype)
    sel = ~kd.heldout_mask(rows["n"], rows["k"]) & (rows["m"] <= m_max)
    wb, ab = GEMM_BYTES[dtype]
    nbytes, flops = gemm_work(rows["m"][sel], rows["n"][sel], rows["k"][sel], wb, ab)
    q = levenberg_marquardt(lambda q: RooflineFit(q[0], q[1], q[2], 1.0).us(nbytes, flops),
                            rows["latency"][sel] * 1e3, [5.0, 2000.0, 500.0])
    return RooflineFit(float(q[0]), float(q[1]), float(q[2]), 1.0)


def fit_gemm_ratio(gpu: str, dtype: str, base_fit: RooflineFit,
                   base: str = "bfloat16") -> tuple[LatencyRatio, RooflineFit, FitScore]:
    """The median measured latency ratio dtype / base per m over the training shapes the profiles run
    (n * k >= GEMM_RATIO_MIN_NK), the dtype's small-m fit, and their score on the held-out shapes."""
    rows = ratio_regime_rows(gpu, dtype)
    ref = ratio_regime_rows(gpu, base)
    base_latency = {(m, n, k): lat for m, n, k, lat in zip(ref["m"], ref["n"], ref["k"], ref["latency"],
                                                             strict=True)}
    test = kd.heldout_mask(rows["n"], rows["k"])
    by_m: dict[float, list[float]] = {}
    for m, n, k, lat, held in zip(rows["m"], rows["n"], rows["k"], rows["latency"], test, strict=True):
        b = base_latency.get((m, n, k))
        if b is not None and not held:
            by_m.setdefault(float(m), []).append(float(lat / b))
    # Measured m only (pairs at tile edges, 256 and 257, ...: FP8 kernels are up to 1.3x slower than
    # bf16 just past an edge and 1.3x faster on it); between them the ratio is interpolated in log m.
    ms = sorted(by_m)
    ratio = LatencyRatio(base, tuple(ms), tuple(float(np.median(by_m[m])) for m in ms))
    small = fit_gemm_small_m(gpu, dtype)
    return ratio, small, score(ratio_predict(base_fit, ratio, small, rows, dtype), rows["latency"] * 1e3, test)


def band_errors(pred: np.ndarray, y: np.ndarray, m: np.ndarray) -> dict[str, float]:
    """Median absolute % error per m band (`M_BANDS`)."""
    e = abs_err_pct(pred, y)
    return {f"m{lo}-{hi}": round(float(np.median(e[(m >= lo) & (m <= hi)])), 2)
            for lo, hi in M_BANDS if ((m >= lo) & (m <= hi)).any()}


# --- attention ----------------------------------------------------------------------------------

def attention_rows(gpu: str, kind: str) -> dict[str, np.ndarray]:
    return kd.load_table(gpu, kind)


# the regime the simulator uses: batch_cap <= 512, contexts up to 32k tokens, prompts of 16+ tokens
DECODE_MAX_BATCH, DECODE_MAX_CTX, PREFILL_MIN_ISL = 512, 32768, 16


def decode_attention_work(rows: dict[str, np.ndarray], kv_dtype: str = "bfloat16") -> tuple[np.ndarray, np.ndarray]:
    """(sequence x KV-head items, bytes) of one decode-attention call: `step` cached tokens + the new one."""
    b = rows["batch_size"]
    ctx = rows["step"] + 1.0
    nbytes = 2.0 * KV_ELEM_BYTES[kv_dtype] * b * ctx * rows["num_key_value_heads"] * rows["head_dim"]
    return b * rows["num_key_value_heads"], nbytes


def kv_dtypes(gpu: str) -> list[str]:
    """KV-cache dtypes the gpu's attention tables measured (A100's: bf16 only)."""
    return sorted(set(attention_rows(gpu, "generation_attention")["kv_cache_dtype"].tolist()))


def decode_attention_rows(gpu: str, kv_dtype: str = "bfloat16") -> dict[str, np.ndarray]:
    rows = attention_rows(gpu, "generation_attention")
    return kd.select(rows, (rows["batch_size"] <= DECODE_MAX_BATCH) & (rows["step"] < DECODE_MAX_CTX)
                     & (rows["kv_cache_dtype"] == kv_dtype))


def prefill_attention_rows(gpu: str, kv_dtype: str = "bfloat16") -> dict[str, np.ndarray]:
    rows = attention_rows(gpu, "context_attention")
    return kd.select(rows, (rows["isl"] >= PREFILL_MIN_ISL) & (rows["kv_cache_dtype"] == kv_dtype))


def fit_decode_attention(gpu: str, kv_dtype: str = "bfloat16") -> tuple[DecodeAttentionFit, FitScore]:
    rows = decode_attention_rows(gpu, kv_dtype)
    test = kd.heldout_mask(rows["num_heads"], rows["num_key_value_heads"], rows["head_dim"])
    b, nbytes = decode_attention_work(rows, kv_dtype)
    y = rows["latency"] * 1e3
    tr = ~test
    q = levenberg_marquardt(lambda q: DecodeAttentionFit(q[0], q[1], q[2]).us(b[tr], nbytes[tr]), y[tr],
                            [10.0, 0.1, 2000.0])
    fit = DecodeAttentionFit(*(float(v) for v in q))
    return fit, score(fit.us(b, nbytes), y, test)


def prefill_attention_rows_work(rows: dict[str, np.ndarray],
                                kv_dtype: str = "bfloat16") -> tuple[np.ndarray, np.ndarray]:
    nbytes, flops = prefill_attention_work(rows["isl"], 0.0, rows["num_heads"], rows["num_key_value_heads"],
                                           rows["head_dim"], KV_ELEM_BYTES[kv_dtype])
    return nbytes * rows["batch_size"], flops * rows["batch_size"]


def fit_prefill_attention(gpu: str, kv_dtype: str = "bfloat16") -> tuple[RooflineFit, FitScore]:
    rows = prefill_attention_rows(gpu, kv_dtype)
    test = kd.heldout_mask(rows["num_heads"], rows["num_key_value_heads"], rows["head_dim"])
    nbytes, flops = prefill_attention_rows_work(rows, kv_dtype)
    y = rows["latency"] * 1e3
    tr = ~test
    q = levenberg_marquardt(lambda q: RooflineFit(q[0], q[1], q[2], q[3]).us(nbytes[tr], flops[tr]), y[tr],
                            [10.0, 1000.0, 300.0, 2.0])
    fit = RooflineFit(*(float(v) for v in q))
    return fit, score(fit.us(nbytes, flops), y, test)


# --- all-reduce ---------------------------------------------------------------------------------

def allreduce_rows(gpu: str, num_gpus: int) -> dict[str, np.ndarray]:
    t = kd.load_table(gpu, "allreduce")
    return kd.select(t, t["num_gpus"] == num_gpus)


def fit_allreduce(gpu: str, num_gpus: int, max_bytes: float = 64 * 2**20) -> tuple[AlphaBetaFit, FitScore]:
    """Alpha-beta fit over messages up to `max_bytes` (a 2,048-token batch of the largest model is 32 MiB)."""
    rows = allreduce_rows(gpu, num_gpus)
    rows = kd.select(rows, rows["message_size"] <= max_bytes)
    test = kd.heldout_mask(rows["message_size"])
    s = rows["message_size"]
    y = rows["latency"] * 1e3
    tr = ~test
    q = levenberg_marquardt(lambda q: AlphaBetaFit(q[0], q[1]).us(s[tr]), y[tr], [5.0, 100.0])
    fit = AlphaBetaFit(*(float(v) for v in q))
    return fit, score(fit.us(s), y, test)
