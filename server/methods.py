"""405 for a method a route does not take, on the routes that sit under the Gradio app's mount.

OpenEnv registers /web/reset, /web/step, /web/state and /web/metadata beside the Gradio app it
mounts at /web. Starlette answers a known path with an unknown method 405, but here the mount
matches any method on any /web/ path, so `TRACE /web/state` reached Gradio and got 404. This pure
ASGI wrapper answers those paths' other methods itself: 405 with an Allow header, as elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

Scope = dict[str, Any]


def routes_under(routes: Iterable[Any], prefix: str) -> dict[str, frozenset[str]]:
    """Path -> the methods its routes take, for the routes whose path starts with `prefix`."""
    out: dict[str, set[str]] = {}
    for route in routes:
        path, methods = getattr(route, "path", ""), getattr(route, "methods", None)
        if path.startswith(prefix) and methods:
            out.setdefault(path, set()).update(methods)
    return {path: frozenset(methods | ({"HEAD"} if "GET" in methods else set())) for path, methods in out.items()}


class KnownMethods:
    def __init__(self, app: Any, allowed: dict[str, frozenset[str]]):
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            methods = self.allowed.get(scope.get("path", ""))
            if methods is not None and scope.get("method") not in methods:
                allow = ", ".join(sorted(methods))
                body = json.dumps({"detail": f"Method Not Allowed (allowed: {allow})"}).encode()
                await send({"type": "http.response.start", "status": 405,
                            "headers": [(b"allow", allow.encode()), (b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
