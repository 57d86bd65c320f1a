"""Real-mode configuration, read from the environment once at start-up.

Variables (defaults in brackets):

    OPENAI_API_KEY                      API key. Required for any non-loopback endpoint; for a loopback
                                        OPENAI_BASE_URL (127.0.0.0/8, ::1, localhost) it may be left unset
                                        and the dummy key "EMPTY" (vLLM's convention) is sent.
    OPENAI_BASE_URL                     [https://api.openai.com/v1] any OpenAI-compatible server
    LLMSERVE_REAL_MODEL                 pin one model for every quantization tier (the tier then changes nothing)
    LLMSERVE_REAL_TIERS                 path to a JSON tier table (see gateway.pricing)
    LLMSERVE_REAL_MAX_REQUESTS_PER_STEP [64] arrivals per window sent; the rest end `rejected`
    LLMSERVE_REAL_MAX_PROMPT_TOKENS     [4096] longer prompts are cut to this
    LLMSERVE_REAL_MAX_COMPLETION_TOKENS [512] max_tokens is capped at this
    LLMSERVE_REAL_MAX_INFLIGHT_TOKENS   [131072] in-flight token budget at kv_budget_fraction = 1.0
    LLMSERVE_REAL_MAX_USD_PER_EPISODE   [5.0] spend guard, dollars (worst case reserved at dispatch)
    LLMSERVE_REAL_MAX_REQUESTS_PER_EPISODE [10000] spend guard, HTTP attempts
    LLMSERVE_REAL_MAX_TOKENS_PER_EPISODE [5000000] spend guard, prompt + max_tokens reserved
    LLMSERVE_REAL_STEP_TIMEOUT_S        [30] a step never blocks longer than this (wall clock)
    LLMSERVE_REAL_REQUEST_TIMEOUT_S     [120] one request, all attempts included -> `timeout`
    LLMSERVE_REAL_STALL_TIMEOUT_S       [30] silence on an open stream -> `timeout`
    LLMSERVE_REAL_MAX_ATTEMPTS          [4] HTTP attempts per request (retries of 429/5xx/connection errors)
    LLMSERVE_REAL_CLIENT                [raw] `raw` (httpx + SSE parsing) or `sdk` (openai.AsyncOpenAI)
    LLMSERVE_REAL_RECORD                JSONL path: every finished RequestRecord (simulator calibration input)
    LLMSERVE_REAL_IGNORE_EOS            [0] 1 sends vLLM/SGLang's `ignore_eos` so outputs reach max_tokens
    LLMSERVE_REAL_PREFILL_LANE_TOKENS   [1024] with prefill_decode_split, prompts this long use the prefill lane

The key is held in a `Secret` whose repr never shows it, and `redact` scrubs it from any text
(server error bodies can echo what they were sent).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
LOOPBACK_DUMMY_KEY = "EMPTY"
CLIENT_KINDS = ("raw", "sdk")


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


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything real mode needs, validated. Build with `from_env` or directly in tests."""

    api_key: Secret
    base_url: str = OPENAI_DEFAULT_BASE_URL
    model: str | None = None
    tiers_path: str | None = None
    max_requests_per_step: int = 64
    max_prompt_tokens: int = 4096
    max_completion_tokens: int = 512
    max_inflight_tokens: int = 131072
    max_usd_per_episode: float = 5.0
    max_requests_per_episode: int = 10000
    max_tokens_per_episode: int = 5_000_000
    step_timeout_s: float = 30.0
    request_timeout_s: float = 120.0
    stall_timeout_s: float = 30.0
    max_attempts: int = 4
    client: str = "raw"
    record_path: str | None = None
    ignore_eos: bool = False
    prefill_lane_tokens: int = 1024
    # Back-off between attempts when the server gives no Retry-After: base * 2**(n-1), capped.
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 8.0
    # Event-loop lag (p99 over a window) above which the client itself is called the bottleneck.
    lag_bottleneck_ms: float = 20.0

    def __post_init__(self) -> None:
        if urlsplit(self.base_url).scheme not in ("http", "https"):
            raise GatewayConfigError(f"OPENAI_BASE_URL must be an http(s) URL, got {self.base_url!r}")
        if self.client not in CLIENT_KINDS:
            raise GatewayConfigError(f"LLMSERVE_REAL_CLIENT must be one of {CLIENT_KINDS}, got {self.client!r}")
        for name in ("max_requests_per_step", "max_prompt_tokens", "max_completion_tokens",
                     "max_inflight_tokens", "max_requests_per_episode", "max_tokens_per_episode",
                     "max_attempts", "prefill_lane_tokens"):
            if getattr(self, name) < 1:
                raise GatewayConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_usd_per_episode", "step_timeout_s", "request_timeout_s", "stall_timeout_s"):
            if not getattr(self, name) > 0:
                raise GatewayConfigError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewayConfig:
        env = os.environ if environ is None else environ
        base_url = (env.get("OPENAI_BASE_URL") or "").strip()
        key = (env.get("OPENAI_API_KEY") or "").strip()
        if not base_url and not key:
            raise GatewayConfigError(
                "real mode needs an endpoint: set OPENAI_API_KEY to use https://api.openai.com/v1, or "
                "OPENAI_BASE_URL to an OpenAI-compatible server (vLLM, SGLang, Ollama, or the offline "
                "stand-in `python -m llmserve_env.sim.openai_server`)"
            )
        base_url = base_url or OPENAI_DEFAULT_BASE_URL
        if not key:
            if not is_loopback_url(base_url):
                raise GatewayConfigError(
                    f"OPENAI_API_KEY is not set and OPENAI_BASE_URL ({base_url}) is not a loopback address; "
                    "set OPENAI_API_KEY (any placeholder if that server needs no key)"
                )
            key = LOOPBACK_DUMMY_KEY
        return cls(
            api_key=Secret(key),
            base_url=base_url.rstrip("/"),
            model=env.get("LLMSERVE_REAL_MODEL") or None,
            tiers_path=env.get("LLMSERVE_REAL_TIERS") or None,
            max_requests_per_step=_int(env, "LLMSERVE_REAL_MAX_REQUESTS_PER_STEP", 64),
            max_prompt_tokens=_int(env, "LLMSERVE_REAL_MAX_PROMPT_TOKENS", 4096),
            max_completion_tokens=_int(env, "LLMSERVE_REAL_MAX_COMPLETION_TOKENS", 512),
            max_inflight_tokens=_int(env, "LLMSERVE_REAL_MAX_INFLIGHT_TOKENS", 131072),
            max_usd_per_episode=_float(env, "LLMSERVE_REAL_MAX_USD_PER_EPISODE", 5.0),
            max_requests_per_episode=_int(env, "LLMSERVE_REAL_MAX_REQUESTS_PER_EPISODE", 10000),
            max_tokens_per_episode=_int(env, "LLMSERVE_REAL_MAX_TOKENS_PER_EPISODE", 5_000_000),
            step_timeout_s=_float(env, "LLMSERVE_REAL_STEP_TIMEOUT_S", 30.0),
            request_timeout_s=_float(env, "LLMSERVE_REAL_REQUEST_TIMEOUT_S", 120.0),
            stall_timeout_s=_float(env, "LLMSERVE_REAL_STALL_TIMEOUT_S", 30.0),
            max_attempts=_int(env, "LLMSERVE_REAL_MAX_ATTEMPTS", 4),
            client=(env.get("LLMSERVE_REAL_CLIENT") or "raw").strip().lower(),
            record_path=env.get("LLMSERVE_REAL_RECORD") or None,
            ignore_eos=_bool(env, "LLMSERVE_REAL_IGNORE_EOS"),
            prefill_lane_tokens=_int(env, "LLMSERVE_REAL_PREFILL_LANE_TOKENS", 1024),
        )

    def describe(self) -> dict[str, object]:
        """JSON-able summary for logs and metadata (no key)."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "client": self.client,
            "max_requests_per_step": self.max_requests_per_step,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_completion_tokens": self.max_completion_tokens,
            "max_inflight_tokens": self.max_inflight_tokens,
            "max_usd_per_episode": self.max_usd_per_episode,
            "step_timeout_s": self.step_timeout_s,
        }


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise GatewayConfigError(f"{name} must be an integer, got {raw!r}") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise GatewayConfigError(f"{name} must be a number, got {raw!r}") from None


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise GatewayConfigError(f"{name} must be 0/1/true/false, got {raw!r}")
