"""Request bodies as this server accepts them: one validation layer in front of every JSON route.

OpenEnv's own `ResetRequest`/`StepRequest` validate in pydantic's lax mode and allow any extra
field, so `"seed": false` became seed 0 and `"seed": "7"` became 7, silently. `StrictBodies` (a
pure ASGI middleware) checks every POST body before the route sees it:

- /reset, /web/reset, /web/step: against the strict models below (one pydantic parse), 422 in
  FastAPI's format (`loc` names the field) when they do not fit; a body that fits is replayed
  untouched, so OpenEnv's routes still do the work.
- /step: not here. Its route (server/routes.py) parses and validates the body once, with
  `ServeStepRequest`, and steps the episode itself.
- every other JSON body (/grader, OpenEnv's task API, /mcp): well-formed JSON only: no NaN or
  Infinity (finite numbers only), no lone UTF-16 surrogate (it cannot be written back out as
  UTF-8), no integer past Python's 4,300 digits, no nesting past DEPTH_LIMIT. Each of these was a
  500 when a route echoed or stored it. The Gradio app under /web/ keeps its own protocol.

The same models document the bodies in /openapi.json (server/openapi.py), so the schema and the
server agree. WebSocket messages do not pass here: `LLMServeEnvironment.reset/step` check their
arguments themselves, and `WebSocketFrames` answers frames that are not JSON objects.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Annotated, Any, TypeVar

from llmserve_env.core.episode import EPISODE_ID_MAX_LEN, EPISODE_ID_PATTERN
from llmserve_env.server.environment import DEFAULT_TASK, SEED_LIMIT
from llmserve_env.shared.models import ServeAction
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

Scope = dict[str, Any]
ModelT = TypeVar("ModelT", bound=BaseModel)


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
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT,
                             description="fixes the whole arrival stream (default 0); 0 <= seed < 2**63")
    episode_id: str | None = Field(None, min_length=1, max_length=EPISODE_ID_MAX_LEN, pattern=EPISODE_ID_PATTERN,
                                   description="an id for the new episode, not one in use (409); default: "
                                               "the server mints an unguessable one")
    profile: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                description="sim mode: serve on this simulator profile id instead of the "
                                            "task's (a fitted one from LLMSERVE_PROFILE_PATH or the user folder)")
    caps: ServeCaps | None = Field(None, description="sim mode: real mode's request caps, applied by the "
                                                      "simulator to replay a recorded episode")


def _checked_metadata(action: ServeAction) -> ServeAction:
    """The action's free-form metadata checked like every other body (bodies.value_problem): it
    is stored and echoed, and pydantic's JSON parser takes NaN and turns 1e999 into infinity."""
    if action.metadata:
        problem = value_problem(action.metadata)
        if problem is not None:
            raise ValueError(f"metadata: {problem}")
    return action


class ServeStepRequest(BaseModel):
    """POST /step: serve the next window of episode `episode_id` under `action`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: Annotated[ServeAction, AfterValidator(_checked_metadata)]
    # Optional here so that a missing id gets the environment's 400 saying how to get one;
    # /openapi.json lists it as required, which it is.
    episode_id: str | None = Field(None, min_length=1, max_length=EPISODE_ID_MAX_LEN, pattern=EPISODE_ID_PATTERN,
                                   description="the episode_id that POST /reset returned")
    timeout_s: float | None = Field(None, gt=0, description="OpenEnv's step timeout; the simulator "
                                                            "ignores it")
    request_id: str | None = Field(None, max_length=255, description="OpenEnv's request id; echoed nowhere")


class ServeWebStepRequest(BaseModel):
    """POST /web/step (OpenEnv's web interface): step the web playground's own episode."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: Annotated[ServeAction, AfterValidator(_checked_metadata)]


# POST path -> its body. /web/reset and /web/step are OpenEnv's web-interface routes: they take a
# reset's arguments and {"action": ...}, and without this check a malformed action was a 500 there.
BODIES: dict[str, type[BaseModel]] = {"/reset": ServeResetRequest, "/step": ServeStepRequest,
                                      "/web/reset": ServeResetRequest, "/web/step": ServeWebStepRequest}
OPTIONAL_BODIES = {"/reset", "/web/reset"}  # an empty body means "all defaults"


def whole_floats_fixed(exc: ValidationError, data: Any) -> Any | None:
    """`data` (decoded JSON) with each integer field that was written as a whole float (52.0,
    1e2) turned into the integer, or None when no error is of that kind. JSON Schema's `integer`
    admits 52.0 and JSON itself has one number type, so a client's writer may print either; the
    fields stay strict otherwise (52.5, "52", true are still refused)."""
    fixed = None
    for e in exc.errors(include_url=False):
        value = e.get("input")
        if e["type"] != "int_type" or not isinstance(value, float) or not value.is_integer() or \
                abs(value) >= 2**64:
            continue
        if fixed is None:
            fixed = copy.deepcopy(data)
        *path, last = e["loc"]
        node = fixed
        try:
            for key in path:
                node = node[key]
            if node[last] == value:
                node[last] = int(value)
        except (KeyError, IndexError, TypeError):
            continue
    return fixed


def validate_body(model: type[ModelT], body: bytes) -> tuple[ModelT, bytes]:
    """`model` validated from the JSON `body` (one parse when it fits), accepting whole floats in
    integer fields (whole_floats_fixed); the model and the body as validated (integers written as
    such), or the ValidationError of the body as sent."""
    try:
        return model.model_validate_json(body), body
    except ValidationError as exc:
        try:
            fixed = whole_floats_fixed(exc, json.loads(body))
        except ValueError:
            fixed = None
        if fixed is None:
            raise
        fixed_body = json.dumps(fixed).encode()
        try:
            return model.model_validate_json(fixed_body), fixed_body
        except ValidationError:
            raise exc from None


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
    return printable(out)


def printable(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`errors` as JSON can carry them: an input that is not finite, not UTF-8-encodable (a lone
    surrogate) or not JSON at all is shown as its (truncated, escaped) repr instead of a 500."""
    try:
        json.dumps(errors, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError):
        for item in errors:
            item["input"] = ascii(item.get("input"))[:200]
            item["msg"] = ascii(item.get("msg"))[1:-1][:500] if not _safe(item.get("msg")) else item.get("msg")
            item["loc"] = [p if _safe(p) else ascii(p) for p in item.get("loc", [])]
    return errors


def _safe(value: Any) -> bool:
    if isinstance(value, str):
        return _encodable(value)
    return isinstance(value, int | bool) or value is None


# Nesting deeper than this is no body any route takes (an episode log is 4 levels deep).
DEPTH_LIMIT = 32
# A JSON escape of a UTF-16 surrogate: only then can a decoded string hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_JSON_TYPES = (b"application/json", b"application/json-rpc", b"text/plain")


def json_problem(body: bytes) -> str | None:
    """Why `body` is not JSON this server takes (see the module docstring), or None."""
    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number; finite numbers only")

    def finite(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(f"{text[:40]} is past the range of a float; finite numbers only")
        return number

    try:
        value = json.loads(body, parse_constant=no_constant, parse_float=finite)
    except RecursionError:
        return f"JSON nested deeper than {DEPTH_LIMIT} levels"
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    except ValueError as exc:  # malformed JSON, NaN/Infinity, an integer past 4,300 digits
        return f"not valid JSON: {str(exc)[:200]}"
    return value_problem(value, check_strings=_SURROGATE_ESCAPE.search(body) is not None)


def value_problem(value: Any, check_strings: bool = True) -> str | None:
    """Why a decoded JSON value is not one this server takes (nesting past DEPTH_LIMIT, a lone
    surrogate in a string or key, a number that is not finite), or None."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > DEPTH_LIMIT:
            return f"JSON nested deeper than {DEPTH_LIMIT} levels"
        if isinstance(item, dict):
            for k, v in item.items():
                if check_strings and not _encodable(k):
                    return "a string holds a lone UTF-16 surrogate (not a character)"
                stack.append((v, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif check_strings and isinstance(item, str) and not _encodable(item):
            return "a string holds a lone UTF-16 surrogate (not a character)"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{item} is not a JSON number; finite numbers only"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.split(b";")[0].strip().lower() in _JSON_TYPES
    return True  # no content type: /mcp clients and curl often send none; it is read as JSON


class StrictBodies:
    """Check every POST body before the app sees it (see the module docstring)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        model = BODIES.get(path)
        if path == "/step" or (model is None and (path.startswith("/web/") or not _is_json(scope))):
            await self.app(scope, receive, send)  # validated by its route / Gradio's / not JSON
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
            if model is not None:
                try:
                    _, body = validate_body(model, body)
                except ValidationError as exc:
                    await _send_json(send, 422, {"detail": validation_errors(exc)})
                    return
            else:
                problem = json_problem(body)
                if problem is not None:
                    await _send_json(send, 422, {"detail": [
                        {"type": "json_invalid", "loc": ["body"], "msg": problem, "input": None}]})
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
