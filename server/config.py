"""Server settings, read once from the environment.

| variable                        | default | meaning                                                    |
|---------------------------------|---------|------------------------------------------------------------|
| LLMSERVE_MODE                   | sim     | `sim` (simulator) or `real` (OpenAI-compatible gateway)    |
| LLMSERVE_MAX_EPISODES           | 1024    | most HTTP episodes kept at once (least recently used go)   |
| LLMSERVE_EPISODE_IDLE_TIMEOUT_S | 1800    | an HTTP episode untouched this long is dropped             |
| LLMSERVE_MAX_SESSIONS           | 256     | most concurrent WebSocket sessions (OpenEnv's              |
|                                 |         | `max_concurrent_envs`)                                     |
| LLMSERVE_MAX_BODY_BYTES         | 1048576 | request bodies above this get 413 (episode logs included)  |
| LLMSERVE_TRACE_DIR              | (unset) | when set, `trace:PATH` tasks (reset and graded logs) may   |
|                                 |         | only read files under this folder (403 otherwise); unset,  |
|                                 |         | any path the server can read (local use). The Docker image |
|                                 |         | sets it, so a public Space cannot be used to probe files.  |

HTTP clients hold no session: each keeps its episode in the store by `episode_id`, so the number
of concurrent HTTP clients is bounded only by LLMSERVE_MAX_EPISODES (an episode pushed out answers
404 "unknown or expired", saying to reset). A WebSocket connection beyond LLMSERVE_MAX_SESSIONS
is refused by OpenEnv with an error frame of code CAPACITY_REACHED naming the limit (OpenEnv's
client raises it as a RuntimeError), and the sessions already open carry on; a slot frees when a
session's socket closes. bench/load.py runs 200 HTTP and 200 WebSocket clients within the defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmserve_env.runtime.errors import TraceForbiddenError
from llmserve_env.shared.workloads import TRACE_PREFIX

MODES = ("sim", "real")


class ConfigError(ValueError):
    """A server setting has a value outside what it allows."""


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"{name}={value} must be > 0")
    return value


@dataclass(frozen=True, slots=True)
class ServerConfig:
    mode: str = "sim"
    max_episodes: int = 1024
    idle_timeout_s: float = 1800.0
    max_sessions: int = 256
    max_body_bytes: int = 1 << 20
    trace_dir: str | None = None

    def trace_task_id(self, task_id: str) -> str:
        """`task_id` as this server replays it: with `trace_dir` set, a `trace:PATH` is read under
        that folder (PATH relative to it; TraceForbiddenError, a 403, for anything outside)."""
        if self.trace_dir is None or not task_id.startswith(TRACE_PREFIX):
            return task_id
        root = Path(self.trace_dir).resolve()
        path, sep, query = task_id[len(TRACE_PREFIX):].partition("?")
        target = (root / path).resolve()  # an absolute PATH replaces root; `..` and links resolve away
        if not target.is_relative_to(root):
            raise TraceForbiddenError(path, str(root))
        return f"{TRACE_PREFIX}{target}{sep}{query}"

    @classmethod
    def from_env(cls) -> ServerConfig:
        mode = os.environ.get("LLMSERVE_MODE", "sim").strip().lower() or "sim"
        if mode not in MODES:
            raise ConfigError(f"LLMSERVE_MODE={mode!r}; allowed values: {', '.join(MODES)}")
        return cls(
            mode=mode,
            max_episodes=_int("LLMSERVE_MAX_EPISODES", 1024),
            idle_timeout_s=_float("LLMSERVE_EPISODE_IDLE_TIMEOUT_S", 1800.0),
            max_sessions=_int("LLMSERVE_MAX_SESSIONS", 256),
            max_body_bytes=_int("LLMSERVE_MAX_BODY_BYTES", 1 << 20, minimum=1024),
            trace_dir=os.environ.get("LLMSERVE_TRACE_DIR") or None,
        )
