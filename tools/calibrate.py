"""The calibration command line (also `llmserve-env calibrate`): kernels, records, replay, steps,
extract. What each does, and the fits themselves: sim/calibration/calibrate.py (its docstring is
this command's --help).

    python -m llmserve_env.tools.calibrate kernels --profile all --out-dir sim/profiles
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.calibration import calibrate as calibration
from llmserve_env.sim.calibration.calibrate import (
    REPORT_NAME,
    STEP_MODELS,
    FitRefusedError,
    out_path,
    run_kernels,
    run_records,
    run_steps,
)
from llmserve_env.sim.calibration.profile_specs import SPECS
from llmserve_env.sim.calibration.record_fit import load_runs, read_actions
from llmserve_env.sim.calibration.replay import replay
from llmserve_env.sim.calibration.table_fit import probe_dicts, read_probe_points
from llmserve_env.sim.caps import RequestCaps
from llmserve_env.sim.profiles import UnknownProfileError, load_profile, user_profile_dir
from llmserve_env.sim.prompt_breaks import parse_prompt_breaks
from llmserve_env.sim.slot_cache import parse_prefix_cache
from llmserve_env.tools import cli


def _replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=Path, required=True, help="a real-mode recording (LLMSERVE_REAL_RECORD)")
    acts = p.add_mutually_exclusive_group(required=True)
    acts.add_argument("--action", help="the action played in every window, as ServeAction JSON")
    acts.add_argument("--actions", type=Path, help="JSONL: one ServeAction per window")
    p.add_argument("--window-s", type=float, default=1.0, help="window length of the recorded task (s)")
    p.add_argument("--windows", type=int, default=None, help="windows played (default: one per action, "
                   "or up to the last recorded event)")
    p.add_argument("--episode", default=None, help="replay only this episode (episode_id, or EPISODE:SEED)")
    p.add_argument("--max-requests-per-step", type=int, default=64, help="real mode's cap [64]")
    p.add_argument("--max-prompt-tokens", type=int, default=4096, help="real mode's cap [4096]")
    p.add_argument("--max-completion-tokens", type=int, default=512, help="real mode's cap [512]")


def _replay_inputs(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[ServeAction], RequestCaps]:
    try:
        actions = read_actions(args.actions) if args.actions else [ServeAction.model_validate_json(args.action)]
    except (OSError, ValueError) as e:
        ap.error(f"--action/--actions: {e}")
    if not args.window_s > 0:
        ap.error(f"--window-s must be > 0, got {args.window_s}")
    if args.windows is not None and args.windows < 1:
        ap.error(f"--windows must be >= 1, got {args.windows}")
    try:
        caps = RequestCaps(args.max_requests_per_step, args.max_prompt_tokens, args.max_completion_tokens)
    except ValueError as e:
        ap.error(str(e))
    return actions, caps


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(prog="python -m llmserve_env.tools.calibrate", description=calibration.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    user = user_profile_dir()
    k = sub.add_parser("kernels", help="fit profiles from the kernel tables")
    k.add_argument("--profile", default="all", help="profile id or 'all'")
    k.add_argument("--out-dir", type=Path, default=user, help=f"where to write the profiles and report [{user}]")
    r = sub.add_parser("records", help="fit a profile's iteration time to a real-mode recording (JSONL)")
    r.add_argument("--profile", required=True, help="the profile to start from (id or path)")
    r.add_argument("--out", default=None, help="where to write the fitted profile: a .json path, or an id "
                   f"written to {user} [<profile>-records]")
    r.add_argument("--step-model", choices=STEP_MODELS, default="auto",
                   help="affine: one cost per decoding sequence; table: decode step by slots and prefill by "
                   "tokens, interpolated; auto: the one that replays held-out episodes better [%(default)s]")
    r.add_argument("--held-out", type=int, default=None,
                   help="episodes (the last ones) held out to choose the step model [a third, at least 1]")
    r.add_argument("--decode-probe", type=Path, default=None, metavar="CSV",
                   help="the engine's decode step by slots (columns slots,step_ms,context_tokens, as "
                   "bench/real_engine.py --probe writes it; two prompt sizes per slot count give the context "
                   "cost by slots): starts the table's decode values and is fitted beside the records")
    r.add_argument("--prefix-cache", default=None, metavar="blocks|slots:N",
                   help="how the recorded engine caches prefixes, written into the profile: blocks (vLLM's "
                   "block cache) or slots:N (llama-server with -np N; sim/slot_cache.py) [the base profile's]")
    r.add_argument("--prompt-breaks", default=None, metavar="none|llama[:UBATCH]",
                   help="where the recorded engine stops a prompt's prefill between iterations, played while "
                   "fitting and written into the profile: llama (llama-server's context checkpoints, made for "
                   "sliding-window and recurrent models; its -ub, 512 by default; sim/prompt_breaks.py) or none "
                   "[the base profile's]")
    r.add_argument("--cached-context-s", type=float, default=None, metavar="S",
                   help="the engine's attention cost per pair of a computed prompt token and a token before it "
                   "(seconds; bench/cached_prefill.py measures it on llama-server), held fixed while fitting and "
                   "written into the profile (sim/cached_context.py) [none: a cached prefix costs nothing]")
    _replay_args(r)
    rp = sub.add_parser("replay", help="replay a real-mode recording through the simulator")
    rp.add_argument("--profile", required=True, help="profile id or path")
    _replay_args(rp)
    s = sub.add_parser("steps", help="score and re-fit a profile on iterations measured on a GPU (CSV)")
    s.add_argument("--profile", required=True)
    s.add_argument("--steps", type=Path, required=True)
    s.add_argument("--out", default=None, help="also write the re-fitted profile under this id")
    s.add_argument("--out-dir", type=Path, default=user, help=f"where to write the report (and profile) [{user}]")
    e = sub.add_parser("extract", help="rebuild sim/data from the full kernel tables")
    e.add_argument("--src", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "kernels":
        ids = list(SPECS) if args.profile == "all" else [args.profile]
        unknown = [i for i in ids if i not in SPECS]
        if unknown:
            ap.error(f"unknown profile {unknown[0]!r}; built-in: {', '.join(SPECS)}")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        report = args.out_dir / REPORT_NAME
        for prof in run_kernels(ids, report, args.out_dir):
            fe = prof["fit_error"]
            print(f"{prof['id']}: held-out kernel median {fe['kernels_heldout_median_abs_error_pct']:.2f} %, "
                  f"p90 {fe['kernels_heldout_p90_abs_error_pct']:.2f} %, t_fixed "
                  f"{prof['engine']['t_fixed_s'] * 1e3:.3f} ms, batch-1 decode "
                  f"{fe['batch1_decode_ms_at_1k_context']:.2f} ms")
        print(f"report: {report}")
    elif args.cmd in ("records", "replay"):
        actions, caps = _replay_inputs(ap, args)
        try:
            if args.cmd == "records":
                base_id = load_profile(args.profile).id
                out = out_path(args.out, f"{base_id}-records")
                cache = parse_prefix_cache(args.prefix_cache) if args.prefix_cache else None
                breaks = parse_prompt_breaks(args.prompt_breaks) if args.prompt_breaks else None
                points = read_probe_points(args.decode_probe) if args.decode_probe else None
                probe, probe_ctx = probe_dicts(points) if points else (None, None)
                prof, fit = run_records(args.profile, args.records, actions, out, window_s=args.window_s,
                                        windows=args.windows, caps=caps, episode=args.episode,
                                        step_model=args.step_model, held_out=args.held_out, probe=probe,
                                        probe_ctx=probe_ctx, probe_points=points, prefix_cache=cache,
                                        prompt_breaks=breaks, cached_context=args.cached_context_s)
            else:
                profile = load_profile(args.profile)
                runs = load_runs(args.records, actions, window_s=args.window_s, windows=args.windows, caps=caps,
                                 episode=args.episode)
        except (UnknownProfileError, OSError, ValueError) as exc:
            msg = str(exc) if not isinstance(exc, UnknownProfileError) else f"--profile: {exc}"
            print(f"error: {msg}", file=sys.stderr)
            return 2
        except FitRefusedError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 1
        if args.cmd == "records":
            b, a = fit.before_summary, fit.after_summary
            c = fit.coefficients
            kept = "" if prof["fit_error"]["records"]["step_model"] == "affine" else " (affine fit, not kept)"
            print(f"{prof['id']}{kept}: per iteration {c.step_s * 1e3:.2f} ms + {c.seq_s * 1e3:.3f} ms per decoding "
                  f"sequence + {c.token_s * 1e3:.3f} ms per token + {c.ctx_s * 1e6:.3f} us per context token; "
                  f"replay TTFT median error {b['ttft_err_pct']:.1f} % -> {a['ttft_err_pct']:.1f} %, TPOT "
                  f"{b['tpot_err_pct']:.1f} % -> {a['tpot_err_pct']:.1f} %")
            records = prof["fit_error"]["records"]
            if "choice" in records:
                held = records["choice"]["held_out"]
                one, by = held["table_one_context"], held["table_context_by_slots"]
                print(f"step model: {records['step_model']} (held-out TTFT / TPOT median error: affine "
                      f"{held['affine']['ttft_err_pct']:.1f} / {held['affine']['tpot_err_pct']:.1f} %, table "
                      f"{held['table']['ttft_err_pct']:.1f} / {held['table']['tpot_err_pct']:.1f} %: with one "
                      f"context cost {one['ttft_err_pct']:.1f} / {one['tpot_err_pct']:.1f} %, with a context cost "
                      f"by slots {by['ttft_err_pct']:.1f} / {by['tpot_err_pct']:.1f} %)")
                if records["step_model"] == "table":
                    print(f"table kept: context cost {records['table_context']}")
            else:
                print(f"step model: {records['step_model']} (one episode recorded: none held out to choose on)")
            if "table_after" in records:
                t = records["table_after"]
                print(f"timed by the table: replay TTFT median error {t['ttft_err_pct']:.1f} %, TPOT "
                      f"{t['tpot_err_pct']:.1f} %")
            print(f"profile: {out}")
            print(f"report: {out.with_name(out.stem + '.records_fit.md')}")
        else:
            results = []
            for run in runs:
                cmp = replay(run, profile)
                results.append(cmp)
                print(f"episode {run.key} on {profile.id}:")
                print(cmp.table())
            w = [c.n_ttft + c.n_tpot for c in results]
            keys = ("ttft_err_pct", "tpot_err_pct", "throughput_err_pct")
            print(json.dumps({k: round(float(np.average([c.summary()[k] for c in results], weights=w)), 2)
                              for k in keys}))
    elif args.cmd == "steps":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        report = args.out_dir / f"{args.out or args.profile}.steps_fit.md"
        steps_fit, _ = run_steps(args.profile, args.steps, args.out, report, args.out_dir)
        print(f"{args.profile} on {args.steps.name}: median abs error "
              f"{steps_fit['before_median_abs_error_pct']:.1f} % (p90 {steps_fit['before_p90_abs_error_pct']:.1f} %, "
              f"model/measured {steps_fit['mean_ratio']:.3f}); re-fitted t_fixed {steps_fit['t_fixed_s'] * 1e3:.3f} ms, "
              f"gpu_time_scale {steps_fit['gpu_time_scale']:.4f} -> {steps_fit['after_median_abs_error_pct']:.1f} %")
        print(f"report: {report}")
    else:
        from llmserve_env.sim.calibration.kernel_data import extract_subsets
        for name, n in extract_subsets(args.src).items():
            print(f"{name}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
