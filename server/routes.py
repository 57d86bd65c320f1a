"""The routes beside OpenEnv's own: /tasks, /grader, /baseline, /state (episode-aware), /demo, /,
and /step (in place of OpenEnv's, which parsed and validated every action twice)."""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, RedirectResponse, Response
from llmserve_env.core.episode import EPISODE_ID_MAX_LEN, EPISODE_ID_PATTERN
from llmserve_env.core.episode_log import EpisodeLog
from llmserve_env.core.errors import EpisodeRequiredError
from llmserve_env.core.grader import GradeResult
from llmserve_env.core.verify import grade_log
from llmserve_env.server.bodies import ServeStepRequest, validate_body, validation_errors
from llmserve_env.server.budget import CallBudget
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState
from llmserve_env.shared.tasks import TASKS, get_task
from openenv.core.env_server.types import StepResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

_OBSERVATION_FIELDS_OFF = {"reward", "done"}


def step_response_json(obs: ServeObservation) -> bytes:
    """OpenEnv's StepResponse wire format, `{"observation": {...}, "reward": r, "done": d}`, written
    straight from the observation. OpenEnv's own serialiser also copies the observation's metadata
    to a top-level "metadata" key (35 % of a step's bytes, said twice): it is sent once, inside
    "observation", where ServeObservation and the typed clients read it."""
    observation = obs.__pydantic_serializer__.to_json(obs, exclude=_OBSERVATION_FIELDS_OFF)
    reward = b"null" if obs.reward is None else json.dumps(obs.reward).encode()
    return b'{"observation":%s,"reward":%s,"done":%s}' % (observation, reward, b"true" if obs.done else b"false")


async def serve_step(app: Any, raw: bytes) -> Response:
    """POST /step's answer to the body `raw`: one parse and one validation of it (pydantic-core,
    strict, extra fields refused), where OpenEnv's route parsed the JSON, validated a StepRequest,
    then the action again; EnvError and the like are raised for the app's exception handlers."""
    try:
        body, _ = validate_body(ServeStepRequest, raw)
    except ValidationError as exc:
        return JSONResponse(status_code=422, content={"detail": validation_errors(exc)})
    # Straight to the episode store: over HTTP every call is stateless, so the per-call
    # Environment that OpenEnv's routes build would only look the episode up and be closed.
    # timeout_s is accepted, not used (as LLMServeEnvironment.step: a simulated window takes ms).
    if not body.episode_id:
        raise EpisodeRequiredError("POST /step")
    episode = app.state.episode_store.get(body.episode_id)
    if app.state.config.mode == "sim":  # on the loop (see InlineStepEnvironment's docstring)
        obs = episode.step(body.action)
    else:  # real mode: a window of wall clock, in the thread pool as OpenEnv did
        obs = await run_in_threadpool(episode.step, body.action)
    return Response(step_response_json(obs), media_type="application/json")


class StepRoute:
    """POST /step answered ahead of FastAPI's router, by the route's own code (`serve_step`).

    The innermost of the app's middleware (inside the body-size limit, so its bounds hold): for
    /step it skips what FastAPI adds around a route, which cost more than the step's own
    plumbing (matching the path against every route in turn, twice, the endpoint's dependencies,
    the exception-middleware and exit-stack wrappers): in process, with the simulator stubbed
    out, a /step took 0.128 ms through the router and takes 0.048 ms here.
    An exception goes to the app's exception handlers as Starlette's ExceptionMiddleware would
    send it (the same handler, so the same status and body); one without a handler propagates to
    the 500 as before. Any other method or path passes on to the router (405, 404 as before)."""

    def __init__(self, app: Any):
        self.app = app
        self._handlers: tuple[dict[Any, Any], dict[int, Any]] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != "/step" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await serve_step(scope["app"], await request.body())
        except Exception as exc:
            handler = self._handler(scope["app"], exc)
            if handler is None:
                raise
            if inspect.iscoroutinefunction(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
            exc.__traceback__ = None
            if response is None:
                return
        await response(scope, receive, send)

    def _handler(self, app: Any, exc: Exception) -> Any:
        """The app's handler for `exc`, looked up as Starlette's ExceptionMiddleware does (a status
        handler for an HTTPException first, then the exception's classes in MRO order)."""
        if self._handlers is None:
            by_class: dict[Any, Any] = {StarletteHTTPException: http_exception_handler}
            by_status: dict[int, Any] = {}
            for key, value in app.exception_handlers.items():
                if isinstance(key, int):
                    by_status[key] = value
                else:
                    by_class[key] = value
            self._handlers = (by_class, by_status)
        by_class, by_status = self._handlers
        if isinstance(exc, StarletteHTTPException) and exc.status_code in by_status:
            return by_status[exc.status_code]
        return next((by_class[cls] for cls in type(exc).__mro__ if cls in by_class), None)


class GraderRequest(BaseModel):
    """Grade the finished episode `episode_id`, or an explicit `episode_log` (exactly one of them)."""

    # The schema says "exactly one of the two, neither null", as the validator below enforces
    # (the fields default to None only so that the missing one can be told apart).
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["episode_id"]}, {"required": ["episode_log"]}]})

    episode_id: str = Field(None, min_length=1, max_length=EPISODE_ID_MAX_LEN,  # type: ignore[assignment]
                            pattern=EPISODE_ID_PATTERN)
    episode_log: EpisodeLog = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _one_of(self) -> GraderRequest:
        if (self.episode_id is None) == (self.episode_log is None):
            raise ValueError("give exactly one of 'episode_id' (a finished episode) or 'episode_log'")
        return self


class ForkRequest(BaseModel):
    """Fork the episode `episode_id`: a new episode continuing from its current state."""

    model_config = ConfigDict(extra="forbid", strict=True)

    episode_id: str = Field(..., min_length=1, max_length=255, description="the episode to copy")


def build_router(env_factory: Any) -> APIRouter:
    router = APIRouter()

    @router.get("/", tags=["Environment Info"], summary="What this server is and where to go")
    def root() -> dict[str, Any]:
        return {
            "name": "LLMServeEnv",
            "description": "OpenEnv environment for learning LLM inference-serving policies",
            "docs": "/docs",
            "web": "/web",
            "tasks": "/tasks",
            "health": "/health",
            "schema": "/schema",
        }

    @router.get("/demo", include_in_schema=False)
    def demo() -> RedirectResponse:
        return RedirectResponse(url="/web", status_code=307)

    @router.get("/tasks", tags=["Task API"], summary="Every task with its SLOs, horizon and the action schema")
    def tasks() -> dict[str, Any]:
        return {
            "tasks": [t.describe() for t in TASKS.values()],
            "trace_replay": "reset(task_id='trace:PATH') replays a CSV (arrived_at,num_prefill_tokens,"
                            "num_decode_tokens) or a Mooncake-style JSONL (timestamp ms, input_length, "
                            "output_length) on the server's file system",
            "action_schema": ServeAction.model_json_schema(),
        }

    @router.get("/state", response_model=ServeState, tags=["State Management"],
                summary="The state of an episode (pass the episode_id that /reset returned)")
    async def state(episode_id: str | None = Query(None, min_length=1, max_length=EPISODE_ID_MAX_LEN,
                                                   pattern=EPISODE_ID_PATTERN)) -> ServeState:
        # async: building the state is microseconds, not worth a thread-pool hop. Optional here so
        # that a missing id gets the 400 saying how to get one; /openapi.json marks it required.
        env: LLMServeEnvironment = env_factory()
        try:
            return env.state_of(episode_id)
        finally:
            env.close()

    @router.post("/grader", response_model=GradeResult, tags=["Task API"],
                 summary="Grade a finished episode (by episode_id) or an explicit episode_log")
    def grader(request: GraderRequest) -> GradeResult:
        env: LLMServeEnvironment = env_factory()
        try:
            if request.episode_log is None:
                return env.grade(request.episode_id)
            log = request.episode_log
            # A sim-mode log is replayed and graded on the replay (refused, 422, at the first window
            # that does not replay); a real-mode one is graded as submitted, verified: false, by a
            # real-mode server or one whose operator allows it (else 422: nothing checks its metrics).
            allow_real = env.config.mode == "real" or env.config.grade_real_logs
            return grade_log(log.model_copy(update={"task_id": env.config.trace_task_id(log.task_id)}),
                             allow_real=allow_real)
        finally:
            env.close()

    @router.post("/step", tags=["Environment Control"], summary="Execute an action in the environment",
                 responses={200: {"model": StepResponse, "description": "the next observation, reward and done"},
                            422: {"description": "the body does not fit ServeStepRequest (loc names the field)",
                                  "content": {"application/json": {"schema": {
                                      "$ref": "#/components/schemas/HTTPValidationError"}}}}})
    async def step(request: Request) -> Response:
        # Served by StepRoute ahead of the router (below); this route documents /step in
        # /openapi.json and answers it for an app built without StepRoute.
        return await serve_step(request.app, await request.body())

    @router.post("/fork", response_model=ServeState, tags=["State Management"],
                 summary="Copy an episode (sim mode): a new episode_id that continues from the same state")
    async def fork(request: ForkRequest) -> ServeState:
        # async: a fork is well under a millisecond of pure Python, not worth a thread-pool hop
        env: LLMServeEnvironment = env_factory()
        try:
            return env.fork(request.episode_id)
        finally:
            env.close()

    @router.get("/baseline", tags=["Task API"], summary="Run the baseline suite in process")
    async def baseline(
        request: Request,
        use_openai: bool = False,
        task_id: str | None = Query(None, description="one task id; all tasks when omitted"),
        model: str | None = Query(None, max_length=200, description="use_openai: one of the models the "
                                                                    "operator allows (LLMSERVE_BASELINE_OPENAI_MODELS)"),
    ) -> Any:
        task_ids = [get_task(task_id).task_id] if task_id is not None else list(TASKS)  # 404 before any work
        from llmserve_env.server.baseline_inference import run_baseline_suite

        if not use_openai:
            return await run_in_threadpool(run_baseline_suite, task_id=task_id)
        # Paid calls on the operator's key: off unless the operator lists models, only those models,
        # within a server-wide budget of requests (server/budget.py).
        config: ServerSettings = request.app.state.config
        budget: CallBudget = request.app.state.baseline_budget
        if not config.openai_models:
            raise HTTPException(status_code=403, detail="use_openai is off on this server: it would spend the "
                                                        "operator's OPENAI_API_KEY. The operator turns it on by "
                                                        "listing the allowed models in "
                                                        "LLMSERVE_BASELINE_OPENAI_MODELS; GET /baseline without "
                                                        "use_openai runs the deterministic suite")
        if model is not None and model not in config.openai_models:
            return JSONResponse(status_code=422, content={"detail": [{
                "type": "value_error", "loc": ["query", "model"], "input": model,
                "msg": f"model {model!r} is not one this server allows; allowed: "
                       f"{', '.join(config.openai_models)} (LLMSERVE_BASELINE_OPENAI_MODELS)"}]})
        if not os.environ.get("OPENAI_API_KEY"):
            # The request is well-formed; this server is not configured to serve it (as the README says).
            raise HTTPException(status_code=503, detail="use_openai=true needs OPENAI_API_KEY set on the "
                                                        "server; GET /baseline without it runs the "
                                                        "deterministic suite")
        windows = sum(get_task(t).horizon for t in task_ids)  # one model call per window
        if not budget.reserve(windows):
            raise HTTPException(status_code=429, detail=f"this run needs {windows} model calls and the server's "
                                                        f"budget has {budget.remaining} of "
                                                        f"{budget.total} left (LLMSERVE_BASELINE_OPENAI_MAX_CALLS, "
                                                        f"for the server's lifetime)")
        import openai

        # No SDK retries: one request per window, as the budget counted.
        llm_client = openai.OpenAI(max_retries=0, timeout=60.0)
        return await run_in_threadpool(run_baseline_suite, use_openai=True, model=model or config.openai_models[0],
                                       task_id=task_id, llm_options={"client": llm_client})

    return router
