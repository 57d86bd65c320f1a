"""Is the endpoint there? `GET {OPENAI_BASE_URL}/models`, with the key, bounded by a timeout.

Used at start-up (a dead endpoint or a refused key stops real mode before the first episode,
instead of looking like an episode in which nothing was served) and by /health (through
gateway.service.endpoint_health). The key is sent as a header and never appears in a result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from llmserve_env.gateway.config import GatewayConfig, redact


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """reachable: an HTTP answer came back (any status). models: the ids /models listed, when it did."""

    reachable: bool
    status: int | None
    models: tuple[str, ...] | None
    error: str | None
    elapsed_ms: float
    checked_at: float  # time.monotonic()

    @property
    def key_refused(self) -> bool:
        return self.status in (401, 403)

    def describe(self) -> dict[str, object]:
        return {"reachable": self.reachable, "status": self.status, "error": self.error,
                "elapsed_ms": round(self.elapsed_ms, 1), "models": list(self.models) if self.models else None}


def probe_endpoint(config: GatewayConfig, timeout_s: float | None = None) -> ProbeResult:
    """One GET of /models. Never raises for network trouble: the result says what happened."""
    timeout = config.probe_timeout_s if timeout_s is None else timeout_s
    started = time.monotonic()
    # The raw and aiohttp clients connect directly; only the SDK client honours proxy variables.
    try:
        with httpx.Client(timeout=timeout, trust_env=config.client == "sdk") as client:
            resp = client.get(config.base_url + "/models",
                              headers={"Authorization": f"Bearer {config.api_key.reveal()}"})
    except httpx.HTTPError as exc:
        return ProbeResult(False, None, None, redact(f"{type(exc).__name__}: {exc}", config.api_key)[:300],
                           1e3 * (time.monotonic() - started), time.monotonic())
    models: tuple[str, ...] | None = None
    error = None
    if resp.status_code == 200:
        try:
            data = resp.json().get("data")
            models = tuple(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))
        except (ValueError, AttributeError, TypeError):
            models = None  # answered, but not an OpenAI model list: reachable all the same
    else:
        error = redact(f"HTTP {resp.status_code}: {resp.text[:200]}", config.api_key)
    return ProbeResult(True, resp.status_code, models, error, 1e3 * (time.monotonic() - started), time.monotonic())
