"""How the server is run: uvicorn with bounds on slow clients, connections and log volume.

    python -m llmserve_env.server.serving --host 127.0.0.1 --port 7860

`make serve`, `llmserve-env serve`, the Docker image and the benches all start the server
through `run` here, so they share these settings:

| bound                      | value          | why                                                        |
|----------------------------|----------------|------------------------------------------------------------|
| READ_TIMEOUT_S             | 10 s           | a request's headers and body must arrive within this of its |
|                            |                | first byte (or of the connection opening); a slow client is |
|                            |                | disconnected (uvicorn has no such timeout: 1,100 slow      |
|                            |                | connections held every file descriptor)                    |
| KEEP_ALIVE_S               | 5 s            | an idle keep-alive connection is closed                    |
| max connections            | open-file limit| at the cap, the connection that has waited longest for its  |
|                            | minus 128, at  | request is closed to let the new one in (a newcomer is      |
|                            | most 10,000    | refused only when none waits): reconnecting slow clients   |
|                            |                | held /health to 6 answers in 74 without this               |
| open-file limit            | raised to the  | (server/limits.py) a soft limit of 1,024 left too few      |
|                            | hard limit     | descriptors for 1,000 slow clients and /health             |
| MAX_HEADER_BYTES           | 64 KiB         | h11's limit on an incomplete request head                  |
| WS_MAX_BYTES               | 1 MiB          | a WebSocket message larger than this closes the socket     |
| log volume                 | server/logbounds.py | identical error lines once per 10 s, access lines 50 a second, each with a count of what was left out |

The app itself (server/app.py) enforces what an ASGI app can, under any runner: the body size and
body-read deadline (server/limits.py), WebSocket idle timeouts and per-client caps
(server/frames.py), the open-file limit and the log bounds. A request head that never ends never
reaches an app, so its timeout and the connection cap need this runner: start the server here
(`python -m llmserve_env serve` and `make serve` do).

Slow-client handling wraps whichever HTTP protocol uvicorn picks (httptools when installed, else h11).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
from collections import OrderedDict
from typing import Any

from llmserve_env.server.limits import READ_TIMEOUT_S, raise_open_file_limit
from llmserve_env.server.logbounds import bound_logs

KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 64 * 1024
WS_MAX_BYTES = 1 << 20
FD_RESERVE = 128
MAX_CONNECTIONS = 10_000  # each open connection costs the server memory, whatever the file limit

log = logging.getLogger("llmserve_env.serving")


def max_connections() -> int:
    """Connections the server keeps open at most: the open-file limit less a reserve, at most MAX_CONNECTIONS."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - FD_RESERVE))


def bounded(protocol_cls: type) -> type:
    """`protocol_cls` (uvicorn's h11 or httptools protocol) with the read timeout and connection cap."""

    class Bounded(protocol_cls):
        read_timeout_s = READ_TIMEOUT_S
        connection_cap = max_connections()
        # Connections waiting for a request (their read timer armed), oldest first: at the cap, the
        # oldest of them is closed to let a new connection in (one event loop: no lock).
        waiting: OrderedDict[Any, None] = OrderedDict()

        def connection_made(self, transport: Any) -> None:
            over = len(self.connections) >= self.connection_cap
            super().connection_made(transport)
            self._read_timer = None
            self._armed_for = None
            if over and not self._evict_oldest_waiting():
                log.warning("connection refused: %d connections open (the cap), none waiting for a request",
                            self.connection_cap)
                self.transport.close()
                return
            self._arm()

        def _evict_oldest_waiting(self) -> bool:
            """Close the connection that has waited longest for its request; False if none waits.
            A slow client, not the newcomer, pays for the cap: reconnecting slow clients cannot keep
            an honest one (who sends its request at once) out."""
            while self.waiting:
                oldest, _ = self.waiting.popitem(last=False)
                if not oldest.transport.is_closing():
                    oldest._disarm()
                    log.info("at the cap of %d connections: closed the one waiting longest for a request",
                             self.connection_cap)
                    oldest.transport.close()
                    return True
            return False

        def _arm(self) -> None:
            self._armed_for = self.cycle
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)
            self.waiting[self] = None

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
            self.waiting.pop(self, None)

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
            self.waiting.pop(self, None)
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


# Set once this process has taken these settings: the app warns at start-up when it is served
# without them (a plain `uvicorn server.app:app`), since it cannot time out a request head itself.
BOUNDED_RUNNER = False


def uvicorn_settings() -> dict[str, Any]:
    """The keyword arguments `uvicorn.run` gets (besides app, host and port)."""
    global BOUNDED_RUNNER
    BOUNDED_RUNNER = True
    return {
        "http": http_protocol(),
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "ws_max_size": WS_MAX_BYTES,
        "timeout_graceful_shutdown": 10,
    }


def quiet_repeated_errors() -> None:
    """The app's own log bounds (server/logbounds.py), installed before uvicorn logs anything."""
    bound_logs()


def run(host: str = "127.0.0.1", port: int = 7860, log_level: str = "info") -> None:
    import uvicorn

    raise_open_file_limit()  # before the connection cap is read from it
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
