"""A throwaway server for the benches: `python -m llmserve_env.server.serving` (the settings `make
serve` and the Docker image use) on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextmanager
def own_server(start_timeout_s: float = 90.0, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """Start the server (with `env` added to this process's environment), wait for /health, yield
    (url, pid); stop it afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "llmserve_env.server.serving", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                            env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not start")
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=20)
