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
3. Idle real-mode episodes (a real-mode server against the loopback stand-in sim/standin):
   `--idle-real` resets, never stepped; `idle_real_episodes_threads` is the server's thread count
   after them minus before (what each idle episode costs in threads; the gateway's event-loop
   design is issue 20 item 3, owned by the gateway branch: this measures whatever it is now).

4. Reconnecting slow clients (issue 30): `--reconnect` clients (default 1,000) each open a
   connection, send half a request head and wait; when the server drops one it reconnects at once.
   Meanwhile /health is asked every 0.5 s on a fresh connection (2 s timeout), for `--reconnect-s`
   seconds (default 40): `health_ok_share_under_slow_clients` is the share answered 200. The server
   runs under a soft open-file limit of `--server-nofile` (default 1024, a common default: the
   limit the issue's server had; `--server-nofile-hard`: its hard limit too, so that the server's
   connection cap, not the raised limit, is what holds) and `--runner` (`bounded`: python -m llmserve_env.server.serving,
   as make serve and the Docker image; `uvicorn`: plain `uvicorn server.app:app`, the app's own
   bounds only). `server_log_bytes_under_slow_clients` is what the server logged meanwhile.
5. Silent WebSocket sockets (issue 30): 256 sockets that never send a frame, first all from one
   address (127.0.0.1), then 32 from each of 8 addresses (127.0.1.1-8); each time a client from
   another address (127.0.0.2) tries a reset until it gets an observation (at most 30 s).
   `ws_reset_ok_after_idle_sockets` is true when both resets succeeded; `ws_reset_wait_s_one_address`
   and `ws_reset_wait_s_many_addresses` are how long each took (the per-address cap answers the
   first at once; the first-frame timeout, 10 s, frees the second).

Every attack stays on loopback and stops by itself (bounded counts and durations).
Prints a table, then (last line) one flat JSON object with the keys above.
"""

from __future__ import annotations

import argparse
import asyncio
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
from llmserve_env.tools.launch import ServerProcess
from local_server import own_server

ROOT = str(Path(__file__).resolve().parent.parent)  # the repository root (the package)

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
        standin = subprocess.Popen([sys.executable, "-m", "llmserve_env.tools.standin", "--port", str(port),
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


def server_argv(runner: str, nofile: int, hard: bool = False) -> list[str]:
    """The server's command under `runner`, with its soft open-file limit set to `nofile` (`hard`:
    the hard limit too, so the server cannot raise it)."""
    if runner == "bounded":
        cmd = f"{sys.executable} -m llmserve_env.server.serving --host 127.0.0.1 --port {{port}} --log-level warning"
    else:
        cmd = f"{sys.executable} -m uvicorn llmserve_env.server.app:app --host 127.0.0.1 --port {{port}}"
    limits = f"ulimit -Sn {nofile} && ulimit -Hn {nofile}" if hard else f"ulimit -Sn {nofile}"
    return ["bash", "-c", f"{limits} && exec {cmd}"]


async def reconnecting_slow_client(port: int, stop_at: float, counts: dict[str, int]) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < stop_at:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["connect_errors"] += 1
            await asyncio.sleep(0.05)
            continue
        counts["connections"] += 1
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head never ends
            try:
                await asyncio.wait_for(reader.read(1024), timeout=max(0.0, stop_at - loop.time()))
            except TimeoutError:
                pass
        except OSError:
            pass
        finally:
            writer.close()


def health_share(url: str, stop_at: float, period_s: float = 0.5) -> tuple[int, int, list[float]]:
    """(answered 200, asked, latencies ms): /health on a fresh connection every `period_s`."""
    ok = asked = 0
    lat: list[float] = []
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        asked += 1
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                ok += 1
                lat.append((time.perf_counter() - t0) * 1e3)
        except httpx.HTTPError:
            pass
        time.sleep(max(0.0, period_s - (time.perf_counter() - t0)))
    return ok, asked, lat


def attack_reconnect(args: argparse.Namespace, res: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        argv = server_argv(args.runner, args.server_nofile, args.server_nofile_hard)
        with ServerProcess(argv, log=log, cwd=ROOT) as server:
            port = int(server.url.rsplit(":", 1)[1])
            before = log.stat().st_size
            counts = {"connections": 0, "connect_errors": 0}
            out: dict[str, object] = {}
            stop_at = time.monotonic() + args.reconnect_s

            def poll() -> None:
                out["health"] = health_share(server.url, stop_at)

            poller = threading.Thread(target=poll)

            async def attack() -> None:
                loop = asyncio.get_running_loop()
                end = loop.time() + args.reconnect_s
                clients = [asyncio.create_task(reconnecting_slow_client(port, end, counts))
                           for _ in range(args.reconnect)]
                await asyncio.sleep(1.0)  # the clients are connected before /health is first asked
                poller.start()
                await asyncio.gather(*clients)

            asyncio.run(attack())
            poller.join()
            ok, asked, lat = out["health"]  # type: ignore[misc]
            res["reconnect_runner"] = args.runner
            res["reconnect_server_nofile"] = f"{args.server_nofile}{' (hard too)' if args.server_nofile_hard else ''}"
            res["reconnect_clients"] = args.reconnect
            res["reconnect_connections"] = counts["connections"]
            res["reconnect_connect_errors"] = counts["connect_errors"]
            res["health_asked_under_slow_clients"] = asked
            res["health_ok_share_under_slow_clients"] = round(ok / asked, 4) if asked else 0.0
            res["health_p99_ms_under_slow_clients"] = round(float(np.percentile(lat, 99)), 1) if lat else None
            res["server_log_bytes_under_slow_clients"] = log.stat().st_size - before


def _ws_from(url: str, source: str):
    from websockets.sync.client import connect

    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return connect(url.replace("http://", "ws://") + "/ws", sock=sock, open_timeout=10)


def reset_wait_s(url: str, source: str, limit_s: float = 30.0) -> float | None:
    """Seconds until a client at `source` gets a reset's observation (None: not within `limit_s`)."""
    from websockets.exceptions import ConnectionClosed

    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            with _ws_from(url, source) as ws:
                try:
                    ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
                except ConnectionClosed:
                    pass
                if json.loads(ws.recv(timeout=10)).get("type") == "observation":
                    return round(time.monotonic() - t0, 2)
        except (ConnectionClosed, OSError, TimeoutError):
            pass
        time.sleep(0.5)
    return None


def attack_ws_idle(args: argparse.Namespace, res: dict) -> None:
    from contextlib import ExitStack

    with own_server() as (url, _):
        for name, sources in (("one_address", ["127.0.0.1"] * 256),
                              ("many_addresses", [f"127.0.1.{1 + i // 32}" for i in range(256)])):
            with ExitStack() as stack:
                held = 0
                for src in sources:
                    try:
                        stack.enter_context(_ws_from(url, src))
                        held += 1
                    except OSError:
                        pass
                time.sleep(0.5)
                res[f"ws_silent_sockets_{name}"] = held
                res[f"ws_reset_wait_s_{name}"] = reset_wait_s(url, "127.0.0.2")
    res["ws_reset_ok_after_idle_sockets"] = all(
        res[f"ws_reset_wait_s_{n}"] is not None for n in ("one_address", "many_addresses"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=int, default=300, help="slow connections (a third of each kind)")
    ap.add_argument("--traces", type=int, default=2, help="resets per huge trace file (two files)")
    ap.add_argument("--idle-real", type=int, default=100, help="idle real-mode episodes")
    ap.add_argument("--limit-s", type=float, default=120.0, help="longest wait for one reset")
    ap.add_argument("--reconnect", type=int, default=1000, help="reconnecting slow clients")
    ap.add_argument("--reconnect-s", type=float, default=40.0, help="how long they attack")
    ap.add_argument("--runner", choices=("bounded", "uvicorn"), default="bounded",
                    help="how the server under the reconnecting clients is started")
    ap.add_argument("--server-nofile", type=int, default=1024, help="that server's soft open-file limit")
    ap.add_argument("--server-nofile-hard", action="store_true",
                    help="set the hard open-file limit too (the server cannot raise it: the connection cap acts)")
    ap.add_argument("--attacks", default="sim,real,reconnect,ws",
                    help="comma-separated: sim (slow clients, huge traces, forged log), real (idle real "
                         "episodes), reconnect (reconnecting slow clients), ws (silent WebSocket sockets)")
    args = ap.parse_args()
    os.chdir(ROOT)
    res: dict = {}
    attacks = {"sim": attack_sim, "real": attack_real, "reconnect": attack_reconnect, "ws": attack_ws_idle}
    for name in args.attacks.split(","):
        attacks[name](args, res)
    print(f"{'measure':<40} value")
    for k, v in res.items():
        print(f"{k:<40} {v}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
