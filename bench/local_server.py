"""A throwaway server for the benches: this project's server on a free loopback port
(llmserve_env.launch.ServerProcess, the helper tests and scripts use too)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llmserve_env.launch import ServerProcess


@contextmanager
def own_server(start_timeout_s: float = 90.0) -> Iterator[tuple[str, int]]:
    """Start the server, wait for /health, yield (url, pid); stop it afterwards."""
    with ServerProcess(start_timeout_s=start_timeout_s) as server:
        yield server.url, server.pid
