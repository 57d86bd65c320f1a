"""Real-mode configuration, read from the environment once at start-up and checked there.

`GatewaySettings` (pydantic-settings) reads and validates every variable; `GatewayConfig` is the
frozen result the gateway uses. Anything wrong fails at start-up with a message naming the
variable: a number that is not finite or out of range, a file that cannot be read or written, a
variable that is set but empty (it would silently turn a protection off), an unknown
`LLMSERVE_REAL_*` name (a typo would do the same).

Variables (defaults in brackets):

    OPENAI_API_KEY                      API key. Required for any non-loopback endpoint; for a loopback
                                        OPENAI_BASE_URL (127.0.0.0/8, ::1, localhost) it may be left unset
                                        and the dummy key "EMPTY" (vLLM's convention) is sent.
    OPENAI_BASE_URL                     [https://api.openai.com/v1] any OpenAI-compatible server
    LLMSERVE_REAL_ENDPOINTS             comma-separated base URLs of identical OpenAI-compatible servers: the
                                        pool that `replicas` maps onto (the gateway routes over the first k,
                                        least outstanding work); replaces OPENAI_BASE_URL (set one of them)
    LLMSERVE_REAL_MODEL                 pin one model for every quantization tier (the tier then changes nothing)
    LLMSERVE_REAL_TIERS                 path to a JSON tier table (see gateway.pricing); read at start-up
    LLMSERVE_REAL_MAX_REQUESTS_PER_STEP [64] arrivals per window sent; the rest end `rejected`
    LLMSERVE_REAL_MAX_PROMPT_TOKENS     [4096] longer prompts are cut to this
    LLMSERVE_REAL_MAX_COMPLETION_TOKENS [512] max_tokens is capped at this
    LLMSERVE_REAL_MAX_INFLIGHT_TOKENS   [131072] in-flight token budget at kv_budget_fraction = 1.0, per endpoint
    LLMSERVE_REAL_MAX_USD_PER_EPISODE   [5.0] spend guard, dollars (worst case reserved at dispatch)
    LLMSERVE_REAL_MAX_REQUESTS_PER_EPISODE [10000] spend guard, HTTP attempts
    LLMSERVE_REAL_MAX_TOKENS_PER_EPISODE [5000000] spend guard, prompt + max_tokens reserved
    LLMSERVE_REAL_MAX_USD_TOTAL         [25.0] spend guard for the whole process (every episode together)
    LLMSERVE_REAL_MAX_INFLIGHT_TOTAL    [1024] requests in flight at once, every episode together
    LLMSERVE_REAL_STEP_TIMEOUT_S        [30] a step never blocks longer than this (wall clock); must
                                        exceed the window length (refused at start-up otherwise)
    LLMSERVE_REAL_REQUEST_TIMEOUT_S     [120] one request, all attempts included -> `timeout`
    LLMSERVE_REAL_STALL_TIMEOUT_S       [30] silence on an open stream -> `timeout`
    LLMSERVE_REAL_MAX_ATTEMPTS          [4] HTTP attempts per request (retries of 429/5xx/connection errors)
    LLMSERVE_REAL_ABANDON_S             [30] an episode with no step for this long after its last window
                                        is abandoned: its queued and in-flight requests end `cancelled`
    LLMSERVE_REAL_CLIENT                [raw] `raw` (gateway/http11.py: asyncio + httptools + SSE parsing),
                                        `aiohttp`, or `sdk` (openai.AsyncOpenAI)
    LLMSERVE_REAL_RECORD                JSONL path: every finished RequestRecord (simulator calibration input)
    LLMSERVE_REAL_IGNORE_EOS            [0] 1 sends vLLM/SGLang's `ignore_eos` so outputs reach max_tokens
    LLMSERVE_REAL_PREFILL_LANE_TOKENS   [1024] with prefill_decode_split, prompts this long use the prefill lane
    LLMSERVE_REAL_REUSE_PROMPTS         [0] 1 sends the same prompts for the same seed in every run, so an
                                        engine's prefix cache can reuse them; by default each episode's
                                        prompts start with a random nonce and no run hits a previous run's cache
    LLMSERVE_REAL_PROBE                 [1] 0 skips the start-up probe of OPENAI_BASE_URL/models
    LLMSERVE_REAL_PROBE_TIMEOUT_S       [5] how long the start-up and /health probes wait

The key is held in a `Secret` whose repr never shows it, and `redact` scrubs it from any text
(server error bodies can echo what they were sent).
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from llmserve_env.shared.models import MAX_REPLICAS
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
LOOPBACK_DUMMY_KEY = "EMPTY"
CLIENT_KINDS = ("raw", "aiohttp", "sdk")
ENV_PREFIX = "LLMSERVE_REAL_"
# Upper bounds: far above any sensible setting, low enough that arithmetic on them stays exact.
MAX_COUNT = 10**9
MAX_SECONDS = 86_400.0
MAX_USD = 1e6


class GatewayConfigError(ValueError):
    """Real mode cannot start: a variable is missing or malformed (the message names it)."""


@dataclass(frozen=True, slots=True)
class Secret:
    """A string that never shows itself in repr/str/format."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self):
        # Refuse to be pickled into logs, caches or subprocess arguments by accident.
        raise TypeError("Secret cannot be pickled")


def redact(text: str, secret: Secret | None) -> str:
    """`text` with every occurrence of the secret replaced by ***."""
    if secret is None:
        return text
    value = secret.reveal()
    if len(value) < 4:  # a 1-3 character "key" would shred ordinary text
        return text
    return text.replace(value, "***")


def is_loopback_url(url: str) -> bool:
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_endpoints(text: str) -> tuple[str, ...]:
    """LLMSERVE_REAL_ENDPOINTS: comma-separated http(s) base URLs, each with a host, none twice."""
    urls = tuple(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    if not urls:
        raise ValueError("expected comma-separated http(s) base URLs, e.g. http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1")
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{u!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
    if len(set(urls)) != len(urls):
        raise ValueError("an endpoint is listed twice (each replica is one endpoint)")
    if len(urls) > MAX_REPLICAS:
        raise ValueError(f"at most {MAX_REPLICAS} endpoints (the most replicas any task may ask for)")
    return urls


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything real mode needs, validated. Build with `from_env` (through GatewaySettings) or directly in tests."""

    api_key: Secret
    base_url: str = OPENAI_DEFAULT_BASE_URL
    # The endpoint pool `replicas` maps onto (LLMSERVE_REAL_ENDPOINTS); empty: base_url alone.
    endpoints: tuple[str, ...] = ()
    model: str | None = None
    tiers_path: str | None = None
    max_requests_per_step: int = 64
    max_prompt_tokens: int = 4096
    max_completion_tokens: int = 512
    max_inflight_tokens: int = 131072
    max_usd_per_episode: float = 5.0
    max_requests_per_episode: int = 10000
    max_tokens_per_episode: int = 5_000_000
    max_usd_total: float = 25.0
    max_inflight_total: int = 1024
    step_timeout_s: float = 30.0
    request_timeout_s: float = 120.0
    stall_timeout_s: float = 30.0
    max_attempts: int = 4
    abandon_s: float = 30.0
    client: str = "raw"
    record_path: str | None = None
    ignore_eos: bool = False
    prefill_lane_tokens: int = 1024
    reuse_prompts: bool = False
    probe: bool = True
    probe_timeout_s: float = 5.0
    # Back-off between attempts when the server gives no Retry-After: base * 2**(n-1), capped.
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 8.0
    # Event-loop lag (p99 over a window) above which the client itself is called the bottleneck.
    lag_bottleneck_ms: float = 20.0

    def __post_init__(self) -> None:
        if urlsplit(self.base_url).scheme not in ("http", "https"):
            raise GatewayConfigError(f"OPENAI_BASE_URL must be an http(s) URL, got {self.base_url!r}")
        if self.endpoints:
            try:
                parse_endpoints(",".join(self.endpoints))
            except ValueError as exc:
                raise GatewayConfigError(f"LLMSERVE_REAL_ENDPOINTS: {exc}") from None
            if self.base_url != self.endpoints[0]:
                raise GatewayConfigError("base_url must be the pool's first endpoint")
        if self.client not in CLIENT_KINDS:
            raise GatewayConfigError(f"LLMSERVE_REAL_CLIENT must be one of {CLIENT_KINDS}, got {self.client!r}")
        for name in ("max_requests_per_step", "max_prompt_tokens", "max_completion_tokens",
                     "max_inflight_tokens", "max_requests_per_episode", "max_tokens_per_episode",
                     "max_attempts", "prefill_lane_tokens", "max_inflight_total"):
            if getattr(self, name) < 1:
                raise GatewayConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_usd_per_episode", "max_usd_total", "step_timeout_s", "request_timeout_s",
                     "stall_timeout_s", "abandon_s", "probe_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise GatewayConfigError(f"{name} must be a finite number > 0, got {value}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewayConfig:
        """Read and check every real-mode variable (os.environ by default); GatewayConfigError names the bad ones."""
        return GatewaySettings.from_env(environ).to_config()

    @property
    def pool(self) -> tuple[str, ...]:
        """The endpoints `replicas` maps onto: LLMSERVE_REAL_ENDPOINTS, else OPENAI_BASE_URL alone."""
        return self.endpoints or (self.base_url,)

    def check_window(self, window_s: float) -> None:
        """A window must fit in one step: a step timeout below it would compress the episode clock."""
        if self.step_timeout_s <= window_s + STEP_MARGIN_S:
            raise GatewayConfigError(
                f"LLMSERVE_REAL_STEP_TIMEOUT_S={self.step_timeout_s:g} must exceed the window length "
                f"({window_s:g} s) by at least {STEP_MARGIN_S:g} s: a shorter step would end windows early and "
                f"squeeze the task's traffic into less wall clock; raise it or use shorter windows")

    def describe(self) -> dict[str, object]:
        """JSON-able summary for logs and metadata (no key)."""
        return {
            "base_url": self.base_url,
            "endpoints": list(self.pool),
            "model": self.model,
            "client": self.client,
            "max_requests_per_step": self.max_requests_per_step,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_completion_tokens": self.max_completion_tokens,
            "max_inflight_tokens": self.max_inflight_tokens,
            "max_usd_per_episode": self.max_usd_per_episode,
            "max_usd_total": self.max_usd_total,
            "max_inflight_total": self.max_inflight_total,
            "step_timeout_s": self.step_timeout_s,
            "reuse_prompts": self.reuse_prompts,
        }


# Time a step keeps beyond its window to build and hand over the report (gateway/backend.py).
STEP_MARGIN_S = 0.25


def _env(name: str, **kw: Any) -> Any:
    return Field(validation_alias=AliasChoices(name), **kw)


Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Dollars = Annotated[float, Field(gt=0, le=MAX_USD, allow_inf_nan=False)]


class GatewaySettings(BaseSettings):
    """The real-mode variables as read from the environment (see this module's docstring)."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", env_ignore_empty=False,
                                      validate_default=False)

    api_key: SecretStr | None = _env("OPENAI_API_KEY", default=None)
    base_url: str | None = _env("OPENAI_BASE_URL", default=None)
    endpoints: str | None = _env("LLMSERVE_REAL_ENDPOINTS", default=None)
    model: str | None = _env("LLMSERVE_REAL_MODEL", default=None, min_length=1, max_length=512)
    tiers: Path | None = _env("LLMSERVE_REAL_TIERS", default=None)
    max_requests_per_step: Count = _env("LLMSERVE_REAL_MAX_REQUESTS_PER_STEP", default=64)
    max_prompt_tokens: Count = _env("LLMSERVE_REAL_MAX_PROMPT_TOKENS", default=4096)
    max_completion_tokens: Count = _env("LLMSERVE_REAL_MAX_COMPLETION_TOKENS", default=512)
    max_inflight_tokens: Count = _env("LLMSERVE_REAL_MAX_INFLIGHT_TOKENS", default=131072)
    max_usd_per_episode: Dollars = _env("LLMSERVE_REAL_MAX_USD_PER_EPISODE", default=5.0)
    max_requests_per_episode: Count = _env("LLMSERVE_REAL_MAX_REQUESTS_PER_EPISODE", default=10000)
    max_tokens_per_episode: Count = _env("LLMSERVE_REAL_MAX_TOKENS_PER_EPISODE", default=5_000_000)
    max_usd_total: Dollars = _env("LLMSERVE_REAL_MAX_USD_TOTAL", default=25.0)
    max_inflight_total: Count = _env("LLMSERVE_REAL_MAX_INFLIGHT_TOTAL", default=1024)
    step_timeout_s: Seconds = _env("LLMSERVE_REAL_STEP_TIMEOUT_S", default=30.0)
    request_timeout_s: Seconds = _env("LLMSERVE_REAL_REQUEST_TIMEOUT_S", default=120.0)
    stall_timeout_s: Seconds = _env("LLMSERVE_REAL_STALL_TIMEOUT_S", default=30.0)
    max_attempts: Annotated[int, Field(ge=1, le=100)] = _env("LLMSERVE_REAL_MAX_ATTEMPTS", default=4)
    abandon_s: Seconds = _env("LLMSERVE_REAL_ABANDON_S", default=30.0)
    client: Literal["raw", "aiohttp", "sdk"] = _env("LLMSERVE_REAL_CLIENT", default="raw")
    record: Path | None = _env("LLMSERVE_REAL_RECORD", default=None)
    ignore_eos: bool = _env("LLMSERVE_REAL_IGNORE_EOS", default=False)
    prefill_lane_tokens: Count = _env("LLMSERVE_REAL_PREFILL_LANE_TOKENS", default=1024)
    reuse_prompts: bool = _env("LLMSERVE_REAL_REUSE_PROMPTS", default=False)
    probe: bool = _env("LLMSERVE_REAL_PROBE", default=True)
    probe_timeout_s: Annotated[float, Field(gt=0, le=120, allow_inf_nan=False)] = _env(
        "LLMSERVE_REAL_PROBE_TIMEOUT_S", default=5.0)

    @field_validator("client", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("must be an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
        return v.rstrip("/")

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: str | None) -> str | None:
        return None if v is None else ",".join(parse_endpoints(v))

    @field_validator("tiers")
    @classmethod
    def _readable(cls, v: Path | None) -> Path | None:
        if v is not None and not (v.is_file() and os.access(v, os.R_OK)):
            raise ValueError("no readable file there")
        return v

    @field_validator("record")
    @classmethod
    def _writable(cls, v: Path | None) -> Path | None:
        if v is None:
            return None
        if v.exists():
            if not v.is_file() or not os.access(v, os.W_OK):
                raise ValueError("exists but is not a writable file")
            return v
        parent = v.parent
        while not parent.exists():  # the recorder creates missing folders: the first existing one must be writable
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"cannot be created: {parent} is not a writable folder")
        return v

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if environ is None else environ
        names = {str(f.validation_alias.choices[0]) for f in cls.model_fields.values()}  # type: ignore[union-attr]
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in names)
        problems = [f"{k} is not a real-mode variable (known: {', '.join(sorted(n for n in names if n.startswith(ENV_PREFIX)))})"
                    for k in unknown]
        values: dict[str, str] = {}
        for name in names:
            raw = env.get(name)
            if raw is None:
                continue
            if name.startswith("OPENAI_"):
                if raw.strip():  # an empty OPENAI_* variable counts as unset (shell and .env habit)
                    values[name] = raw.strip()
            elif not raw.strip():
                problems.append(f"{name} is set but empty; unset it to use the default")
            else:
                values[name] = raw.strip()
        if problems:
            raise GatewayConfigError("real-mode configuration: " + "; ".join(problems))
        try:
            # Validated from the mapping alone: nothing else in the environment is read.
            return cls.model_validate(values)
        except ValidationError as exc:
            raise GatewayConfigError("real-mode configuration: " + "; ".join(
                _describe_error(e) for e in exc.errors())) from None

    def to_config(self) -> GatewayConfig:
        endpoints = parse_endpoints(self.endpoints) if self.endpoints else ()
        if endpoints and self.base_url:
            raise GatewayConfigError(
                "real-mode configuration: OPENAI_BASE_URL and LLMSERVE_REAL_ENDPOINTS are both set; set one: "
                "LLMSERVE_REAL_ENDPOINTS for a pool of endpoints (`replicas` picks how many serve), "
                "OPENAI_BASE_URL for one")
        base_url = endpoints[0] if endpoints else self.base_url
        key = self.api_key.get_secret_value() if self.api_key is not None else ""
        if not base_url and not key:
            raise GatewayConfigError(
                "real mode needs an endpoint: set OPENAI_API_KEY to use https://api.openai.com/v1, or "
                "OPENAI_BASE_URL to an OpenAI-compatible server (vLLM, SGLang, Ollama, or the offline "
                "stand-in `python -m llmserve_env.tools.standin`)"
            )
        base_url = base_url or OPENAI_DEFAULT_BASE_URL
        if not key:
            remote = [u for u in (endpoints or (base_url,)) if not is_loopback_url(u)]
            if remote:
                name = "LLMSERVE_REAL_ENDPOINTS" if endpoints else "OPENAI_BASE_URL"
                raise GatewayConfigError(
                    f"OPENAI_API_KEY is not set and {name} ({remote[0]}) is not a loopback address; "
                    "set OPENAI_API_KEY (any placeholder if that server needs no key)"
                )
            key = LOOPBACK_DUMMY_KEY
        return GatewayConfig(
            api_key=Secret(key),
            base_url=base_url,
            endpoints=endpoints,
            model=self.model,
            tiers_path=str(self.tiers) if self.tiers is not None else None,
            max_requests_per_step=self.max_requests_per_step,
            max_prompt_tokens=self.max_prompt_tokens,
            max_completion_tokens=self.max_completion_tokens,
            max_inflight_tokens=self.max_inflight_tokens,
            max_usd_per_episode=self.max_usd_per_episode,
            max_requests_per_episode=self.max_requests_per_episode,
            max_tokens_per_episode=self.max_tokens_per_episode,
            max_usd_total=self.max_usd_total,
            max_inflight_total=self.max_inflight_total,
            step_timeout_s=self.step_timeout_s,
            request_timeout_s=self.request_timeout_s,
            stall_timeout_s=self.stall_timeout_s,
            max_attempts=self.max_attempts,
            abandon_s=self.abandon_s,
            client=self.client,
            record_path=str(self.record) if self.record is not None else None,
            ignore_eos=self.ignore_eos,
            prefill_lane_tokens=self.prefill_lane_tokens,
            reuse_prompts=self.reuse_prompts,
            probe=self.probe,
            probe_timeout_s=self.probe_timeout_s,
        )


def _describe_error(err: Any) -> str:
    name = str(err["loc"][0]) if err.get("loc") else "?"
    if name == "OPENAI_API_KEY":  # never echo the key
        return f"{name}: {err['msg']}"
    return f"{name}={err.get('input')!r}: {err['msg']}"
