"""The JSON bodies of POST /reset and POST /step as this server accepts them, checked strictly.

OpenEnv's own `ResetRequest`/`StepRequest` validate in pydantic's lax mode and allow any extra
field, so `"seed": false` became seed 0 and `"seed": "7"` became 7, silently. `StrictBodies` (a
pure ASGI middleware) validates these two bodies against the models below before OpenEnv's
handlers parse them, and answers 422 in FastAPI's format (`loc` names the field) when they do not
fit; a body that fits is replayed untouched, so OpenEnv's routes still do all the work. The same
models document the bodies in /openapi.json (server/openapi.py), so the schema and the server
agree. OpenEnv's /web/reset and /web/step get the same treatment. WebSocket messages do not pass here: `LLMServeEnvironment.reset/step` check their
arguments themselves.
"""

from __future__ import annotations

import json
from typing import Any

from llmserve_env.server.environment import DEFAULT_TASK
from llmserve_env.shared.models import ServeAction
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Scope = dict[str, Any]


class ServeCaps(BaseModel):
    """Real mode's request caps (LLMSERVE_REAL_MAX_*) for the simulator; null or absent: no cap."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_requests_per_step: int | None = Field(None, ge=1, description="arrivals served per window; the rest "
                                                                      "are rejected")
    max_prompt_tokens: int | None = Field(None, ge=1, description="prompts are cut to this")
    max_completion_tokens: int | None = Field(None, ge=1, description="completions are cut to this")


class ServeResetRequest(BaseModel):
    """POST /reset: start an episode of `task_id` with `seed`; the answer carries its episode_id."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task_id: str = Field(DEFAULT_TASK, min_length=1, max_length=4096,
                         description="a task id from GET /tasks, or 'trace:PATH[?options]' (a trace file "
                                     "on the server)")
    seed: int | None = Field(None, ge=0, description="fixes the whole arrival stream (default 0)")
    episode_id: str | None = Field(None, max_length=255,
                                   description="an id for the new episode (default: a fresh uuid)")
    profile: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                description="sim mode: serve on this simulator profile id instead of the "
                                            "task's (a fitted one from LLMSERVE_PROFILE_PATH or the user folder)")
    caps: ServeCaps | None = Field(None, description="sim mode: real mode's request caps, applied by the "
                                                      "simulator to replay a recorded episode")


class ServeStepRequest(BaseModel):
    """POST /step: serve the next window of episode `episode_id` under `action`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: ServeAction
    # Optional here so that a missing id gets the environment's 400 saying how to get one;
    # /openapi.json lists it as required, which it is.
    episode_id: str | None = Field(None, min_length=1, max_length=255,
                                   description="the episode_id that POST /reset returned")
    timeout_s: float | None = Field(None, gt=0, description="OpenEnv's step timeout; the simulator "
                                                            "ignores it")
    request_id: str | None = Field(None, max_length=255, description="OpenEnv's request id; echoed nowhere")


class ServeWebStepRequest(BaseModel):
    """POST /web/step (OpenEnv's web interface): step the web playground's own episode."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: ServeAction


# POST path -> its body. /web/reset and /web/step are OpenEnv's web-interface routes: they take a
# reset's arguments and {"action": ...}, and without this check a malformed action was a 500 there.
BODIES: dict[str, type[BaseModel]] = {"/reset": ServeResetRequest, "/step": ServeStepRequest,
                                      "/web/reset": ServeResetRequest, "/web/step": ServeWebStepRequest}
OPTIONAL_BODIES = {"/reset", "/web/reset"}  # an empty body means "all defaults"


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors in FastAPI's 422 shape (`loc` starting with "body").

    The input of a body that is not JSON (raw bytes, maybe not UTF-8) is not echoed back, and
    anything JSON cannot carry (an exception in `ctx`, a non-finite float) becomes text.
    """
    out = []
    for e in exc.errors(include_url=False):
        item: dict[str, Any] = {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"],
                                "input": None if e["type"] == "json_invalid" else e.get("input")}
        if "ctx" in e:
            item["ctx"] = {k: v if isinstance(v, (str, int, bool)) else str(v) for k, v in e["ctx"].items()}
        out.append(item)
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError):
        for item in out:
            item["input"] = repr(item["input"])[:200]
    return out


class StrictBodies:
    """Check the JSON body of the POST routes in BODIES (path -> model) before the app sees it."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        model = BODIES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if model is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before sending it all
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.strip():  # an empty /reset body means "all defaults": OpenEnv allows it
            try:
                model.model_validate_json(body)
            except ValidationError as exc:
                await _send_json(send, 422, {"detail": validation_errors(exc)})
                return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: wait for the disconnect, as usual
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _send_json(send: Any, status: int, content: Any) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
