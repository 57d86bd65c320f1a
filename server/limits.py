"""Request limits the app enforces itself, whatever runner serves it: a body-size limit (413), a
body-read deadline (408), and the open-file limit raised to its hard limit.

Size: a declared Content-Length over the limit is refused at once. A body sent without one
(chunked) is counted as it arrives; past the limit, reading it raises inside the app, and whatever
the app then answers is replaced by the 413: FastAPI turns an error while reading a body into a
400 "error parsing the body", and OpenEnv's /mcp into a JSON-RPC parse error, neither of which
says why.

Deadline: a request's body must arrive whole within READ_TIMEOUT_S of the app receiving the
request (its head); a client that sends it slower, or never, gets 408 with `connection: close`,
so the runner drops the connection. (A request *head* that never ends never reaches the app: only
the runner can time that out; server/serving.py does, and is how the README starts the server.)

Open files: each connection holds a descriptor. Under a common soft limit of 1,024, 1,100 slow
connections left none to accept /health's (asyncio then pauses accepting for a second at a time,
and logs each failure): `raise_open_file_limit` lifts the soft limit to the hard one at start-up.
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Any

Scope = dict[str, Any]
# A request's headers and body (and a WebSocket's first frame) must arrive within this.
READ_TIMEOUT_S = 10.0
# The soft open-file limit raised at most to this (when the hard limit is unlimited or higher).
OPEN_FILES_TARGET = 65536


def raise_open_file_limit(target: int = OPEN_FILES_TARGET) -> int:
    """Raise this process's soft open-file limit toward its hard limit (at most `target`); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass  # not allowed here (a sandbox): the runner's connection cap still applies
    return soft


class BodyTooLarge(Exception):
    pass


class BodyTimedOut(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: Any, max_bytes: int, read_timeout_s: float | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._reject(send, 413, f"request body larger than the limit of {self.max_bytes} "
                                                  f"bytes (LLMSERVE_MAX_BODY_BYTES)")
                    return
        seen = 0
        refused: int | None = None  # 413 or 408, once the body broke a limit
        whole = False
        started = False
        deadline = asyncio.get_running_loop().time() + self.read_timeout_s

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, refused, whole
            if whole:  # after the body: the app waits for the disconnect, however long
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refused = 408
                raise BodyTimedOut from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = 413
                    raise BodyTooLarge
                whole = not message.get("more_body", False)
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if refused is not None and not started:
                return  # the app's answer to a body it never got whole: the refusal below replaces it
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except (BodyTooLarge, BodyTimedOut):
            pass
        if refused is not None and not started:
            if refused == 413:
                await self._reject(send, 413, f"request body larger than the limit of {self.max_bytes} bytes "
                                              f"(LLMSERVE_MAX_BODY_BYTES)")
            else:
                await self._reject(send, 408, f"the request body did not arrive within {self.read_timeout_s:g} s")

    async def _reject(self, send: Any, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
