"""Fit simulator profiles from measured kernel latencies, or re-fit them from measured requests.

    python -m llmserve_env.sim.calibrate kernels [--profile ID|all]
        Fit each profile's kernel-time coefficients (GEMM per dtype, decode and prefill attention,
        all-reduce, KV transfer) to the kernel tables in sim/data (held-out shapes excluded), fit
        t_fixed to the published batch-1 decode step, write sim/profiles/<id>.json and a fit report.

    python -m llmserve_env.sim.calibrate records --profile ID --records FILE.jsonl [--out NEW_ID]
        Re-fit t_fixed and gpu_time_scale of a profile from request records measured by the real-mode
        gateway (one JSON object per line with the RequestRecord fields plus dispatch_s, first_token_s,
        finish_s, prompt_tokens, output_tokens), and write the profile and a fit report.

    python -m llmserve_env.sim.calibrate steps --profile ID --steps FILE.csv [--out NEW_ID]
        Score a profile against whole iterations measured on a GPU (scripts/measure_gpu_steps.py
        writes FILE.csv), re-fit t_fixed and gpu_time_scale to them, write a fit report, and, with
        --out, the re-fitted profile.

    python -m llmserve_env.sim.calibrate extract --src /path/to/data/kernels
        Rebuild the kernel-table subsets in sim/data from the full tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from llmserve_env.sim import fitting
from llmserve_env.sim.profile_specs import SPECS, base_profile
from llmserve_env.sim.profiles import PROFILE_DIR, Profile, load_profile, profile_from_dict
from llmserve_env.sim.record_fit import fit_records, read_records
from llmserve_env.sim.step_fit import fit_steps, read_steps
from llmserve_env.sim.step_time import StepTimeModel

# Published anchor (shared/data/README.md): a batch-1 decode step of Llama-3.1-8B on one H100 is 7-8 ms.
ANCHOR_DECODE_S = 7.5e-3
ANCHOR_CONTEXT = 1024
REPORT_NAME = "fit_report.md"


def fit_kernels(gpu: str, tp: int, dtypes: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Coefficients and held-out scores for every kernel a profile on `gpu` with `tp` GPUs uses."""
    fits: dict[str, Any] = {"gemm": {}}
    scores: dict[str, Any] = {}
    for dtype in sorted(dtypes):
        fit, sc = fitting.fit_gemm(gpu, dtype)
        fits["gemm"][dtype] = fit.to_dict()
        scores[f"gemm_{dtype}"] = sc.to_dict()
    fit, sc = fitting.fit_decode_attention(gpu)
    fits["attn_decode"], scores["attn_decode"] = fit.to_dict(), sc.to_dict()
    fit, sc = fitting.fit_prefill_attention(gpu)
    fits["attn_prefill"], scores["attn_prefill"] = fit.to_dict(), sc.to_dict()
    fit, sc = fitting.fit_allreduce(gpu, 2)
    fits["kv_transfer"], scores["kv_transfer_allreduce2"] = fit.to_dict(), sc.to_dict()
    if tp > 1:
        fit, sc = fitting.fit_allreduce(gpu, tp)
        fits["allreduce"], scores[f"allreduce_{tp}"] = fit.to_dict(), sc.to_dict()
    return fits, scores


def heldout_errors_by_kernel(profile: dict[str, Any]) -> dict[str, np.ndarray]:
    """Absolute % errors of the profile's fitted kernels on the held-out measurements, per kernel class."""
    p = profile_from_dict(profile)
    out: dict[str, np.ndarray] = {}
    for dtype in sorted({t.gemm for t in p.tiers.values()}):
        rows = fitting.gemm_rows(p.gpu, dtype)
        test = fitting.kd.heldout_mask(rows["n"], rows["k"])
        out[f"gemm {dtype}"] = fitting.abs_err_pct(fitting.gemm_predict(p.gemm[dtype], rows, dtype),
                                                   rows["latency"] * 1e3)[test]
    rows = fitting.decode_attention_rows(p.gpu)
    test = fitting.kd.heldout_mask(rows["num_heads"], rows["num_key_value_heads"], rows["head_dim"])
    items, nbytes = fitting.decode_attention_work(rows)
    out["decode attention"] = fitting.abs_err_pct(p.attn_decode.us(items, nbytes), rows["latency"] * 1e3)[test]
    rows = fitting.prefill_attention_rows(p.gpu)
    test = fitting.kd.heldout_mask(rows["num_heads"], rows["num_key_value_heads"], rows["head_dim"])
    nbytes, flops = fitting.prefill_attention_rows_work(rows)
    out["prefill attention"] = fitting.abs_err_pct(p.attn_prefill.us(nbytes, flops), rows["latency"] * 1e3)[test]
    for n, fit in ((2, p.kv_transfer), (p.tp, p.allreduce)):
        if fit is None or n < 2:
            continue
        rows = fitting.allreduce_rows(p.gpu, n)
        rows = fitting.kd.select(rows, rows["message_size"] <= 64 * 2**20)
        test = fitting.kd.heldout_mask(rows["message_size"])
        out[f"all-reduce x{n}"] = fitting.abs_err_pct(fit.us(rows["message_size"]), rows["latency"] * 1e3)[test]
    return out


def heldout_errors(profile: dict[str, Any]) -> np.ndarray:
    """Every held-out kernel error of the profile, pooled."""
    return np.concatenate(list(heldout_errors_by_kernel(profile).values()))


def batch1_decode_s(profile: dict[str, Any], context: int = ANCHOR_CONTEXT) -> float:
    """Modelled batch-1 decode iteration (FP16, no speculation) at `context` tokens."""
    return StepTimeModel(profile_from_dict(profile), "FP16").iteration_s(1, float(context), 0, [], 0, 0)


def calibrate_kernels(profile_id: str, t_fixed_s: float | None = None) -> dict[str, Any]:
    """The full profile dict for `profile_id`, fitted from the kernel tables."""
    prof = base_profile(profile_id)
    hw = prof["hardware"]
    dtypes = {t["gemm"] for t in prof["quantization"].values()} | {"bfloat16"}
    fits, scores = fit_kernels(hw["gpu"], hw["tp"], dtypes)
    prof["fits"] = fits
    prof["engine"]["t_fixed_s"] = 0.0
    gpu_only = batch1_decode_s(prof)
    if t_fixed_s is None:
        t_fixed_s = ANCHOR_DECODE_S - gpu_only
    prof["engine"]["t_fixed_s"] = round(t_fixed_s, 7)
    errs = heldout_errors(prof)
    prof["fit_error"] = {
        "kernels_heldout_median_abs_error_pct": round(float(np.median(errs)), 2),
        "kernels_heldout_p90_abs_error_pct": round(float(np.percentile(errs, 90)), 2),
        "kernels_heldout_rows": int(len(errs)),
        "per_kernel": scores,
        "batch1_decode_ms_at_1k_context": round(batch1_decode_s(prof) * 1e3, 3),
        "batch1_decode_gpu_ms_at_1k_context": round(gpu_only * 1e3, 3),
    }
    prof["provenance"] = {
        "kernels": f"NVIDIA AIConfigurator kernel database (aiconfigurator-core 0.12.0, Apache-2.0), "
                   f"{hw['gpu']} tables; subsets in sim/data, see sim/data/PROVENANCE.md",
        "fit": "python -m llmserve_env.sim.calibrate kernels: log-space least squares on the training shapes; "
               "about a quarter of the shapes (CRC32 of the shape key % 4 == 0) are held out and scored",
        "t_fixed": "fitted so a batch-1 decode step at 1k context is 7.5 ms (published 7-8 ms, "
                   "Llama-3.1-8B on one H100, shared/data/README.md)",
        "price": hw.pop("price_source"),
        "memory": hw.pop("memory_source"),
        "model_shapes": "config.json of the Hugging Face checkpoints named in model/draft_model",
        "speculation": prof["speculation"].pop("source"),
        "cluster": prof["cluster"].pop("source"),
    }
    return prof


def write_profile(prof: dict[str, Any], directory: Path = PROFILE_DIR) -> Path:
    path = directory / f"{prof['id']}.json"
    path.write_text(json.dumps(prof, indent=2) + "\n")
    load_profile.cache_clear()
    return path


def kernel_report(profiles: list[dict[str, Any]]) -> str:
    lines = ["# Simulator fit report (kernel tables)", "",
             "Held-out shapes only; errors are |model / measured - 1| in percent.", "",
             "| profile | kernel | train rows | held-out rows | held-out median % | held-out p90 % |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for p in profiles:
        for name, s in p["fit_error"]["per_kernel"].items():
            lines.append(f"| {p['id']} | {name} | {s['n_train']} | {s['n_test']} | "
                         f"{s['test_median_abs_err_pct']:.1f} | {s['test_p90_abs_err_pct']:.1f} |")
    lines += ["", "| profile | all held-out kernels median % | p90 % | t_fixed ms | batch-1 decode ms (1k ctx) |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for p in profiles:
        fe = p["fit_error"]
        lines.append(f"| {p['id']} | {fe['kernels_heldout_median_abs_error_pct']:.2f} | "
                     f"{fe['kernels_heldout_p90_abs_error_pct']:.2f} | {p['engine']['t_fixed_s'] * 1e3:.3f} | "
                     f"{fe['batch1_decode_ms_at_1k_context']:.2f} |")
    return "\n".join(lines) + "\n"


def run_kernels(profile_ids: list[str], report_path: Path, out_dir: Path = PROFILE_DIR) -> list[dict[str, Any]]:
    anchor = next(pid for pid, s in SPECS.items() if s.get("anchor"))
    ordered = [anchor] + [p for p in profile_ids if p != anchor]
    out: dict[str, dict[str, Any]] = {}
    t_fixed = None
    for pid in ordered:
        prof = calibrate_kernels(pid, t_fixed)
        t_fixed = prof["engine"]["t_fixed_s"] if pid == anchor else t_fixed
        out[pid] = prof
    chosen = [out[p] for p in profile_ids]
    for prof in chosen:
        write_profile(prof, out_dir)
    report_path.write_text(kernel_report(chosen))
    return chosen


def write_refit(base: Profile, out_id: str, t_fixed_s: float, gpu_time_scale: float, how: str, source: str,
                fit: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """`base` with re-fitted t_fixed and gpu_time_scale, saved as `out_id` with where they came from."""
    prof = json.loads(json.dumps(base.raw))
    prof["id"] = out_id
    prof["engine"]["t_fixed_s"] = round(t_fixed_s, 7)
    prof["engine"]["gpu_time_scale"] = round(gpu_time_scale, 5)
    prof.setdefault("provenance", {})[f"{how}_fit"] = (
        f"t_fixed_s and gpu_time_scale re-fitted to {source} by python -m llmserve_env.sim.calibrate {how}")
    prof.setdefault("fit_error", {})[how] = fit
    write_profile(prof, out_dir)
    return prof


def run_records(profile_id: str, records_path: Path, out_id: str | None, report_path: Path,
                out_dir: Path = PROFILE_DIR) -> dict[str, Any]:
    base = load_profile(profile_id)
    records = read_records(records_path)
    result = fit_records(base, records)
    prof = write_refit(base, out_id or profile_id, result.t_fixed_s, result.gpu_time_scale, "records",
                       f"{len(records)} measured request records ({records_path.name})", result.to_dict(),
                       out_dir)
    report_path.write_text(result.report(prof["id"], records_path.name))
    return prof


def run_steps(profile_id: str, steps_path: Path, out_id: str | None, report_path: Path,
              out_dir: Path = PROFILE_DIR) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Fit report of `profile_id` on measured iterations; the re-fitted profile when `out_id` is given."""
    base = load_profile(profile_id)
    data = read_steps(steps_path)
    result = fit_steps(base, data)
    report_path.write_text(result.report(profile_id, f"{steps_path.name} ({data.meta.get('device', '?')}, "
                                                     f"torch {data.meta.get('torch', '?')})"))
    if out_id is None:
        return result.to_dict(), None
    prof = write_refit(base, out_id, result.t_fixed_s, result.gpu_time_scale, "steps",
                       f"{result.n} iterations measured on a GPU ({steps_path.name})", result.to_dict(), out_dir)
    return result.to_dict(), prof


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.sim.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels", help="fit profiles from the kernel tables")
    k.add_argument("--profile", default="all", help="profile id or 'all'")
    k.add_argument("--out-dir", type=Path, default=PROFILE_DIR, help="where to write the profiles and report")
    r = sub.add_parser("records", help="re-fit a profile from measured request records (JSONL)")
    r.add_argument("--profile", required=True)
    r.add_argument("--records", type=Path, required=True)
    r.add_argument("--out", default=None, help="id of the profile to write (default: overwrite --profile)")
    r.add_argument("--out-dir", type=Path, default=PROFILE_DIR, help="where to write the profile and report")
    s = sub.add_parser("steps", help="score and re-fit a profile on iterations measured on a GPU (CSV)")
    s.add_argument("--profile", required=True)
    s.add_argument("--steps", type=Path, required=True)
    s.add_argument("--out", default=None, help="also write the re-fitted profile under this id")
    s.add_argument("--out-dir", type=Path, default=PROFILE_DIR, help="where to write the report (and profile)")
    e = sub.add_parser("extract", help="rebuild sim/data from the full kernel tables")
    e.add_argument("--src", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "kernels":
        ids = list(SPECS) if args.profile == "all" else [args.profile]
        unknown = [i for i in ids if i not in SPECS]
        if unknown:
            ap.error(f"unknown profile {unknown[0]!r}; built-in: {', '.join(SPECS)}")
        report = args.out_dir / REPORT_NAME
        for prof in run_kernels(ids, report, args.out_dir):
            fe = prof["fit_error"]
            print(f"{prof['id']}: held-out kernel median {fe['kernels_heldout_median_abs_error_pct']:.2f} %, "
                  f"p90 {fe['kernels_heldout_p90_abs_error_pct']:.2f} %, t_fixed "
                  f"{prof['engine']['t_fixed_s'] * 1e3:.3f} ms, batch-1 decode "
                  f"{fe['batch1_decode_ms_at_1k_context']:.2f} ms")
        print(f"report: {report}")
    elif args.cmd == "records":
        report = args.out_dir / f"{args.out or args.profile}.records_fit.md"
        prof = run_records(args.profile, args.records, args.out, report, args.out_dir)
        fe = prof["fit_error"]["records"]
        print(f"{prof['id']}: t_fixed {prof['engine']['t_fixed_s'] * 1e3:.3f} ms, gpu_time_scale "
              f"{prof['engine']['gpu_time_scale']:.4f}, TPOT median error {fe['before_median_abs_error_pct']:.1f} % "
              f"-> {fe['after_median_abs_error_pct']:.1f} %")
        print(f"report: {report}")
    elif args.cmd == "steps":
        report = args.out_dir / f"{args.out or args.profile}.steps_fit.md"
        fit, _ = run_steps(args.profile, args.steps, args.out, report, args.out_dir)
        print(f"{args.profile} on {args.steps.name}: median abs error {fit['before_median_abs_error_pct']:.1f} % "
              f"(p90 {fit['before_p90_abs_error_pct']:.1f} %, model/measured {fit['mean_ratio']:.3f}); re-fitted "
              f"t_fixed {fit['t_fixed_s'] * 1e3:.3f} ms, gpu_time_scale {fit['gpu_time_scale']:.4f} -> "
              f"{fit['after_median_abs_error_pct']:.1f} %")
        print(f"report: {report}")
    else:
        from llmserve_env.sim.kernel_data import extract_subsets
        for name, n in extract_subsets(args.src).items():
            print(f"{name}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
