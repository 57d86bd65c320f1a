"""The stand-in's command line: `python -m llmserve_env.tools.standin --help`."""

from __future__ import annotations

import argparse
import gc
import json
import random

import uvicorn
from llmserve_env.sim import standin
from llmserve_env.sim.standin.app import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_PROFILE,
    TIERS,
    StandinConfig,
    build_app,
    tier_table,
)
from llmserve_env.sim.standin.faults import Faults, cut_on_drop


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.tools.standin",
                                 description=(standin.__doc__ or "").split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="simulator profile whose step times are served")
    ap.add_argument("--tier", default="FP16", choices=TIERS, help="tier for model names without a tier suffix")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="most sequences per batch (vLLM's max_num_seqs)")
    ap.add_argument("--fixed-ttft-ms", type=float, default=None, help="exact TTFT instead of the batching loop")
    ap.add_argument("--fixed-itl-ms", type=float, default=20.0, help="exact ITL with --fixed-ttft-ms")
    ap.add_argument("--api-key", default=None, help="require this key (default: accept any)")
    ap.add_argument("--served-model", default=None, help="answer every request as this one model (like llama-server)")
    ap.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                    help="context length served (vLLM's --max-model-len): prompt + max_tokens must fit, and a "
                         "request without max_tokens gets what is left of it")
    ap.add_argument("--fail-429", type=float, default=0.0)
    ap.add_argument("--retry-after", type=float, default=1.0)
    ap.add_argument("--fail-500", type=float, default=0.0)
    ap.add_argument("--drop", type=float, default=0.0)
    ap.add_argument("--drop-after", type=int, default=3)
    ap.add_argument("--stall", type=float, default=0.0)
    ap.add_argument("--stall-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    ap.add_argument("--write-tiers", default=None, metavar="PATH",
                    help="write a tier table naming this server's models for LLMSERVE_REAL_TIERS, then serve")
    ap.add_argument("--log-level", default="warning")
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> StandinConfig:
    faults = Faults(rate_429=a.fail_429, rate_500=a.fail_500, rate_drop=a.drop, rate_stall=a.stall,
                    retry_after_s=a.retry_after, stall_s=a.stall_s, drop_after=a.drop_after,
                    rng=random.Random(a.seed))
    fixed = a.fixed_ttft_ms is not None
    return StandinConfig(profile=a.profile, tier=a.tier, max_num_seqs=a.max_num_seqs,
                         fixed_ttft_s=a.fixed_ttft_ms / 1000 if fixed else None,
                         fixed_itl_s=a.fixed_itl_ms / 1000 if fixed else None, api_key=a.api_key,
                         served_model=a.served_model, max_model_len=a.max_model_len, faults=faults)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.max_model_len < 2:
        raise SystemExit(f"--max-model-len must be >= 2 (a prompt token and an output token), got {a.max_model_len}")
    app = cut_on_drop(build_app(config_from_args(a)))
    if a.write_tiers:
        with open(a.write_tiers, "w", encoding="utf-8") as f:
            json.dump(tier_table(a.profile), f, indent=2)
    # Keep full garbage collections short: startup objects live as long as the server (see
    # gateway/backend.py for the pauses measured without this).
    gc.collect()
    gc.freeze()
    # backlog: the accuracy bench opens hundreds of connections at once.
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level,
                access_log=False, backlog=4096)


if __name__ == "__main__":
    main()
