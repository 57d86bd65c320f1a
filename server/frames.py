"""WebSocket frames OpenEnv's /ws loop cannot read, answered with an error frame instead.

OpenEnv's session loop reads text frames and calls `.get` on the decoded JSON: a binary frame
raised inside `receive_text`, and a JSON list or number raised on `.get`; either ended the session
and lost its episode. This pure ASGI wrapper answers such a frame itself with OpenEnv's error
message shape (`{"type": "error", "data": {"message", "code"}}`) and keeps the session. A text
frame that starts with `{` passes untouched (OpenEnv answers malformed JSON itself, and keeps the
session), so a well-formed message costs one character test, not a second parse.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]
_NOT_AN_OBJECT = json.dumps({"type": "error", "data": {
    "message": "a message must be a JSON object such as {\"type\": \"step\", \"data\": {...}} sent as a text "
               "frame; this frame was ignored and the session goes on", "code": "INVALID_JSON"}})


class WebSocketFrames:
    def __init__(self, app: Any, path: str = "/ws"):
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return

        async def guarded_receive() -> dict[str, Any]:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                text = message.get("text")
                if text is not None and text.lstrip()[:1] == "{":
                    return message
                # The app is waiting in receive, so nothing else is sending on this socket now.
                await send({"type": "websocket.send", "text": _NOT_AN_OBJECT})

        await self.app(scope, guarded_receive, send)
