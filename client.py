"""LLMServeEnv's Python client: plays episodes against a running server over keep-alive HTTP.

    from llmserve_env import LLMServeEnv

    with LLMServeEnv.from_url("http://localhost:7860") as env:
        obs = env.reset(task_id="static_workload", seed=42)
        while not obs.done:
            obs, reward, done, info = env.step({"batch_cap": 32, ...})
        print(env.grade()["score"])

The client remembers the `episode_id` that `/reset` returned and sends it with every call, so
many clients (or threads, each with its own client) play separate episodes on one server.
"""

from __future__ import annotations

from typing import Any

import httpx
from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState


class LLMServeError(RuntimeError):
    """The server answered with an error status; `status` and `detail` say what and why."""

    def __init__(self, status: int, detail: Any, route: str):
        self.status = status
        self.detail = detail
        self.route = route
        super().__init__(f"{route} -> HTTP {status}: {detail}")


class LLMServeEnv:
    def __init__(self, base_url: str, timeout_s: float = 60.0, client: httpx.Client | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = client or httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self.episode_id: str | None = None

    @classmethod
    def from_url(cls, base_url: str, timeout_s: float = 60.0) -> LLMServeEnv:
        return cls(base_url, timeout_s=timeout_s)

    # -- episode -------------------------------------------------------------------------------
    def reset(self, task_id: str = "static_workload", seed: int | None = None) -> ServeObservation:
        body: dict[str, Any] = {"task_id": task_id}
        if seed is not None:
            body["seed"] = seed
        payload = self._call("POST", "/reset", json=body)
        obs = self._observation(payload)
        self.episode_id = obs.episode_id
        return obs

    def step(self, action: ServeAction | dict[str, Any]) -> tuple[ServeObservation, float, bool, dict[str, Any]]:
        if isinstance(action, ServeAction):
            action = action.knobs()
        payload = self._call("POST", "/step", json={"action": action, "episode_id": self._require_episode()})
        obs = self._observation(payload)
        return obs, float(obs.reward or 0.0), obs.done, dict(obs.metadata)

    def state(self) -> ServeState:
        payload = self._call("GET", "/state", params={"episode_id": self._require_episode()})
        return ServeState.model_validate(payload)

    def grade(self) -> dict[str, Any]:
        return self._call("POST", "/grader", json={"episode_id": self._require_episode()})

    # -- server info ---------------------------------------------------------------------------
    def tasks(self) -> list[dict[str, Any]]:
        return self._call("GET", "/tasks")["tasks"]

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def baseline(self, use_openai: bool = False, task_id: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"use_openai": str(use_openai).lower()}
        if task_id:
            params["task_id"] = task_id
        return self._call("GET", "/baseline", params=params)

    # -- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LLMServeEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_episode(self) -> str:
        if self.episode_id is None:
            raise RuntimeError("call reset() first: there is no episode yet")
        return self.episode_id

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise LLMServeError(response.status_code, detail, f"{method} {path}")
        return response.json()

    @staticmethod
    def _observation(payload: dict[str, Any]) -> ServeObservation:
        fields = dict(payload["observation"])
        fields["reward"] = payload.get("reward")
        fields["done"] = payload.get("done", False)
        return ServeObservation.model_validate(fields)
