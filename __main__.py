"""LLMServeEnv's command line: `python -m llmserve_env COMMAND [options]`, also installed as
`llmserve-env COMMAND [options]`. Each command is the project's own tool, run as is;
`COMMAND --help` shows its options and defaults.

commands:
  serve       the HTTP API and web UI (uvicorn; sim mode unless --mode real)
  evaluate    score policies on held-out episodes (evaluate.py)
  train       PPO on one task (train.py; needs the `train` extra: make install-train)
  calibrate   fit simulator profiles (python -m llmserve_env.sim.calibrate)
  bench       a benchmark script from bench/ (source checkout only): bench NAME [options]
  baseline    the baseline suite (python -m llmserve_env.server.baseline_inference)
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

from llmserve_env import cli

ROOT = Path(__file__).resolve().parent
BENCH_DIR = ROOT / "bench"
COMMANDS = ("serve", "evaluate", "train", "calibrate", "bench", "baseline")
PROG = "python -m llmserve_env"


def bench_names() -> list[str]:
    if not BENCH_DIR.is_dir():
        return []
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem != "local_server" and not p.stem.startswith("_"))


def serve_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"{PROG} serve", formatter_class=cli.HelpFormatter,
                                 description="Serve LLMServeEnv's HTTP API, WebSocket and web UI (/web).")
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0: every interface)")
    ap.add_argument("--port", type=cli.int_at_least(1), default=int(os.environ.get("PORT", "7860")),
                    help="port to listen on (default: $PORT, else 7860)")
    ap.add_argument("--mode", choices=("sim", "real"), default=os.environ.get("LLMSERVE_MODE", "sim") or "sim",
                    help="backend: the simulator, or an OpenAI-compatible endpoint (needs OPENAI_API_KEY)")
    cli.add_output_options(ap)
    return ap


def serve(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    cli.configure_logging(args)
    # The app reads its mode from the environment when it is built (server/config.py).
    os.environ["LLMSERVE_MODE"] = args.mode
    import uvicorn
    from llmserve_env.server.app import build_app

    uvicorn.run(build_app(), host=args.host, port=args.port, log_level=args.log_level.lower())
    return 0


def train(argv: list[str]) -> int:
    from llmserve_env.train_config import parse_args

    parse_args(argv)  # --help and every argument error, without torch
    try:
        from llmserve_env import train as train_module
    except ModuleNotFoundError as exc:
        print(f"{PROG} train: needs torch, from the `train` extra: make install-train ({exc})", file=sys.stderr)
        return 1
    train_module.main(argv)
    return 0


def bench(argv: list[str]) -> int:
    names = bench_names()
    ap = argparse.ArgumentParser(prog=f"{PROG} bench", formatter_class=cli.HelpFormatter,
                                 description="Run a benchmark script from bench/ with its own options "
                                             "(`bench NAME --help` lists them).")
    ap.add_argument("name", choices=names or ["(none: bench/ ships with the source checkout only)"],
                    help="the script")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the script's options")
    args = ap.parse_args(argv)
    script = BENCH_DIR / f"{args.name}.py"
    # As `python bench/NAME.py`: its folder first on the path (for bench/local_server.py), its own argv.
    sys.path.insert(0, str(BENCH_DIR))
    sys.argv = [f"bench/{args.name}.py", *args.options]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _call(main, argv: list[str]) -> int:
    code = main(argv)
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=f"one of {', '.join(COMMANDS)}")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the command's options")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0 if argv else 2
    args = ap.parse_args(argv[:1])
    rest = argv[1:]
    if args.command == "serve":
        return serve(rest)
    if args.command == "train":
        return train(rest)
    if args.command == "bench":
        return bench(rest)
    if args.command == "evaluate":
        from llmserve_env import evaluate

        return _call(evaluate.main, rest)
    if args.command == "calibrate":
        from llmserve_env.sim import calibrate

        return _call(calibrate.main, rest)
    from llmserve_env.server import baseline_inference

    return _call(baseline_inference.main, rest)


if __name__ == "__main__":
    sys.exit(main())
