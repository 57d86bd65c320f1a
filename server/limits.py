"""Request-body size limit: a body over the limit gets 413 before any parsing (pure ASGI).

A declared Content-Length over the limit is refused at once. A body sent without one (chunked) is
counted as it arrives; past the limit, reading it raises inside the app, and whatever the app then
answers is replaced by the 413: FastAPI turns an error while reading a body into a 400 "error
parsing the body", and OpenEnv's /mcp into a JSON-RPC parse error, neither of which says why.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]
# A request's headers and body (and a WebSocket's first frame) must arrive within this.
READ_TIMEOUT_S = 10.0


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

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
                    await self._reject(send)
                    return
        seen = 0
        too_large = False
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    too_large = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if too_large and not started:
                return  # the app's answer to a body it never got whole: the 413 below replaces it
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except BodyTooLarge:
            pass
        if too_large and not started:
            await self._reject(send)

    async def _reject(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body larger than the limit of {self.max_bytes} bytes "
                                     f"(LLMSERVE_MAX_BODY_BYTES)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
