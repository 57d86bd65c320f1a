"""The routes beside OpenEnv's own: /tasks, /grader, /baseline, /state (episode-aware), /demo, /."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.shared.episode import EpisodeLog
from llmserve_env.shared.grader import GradeResult, grade_episode
from llmserve_env.shared.models import ServeAction, ServeState
from llmserve_env.shared.tasks import TASKS, get_task
from pydantic import BaseModel, ConfigDict, Field, model_validator


class GraderRequest(BaseModel):
    """Grade the finished episode `episode_id`, or an explicit `episode_log` (exactly one of them)."""

    # The schema says "exactly one of the two, neither null", as the validator below enforces
    # (the fields default to None only so that the missing one can be told apart).
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["episode_id"]}, {"required": ["episode_log"]}]})

    episode_id: str = Field(None, min_length=1, max_length=255)  # type: ignore[assignment]
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
    async def state(episode_id: str | None = Query(None, min_length=1, max_length=255)) -> ServeState:
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
            return grade_episode(log.model_copy(update={"task_id": env.config.trace_task_id(log.task_id)}))
        finally:
            env.close()

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
        use_openai: bool = False,
        task_id: str | None = Query(None, description="one task id; all tasks when omitted"),
        model: str | None = Query(None, max_length=200),
    ) -> dict[str, Any]:
        if task_id is not None:
            get_task(task_id)  # 404 with the valid ids before any work
        if use_openai and not os.environ.get("OPENAI_API_KEY"):
            # A request this server cannot serve as configured: a 4xx naming the field, not a 5xx.
            raise RequestValidationError([{
                "type": "value_error", "loc": ("query", "use_openai"), "input": True,
                "msg": "use_openai=true needs OPENAI_API_KEY set on the server; "
                       "GET /baseline without it runs the deterministic suite"}])
        from llmserve_env.server.baseline_inference import run_baseline_suite

        return await run_in_threadpool(run_baseline_suite, use_openai=use_openai, model=model, task_id=task_id)

    return router
