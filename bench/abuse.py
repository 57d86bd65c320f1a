"""The server under abuse, on loopback only, bounded in count and time.

    python bench/abuse.py                        # own servers (sim, and real against the stand-in)
    python bench/abuse.py --slow 300 --idle-real 100

Three attacks from issue 20, each measured by what an honest client sees meanwhile:

1. Slow clients and huge traces (sim-mode server): `--slow` connections that never finish their
   headers, as many that never finish their body, and as many that send nothing; at the same time
   `--traces` resets replaying a trace file past the row cap (MAX_TRACE_ROWS + 1 rows) and as many
   replaying a file of 32 MiB of newlines. Meanwhile a client polls /health every 20 ms:
   `health_p99_ms_under_abuse` is the 99th percentile of its latency, `health_errors` the polls that
   failed. `slow_closed` counts the slow connections the server closed within the run.
2. A forged episode log (the issue's: every request of the task's own arrivals marked met) sent to
   POST /grader: `grader_forged_log_score` is its score, or "refused" (the 422 of a log that does
   not replay).
3. Idle real-mode episodes (a real-mode server against the loopback stand-in sim/openai_server.py):
   `--idle-real` resets, never stepped; `idle_real_episodes_threads` is the server's thread count
   after them minus before (what each idle episode costs in threads; the gateway's event-loop
   design is issue 20 item 3, owned by the gateway branch: this measures whatever it is now).

Prints a table, then (last line) one flat JSON object with the keys above.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from local_server import ROOT, own_server

sys.path.insert(0, str(Path(ROOT) / "tests"))


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no thread count for pid {pid}")


def poll_health(url: str, stop: threading.Event, lat: list[float], errors: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=10) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                c.get("/health").raise_for_status()
                lat.append((time.perf_counter() - t0) * 1e3)
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
            time.sleep(0.02)


def slow_sockets(port: int, n: int) -> list[socket.socket]:
    out = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        kind = i % 3
        if kind == 0:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        elif kind == 1:
            s.sendall(b"POST /grader HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{")  # body never finishes
        out.append(s)  # kind 2: never sends a byte
    return out


def closed(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(64) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def huge_traces(folder: Path) -> list[Path]:
    from llmserve_env.shared.traces import MAX_TRACE_ROWS

    rows = folder / "rows.csv"
    with rows.open("w") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        line = "1.0,100,10\n"
        f.write(line * (MAX_TRACE_ROWS + 1))
    blank = folder / "newlines.csv"
    blank.write_bytes(b"\n" * (32 << 20))
    return [rows, blank]


def attack_sim(args: argparse.Namespace, res: dict) -> None:
    from test_grader import synthetic_log

    with tempfile.TemporaryDirectory() as tmp, own_server() as (url, pid):
        port = int(url.rsplit(":", 1)[1])
        traces = huge_traces(Path(tmp))
        lat: list[float] = []
        errors: list[str] = []
        stop = threading.Event()
        poller = threading.Thread(target=poll_health, args=(url, stop, lat, errors))
        poller.start()
        time.sleep(1.0)
        baseline_n = len(lat)
        t0 = time.perf_counter()
        socks = slow_sockets(port, args.slow)
        statuses: list[int] = []

        def reset(path: Path) -> None:
            with httpx.Client(base_url=url, timeout=120) as c:
                statuses.append(c.post("/reset", json={"task_id": f"trace:{path}"}).status_code)

        workers = [threading.Thread(target=reset, args=(p,)) for p in traces for _ in range(args.traces)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=args.limit_s)
        wait_until = time.perf_counter() + 12  # past the 10 s read timeout
        while time.perf_counter() < wait_until:
            time.sleep(0.5)
        res["slow_closed"] = sum(closed(s) for s in socks)
        for s in socks:
            s.close()
        stop.set()
        poller.join()
        under = lat[baseline_n:]
        res["abuse_s"] = round(time.perf_counter() - t0, 1)
        res["trace_statuses"] = ",".join(str(s) for s in sorted(statuses))
        res["health_p50_ms_under_abuse"] = round(float(np.percentile(under, 50)), 2)
        res["health_p99_ms_under_abuse"] = round(float(np.percentile(under, 99)), 2)
        res["health_max_ms_under_abuse"] = round(max(under), 2)
        res["health_polls"] = len(under)
        res["health_errors"] = len(errors)

        forged = json.loads(synthetic_log("static_workload").model_dump_json())
        r = httpx.post(url + "/grader", json={"episode_log": forged}, timeout=60)
        res["grader_forged_log_status"] = r.status_code
        res["grader_forged_log_score"] = r.json()["score"] if r.status_code == 200 else "refused"


def attack_real(args: argparse.Namespace, res: dict) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        tiers = Path(tmp) / "tiers.json"
        standin = subprocess.Popen([sys.executable, "-m", "llmserve_env.sim.openai_server", "--port", str(port),
                                    "--write-tiers", str(tiers)], cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            env = {"LLMSERVE_MODE": "real", "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                   "LLMSERVE_REAL_TIERS": str(tiers)}
            with own_server(env=env) as (url, pid):
                before = threads_of(pid)
                with httpx.Client(base_url=url, timeout=60) as c:
                    for i in range(args.idle_real):
                        c.post("/reset", json={"seed": i}).raise_for_status()
                time.sleep(1.0)
                after = threads_of(pid)
                res["real_threads_before"] = before
                res["real_threads_after"] = after
                res["idle_real_episodes"] = args.idle_real
                res["idle_real_episodes_threads"] = after - before
        finally:
            standin.terminate()
            standin.wait(timeout=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=int, default=300, help="slow connections (a third of each kind)")
    ap.add_argument("--traces", type=int, default=2, help="resets per huge trace file (two files)")
    ap.add_argument("--idle-real", type=int, default=100, help="idle real-mode episodes")
    ap.add_argument("--limit-s", type=float, default=120.0, help="longest wait for one reset")
    args = ap.parse_args()
    os.chdir(ROOT)
    res: dict = {}
    attack_sim(args, res)
    attack_real(args, res)
    print(f"{'measure':<32} value")
    for k, v in res.items():
        print(f"{k:<32} {v}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
