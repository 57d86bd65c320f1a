"""`GatewayBackend`: real mode behind the same `Backend` protocol as the simulator.

Every episode's backend is a dispatcher on the process's one gateway loop (gateway/service.py):
requests stay in flight between steps, and between `run_window` calls the gateway keeps serving
under the last action (the wall clock does not pause while the agent thinks). An idle episode
costs no thread and no CPU. `run_window` builds the window's prompts in the caller's thread
(tiktoken work kept off the loop), hands the window to the dispatcher and blocks until the
window's end on the episode clock, never longer than LLMSERVE_REAL_STEP_TIMEOUT_S (which must
exceed the window: a shorter step would compress the episode clock, so it is refused). The episode
clock runs 1:1 with the wall clock: scaling it would scale every measured latency with it.

Run real mode against the offline stand-in (no key needed on loopback; the tier table it writes
maps the quantization tiers to its FP16/INT8/INT4 models, priced at 0):

    python -m llmserve_env.tools.standin --port 8000 --write-tiers /tmp/standin-tiers.json &
    LLMSERVE_MODE=real OPENAI_BASE_URL=http://127.0.0.1:8000/v1 LLMSERVE_REAL_TIERS=/tmp/standin-tiers.json \
        uvicorn server.app:app --port 7860
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import os
import secrets
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Any

from llmserve_env.gateway.config import GatewayConfig, GatewayConfigError, is_loopback_url
from llmserve_env.gateway.dispatcher import Dispatcher
from llmserve_env.gateway.pricing import TierTable, load_tier_table
from llmserve_env.gateway.service import SERVICE, GatewayClosedError, GatewayService
from llmserve_env.gateway.tokens import prompt_builder
from llmserve_env.shared.backend import Arrival, RequestRecord, WindowReport
from llmserve_env.shared.models import ServeAction

logger = logging.getLogger("llmserve_env.gateway")

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
# Time kept back from the step timeout to build and hand over the report.
REPORT_MARGIN_S = 0.05


class GatewayStepTimeout(RuntimeError):
    """The event loop could not hand back a window report within the step timeout."""


_frozen = False


def _freeze_startup_objects() -> None:
    """Once per process: full collections walk every live object; with the libraries loaded that is
    hundreds of thousands, and a pause of 0.4-0.7 s was measured at 200-500 streams, all of it landing
    in measured latencies. What is alive at the first real-mode start (modules, the app) lives as long
    as the process: take it out of the collector's sight. Later backends (one per episode) skip this,
    so they neither pause other episodes nor freeze their in-flight objects."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


class GatewayBackend:
    """Backend protocol over an OpenAI-compatible streaming endpoint (see gateway/dispatcher.py)."""

    name = "real"

    def __init__(self, config: GatewayConfig, *, tiers: TierTable | None = None, http_client: Any = None,
                 lag_monitor: bool = True, service: GatewayService | None = None):
        self.config = config
        self.tiers = tiers or load_tier_table(config.tiers_path, config.model)
        self._service = service or SERVICE
        self._prompts = prompt_builder()
        self._seed = 0
        self._nonce = ""
        self._units: dict[tuple[int, int], str] = {}
        self.episode_id = ""
        self._closed = False
        # Records that reached a terminal state after the last report: cancelled by reset/close,
        # or finished in between. They belong to the episode that just ended.
        self.last_flush: list[RequestRecord] = []
        self._dispatcher: Dispatcher = self._service.call(
            self._service.open_dispatcher(config, self.tiers, http_client, lag_monitor), timeout=30)
        _freeze_startup_objects()
        logger.debug("real mode: %s via %s client, tiers from %s", config.base_url, config.client, self.tiers.source)
        proxied = [v for v in PROXY_VARS if os.environ.get(v)]
        if config.client != "sdk" and proxied and not is_loopback_url(config.base_url):
            logger.warning("%s is set but the %s client connects directly; set LLMSERVE_REAL_CLIENT=sdk to "
                           "go through the proxy", proxied[0], config.client)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **kwargs: Any) -> GatewayBackend:
        """Build from environment variables (gateway/config.py); raises GatewayConfigError when unusable."""
        return cls(GatewayConfig.from_env(environ), **kwargs)

    def __repr__(self) -> str:
        return f"GatewayBackend(base_url={self.config.base_url!r}, client={self.config.client!r}, closed={self._closed})"

    def cap_arrivals(self, arrivals: Sequence[Arrival]) -> list[Arrival]:
        """The arrivals as real mode sends them: prompts cut to LLMSERVE_REAL_MAX_PROMPT_TOKENS and
        max_tokens to LLMSERVE_REAL_MAX_COMPLETION_TOKENS (what the metrics should judge and replay)."""
        c = self.config
        return [a if a.prompt_tokens <= c.max_prompt_tokens and a.output_tokens <= c.max_completion_tokens
                else replace(a, prompt_tokens=min(a.prompt_tokens, c.max_prompt_tokens),
                             output_tokens=min(a.output_tokens, c.max_completion_tokens))
                for a in arrivals]

    @property
    def max_replicas(self) -> int:
        """The most replicas an action may ask for here: the endpoints in the pool (LLMSERVE_REAL_ENDPOINTS)."""
        return len(self.config.pool)

    def begin(self, seed: int, episode_id: str, window_s: float, arrivals: Sequence[Arrival],
              initial_replicas: int = 1) -> list[Arrival]:
        """Start an episode for the runtime: refuse a window the step timeout cannot hold, or a task that
        starts with more replicas than the pool has endpoints (GatewayConfigError), reset under the
        runtime's episode id, and return the arrivals as they will be sent (`cap_arrivals`), so the
        metrics judge what the endpoint was asked to do."""
        self.config.check_window(window_s)
        if initial_replicas > self.max_replicas:
            raise GatewayConfigError(
                f"this task starts with {initial_replicas} replicas and real mode has {self.max_replicas} "
                f"endpoint{'s' if self.max_replicas > 1 else ''}: list at least {initial_replicas} in "
                "LLMSERVE_REAL_ENDPOINTS (comma-separated base URLs)")
        self.reset(seed, episode_id=episode_id)
        self._service.call(self._start_replicas(initial_replicas), timeout=30)
        return self.cap_arrivals(arrivals)

    async def _start_replicas(self, k: int) -> None:
        self._dispatcher.start_replicas(k)

    # ----------------------------------------------------------------- Backend protocol

    def reset(self, seed: int, episode_id: str | None = None) -> None:
        """A new episode: cancels (and records) what the previous one left. Prompts get a fresh random
        nonce unless LLMSERVE_REAL_REUSE_PROMPTS asks for the same prompts every run."""
        self._check_open()
        self._seed = seed
        self._nonce = "" if self.config.reuse_prompts else secrets.token_hex(6)
        self._units = {}  # prefix unit texts of this episode (its nonce): (id, unit tokens) -> text
        self.episode_id = episode_id or uuid.uuid4().hex
        self.last_flush = self._service.call(self._reset(seed, self.episode_id), timeout=30)

    async def _reset(self, seed: int, episode_id: str) -> list[RequestRecord]:
        flushed = await self._dispatcher.cancel_all("episode reset")
        self._dispatcher.new_episode(seed, episode_id)
        return flushed

    def run_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float, dt: float) -> WindowReport:
        self._check_open()
        c = self.config
        c.check_window(dt)
        started = time.monotonic()
        prompts = {a.request_id: self._prompt(a) for a in arrivals[: c.max_requests_per_step]}
        # Over-cap arrivals are rejected on release; they need no prompt.
        prompts.update({a.request_id: "" for a in arrivals[c.max_requests_per_step:]})
        remaining = c.step_timeout_s - (time.monotonic() - started)
        wall = max(0.0, remaining - REPORT_MARGIN_S)
        future = self._service.submit(self._dispatcher.run_window(action, arrivals, prompts, t0, dt, wall_s=wall))
        try:
            return future.result(timeout=max(0.0, c.step_timeout_s - (time.monotonic() - started)))
        except FutureTimeout:
            future.cancel()
            raise GatewayStepTimeout(
                f"the gateway's event loop did not return the window report within "
                f"LLMSERVE_REAL_STEP_TIMEOUT_S={c.step_timeout_s:g} s; the client machine is overloaded"
            ) from None
        except concurrent.futures.CancelledError:
            raise GatewayStepTimeout("the window was cut short: real mode is shutting down") from None

    def _prompt(self, a: Arrival) -> str:
        """The prompt text sent for `a`: exactly its (capped) prompt tokens; with prefix ids, its leading
        units' texts are the episode's one text per unit id (requests sharing a prefix share its text)."""
        n = min(a.prompt_tokens, self.config.max_prompt_tokens)
        salt = a.request_id + 1_000_003 * self._seed
        if a.prefix_ids and a.prefix_block_tokens > 0:
            return self._prompts.build_shared(n, a.prefix_ids, a.prefix_block_tokens, salt=salt, nonce=self._nonce,
                                              cache=self._units)
        return self._prompts.build(n, salt=salt, nonce=self._nonce)

    def close(self) -> None:
        """Cancel (and record) everything this episode still has queued or in flight; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._dispatcher.closed is not None:
            self.last_flush = []  # the service's shutdown already cancelled and recorded them
            return
        self.last_flush = self._service.call(
            self._service.close_dispatcher(self._dispatcher, "backend closed"), timeout=30)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("GatewayBackend is closed")
        if self._dispatcher.closed is not None:
            raise GatewayClosedError(f"this real-mode episode was ended: {self._dispatcher.closed}")
