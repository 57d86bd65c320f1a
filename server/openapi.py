"""/openapi.json as this server behaves: the real request bodies and every error status it answers.

FastAPI's generated schema describes OpenEnv's generic routes: `/step` takes "any object" as the
action, `/reset` any extra field, and only 200/422 are listed, while the server also answers
400, 404, 409, 413 and (real mode) 502. Clients generated from the schema, and Schemathesis
(tests/test_fuzz.py), then disagree with the server. This module rewrites the generated schema
once, after FastAPI builds it: the bodies of POST /reset and /step (and of OpenEnv's /web/reset and
/web/step) become the strict models that server/bodies.py enforces, the episode_id of /step and /state is marked required (it is, over
HTTP), and each operation lists the error statuses it can answer. Routes are not touched.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from llmserve_env.core.episode import EPISODE_ID_MAX_LEN, EPISODE_ID_PATTERN
from llmserve_env.server.bodies import BODIES, OPTIONAL_BODIES
from pydantic import BaseModel

ERROR = {
    "title": "Error",
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": {"type": "string", "description": "what was wrong and what to do instead"}},
}

# Every operation with a request body: a body FastAPI cannot decode (400), one over the limit (413).
BODY_ERRORS = [(400, "the body is not UTF-8 JSON, or an argument the environment does not take"),
               (408, "the body did not arrive within 10 s of the request head"),
               (413, "request body larger than LLMSERVE_MAX_BODY_BYTES")]

# (method, path) -> the other error statuses that operation answers, beside 200 and 422.
ERRORS: dict[tuple[str, str], list[tuple[int, str]]] = {
    ("post", "/reset"): [(404, "unknown task_id (the body lists the valid ones), or a profile id this "
                                "server does not hold"),
                         (403, "trace:PATH outside LLMSERVE_TRACE_DIR"),
                         (409, "the episode_id named is already in use, or named an episode dropped less than "
                               "LLMSERVE_EPISODE_IDLE_TIMEOUT_S ago, or profile or caps given to a "
                               "real-mode server"),
                         (503, "too many client-named ids were dropped recently: leave episode_id out")],
    ("post", "/step"): [(400, "no episode_id: call POST /reset first"),
                        (404, "unknown or expired episode_id"),
                        (409, "the episode is done: grade it or reset"),
                        (502, "real mode: the upstream endpoint failed; this episode has ended")],
    ("get", "/state"): [(400, "no episode_id: call POST /reset first"), (404, "unknown or expired episode_id")],
    ("post", "/grader"): [(404, "unknown episode_id, or the episode_log's task_id is unknown"),
                          (409, "the episode is not finished"),
                          (403, "the episode_log's trace:PATH is outside LLMSERVE_TRACE_DIR")],
    ("post", "/fork"): [(404, "unknown or expired episode_id"),
                        (409, "real mode (a live engine cannot be copied), or the episode failed, or the new id is in use")],
    ("get", "/baseline"): [(404, "unknown task_id"),
                           (403, "use_openai=true but the operator has not turned it on "
                                 "(LLMSERVE_BASELINE_OPENAI_MODELS)"),
                           (429, "use_openai=true: the run does not fit the server's budget of model calls "
                                 "(LLMSERVE_BASELINE_OPENAI_MAX_CALLS)"),
                           (503, "use_openai=true but the server has no OPENAI_API_KEY")],
    ("post", "/web/reset"): [(404, "unknown task_id (the body lists the valid ones)"),
                             (409, "the episode_id named is already in use, or was dropped recently"),
                             (503, "too many client-named ids were dropped recently: leave episode_id out")],
    ("post", "/web/step"): [(404, "no episode yet: POST /web/reset first"),
                            (409, "the episode is done: reset")],
    ("get", "/web/state"): [(404, "no episode yet: POST /web/reset first")],
    # OpenEnv's task API: unknown environment name or split, task index out of range.
    ("get", "/{env_name}/splits"): [(404, "unknown environment name")],
} | {("post", f"/{{env_name}}/{name}"): [(400, "task index out of range"),
                                         (404, "unknown environment name or split")]
     for name in ("tasks", "num_tasks", "task", "task_range")}
REQUIRED_EPISODE_ID = {("get", "/state")}


def _add_model(schemas: dict[str, Any], model: type[BaseModel]) -> dict[str, str]:
    """Put `model` (and the models it uses) into components/schemas; return a $ref to it."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    schemas[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


EPISODE_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": EPISODE_ID_MAX_LEN,
                     "pattern": EPISODE_ID_PATTERN}


def rewrite(schema: dict[str, Any]) -> dict[str, Any]:
    """Apply the changes described in the module docstring to a FastAPI-generated schema."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = ERROR
    paths = schema.get("paths", {})
    for path, model in BODIES.items():
        op = paths.get(path, {}).get("post")
        if op is None:
            continue
        ref = _add_model(schemas, model)
        op["requestBody"] = {"content": {"application/json": {"schema": ref}},
                             "required": path not in OPTIONAL_BODIES}
    if "ServeStepRequest" in schemas:
        schemas["ServeStepRequest"]["required"] = ["action", "episode_id"]
        schemas["ServeStepRequest"]["properties"]["episode_id"] = {
            **EPISODE_ID_SCHEMA,
            "description": "the episode_id that POST /reset returned"}
    for method, path in REQUIRED_EPISODE_ID:
        for param in paths.get(path, {}).get(method, {}).get("parameters", []):
            if param["name"] == "episode_id":
                param["required"] = True
                param["schema"] = dict(EPISODE_ID_SCHEMA)
    _add_links(paths)
    for path, ops in paths.items():
        for method, op in ops.items():
            errors = ERRORS.get((method, path), []) + (BODY_ERRORS if "requestBody" in op else [])
            responses = op.setdefault("responses", {})
            responses.pop("500", None)  # OpenEnv documents a 500 for /step; this server never answers one
            for status, why in errors:
                responses.setdefault(str(status), {
                    "description": why,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
    return schema


# An action that any task takes: the links below step with it, so a chain reaches a real episode.
LINK_ACTION = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, "quantization_tier": "FP16",
               "prefill_decode_split": False, "priority_routing": False}
EPISODE_FROM_RESET = "$response.body#/observation/episode_id"


def _add_links(paths: dict[str, Any]) -> None:
    """OpenAPI links: reset -> step -> step/state/grade on the episode reset returned, so clients
    generated from the schema and Schemathesis's stateful phase can chain real calls."""
    def link(path: str, method: str, status: str, name: str, target: dict[str, Any]) -> None:
        op = paths.get(path, {}).get(method)
        if op is not None:
            op.setdefault("responses", {}).setdefault(status, {"description": "OK"}).setdefault(
                "links", {})[name] = target

    step = {"operationId": "step_step_post", "requestBody": {"action": LINK_ACTION, "episode_id": EPISODE_FROM_RESET}}
    link("/reset", "post", "200", "StepTheEpisode", step)
    link("/reset", "post", "200", "StateOfTheEpisode",
         {"operationId": "state_state_get", "parameters": {"query.episode_id": EPISODE_FROM_RESET}})
    link("/step", "post", "200", "StepAgain", {"operationId": "step_step_post", "requestBody": {
        "action": LINK_ACTION, "episode_id": "$request.body#/episode_id"}})
    link("/step", "post", "200", "GradeTheEpisode", {"operationId": "grader_grader_post", "requestBody": {
        "episode_id": "$request.body#/episode_id"}})


def install(app: FastAPI) -> None:
    """Serve the rewritten schema from /openapi.json (built on first request, as FastAPI does)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if getattr(app.state, "openapi_rewritten", False):
            return app.openapi_schema  # type: ignore[return-value]
        app.openapi_schema = rewrite(generate())
        app.state.openapi_rewritten = True
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
