"""How the server is run: uvicorn with bounds on slow clients, connections and log volume.

    python -m llmserve_env.server.serving --host 127.0.0.1 --port 7860

`make serve`, the Docker image, `python -m server.app` and the benches all start the server
through `run` here, so they share these settings:

| bound                      | value          | why                                                        |
|----------------------------|----------------|------------------------------------------------------------|
| READ_TIMEOUT_S             | 10 s           | a request's headers and body must arrive within this of its |
|                            |                | first byte (or of the connection opening); a slow client is |
|                            |                | disconnected (uvicorn has no such timeout: 1,100 slow      |
|                            |                | connections held every file descriptor)                    |
| KEEP_ALIVE_S               | 5 s            | an idle keep-alive connection is closed                    |
| max connections            | open-file limit| a connection past it is closed at once, before it holds a  |
|                            | minus 128      | descriptor the server needs (files, /health, the log)      |
| MAX_HEADER_BYTES           | 64 KiB         | h11's limit on an incomplete request head                  |
| WS_MAX_BYTES               | 1 MiB          | a WebSocket message larger than this closes the socket     |
| accept-error log lines     | 1 per 10 s     | repeated identical asyncio errors (EMFILE on accept wrote  |
|                            | per message    | 85 MB of log in 17 s) are counted, not repeated            |

Slow-client handling wraps whichever HTTP protocol uvicorn picks (httptools when installed, else h11).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import time
from typing import Any

from llmserve_env.server.limits import READ_TIMEOUT_S

KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 64 * 1024
WS_MAX_BYTES = 1 << 20
FD_RESERVE = 128
LOG_INTERVAL_S = 10.0

log = logging.getLogger("llmserve_env.serving")


def max_connections() -> int:
    """Connections the server keeps open at most: the open-file limit less a reserve."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, soft - FD_RESERVE)


class RateLimitFilter(logging.Filter):
    """Pass the first record of each message per LOG_INTERVAL_S; count the rest, report the count."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S):
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this in the last {self.interval_s:g} s not logged]"
        if len(self._last) > 1024:  # bounded memory whatever the messages
            self._last.clear()
        return True


def bounded(protocol_cls: type) -> type:
    """`protocol_cls` (uvicorn's h11 or httptools protocol) with the read timeout and connection cap."""

    class Bounded(protocol_cls):
        read_timeout_s = READ_TIMEOUT_S
        connection_cap = max_connections()

        def connection_made(self, transport: Any) -> None:
            over = len(self.connections) >= self.connection_cap
            super().connection_made(transport)
            self._read_timer = None
            self._armed_for = None
            if over:
                log.warning("connection refused: %d connections open (the cap)", self.connection_cap)
                self.transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._armed_for = self.cycle
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def data_received(self, data: bytes) -> None:
            if self._read_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first bytes of the next request on a keep-alive connection
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._armed_for and not cycle.more_body:
                self._disarm()  # the request is in whole

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._disarm()  # the WebSocket protocol takes the connection over
            super().handle_websocket_upgrade(*args)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                log.info("closing a connection whose request did not arrive within %g s", self.read_timeout_s)
                self.transport.close()

    Bounded.__name__ = f"Bounded{protocol_cls.__name__}"
    return Bounded


def http_protocol() -> type:
    base: type
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return bounded(base)


def uvicorn_settings() -> dict[str, Any]:
    """The keyword arguments `uvicorn.run` gets (besides app, host and port)."""
    return {
        "http": http_protocol(),
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "ws_max_size": WS_MAX_BYTES,
        "timeout_graceful_shutdown": 10,
    }


def quiet_repeated_errors() -> None:
    limiter = RateLimitFilter()
    for name in ("asyncio", "uvicorn.error"):
        logging.getLogger(name).addFilter(limiter)


def run(host: str = "127.0.0.1", port: int = 7860, log_level: str = "info") -> None:
    import uvicorn

    quiet_repeated_errors()
    uvicorn.run("llmserve_env.server.app:app", host=host, port=port, log_level=log_level, **uvicorn_settings())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.server.serving", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", "7860")))
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    run(args.host, args.port, args.log_level)


if __name__ == "__main__":
    main()
