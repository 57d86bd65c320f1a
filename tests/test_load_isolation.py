"""Many clients at once: every episode sees exactly what it would see alone (isolation, determinism).

Clients in threads, each with its own seed and its own random actions, over keep-alive HTTP and
over OpenEnv's WebSocket, all against one live server; each episode is compared with the same
(task, seed, actions) episode played alone in process. bench/load.py does the same at 1-200
clients; the last test runs it briefly so it keeps working.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.server.episodes import EpisodeStore
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction
from openenv.core.generic_client import GenericEnvClient

ROOT = Path(__file__).resolve().parent.parent
TASK = "bursty_workload"
STEPS = 6
HTTP_CLIENTS = 12
WS_CLIENTS = 6


def actions_for(seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"batch_cap": rng.randint(1, 512), "kv_budget_fraction": round(rng.uniform(0.1, 1.0), 3),
             "speculation_depth": rng.randint(0, 8), "quantization_tier": rng.choice(QUANTIZATION_TIERS),
             "prefill_decode_split": rng.random() < 0.5, "priority_routing": rng.random() < 0.5}
            for _ in range(STEPS)]


def strip(observation: dict) -> dict:
    return {k: v for k, v in observation.items() if k != "episode_id"}


def alone(seed: int) -> list[dict]:
    env = LLMServeEnvironment(store=EpisodeStore(max_episodes=1), config=ServerSettings(mode="sim"))
    env.reset(seed=seed, task_id=TASK)
    # Through JSON, as the observations arrive over the wire.
    return [strip(json.loads(env.step(ServeAction(**a)).model_dump_json(exclude={"reward", "done"})))
            for a in actions_for(seed)]


def http_client(url: str, seed: int, start: threading.Barrier, out: dict) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        eid = c.post("/reset", json={"task_id": TASK, "seed": seed}).json()["observation"]["episode_id"]
        start.wait()
        got = []
        for a in actions_for(seed):
            r = c.post("/step", json={"action": a, "episode_id": eid})
            r.raise_for_status()
            got.append(strip(r.json()["observation"]))
        out[("http", seed)] = got


def ws_client(url: str, seed: int, start: threading.Barrier, out: dict) -> None:
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(task_id=TASK, seed=seed)
        start.wait()
        out[("ws", seed)] = [strip(env.step(a).observation) for a in actions_for(seed)]


def test_concurrent_http_and_websocket_episodes_match_their_solo_runs(live_server):
    seeds = {("http", 100 + i) for i in range(HTTP_CLIENTS)} | {("ws", 200 + i) for i in range(WS_CLIENTS)}
    start = threading.Barrier(len(seeds))
    out: dict = {}
    errors: list[BaseException] = []

    def run(kind: str, seed: int) -> None:
        try:
            (http_client if kind == "http" else ws_client)(live_server.url, seed, start, out)
        except BaseException as exc:  # reported below, with the client it came from
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=run, args=key) for key in sorted(seeds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert set(out) == seeds
    for (kind, seed), got in out.items():
        assert got == alone(seed), f"{kind} client with seed {seed} saw another episode's windows"


def test_two_websocket_sessions_with_the_same_seed_stay_separate(live_server):
    # The same (task, seed) in two sessions, different actions: neither sees the other's.
    a_actions, b_actions = actions_for(300), actions_for(301)
    with GenericEnvClient(base_url=live_server.url).sync() as a, \
            GenericEnvClient(base_url=live_server.url).sync() as b:
        a.reset(task_id=TASK, seed=7)
        b.reset(task_id=TASK, seed=7)
        got_a, got_b = [], []
        for x, y in zip(a_actions, b_actions, strict=True):
            got_a.append(strip(a.step(x).observation))
            got_b.append(strip(b.step(y).observation))
    env = LLMServeEnvironment(store=EpisodeStore(max_episodes=1), config=ServerSettings(mode="sim"))
    for actions, got in ((a_actions, got_a), (b_actions, got_b)):
        env.reset(seed=7, task_id=TASK)
        want = [strip(json.loads(env.step(ServeAction(**x)).model_dump_json(exclude={"reward", "done"})))
                for x in actions]
        assert got == want


def test_the_load_bench_runs_and_reports_its_json_line(live_server):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "load.py"), "--url", live_server.url,
                           "--clients", "1,4", "--steps", "3"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for n in (1, 4):
        assert result[f"clients_{n}_errors"] == 0, proc.stdout
        assert result[f"clients_{n}_p50_ms"] > 0 and result[f"clients_{n}_steps_per_s"] > 0
        assert result[f"clients_{n}_p99_ms"] >= result[f"clients_{n}_p50_ms"]
