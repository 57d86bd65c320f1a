"""The FastAPI app: OpenEnv's `create_app` plus LLMServeEnv's own routes.

    python -m llmserve_env serve --host 0.0.0.0 --port 7860     # the bounded way (server/serving.py)

OpenEnv registers /reset /step /schema /metadata /health /ws /mcp, its task API (/{env_name}/...)
and the web interface at /web; server/routes.py adds /tasks /grader /baseline /demo / and an
episode-aware /state. Around them: a body-size limit (server/limits.py), strict checking of the
/reset and /step bodies (server/bodies.py), and an /openapi.json that documents what the server
really takes and answers (server/openapi.py). Settings: server/config.py.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from llmserve_env.core.errors import EnvError, EpisodeRequiredError
from llmserve_env.core.grader import GradeError
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.limits import raise_open_file_limit
from llmserve_env.shared.tasks import UnknownTaskError
from llmserve_env.shared.traces import TraceError

log = logging.getLogger("llmserve_env.app")

# Gradio starts a thread that asks api.gradio.app for its latest version, and sends usage
# telemetry, every time a Blocks is built (read at build time, so setting it here is in time).
# A serving environment should not phone home unless asked to: off unless the variable is set
# (the Docker image sets it too).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

# Gradio's queue polls for work every 1 ms on the server's event loop (`sleep_when_free`), which
# costs an idle server ~7 % of a core and wakes the loop between every two steps. The dashboard
# does not need millisecond pick-up: 20 ms (progress: 50 ms) is invisible to a person.
GRADIO_POLL_S = 0.02
GRADIO_PROGRESS_POLL_S = 0.05

# Where a TraceError/GradeError came from, for the `loc` of its 422.
VALUE_ERROR_LOC = {"/reset": ["body", "task_id"], "/web/reset": ["body", "task_id"],
                   "/grader": ["body", "episode_log"]}


def _drop_route(app: FastAPI, path: str, method: str) -> None:
    """Remove one of OpenEnv's routes that this app replaces (never register a second one)."""
    app.router.routes[:] = [
        r for r in app.router.routes
        if not (getattr(r, "path", None) == path and method in (getattr(r, "methods", None) or ()))
    ]


def _calm_gradio_queue(app: FastAPI) -> None:
    """Slow the polling of the Gradio app mounted at /web (see GRADIO_POLL_S); best effort, since
    the queue is Gradio's private attribute: if a Gradio release renames it, nothing breaks."""
    from starlette.routing import Mount

    for route in app.router.routes:
        if isinstance(route, Mount) and route.path == "/web" and hasattr(route.app, "get_blocks"):
            queue = getattr(route.app.get_blocks(), "_queue", None)
            if queue is not None and hasattr(queue, "sleep_when_free"):
                queue.sleep_when_free = max(queue.sleep_when_free, GRADIO_POLL_S)
                queue.progress_update_sleep_when_free = max(
                    getattr(queue, "progress_update_sleep_when_free", 0.0), GRADIO_PROGRESS_POLL_S)
            else:
                log.debug("the Gradio queue has no sleep_when_free; left as it is")


def _wire_real_mode(app: FastAPI) -> None:
    """/health reports the endpoint (503 while it is unreachable); shutdown cancels and records every
    in-flight request and flushes the record file (gateway/service.py)."""
    from llmserve_env.gateway import service

    async def health() -> JSONResponse:
        endpoint = await service.endpoint_health_async()
        ok = endpoint is None or bool(endpoint["reachable"])
        return JSONResponse(status_code=200 if ok else 503,
                            content={"status": "healthy" if ok else "unhealthy", "real_endpoint": endpoint})

    _drop_route(app, "/health", "GET")
    app.add_api_route("/health", health, methods=["GET"], tags=["Health"], summary="Health check",
                      description="healthy, or 503 unhealthy while the real-mode endpoint is unreachable")
    app.router.on_shutdown.append(service.shutdown)


async def _warn_if_unbounded() -> None:
    from llmserve_env.server import serving

    if not serving.BOUNDED_RUNNER:
        log.warning("served without server/serving.py's bounds: a request head that never ends is never timed "
                    "out and connections are not capped (the app's own bounds still hold); start the server "
                    "with `python -m llmserve_env serve` (or make serve)")


def build_app(config: ServerSettings | None = None) -> FastAPI:
    # Imported here, not at the top: OpenEnv's package imports Gradio and MCP whole (~3 s), which
    # `import llmserve_env.server.app` (a test collecting, a tool naming build_app) need not pay.
    from llmserve_env.server import docs, openapi
    from llmserve_env.server.bodies import StrictBodies, printable
    from llmserve_env.server.budget import CallBudget
    from llmserve_env.server.dashboard import build_dashboard
    from llmserve_env.server.environment import InlineStepEnvironment, LLMServeEnvironment
    from llmserve_env.server.episodes import EpisodeStore
    from llmserve_env.server.frames import WebSocketFrames
    from llmserve_env.server.limits import BodySizeLimit
    from llmserve_env.server.logbounds import bound_logs
    from llmserve_env.server.methods import KnownMethods, routes_under
    from llmserve_env.server.routes import StepRoute, build_router
    from llmserve_env.server.wire import WireAction, WireObservation, WireState
    from llmserve_env.shared.traces import parse_in_worker_process
    from openenv.core.env_server.http_server import create_app

    config = config or ServerSettings.from_env()
    if config.mode == "real":
        # Fail at start-up, not at the first step: every variable, the tier table, the step timeout
        # against the longest built-in window, and a probe of the endpoint (gateway/startup.py).
        from llmserve_env.gateway.startup import check_real_mode
        from llmserve_env.shared.tasks import TASKS

        check_real_mode(t.window_s for t in TASKS.values())
    # Bounds that hold under any runner (server/limits.py, server/logbounds.py); server/serving.py
    # adds the ones only a runner can enforce (request-head timeout, connection cap).
    raise_open_file_limit()
    bound_logs()
    from llmserve_env.core.kernels import warm

    # every compiled kernel (core/kernels.py), compiled or loaded from numba's cache before the first reset
    # rather than during it; the simulator's only in sim mode
    warm(sim=config.mode == "sim")
    store = EpisodeStore(config.max_episodes, config.idle_timeout_s)
    parse_in_worker_process()  # trace files parse in a worker process, never against the event loop

    # Sim steps run inline on the event loop; real-mode steps block for a window of wall clock,
    # so they keep OpenEnv's thread pool (see InlineStepEnvironment).
    env_cls = InlineStepEnvironment if config.mode == "sim" else LLMServeEnvironment

    def env_factory() -> LLMServeEnvironment:
        return env_cls(store=store, config=config)

    # The seed promises /web out of the box, so the app turns OpenEnv's web interface on itself.
    os.environ.setdefault("ENABLE_WEB_INTERFACE", "true")
    app = create_app(
        env_factory,
        WireAction,
        WireObservation,
        env_name="llmserve_env",
        max_concurrent_envs=config.max_sessions,
        state_cls=WireState,
        gradio_builder=build_dashboard,
        # The dashboard builds both tabs (server/dashboard.py): the Dashboard lands first, and OpenEnv's
        # Playground second, built on a form that starts at a valid action (OpenEnv's own started at
        # batch_cap 0 and failed its first step) and naming the server's own URL.
        show_default_tab=False,
    )
    app.title = "LLMServeEnv"
    _calm_gradio_queue(app)
    app.state.episode_store = store
    app.state.config = config
    app.state.baseline_budget = CallBudget(config.baseline_openai_max_calls)
    # /state must find the episode by id; "/" points at the docs rather than redirecting.
    _drop_route(app, "/state", "GET")
    _drop_route(app, "/", "GET")
    _drop_route(app, "/step", "POST")  # ours parses and validates the action once (server/routes.py)
    app.include_router(build_router(env_factory))
    if config.mode == "real":
        _wire_real_mode(app)
    app.router.on_startup.append(_warn_if_unbounded)

    async def env_error(request: Request, exc: EnvError) -> JSONResponse:
        if isinstance(exc, EpisodeRequiredError) and request.url.path.startswith("/web/"):
            # The web playground's one episode does not exist yet: a missing resource, not a bad request.
            return JSONResponse(status_code=404, content={"detail": exc.message})
        if exc.status == 422:  # a value out of its range: FastAPI's 422 shape, as the schema documents
            return JSONResponse(status_code=422, content={"detail": [
                {"type": "value_error", "loc": list(getattr(exc, "loc", ["body"])), "msg": exc.message,
                 "input": getattr(exc, "input", None)}]})
        return JSONResponse(status_code=exc.status, content={"detail": exc.message})

    async def unknown_task(_: Request, exc: UnknownTaskError) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc), "valid_task_ids": exc.valid})

    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        # A trace or episode log that parses but cannot be used: FastAPI's 422 shape, as documented.
        loc = VALUE_ERROR_LOC.get(request.url.path, ["body"])
        return JSONResponse(status_code=422, content={"detail": [
            {"type": "value_error", "loc": loc, "msg": str(exc), "input": None}]})

    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each error's input, and a NaN or a lone surrogate in it made
        # the 422 itself fail as a 500: the same errors, made printable.
        errors = [dict(e) for e in exc.errors()]
        for e in errors:
            e.pop("url", None)
            if "ctx" in e:
                e["ctx"] = {k: v if isinstance(v, str | int | bool) else str(v) for k, v in e["ctx"].items()}
        return JSONResponse(status_code=422, content={"detail": printable(jsonable_encoder(errors))})

    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(EnvError, env_error)
    app.add_exception_handler(UnknownTaskError, unknown_task)
    app.add_exception_handler(TraceError, bad_value)
    app.add_exception_handler(GradeError, bad_value)
    # Added last = runs first: the size limit applies before StrictBodies buffers a body, and
    # before StepRoute (innermost) answers POST /step ahead of the router (server/routes.py).
    app.add_middleware(StepRoute)
    app.add_middleware(StrictBodies)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(WebSocketFrames, idle_timeout_s=config.ws_idle_timeout_s,
                       max_per_client=config.ws_max_per_client)
    app.add_middleware(KnownMethods, allowed=routes_under(app.router.routes, "/web/"))
    openapi.install(app)
    docs.install(app)  # /docs from the packaged Swagger UI: it renders offline
    return app


# At import, as when the app was built at import: a runner's listening socket and first
# connections already count against the limit before the lazy app is built (build_app raises it too).
raise_open_file_limit()
# A bad setting still stops the import (and so `uvicorn ...server.app:app`) with its one-line reason,
# as when the app was built here; reading the settings is cheap, the app is built on first use.
ServerSettings.from_env()


class LazyApp:
    """The module's ASGI app (`uvicorn llmserve_env.server.app:app`), built by `build_app()` on first
    use: the first ASGI call (uvicorn's lifespan start-up, before it serves anything, so a real-mode
    check still stops the start) or the first attribute read (app.state, app.routes)."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None
        self._lock = threading.Lock()

    def get(self) -> FastAPI:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    self._app = build_app()
        return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None and scope["type"] == "lifespan":
            try:
                self.get()
            except Exception as exc:
                # An exception here reads to uvicorn's default lifespan ("auto") as "lifespan not
                # supported", and it would serve anyway: say the start failed, so it stops before it
                # listens (a real-mode endpoint that does not answer, say).
                await receive()  # lifespan.startup
                await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                return
        await self.get()(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # probes (hasattr(app, "__await__")) must not build the app
            raise AttributeError(name)
        return getattr(self.get(), name)


app = LazyApp()
