"""LLMServeEnv's command line: `python -m llmserve_env COMMAND [options]`, also installed as
`llmserve-env COMMAND [options]`. Each command is the project's own tool, run as is;
`COMMAND --help` shows its options and defaults.

commands:
  serve       the HTTP API and web UI (uvicorn; sim mode unless --mode real)
  evaluate    score policies on held-out episodes (evaluate.py)
  train       PPO on one task (train.py; needs the `train` extra: make install-train)
  calibrate   fit simulator profiles (python -m llmserve_env.tools.calibrate)
  bench       a benchmark script from bench/ (source checkout only): bench NAME [options]
  baseline    the baseline suite (python -m llmserve_env.server.baseline_inference)
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

from llmserve_env.tools import cli

ROOT = Path(__file__).resolve().parent
BENCH_DIR = ROOT / "bench"
COMMANDS = ("serve", "evaluate", "train", "calibrate", "bench", "baseline")
PROG = "python -m llmserve_env"


def typed_prog() -> str:
    """The dispatcher as the user typed it: the console script, or `python -m llmserve_env`."""
    return "llmserve-env" if Path(sys.argv[0]).name == "llmserve-env" else PROG


def bench_names() -> list[str]:
    if not BENCH_DIR.is_dir():
        return []
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem != "local_server" and not p.stem.startswith("_"))


def serve_parser() -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=f"{typed_prog()} serve", formatter_class=cli.HelpFormatter,
                                 description="Serve LLMServeEnv's HTTP API, WebSocket and web UI (/web).")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (loopback by default; 0.0.0.0: every interface, with LLMSERVE_TRACE_DIR set)")
    ap.add_argument("--port", type=cli.port, default=os.environ.get("PORT", "7860"),
                    help="port to listen on (default: $PORT, else 7860)")
    ap.add_argument("--mode", choices=("sim", "real"), default=os.environ.get("LLMSERVE_MODE", "sim") or "sim",
                    help="backend: the simulator, or an OpenAI-compatible endpoint (needs OPENAI_API_KEY)")
    cli.add_output_options(ap)
    return ap


def serve(argv: list[str]) -> int:
    """Serve until stopped; a configuration the server cannot start with is one line on stderr and
    exit 1 (a real-mode endpoint that does not answer, a bad setting), never a traceback."""
    ap = serve_parser()
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    # The app reads its mode from the environment when it is built (server/config.py).
    os.environ["LLMSERVE_MODE"] = args.mode
    import uvicorn
    from llmserve_env.server.serving import quiet_repeated_errors, uvicorn_settings

    try:
        # built here, before uvicorn starts: a real-mode check that fails is one line, not a traceback
        from llmserve_env.server.app import build_app

        app = build_app()
    except ValueError as exc:  # GatewayConfigError and pydantic's ValidationError are ValueErrors
        print(f"{ap.prog}: cannot start: {cli.one_line(exc)}", file=sys.stderr)
        return 1
    quiet_repeated_errors()  # the same slow-client, connection and log bounds as make serve
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), **uvicorn_settings())
    return 0


def train(argv: list[str]) -> int:
    from llmserve_env.tools.train_config import parse_args

    parse_args(argv)  # --help and every argument error, without torch
    try:
        from llmserve_env.tools import train as train_module
    except ModuleNotFoundError as exc:
        print(f"{typed_prog()} train: needs torch, from the `train` extra: make install-train ({exc})",
              file=sys.stderr)
        return 1
    train_module.main(argv)
    return 0


def bench(argv: list[str]) -> int:
    names = bench_names()
    ap = cli.ArgumentParser(prog=f"{typed_prog()} bench", formatter_class=cli.HelpFormatter,
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
    ap = cli.ArgumentParser(prog=typed_prog(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=f"one of {', '.join(COMMANDS)}")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the command's options")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0 if argv else 2
    args = ap.parse_args(argv[:1])
    # Each command's own parser names itself as typed (`llmserve-env evaluate`, not `python tools/evaluate.py`).
    with cli.invoked_as(f"{typed_prog()} {args.command}"):
        return dispatch(args.command, argv[1:])


def dispatch(command: str, rest: list[str]) -> int:
    if command == "serve":
        return serve(rest)
    if command == "train":
        return train(rest)
    if command == "bench":
        return bench(rest)
    if command == "evaluate":
        from llmserve_env.tools import evaluate

        return _call(evaluate.main, rest)
    if command == "calibrate":
        from llmserve_env.tools import calibrate

        return _call(calibrate.main, rest)
    from llmserve_env.server import baseline_inference

    return _call(baseline_inference.main, rest)


if __name__ == "__main__":
    sys.exit(main())
