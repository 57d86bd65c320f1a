"""Starting a server and waiting until it serves: the one helper tests, benches and scripts share.

`ThreadServer` runs an ASGI app under uvicorn in a daemon thread of this process, on a loopback
socket bound before it starts (no port race); `ServerProcess` runs a server command (by default
this project's server as `make serve` runs it, `python -m llmserve_env.server.serving`) as a child process on a free
loopback port and waits until its health path answers 200. The child stays in the caller's
session: with the kernel's autogroup scheduling a session of its own is scheduled as a separate
group, which changed the benches' client/server round trips.
Both are context managers. Imports of uvicorn and httpx stay inside, so importing this is free.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

APP = "llmserve_env.server.app:app"


class ServerStartError(RuntimeError):
    """The server did not come up in time (the message says where it was expected, and why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_health(url: str, timeout_s: float, alive: Callable[[], bool] = lambda: True,
                    health_path: str = "/health") -> None:
    """Poll `url` + `health_path` until it answers 200; ServerStartError after `timeout_s` or once
    `alive()` turns false (the process died)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise ServerStartError(f"the server for {url} exited before answering {health_path}")
        try:
            if httpx.get(url + health_path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise ServerStartError(f"{url}{health_path} did not answer 200 within {timeout_s:.0f}s")


class ThreadServer:
    """`with ThreadServer(app) as s: s.url` - uvicorn serving `app` on 127.0.0.1 in a daemon thread."""

    def __init__(self, app: Any, *, lifespan: Literal["auto", "on", "off"] = "auto", log_level: str = "warning",
                 name: str = "server", port: int = 0):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))  # 0: a free port
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, lifespan=lifespan))
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self._sock])),
                                        name=name, daemon=True)

    def start(self, timeout_s: float = 30.0) -> ThreadServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise ServerStartError(f"{self._thread.name} on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> ThreadServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess:
    """`with ServerProcess() as s: s.url` - a server in a child process on a free loopback port.

    `argv` is the command, `{port}` in it replaced by the port (default: this project's server under
    uvicorn); its output goes to `log` (inherited when None); `env` is its whole environment (None:
    this process's)."""

    def __init__(self, argv: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None,
                 log: Path | None = None, health_path: str = "/health", start_timeout_s: float = 120.0,
                 cwd: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        template = argv or [sys.executable, "-m", "llmserve_env.server.serving", "--host", "127.0.0.1",
                            "--port", "{port}", "--log-level", "warning"]
        self.argv = [a.replace("{port}", str(self.port)) for a in template]
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log = log
        self.health_path = health_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> ServerProcess:
        argv = self.argv
        if self.log is None:
            self.proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd)
        else:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("wb") as sink:
                self.proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdout=sink,
                                             stderr=subprocess.STDOUT)
        proc = self.proc
        try:
            wait_for_health(self.url, self.start_timeout_s, lambda: proc.poll() is None, self.health_path)
        except ServerStartError as exc:
            self.stop()
            if self.log is not None:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
                raise ServerStartError(f"{exc}; server log:\n{tail}") from None
            raise
        return self

    def peak_rss_mb(self) -> float | None:
        """The server's peak resident memory (Linux /proc), None where it cannot be read."""
        status = Path(f"/proc/{self.proc.pid}/status") if self.proc else None
        if status is None or not status.exists():
            return None
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
