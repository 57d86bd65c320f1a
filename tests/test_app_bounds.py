"""Issue 30, item 4: the bounds the app enforces itself, whatever runner serves it (server/limits.py,
server/logbounds.py), here under a plain uvicorn without server/serving.py's protocol."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.logbounds import AccessLogBudget, RateLimitFilter
from llmserve_env.tools.launch import ThreadServer


def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closed(monkeypatch):
    """Before: plain uvicorn waited for a slow body for ever (0 of 1,100 slow connections closed)."""
    monkeypatch.setattr("llmserve_env.server.limits.READ_TIMEOUT_S", 1.0)
    with ThreadServer(build_app(ServerSettings(mode="sim", max_sessions=2))) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"POST /grader HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            slow.settimeout(5.0)
            t0 = time.monotonic()
            answer = b""
            while chunk := slow.recv(4096):  # read to the close
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b"did not arrive within 1 s" in answer
            assert 0.8 < time.monotonic() - t0 < 4.0
        # A body that arrives in time is served as usual, and so is /health meanwhile.
        assert httpx.post(server.url + "/grader", json={"episode_id": "nope"}, timeout=5).status_code == 404
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_the_app_installs_its_log_bounds_whatever_runs_it():
    build_app(ServerSettings(mode="sim", max_sessions=2))
    assert any(isinstance(f, AccessLogBudget) for f in logging.getLogger("uvicorn.access").filters)
    assert any(isinstance(f, RateLimitFilter) for f in logging.getLogger("asyncio").filters)
    build_app(ServerSettings(mode="sim", max_sessions=2))  # a second app adds no second filter
    assert sum(isinstance(f, AccessLogBudget) for f in logging.getLogger("uvicorn.access").filters) == 1


def test_access_lines_past_the_budget_are_counted_not_written():
    budget = AccessLogBudget(rate=50, burst=200)
    records = [logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:1", "GET", "/health", "1.1", 200), None) for _ in range(5000)]
    passed = sum(budget.filter(r) for r in records)
    assert 200 <= passed < 260  # the burst, and what the rate refilled while the loop ran
    budget._at -= 1.0  # a second later: 50 more lines may pass  # noqa: SLF001
    r = records[0]
    assert budget.filter(r)
    assert "access lines before this one not logged" in r.getMessage()


@pytest.mark.skipif(sys.platform != "linux", reason="ulimit and /proc are Linux's")
def test_the_app_raises_a_low_open_file_limit():
    """Under a soft limit of 1,024, 1,000 slow connections left no descriptor for /health's."""
    code = ("import resource, llmserve_env.server.app; "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run(["bash", "-c", f"ulimit -Sn 256 && exec {sys.executable} -c '{code}'"],
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-500:]
    hard = int(subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
               .replace("unlimited", str(10**9)))
    assert int(out.stdout.split()[-1]) == min(hard, 65536)
