"""The measured kernel latencies the step-time model is fitted to, and the held-out split.

`sim/data/` holds subsets of NVIDIA AIConfigurator's vLLM kernel database (see
sim/data/PROVENANCE.md): only the dtypes, kernels and shapes the profiles use. `extract_subsets`
rebuilds them from the full tables; `load_table` reads one into numpy columns (no pandas).

Held-out split: a row is held out of every fit when the CRC32 of its *shape key* (GEMM: n, k;
attention: heads, kv heads, head dim; all-reduce: message size) is divisible by 4, so whole
shapes are unseen by the fit and the fidelity bench measures generalisation, not interpolation.
"""

from __future__ import annotations

import csv
import gzip
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # sim/data

FILES: dict[str, str] = {
    "h100": "h100_sxm_vllm-0.24.0_{kind}.csv.gz",
    "a100": "a100_sxm_vllm-0.14.0_{kind}.csv.gz",
}
KINDS = ("gemm", "context_attention", "generation_attention", "allreduce")

NUMERIC = {"m", "n", "k", "latency", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
           "step", "window_size", "num_gpus", "message_size", "beam_width"}


def _keep_gemm(row: dict[str, str]) -> bool:
    n, k, m = int(row["n"]), int(row["k"]), int(row["m"])
    return row["gemm_dtype"] in ("bfloat16", "fp8") and 1024 <= n <= 65536 and 1024 <= k <= 16384 and m <= 16384


def _keep_attention(row: dict[str, str]) -> bool:
    return (row["kernel_source"] in ("vllm_flash_attn_fa3", "vllm_flash_attn")
            and row.get("kv_cache_dtype", "bfloat16") in ("bfloat16", "fp8")  # fp8: the INT8/INT4 tiers' cache
            and row.get("window_size", "0") == "0"
            and row["head_dim"] in ("64", "128"))


def _keep_allreduce(row: dict[str, str]) -> bool:
    return row["backend"] == "vllm_graph"


KEEP: dict[str, Callable[[dict[str, str]], bool]] = {
    "gemm": _keep_gemm,
    "context_attention": _keep_attention,
    "generation_attention": _keep_attention,
    "allreduce": _keep_allreduce,
}


def extract_subsets(src: Path, dst: Path = DATA_DIR) -> dict[str, int]:
    """Copy the rows the profiles use from the full kernel tables in `src` into `dst`; rows per file."""
    dst.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    for pattern in FILES.values():
        for kind in KINDS:
            name = pattern.format(kind=kind)
            with gzip.open(src / name, "rt", newline="") as f:
                reader = csv.DictReader(f)
                fields = list(reader.fieldnames or [])
                rows = [r for r in reader if KEEP[kind](r)]
            # mtime=0 keeps the gzip bytes reproducible
            with open(dst / name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                text = _to_csv(fields, rows)
                gz.write(text.encode())
            written[name] = len(rows)
    return written


def _to_csv(fields: list[str], rows: Iterable[dict[str, str]]) -> str:
    lines = [",".join(fields)]
    lines.extend(",".join(r[c] for c in fields) for r in rows)
    return "\n".join(lines) + "\n"


def load_table(gpu: str, kind: str, data_dir: Path = DATA_DIR) -> dict[str, np.ndarray]:
    """One kernel table as columns: numeric columns float64, the rest str."""
    path = data_dir / FILES[gpu].format(kind=kind)
    with gzip.open(path, "rt", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    cols: dict[str, np.ndarray] = {}
    for i, name in enumerate(header):
        values = [r[i] for r in rows]
        cols[name] = np.array(values, dtype=float) if name in NUMERIC else np.array(values)
    return cols


def select(table: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in table.items()}


def heldout_mask(*key_columns: np.ndarray) -> np.ndarray:
    """True for rows whose shape key is held out of the fits (about a quarter of the shapes)."""
    keys = np.stack([np.asarray(c).astype(np.int64) for c in key_columns], axis=1)
    out = np.empty(len(keys), dtype=bool)
    cache: dict[tuple[int, ...], bool] = {}
    for i, row in enumerate(keys):
        key = tuple(int(v) for v in row)
        held = cache.get(key)
        if held is None:
            held = zlib.crc32(",".join(map(str, key)).encode()) % 4 == 0
            cache[key] = held
        out[i] = held
    return out
