"""Step latency over keep-alive HTTP and over the WebSocket.

    python bench/http_step.py                 # starts its own server on a free port
    python bench/http_step.py --url http://127.0.0.1:7860 --episodes 5
    python bench/http_step.py --against 9d1832e --repeats 3   # REV's server and this tree's, alternating

`--against REV` runs the whole bench (its own server included) on git revision REV's package and on
this tree's, alternating child processes for `--repeats` rounds (bench/against.py), and prints the
before/after of each figure (the smallest latency of the rounds, the largest rate).

Prints a table, then (last line) one JSON object with http_p50_ms, http_p99_ms,
http_steps_per_s, ws_p50_ms.

Where one POST /step goes (static_workload, this script's action; medians on the 2-core dev
machine under other load, measured in process unless said otherwise):

| piece                                                               | ms        |
|---------------------------------------------------------------------|-----------|
| the simulator's `run_window` alone                                  | 0.70-0.85 |
| + metrics (0.10), reward, log record (0.02), observation (0.015),   | 0.13-0.19 |
|   the response's JSON (0.02): `Episode.step` whole 0.83-1.04        |           |
| the app around it (middleware, body validation, store, response),   | 0.05      |
|   `Episode._serve` stubbed out (was 0.13 through FastAPI's router,  |           |
|   which matched every route in turn, twice; server/routes.py's      |           |
|   StepRoute now answers /step ahead of it)                          |           |
| over keep-alive loopback, `Episode._serve` stubbed out, quieter     |           |
|   rounds: /step with httpx                                          | 0.84-0.92 |
|   the same with the standard library's http.client                  | 0.39-0.45 |

So with httpx about 0.8 ms of every HTTP step is transport, uvicorn and the client, and the
simulator's ~0.9 ms the rest: a p50 just under 2 ms on a quiet machine (1.67-1.71 ms, best of 5
alternating rounds), above it when the machine is loaded (rounds of the same run spread 1.7-3.5 ms).
Sending the response's head and body in one send() took ~0.07 ms off http.client's round trip
but nothing off httpx's, so uvicorn writes them as it does (two). The WebSocket, with lighter
framing on both ends, is faster still. httptools and uvloop (uvicorn[standard]) take ~0.2 ms off
the server's share.
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
import numpy as np
from against import alternate, check_rev, compare
from llmserve_env.tools import cli
from local_server import own_server

ACTION = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, "quantization_tier": "FP16",
          "prefill_decode_split": False, "priority_routing": False}


def http_episodes(url: str, task: str, episodes: int) -> tuple[list[float], float]:
    lat: list[float] = []
    steps = 0
    t_start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=30) as c:
        for ep in range(episodes):
            eid = c.post("/reset", json={"task_id": task, "seed": ep}).json()["observation"]["episode_id"]
            done = False
            while not done:
                t0 = time.perf_counter()
                r = c.post("/step", json={"action": ACTION, "episode_id": eid})
                lat.append((time.perf_counter() - t0) * 1e3)
                r.raise_for_status()
                done = r.json()["done"]
                steps += 1
    return lat, steps / (time.perf_counter() - t_start)


def ws_episodes(url: str, task: str, episodes: int) -> list[float]:
    from openenv.core.generic_client import GenericEnvClient

    lat: list[float] = []
    with GenericEnvClient(base_url=url).sync() as env:
        for ep in range(episodes):
            result = env.reset(task_id=task, seed=ep)
            while not result.done:
                t0 = time.perf_counter()
                result = env.step(ACTION)
                lat.append((time.perf_counter() - t0) * 1e3)
    return lat


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/http_step.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--url", type=cli.http_url, help="a running server; default: start one")
    ap.add_argument("--task", type=cli.task_id, default="static_workload", help="task played")
    ap.add_argument("--episodes", type=cli.int_at_least(1), default=5, help="timed episodes per transport")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="a git revision whose server is measured in the same run (before/after)")
    ap.add_argument("--repeats", type=cli.int_at_least(1), default=3, help="rounds with --against")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one --against side
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    if args.against is not None:
        bad = check_rev(args.against)
        if bad:
            ap.error(f"argument --against: {bad}")
        if args.url:
            ap.error("argument --against: starts its own servers, one per side; leave out --url")
        rounds = alternate(__file__, ["--child", "--quiet", "--task", args.task, "--episodes", str(args.episodes)], args.against,
                           args.repeats, args.quiet)
        print(json.dumps(compare(rounds, lower_is_better=("_ms",), counts=("steps",))))
        return

    def run(url: str) -> dict[str, float]:
        http_episodes(url, args.task, 1)  # warm-up
        lat, sps = http_episodes(url, args.task, args.episodes)
        ws = ws_episodes(url, args.task, args.episodes)
        return {
            "http_p50_ms": float(np.percentile(lat, 50)),
            "http_p99_ms": float(np.percentile(lat, 99)),
            "http_steps_per_s": float(sps),
            "ws_p50_ms": float(np.percentile(ws, 50)),
            "ws_p99_ms": float(np.percentile(ws, 99)),
            "steps": len(lat),
        }

    if args.url:
        res = run(args.url)
    else:
        with own_server() as (url, _):
            res = run(url)
    print(f"{'transport':<10} {'p50 ms':>8} {'p99 ms':>8} {'steps/s':>9}")
    print(f"{'http':<10} {res['http_p50_ms']:>8.2f} {res['http_p99_ms']:>8.2f} {res['http_steps_per_s']:>9.1f}")
    print(f"{'ws':<10} {res['ws_p50_ms']:>8.2f} {res['ws_p99_ms']:>8.2f} {'':>9}")
    print(json.dumps({k: round(v, 3) for k, v in res.items()}))


if __name__ == "__main__":
    main()
