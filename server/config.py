"""Server settings: one pydantic-settings class, read from the environment and checked at start-up.

Every variable is validated before the app is built (`ServerSettings.from_env`, which
`server.app` calls at import): a number that is not finite or out of range, a mode that is not
`sim`/`real`, a variable that is set but empty (`LLMSERVE_TRACE_DIR=""` would silently turn trace
confinement off), a trace folder that does not exist, each stop the server with a message naming
the variable (ConfigError). The variables, their defaults and meanings are listed in docs/configuration.md's
configuration table, which `python scripts/env_table.py --write` generates from the `Field`
descriptions here and in gateway/config.py (tests/test_env_table.py keeps them in step).

HTTP clients hold no session: each keeps its episode in the store by `episode_id`, so the number
of concurrent HTTP clients is bounded only by LLMSERVE_MAX_EPISODES (an episode pushed out answers
404 "unknown or expired", saying to reset). A WebSocket connection beyond LLMSERVE_MAX_SESSIONS
is refused by OpenEnv with an error frame of code CAPACITY_REACHED naming the limit (OpenEnv's
client raises it as a RuntimeError), and the sessions already open carry on; a slot frees when a
session's socket closes. bench/load.py runs 200 HTTP and 200 WebSocket clients within the defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from llmserve_env.core.errors import TraceForbiddenError
from llmserve_env.shared.workloads import TRACE_PREFIX
from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MODES = ("sim", "real")
# Upper bounds: far above any sensible setting, low enough that arithmetic on them stays exact.
MAX_COUNT = 10**9
MAX_SECONDS = 30 * 86_400.0
MAX_BODY_BYTES = 1 << 30
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class ConfigError(ValueError):
    """A server setting has a value outside what it allows (the message names the variable)."""


def _env(name: str, description: str, **kw: Any) -> Any:
    return Field(validation_alias=AliasChoices(name), description=description, **kw)


class ServerSettings(BaseSettings):
    """The server layer's settings (the gateway's real-mode ones are gateway.config's)."""

    # Built by from_env (model_validate on the variables alone) or directly by name in tests;
    # frozen: the app shares one instance.
    model_config = SettingsConfigDict(frozen=True, populate_by_name=True, extra="forbid", case_sensitive=True)

    mode: Literal["sim", "real"] = _env(
        "LLMSERVE_MODE", "`sim` (simulator) or `real` (OpenAI-compatible gateway)", default="sim")
    max_episodes: Annotated[int, Field(ge=1, le=MAX_COUNT)] = _env(
        "LLMSERVE_MAX_EPISODES", "most HTTP episodes kept at once (least recently used go)", default=1024)
    idle_timeout_s: Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)] = _env(
        "LLMSERVE_EPISODE_IDLE_TIMEOUT_S", "an HTTP episode untouched this many seconds is dropped",
        default=1800.0)
    max_sessions: Annotated[int, Field(ge=1, le=MAX_COUNT)] = _env(
        "LLMSERVE_MAX_SESSIONS", "most concurrent WebSocket sessions (OpenEnv's `max_concurrent_envs`)",
        default=256)
    max_body_bytes: Annotated[int, Field(ge=1024, le=MAX_BODY_BYTES)] = _env(
        "LLMSERVE_MAX_BODY_BYTES", "request bodies above this get 413 (episode logs included)", default=1 << 20)
    ws_idle_timeout_s: Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)] = _env(
        "LLMSERVE_WS_IDLE_TIMEOUT_S",
        "a WebSocket session that sends no frame for this many seconds is closed (its slot freed); "
        "a new one must send its first frame within 10 s", default=120.0)
    ws_max_per_client: Annotated[int, Field(ge=1, le=MAX_COUNT)] = _env(
        "LLMSERVE_WS_MAX_PER_CLIENT",
        "most WebSocket sessions open at once from one client address (as the ASGI server reports it)",
        default=32)
    baseline_openai_models: str | None = _env(
        "LLMSERVE_BASELINE_OPENAI_MODELS",
        "comma-separated models that `GET /baseline?use_openai=true` may call on this server's "
        "OPENAI_API_KEY (the first is the default). Unset: use_openai is off (403)", default=None)
    baseline_openai_max_calls: Annotated[int, Field(ge=1, le=MAX_COUNT)] = _env(
        "LLMSERVE_BASELINE_OPENAI_MAX_CALLS",
        "chat-completion requests `GET /baseline?use_openai=true` may send in this server's lifetime, "
        "every client together (a run reserves one per window before it starts; 429 past it)",
        default=1000)
    grade_real_logs: bool = _env(
        "LLMSERVE_GRADE_REAL_LOGS",
        "1: a sim-mode server grades submitted `mode: real` episode logs (as submitted, verified: false). "
        "Unset: it refuses them (422); a real-mode server always grades them", default=False)
    trace_dir: str | None = _env(
        "LLMSERVE_TRACE_DIR",
        "an existing folder: `trace:PATH` tasks (reset and graded logs) may only read files under it "
        "(403 otherwise). Unset: any path the server can read (local use). The Docker image sets it",
        default=None)

    @field_validator("trace_dir")
    @classmethod
    def _existing_folder(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.strip():
            raise ValueError("is empty: unset it for no confinement, or name an existing folder")
        if not Path(v).is_dir():
            raise ValueError("is not an existing folder")
        return v

    @field_validator("baseline_openai_models")
    @classmethod
    def _model_names(cls, v: str | None) -> str | None:
        if v is None:
            return None
        names = [n.strip() for n in v.split(",")]
        bad = [n for n in names if not MODEL_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a model name (1-128 of A-Z a-z 0-9 . _ : / -, comma-separated)")
        return ",".join(names)

    @property
    def openai_models(self) -> tuple[str, ...]:
        """The models /baseline may call, in the operator's order; empty: use_openai is off."""
        return tuple(self.baseline_openai_models.split(",")) if self.baseline_openai_models else ()

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
    def variables(cls) -> dict[str, str]:
        """Field name -> its environment variable."""
        return {name: str(f.validation_alias.choices[0])  # type: ignore[union-attr]
                for name, f in cls.model_fields.items()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Read and check every server variable (os.environ by default); ConfigError names the bad ones."""
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        problems: list[str] = []
        for field, var in cls.variables().items():
            raw = env.get(var)
            if raw is None:
                continue
            if not raw.strip():
                problems.append(f"{var} is set but empty; unset it to use the default")
            else:
                values[field] = raw.strip().lower() if field == "mode" else raw.strip()
        if problems:
            raise ConfigError("server configuration: " + "; ".join(problems))
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            names = cls.variables()
            raise ConfigError("server configuration: " + "; ".join(
                f"{names.get(str(e['loc'][0]), e['loc'][0])}={e['input']!r}: {e['msg']}" for e in exc.errors()
            )) from None
