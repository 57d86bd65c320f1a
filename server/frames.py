"""WebSocket sessions under limits: an idle timeout, a per-client cap, and an error frame (never a
lost session) for any frame OpenEnv's /ws loop cannot read.

OpenEnv gives every WebSocket connection a session out of LLMSERVE_MAX_SESSIONS and keeps it while
the socket is open, so 256 sockets that never sent a frame held every slot for good (issue 30:
past 150 s, every new client's session was refused). This pure ASGI wrapper, in front of every
WebSocket route (/ws, /mcp, ...):

- closes a socket that sends no frame within FIRST_FRAME_S (10 s, or the idle timeout if shorter)
  of opening, or none for
  `idle_timeout_s` (LLMSERVE_WS_IDLE_TIMEOUT_S) afterwards, with an error frame (code
  IDLE_TIMEOUT) first; the app sees a disconnect, so OpenEnv frees the session. Time the server
  spends on a step does not count: only time waiting for the client's next frame;
- (this includes /ws/ui, OpenEnv's web-UI push socket, which no page of this server opens and
  which had no bound at all);
- refuses a socket beyond `max_per_client` (LLMSERVE_WS_MAX_PER_CLIENT) open at once from one
  client address, with OpenEnv's own refusal shape (an error frame of code CAPACITY_REACHED, then
  close 1008), so one host cannot take the whole pool.

On /ws (and /mcp) it also answers, itself, with OpenEnv's error shape (`{"type": "error", "data":
{"message", "code"}}`; on /mcp a JSON-RPC error), a frame the session loop would die on, and the
session goes on: a binary frame or a
JSON value that is not an object (OpenEnv calls `.get` on it), and JSON the server takes on no
route (bodies.json_problem: NaN/Infinity or a number past the float range, a lone UTF-16
surrogate, which made OpenEnv's error reply itself fail to serialise, nesting past 32 levels,
which hit Python's recursion limit, an integer past 4,300 digits). A well-formed frame costs a
character test, two counts and one regular-expression search, not a second parse; only a frame
that trips one of those is parsed here as well.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from llmserve_env.server.bodies import DEPTH_LIMIT, json_problem
from llmserve_env.server.limits import READ_TIMEOUT_S

Scope = dict[str, Any]
FIRST_FRAME_S = READ_TIMEOUT_S
# What a frame must contain for json_problem to have something to find (besides length and nesting).
_SUSPECT = re.compile(r"\\u[dD][89a-fA-F]|NaN|Infinity|[eE][+]?\d{3}")
_LONG_FRAME = 4096  # an integer past 4,300 digits needs a frame at least this long


def _error(message: str, code: str) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


def _rpc_error(message: str, code: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


_NOT_AN_OBJECT = "a message must be a JSON object sent as a text frame; this frame was ignored and the session goes on"


def openenv_reply(problem: str) -> str:
    """/ws: OpenEnv's error message shape."""
    if problem in ("binary frame", "not an object"):
        return _error(_NOT_AN_OBJECT.replace("JSON object", "JSON object such as {\"type\": \"step\", \"data\": {...}}"),
                      "INVALID_JSON")
    return _error(f"{problem}; this frame was ignored and the session goes on", "INVALID_JSON")


def jsonrpc_reply(problem: str) -> str:
    """/mcp: a JSON-RPC error (-32600 invalid request, -32700 parse error), as OpenEnv's /mcp answers."""
    if problem in ("binary frame", "not an object"):
        return _rpc_error(_NOT_AN_OBJECT.replace("JSON object", "JSON-RPC request object"), -32600)
    return _rpc_error(f"Parse error: {problem}; this frame was ignored and the session goes on", -32700)


# WebSocket path -> how a frame its session loop cannot take is answered.
REPLIES = {"/ws": openenv_reply, "/mcp": jsonrpc_reply}


def frame_problem(text: str) -> str | None:
    """Why OpenEnv's session loop cannot take this text frame, or None (the cheap tests first)."""
    if text.lstrip()[:1] != "{":
        return "not an object"
    if len(text) <= _LONG_FRAME and text.count("{") + text.count("[") <= DEPTH_LIMIT and not _SUSPECT.search(text):
        return None
    return json_problem(text.encode("utf-8", "surrogatepass"))


class WebSocketFrames:
    def __init__(self, app: Any, idle_timeout_s: float = 120.0, max_per_client: int = 32,
                 first_frame_s: float = FIRST_FRAME_S):
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.max_per_client = max_per_client
        self.first_frame_s = min(first_frame_s, idle_timeout_s)
        self.open: dict[str, int] = {}  # client address -> sockets open (one event loop: no lock)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        client = str((scope.get("client") or ("unknown",))[0])
        if self.open.get(client, 0) >= self.max_per_client:
            await self._refuse(receive, send)
            return
        self.open[client] = self.open.get(client, 0) + 1
        try:
            await self._serve(scope, receive, send)
        finally:
            left = self.open[client] - 1
            if left:
                self.open[client] = left
            else:
                del self.open[client]

    async def _refuse(self, receive: Any, send: Any) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": {
            "message": f"this client address already has {self.max_per_client} WebSocket sessions open "
                       f"(LLMSERVE_WS_MAX_PER_CLIENT); close one first",
            "code": "CAPACITY_REACHED", "max_per_client": self.max_per_client}})})
        await send({"type": "websocket.close", "code": 1008})

    async def _serve(self, scope: Scope, receive: Any, send: Any) -> None:
        reply = REPLIES.get(scope.get("path", ""))
        frames = 0
        connected = closed = False

        async def guarded_send(message: dict[str, Any]) -> None:
            if not closed:  # after an idle close the app's own close (or reply) has no socket to go to
                await send(message)

        async def guarded_receive() -> dict[str, Any]:
            nonlocal frames, connected, closed
            while True:
                if closed:
                    return {"type": "websocket.disconnect", "code": 1000}
                if connected:
                    wait = self.idle_timeout_s if frames else self.first_frame_s
                    try:
                        async with asyncio.timeout(wait):
                            message = await receive()
                    except TimeoutError:
                        closed = True
                        await send({"type": "websocket.send", "text": _error(
                            f"no frame for {wait:g} s: session closed to free its slot "
                            f"({'LLMSERVE_WS_IDLE_TIMEOUT_S' if frames else 'the first frame is due within'} "
                            f"{wait:g} s); reconnect to start again", "IDLE_TIMEOUT")})
                        await send({"type": "websocket.close", "code": 1000, "reason": "idle timeout"})
                        return {"type": "websocket.disconnect", "code": 1000}
                else:
                    message = await receive()  # websocket.connect: the timers start once it is in
                    connected = True
                if message["type"] != "websocket.receive":
                    return message
                frames += 1
                if reply is None:
                    return message
                text = message.get("text")
                problem = "binary frame" if text is None else frame_problem(text)
                if problem is None:
                    return message
                # The app is waiting in receive, so nothing else is sending on this socket now.
                await send({"type": "websocket.send", "text": reply(problem)})

        await self.app(scope, guarded_receive, guarded_send)
