"""A throwaway server for the benches: this project's server (`python -m llmserve_env.server.serving`,
the settings `make serve` and the Docker image use) on a free loopback port, through
llmserve_env.tools.launch.ServerProcess, the helper tests and scripts use too."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from llmserve_env.tools.launch import ServerProcess


@contextmanager
def own_server(start_timeout_s: float = 90.0, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """Start the server (with `env` added to this process's environment), wait for /health, yield
    (url, pid); stop it afterwards."""
    with ServerProcess(env={**os.environ, **(env or {})}, start_timeout_s=start_timeout_s) as server:
        yield server.url, server.pid
