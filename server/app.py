"""The FastAPI app: OpenEnv's `create_app` plus LLMServeEnv's own routes.

    uvicorn server.app:app --host 0.0.0.0 --port 7860

OpenEnv registers /reset /step /schema /metadata /health /ws /mcp and the web interface at /web;
server/routes.py adds /tasks /grader /baseline /demo / and an episode-aware /state.
"""

from __future__ import annotations

import logging
import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.env_server.http_server import create_app

from llmserve_env.server.config import ServerConfig
from llmserve_env.server.dashboard import build_dashboard
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.server.episodes import EpisodeStore
from llmserve_env.server.errors import EnvError
from llmserve_env.server.limits import BodySizeLimit
from llmserve_env.server.routes import build_router
from llmserve_env.shared.grader import GradeError
from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState
from llmserve_env.shared.tasks import UnknownTaskError
from llmserve_env.shared.traces import TraceError

log = logging.getLogger("llmserve_env.app")


def _drop_route(app: FastAPI, path: str, method: str) -> None:
    """Remove one of OpenEnv's routes that this app replaces (never register a second one)."""
    app.router.routes[:] = [
        r for r in app.router.routes
        if not (getattr(r, "path", None) == path and method in (getattr(r, "methods", None) or ()))
    ]


def build_app(config: ServerConfig | None = None) -> FastAPI:
    config = config or ServerConfig.from_env()
    if config.mode == "real":
        # Fail at start-up, not at the first step, when real mode lacks its key or endpoint.
        from llmserve_env.gateway.config import GatewayConfig

        GatewayConfig.from_env()
    store = EpisodeStore(config.max_episodes, config.idle_timeout_s)

    def env_factory() -> LLMServeEnvironment:
        return LLMServeEnvironment(store=store, config=config)

    # The seed promises /web out of the box, so the app turns OpenEnv's web interface on itself.
    os.environ.setdefault("ENABLE_WEB_INTERFACE", "true")
    app = create_app(
        env_factory,
        ServeAction,
        ServeObservation,
        env_name="llmserve_env",
        max_concurrent_envs=config.max_sessions,
        state_cls=ServeState,
        gradio_builder=build_dashboard,
        custom_tab_name="Dashboard",
    )
    app.title = "LLMServeEnv"
    app.state.episode_store = store
    app.state.config = config
    # /state must find the episode by id; "/" points at the docs rather than redirecting.
    _drop_route(app, "/state", "GET")
    _drop_route(app, "/", "GET")
    app.include_router(build_router(env_factory))

    async def env_error(_: Request, exc: EnvError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": exc.message})

    async def unknown_task(_: Request, exc: UnknownTaskError) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc), "valid_task_ids": exc.valid})

    async def bad_value(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    app.add_exception_handler(EnvError, env_error)
    app.add_exception_handler(UnknownTaskError, unknown_task)
    app.add_exception_handler(TraceError, bad_value)
    app.add_exception_handler(GradeError, bad_value)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    return app


app = build_app()


def main(host: str = "0.0.0.0", port: int | None = None) -> None:
    """Serve the app (the `server` console script, and `python -m server.app`)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port or int(os.environ.get("PORT", "7860")))


if __name__ == "__main__":
    main()
