"""A small HTTP/1.1 client on asyncio protocols, for many concurrent streaming POSTs at low CPU cost.

Why not httpx: measured on this 2-core machine against the loopback stand-in at 200 concurrent
streams of 16 chunks, httpx/httpx2 spent 1.6-2.0 ms of CPU per request (most of it in httpcore's
connection-pool bookkeeping, which probes every idle socket on each request), and the OpenAI SDK
another ~90 us per chunk on top; that CPU time is event-loop lag, and the lag lands in every TTFT
and ITL the gateway measures. Here response bytes are parsed in `data_received`, where they are
timestamped, with no task switch between the socket and the timestamp. The bytes are parsed by
httptools (llhttp, as in uvicorn and Node.js), not by hand; the timestamping stays here.

Scope, deliberately narrow: HTTP/1.1 with keep-alive, http and https (TLS through asyncio's ssl),
request bodies with Content-Length, responses framed by chunked transfer-encoding, Content-Length
or connection close, no compression (`Accept-Encoding: identity`), no redirects, no proxies (use
LLMSERVE_REAL_CLIENT=sdk behind a proxy).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

BodyCallback = Callable[[bytes, float], None]  # (body bytes, loop time they arrived)
MAX_HEADER_BYTES = 64 * 1024


class HttpError(Exception):
    """Transport-level failure. `received` is True once any response byte arrived."""

    def __init__(self, message: str, received: bool):
        super().__init__(message)
        self.received = received


class ConnectError(HttpError):
    pass


class RemoteProtocolError(HttpError):
    pass


class StallTimeout(HttpError):
    pass


class Response:
    """Status and headers of a response whose body is being delivered to a callback."""

    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: dict[str, str]):
        self.status = status
        self.headers = headers


class _Connection(asyncio.Protocol):
    """One keep-alive connection; serves one exchange at a time. Responses are parsed by httptools
    (llhttp, the parser uvicorn uses) inside `data_received`, so each body piece is timestamped
    with the time its bytes were read."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset_exchange()

    def _reset_exchange(self) -> None:
        # The exchange's callbacks (not named on_*: httptools calls the on_* methods below).
        self.head_cb: Callable[[Response], None] | None = None
        self.body_cb: BodyCallback | None = None
        self.head_future: asyncio.Future[Response] | None = None
        self.done_future: asyncio.Future[bool] | None = None  # result: connection reusable
        self.parser: httptools.HttpResponseParser | None = None
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.body_parts: list[bytes] = []
        self.message_done = False
        self.state = "idle"  # idle -> head -> body -> done
        self.framing = ""  # chunked | length | close
        self.keep_alive = True
        self.received = False
        self.last_data_t = 0.0

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state in ("head", "body"):
            if self.state == "body" and self.framing == "close":
                self._complete(reusable=False)  # a body framed by the connection's end: it ended
            else:
                self._fail(RemoteProtocolError(
                    f"connection closed {'mid-response' if self.received else 'before the response'}"
                    + (f" ({type(exc).__name__})" if exc else ""), self.received))

    def data_received(self, data: bytes) -> None:
        t = self.loop.time()
        self.last_data_t = t
        self.received = True
        if self.state == "idle" or self.state == "done" or self.parser is None:
            self.keep_alive = False  # stray bytes: this connection is not reused
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._protocol_error("the server switched protocols")
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
            self._protocol_error(str(cause) if isinstance(cause, RemoteProtocolError) else f"malformed response: {exc}")
            return
        if self.body_parts:
            parts, self.body_parts = self.body_parts, []
            assert self.body_cb is not None
            self.body_cb(parts[0] if len(parts) == 1 else b"".join(parts), t)
        if self.message_done:
            self._complete(self.keep_alive)

    def _protocol_error(self, message: str) -> None:
        self._fail(RemoteProtocolError(message, True))
        if self.transport is not None:
            self.transport.close()

    # -- httptools callbacks (inside feed_data)
    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            raise RemoteProtocolError("response headers too large", True)
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None and self.head_cb is not None and self.head_future is not None
        status = parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            self.headers, self.header_bytes = {}, 0
            return
        headers = self.headers
        self.keep_alive = parser.should_keep_alive()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.framing = "chunked"
        elif "content-length" in headers:
            self.framing = "length"
        else:
            self.framing, self.keep_alive = "close", False
        self.state = "body"
        response = Response(status, headers)
        self.head_cb(response)  # before any body byte is handed over
        if not self.head_future.done():
            self.head_future.set_result(response)

    def on_body(self, body: bytes) -> None:
        self.body_parts.append(bytes(body))

    def on_message_complete(self) -> None:
        if self.state == "body":
            self.message_done = True

    # -- the exchange
    def start(self, request: bytes, on_head: Callable[[Response], None],
              on_body: BodyCallback) -> tuple[asyncio.Future[Response], asyncio.Future[bool]]:
        self._reset_exchange()
        self.head_cb = on_head
        self.body_cb = on_body
        self.head_future = self.loop.create_future()
        self.done_future = self.loop.create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.state = "head"
        self.last_data_t = self.loop.time()
        assert self.transport is not None
        self.transport.write(request)
        return self.head_future, self.done_future

    def _complete(self, reusable: bool) -> None:
        self.state = "done"
        self.parser = None
        if self.done_future is not None and not self.done_future.done():
            self.done_future.set_result(reusable and not self.closed)

    def _fail(self, exc: HttpError) -> None:
        self.state = "done"
        self.parser = None
        for fut in (self.head_future, self.done_future):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                # The waiter may be gone (cancelled): never log "exception was never retrieved".
                fut.exception()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http11Pool:
    """Keep-alive connections to one origin, at most `max_connections` open."""

    def __init__(self, base_url: str, max_connections: int = 1024, connect_timeout_s: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None):
        u = urlsplit(base_url)
        self.scheme = u.scheme
        self.host = u.hostname or "localhost"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.base_path = u.path.rstrip("/")
        self.host_header = u.netloc.rsplit("@", 1)[-1]
        self._ssl = (ssl_context or ssl.create_default_context()) if u.scheme == "https" else None
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._connect_timeout = connect_timeout_s
        self._all: set[_Connection] = set()

    def __repr__(self) -> str:
        return f"Http11Pool({self.scheme}://{self.host_header}, open={len(self._all)})"

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port} ({type(exc).__name__})", False) from None
        self._all.add(conn)
        return conn

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._all.discard(conn)
        return None

    def _release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and not conn.closed:
            conn.state = "idle"
            conn.head_cb = conn.body_cb = None
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)

    async def post(self, path: str, headers: dict[str, str], body: bytes, on_head: Callable[[Response], None],
                   on_body: BodyCallback, stall_timeout_s: float) -> None:
        """POST, call `on_head` with the status and headers, then `on_body` per arrival; return at the end."""
        head = (f"POST {self.base_path}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Length: {len(body)}\r\nAccept-Encoding: identity\r\nConnection: keep-alive\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")
        request = head + body
        async with self._slots:
            conn = self._take_idle()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                await self._exchange(conn, request, on_head, on_body, stall_timeout_s)
            except RemoteProtocolError as exc:
                self._release(conn, False)
                if not (reused and not exc.received):
                    raise
                # A kept-alive connection the server had already closed: one fresh try, as any
                # HTTP client does; nothing reached the server's application.
                conn = await self._connect()
                try:
                    await self._exchange(conn, request, on_head, on_body, stall_timeout_s)
                except BaseException:
                    self._release(conn, False)
                    raise
            except BaseException:
                self._release(conn, False)
                raise

    async def _exchange(self, conn: _Connection, request: bytes, on_head: Callable[[Response], None],
                        on_body: BodyCallback, stall_timeout_s: float) -> None:
        head_f, done_f = conn.start(request, on_head, on_body)
        await self._wait(conn, head_f, stall_timeout_s)
        reusable = await self._wait(conn, done_f, stall_timeout_s)
        self._release(conn, reusable)

    @staticmethod
    async def _wait(conn: _Connection, fut: asyncio.Future, stall_timeout_s: float):
        """Await `fut`, failing when no byte has arrived for `stall_timeout_s` (checked, not re-armed per byte)."""
        loop = conn.loop
        while True:
            left = conn.last_data_t + stall_timeout_s - loop.time()
            if left <= 0:
                raise StallTimeout(f"no data for {stall_timeout_s:g} s", conn.received)
            done, _ = await asyncio.wait((fut,), timeout=left)
            if done:
                return fut.result()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
