"""Many concurrent clients: isolation, determinism and latency under load, over HTTP and the WebSocket.

    python bench/load.py                          # 1, 10, 50, 200 clients, 16 windows each; own server
    python bench/load.py --steps 0                # whole episodes (64 windows: ~6 min on 2 cores)
    python bench/load.py --clients 1,10 --url http://127.0.0.1:7860

For each N, N clients run at once (asyncio, one process). Client i plays one episode over
keep-alive HTTP (POST /reset, then POST /step with the episode_id that /reset returned), then the
same episode over the WebSocket /ws (OpenEnv's protocol, through OpenEnv's GenericEnvClient):
task `--task`, seed i, and its own seeded sequence of random actions. Every observation, reward
and done flag must equal those of the same (task, seed, actions) episode played alone in this
process (the simulator is deterministic), serialised the way the server serialises it; a
difference, an exception or an error status counts as an error. `--steps K` (default 16) plays
the first K windows of each episode, and compares those; `--steps 0` plays whole episodes.

The server's limits come from its environment (server/config.py): LLMSERVE_MAX_SESSIONS (default
256) bounds concurrent WebSocket sessions, and a client beyond it is refused with OpenEnv's
CAPACITY_REACHED error (counted here as an error); HTTP clients have no such bound, their episodes
are kept in a store of LLMSERVE_MAX_EPISODES (default 1024). The server this script starts
inherits the environment, so `LLMSERVE_MAX_SESSIONS=512 python bench/load.py --clients 300` works.

Prints a table, then (last line) one flat JSON object with clients_<N>_errors, clients_<N>_p50_ms,
clients_<N>_p99_ms and clients_<N>_steps_per_s (both transports together: steps per second of
wall clock while the N clients ran), plus clients_<N>_http_p50_ms and clients_<N>_ws_p50_ms.
The table also shows the CPU the clients (this process) and the server (when this script started
it) used, in cores: on a small machine the clients can be the bottleneck, and this says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction, ServeObservation
from llmserve_env.shared.workloads import resolve_task
from llmserve_env.tools import cli
from local_server import own_server
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.env_server.types import StepResponse
from openenv.core.generic_client import GenericEnvClient

TIMEOUT_S = 600.0  # 200 clients on 2 cores: one step may wait behind 200 others


@dataclass
class Level:
    """What N concurrent clients saw."""

    clients: int
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    http_ms: list[float] = field(default_factory=list)
    ws_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def row(self) -> dict[str, float]:
        both = self.http_ms + self.ws_ms
        n = self.clients

        def pct(xs: list[float], q: float) -> float:
            return float(np.percentile(xs, q)) if xs else float("nan")

        return {
            f"clients_{n}_errors": len(self.errors),
            f"clients_{n}_p50_ms": pct(both, 50),
            f"clients_{n}_p99_ms": pct(both, 99),
            f"clients_{n}_steps_per_s": len(both) / self.wall_s if self.wall_s else 0.0,
            f"clients_{n}_http_p50_ms": pct(self.http_ms, 50),
            f"clients_{n}_ws_p50_ms": pct(self.ws_ms, 50),
        }


def random_actions(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [{"batch_cap": rng.randint(1, 512), "kv_budget_fraction": round(rng.uniform(0.1, 1.0), 3),
             "speculation_depth": rng.randint(0, 8), "quantization_tier": rng.choice(QUANTIZATION_TIERS),
             "prefill_decode_split": rng.random() < 0.5, "priority_routing": rng.random() < 0.5}
            for _ in range(n)]


def comparable(observation: dict[str, Any], reward: Any, done: Any) -> dict[str, Any]:
    """One step as both transports deliver it, minus the episode_id (each run has its own)."""
    return {"observation": {k: v for k, v in observation.items() if k != "episode_id"},
            "reward": reward, "done": done}


def wire(obs: ServeObservation) -> dict[str, Any]:
    """An in-process observation serialised as the server does (OpenEnv's serialize_observation,
    then pydantic's JSON), so floats compare exactly as they arrive over the wire."""
    payload = json.loads(StepResponse(**serialize_observation(obs)).model_dump_json())
    return comparable(payload["observation"], payload["reward"], payload["done"])


def reference(task_id: str, seed: int, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The episode played alone, in process."""
    env = InProcessEnv()
    env.reset(task_id=task_id, seed=seed)
    out = []
    for a in actions:
        obs = env.step(ServeAction(**a))
        out.append(wire(obs))
        if obs.done:
            break
    return out


async def http_episode(url: str, task_id: str, seed: int, actions: list[dict[str, Any]],
                       lat: list[float]) -> list[dict[str, Any]]:
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as c:
        r = await c.post("/reset", json={"task_id": task_id, "seed": seed})
        if r.status_code != 200:
            raise RuntimeError(f"POST /reset -> HTTP {r.status_code}: {r.text[:200]}")
        episode_id = r.json()["observation"]["episode_id"]
        for a in actions:
            t0 = time.perf_counter()
            r = await c.post("/step", json={"action": a, "episode_id": episode_id})
            lat.append((time.perf_counter() - t0) * 1e3)
            if r.status_code != 200:
                raise RuntimeError(f"POST /step -> HTTP {r.status_code}: {r.text[:200]}")
            p = r.json()
            out.append(comparable(p["observation"], p["reward"], p["done"]))
            if p["done"]:
                break
    return out


async def ws_episode(url: str, task_id: str, seed: int, actions: list[dict[str, Any]],
                     lat: list[float]) -> list[dict[str, Any]]:
    out = []
    async with GenericEnvClient(base_url=url, message_timeout_s=TIMEOUT_S) as env:
        await env.reset(task_id=task_id, seed=seed)
        for a in actions:
            t0 = time.perf_counter()
            res = await env.step(a)
            lat.append((time.perf_counter() - t0) * 1e3)
            out.append(comparable(res.observation, res.reward, res.done))
            if res.done:
                break
    return out


def first_difference(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} steps, alone {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            fields = sorted(f for f in set(g["observation"]) | set(w["observation"])
                            if g["observation"].get(f) != w["observation"].get(f))
            return f"step {k + 1} differs from the episode played alone (fields: {fields or 'reward/done'})"
    return None


async def client(url: str, task_id: str, i: int, actions: list[dict[str, Any]], want: list[dict[str, Any]],
                 level: Level) -> None:
    for name, play, lat in (("http", http_episode, level.http_ms), ("ws", ws_episode, level.ws_ms)):
        try:
            got = await play(url, task_id, i, actions, lat)
        except Exception as exc:  # a bench counts every failure, whatever its kind
            level.errors.append(f"client {i} {name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        diff = first_difference(got, want)
        if diff:
            level.errors.append(f"client {i} {name}: {diff}")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of a process: this one when pid is None, else from /proc (Linux)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_level(url: str, task_id: str, n: int, plans: list[list[dict[str, Any]]],
                    refs: list[list[dict[str, Any]]], server_pid: int | None) -> Level:
    level = Level(n)
    c0, s0 = cpu_seconds(None), cpu_seconds(server_pid) if server_pid else None
    t0 = time.perf_counter()
    await asyncio.gather(*(client(url, task_id, i, plans[i], refs[i], level) for i in range(n)))
    level.wall_s = time.perf_counter() - t0
    level.client_cpu_s = (cpu_seconds(None) or 0.0) - (c0 or 0.0)
    s1 = cpu_seconds(server_pid) if server_pid else None
    level.server_cpu_s = s1 - s0 if s0 is not None and s1 is not None else None
    return level


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/load.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--clients", type=cli.int_list(1), default="1,10,50,200", help="comma-separated client counts")
    ap.add_argument("--url", type=cli.http_url, help="a running server; default: start one")
    ap.add_argument("--task", type=cli.task_id, default="static_workload", help="task played")
    ap.add_argument("--steps", type=cli.int_at_least(0), default=16, help="windows per episode; 0 = the task's horizon")
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)
    counts = args.clients
    horizon = resolve_task(args.task).horizon
    steps = min(args.steps, horizon) if args.steps > 0 else horizon

    # Client i has seed i and its own action sequence at every N, so each reference is played once.
    t0 = time.perf_counter()
    plans = [random_actions(random.Random(1000 + i), steps) for i in range(max(counts))]
    refs = [reference(args.task, i, plans[i]) for i in range(max(counts))]
    print(f"{len(refs)} reference episodes of {steps} windows played alone in {time.perf_counter() - t0:.1f} s",
          flush=True)

    def run(url: str, server_pid: int | None) -> list[Level]:
        levels = []
        for n in counts:
            levels.append(asyncio.run(run_level(url, args.task, n, plans, refs, server_pid)))
            lv = levels[-1]
            print(f"  {n} clients: {len(lv.http_ms) + len(lv.ws_ms)} steps in {lv.wall_s:.1f} s, "
                  f"{len(lv.errors)} errors", flush=True)
        return levels

    if args.url:
        levels = run(args.url, None)
    else:
        # Every client here is one address (loopback): the per-address WebSocket cap must admit them all.
        per_client = os.environ.get("LLMSERVE_WS_MAX_PER_CLIENT", str(max(args.clients)))
        with own_server(env={"LLMSERVE_WS_MAX_PER_CLIENT": per_client}) as (url, pid):
            levels = run(url, pid)

    print(f"\n{'clients':>7} {'errors':>6} {'steps':>6} {'steps/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'http p50':>9} {'ws p50':>8} {'wall s':>7} {'client cpu':>10} {'server cpu':>10}")
    result: dict[str, float] = {}
    for lv in levels:
        row = lv.row()
        n = lv.clients
        print(f"{n:>7} {len(lv.errors):>6} {len(lv.http_ms) + len(lv.ws_ms):>6} "
              f"{row[f'clients_{n}_steps_per_s']:>8.1f} {row[f'clients_{n}_p50_ms']:>8.2f} "
              f"{row[f'clients_{n}_p99_ms']:>8.2f} {row[f'clients_{n}_http_p50_ms']:>9.2f} "
              f"{row[f'clients_{n}_ws_p50_ms']:>8.2f} {lv.wall_s:>7.1f} {lv.client_cpu_s / lv.wall_s:>10.2f} "
              f"{'n/a' if lv.server_cpu_s is None else f'{lv.server_cpu_s / lv.wall_s:.2f}':>10}")
        result.update(row)
    errors = [e for lv in levels for e in lv.errors]
    if errors:
        print(f"\nfirst errors ({len(errors)} in all):")
        for e in errors[:8]:
            print("  " + e)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}))


if __name__ == "__main__":
    main()
