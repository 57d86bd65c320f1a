"""`GatewayBackend`: real mode behind the same `Backend` protocol as the simulator.

It owns one asyncio loop in a daemon thread for its whole life (requests stay in flight between
steps and between `run_window` calls the gateway keeps serving under the last action: the wall
clock does not pause while the agent thinks). `run_window` builds the window's prompts in the
caller's thread (tiktoken work kept off the loop), hands the window to the dispatcher and blocks
for `dt` wall-clock seconds, never more than LLMSERVE_REAL_STEP_TIMEOUT_S. The episode clock runs
1:1 with the wall clock: scaling it would scale every measured latency with it.

Run real mode against the offline stand-in (no key needed on loopback; the tier table it writes
maps the quantization tiers to its FP16/INT8/INT4 models, priced at 0):

    python -m llmserve_env.sim.openai_server --port 8000 --write-tiers /tmp/standin-tiers.json &
    LLMSERVE_MODE=real OPENAI_BASE_URL=http://127.0.0.1:8000/v1 LLMSERVE_REAL_TIERS=/tmp/standin-tiers.json \
        uvicorn server.app:app --port 7860
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import openai
from llmserve_env.gateway.config import GatewayConfig, is_loopback_url
from llmserve_env.gateway.dispatcher import Dispatcher
from llmserve_env.gateway.http11 import Http11Pool
from llmserve_env.gateway.pricing import TierTable, load_tier_table
from llmserve_env.gateway.recorder import JsonlRecorder
from llmserve_env.gateway.streaming import RawStreamClient, SdkStreamClient, StreamClient
from llmserve_env.gateway.tokens import PromptBuilder, count_tokens
from llmserve_env.shared.backend import Arrival, RequestRecord, WindowReport
from llmserve_env.shared.models import ServeAction

logger = logging.getLogger("llmserve_env.gateway")

# batch_cap allows 512 in flight; leave room for connections still closing.
MAX_CONNECTIONS = 1024
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
# Time kept back from the step timeout to build and hand over the report.
REPORT_MARGIN_S = 0.05


class GatewayStepTimeout(RuntimeError):
    """The event loop could not hand back a window report within the step timeout."""


def build_stream_client(config: GatewayConfig, http_client: Any = None) -> StreamClient:
    """The configured client. `http_client` (an httpx/httpx2 AsyncClient for the SDK) is for tests (respx)."""
    key = config.api_key.reveal()
    if config.client == "sdk":
        sdk = openai.AsyncOpenAI(api_key=key, base_url=config.base_url, max_retries=0, http_client=http_client)
        return SdkStreamClient(sdk, config.stall_timeout_s)
    if http_client is not None:
        raise ValueError("http_client is for LLMSERVE_REAL_CLIENT=sdk; the raw client has its own pool")
    return RawStreamClient(Http11Pool(config.base_url, MAX_CONNECTIONS), key, config.stall_timeout_s)


_frozen = False


def _freeze_startup_objects() -> None:
    """Once per process: full collections walk every live object; with the libraries loaded that is
    hundreds of thousands, and a pause of 0.4-0.7 s was measured at 200-500 streams, all of it landing
    in measured latencies. What is alive at the first real-mode start (modules, the app) lives as long
    as the process: take it out of the collector's sight. Later backends (one per episode) skip this,
    so they neither pause other episodes' loops nor freeze their in-flight objects."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


class GatewayBackend:
    """Backend protocol over an OpenAI-compatible streaming endpoint (see gateway/dispatcher.py)."""

    name = "real"

    def __init__(self, config: GatewayConfig, *, tiers: TierTable | None = None, http_client: Any = None,
                 lag_monitor: bool = True):
        self.config = config
        self.tiers = tiers or load_tier_table(config.tiers_path, config.model)
        self._prompts = PromptBuilder()
        self._recorder = JsonlRecorder(config.record_path) if config.record_path else None
        self._seed = 0
        self._closed = False
        # Records that reached a terminal state after the last report: cancelled by reset/close,
        # or finished in between. They belong to the episode that just ended.
        self.last_flush: list[RequestRecord] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmserve-gateway", daemon=True)
        self._thread.start()
        self._dispatcher: Dispatcher = self._call(self._make_dispatcher(http_client, lag_monitor), timeout=30)
        _freeze_startup_objects()
        logger.info("real mode: %s via %s client, tiers from %s", config.base_url, config.client, self.tiers.source)
        proxied = [v for v in PROXY_VARS if os.environ.get(v)]
        if config.client == "raw" and proxied and not is_loopback_url(config.base_url):
            logger.warning("%s is set but the raw client connects directly; set LLMSERVE_REAL_CLIENT=sdk to "
                           "go through the proxy", proxied[0])

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **kwargs: Any) -> GatewayBackend:
        """Build from environment variables (gateway/config.py); raises GatewayConfigError when unusable."""
        return cls(GatewayConfig.from_env(environ), **kwargs)

    def __repr__(self) -> str:
        return f"GatewayBackend(base_url={self.config.base_url!r}, client={self.config.client!r}, closed={self._closed})"

    async def _make_dispatcher(self, http_client: Any, lag_monitor: bool) -> Dispatcher:
        client = build_stream_client(self.config, http_client)
        d = Dispatcher(self.config, client, self.tiers, count_tokens, recorder=self._recorder, lag_monitor=lag_monitor)
        await d.start()
        return d

    def _call(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ----------------------------------------------------------------- Backend protocol

    def reset(self, seed: int) -> None:
        self._check_open()
        self._seed = seed
        self.last_flush = self._call(self._reset(seed), timeout=30)

    async def _reset(self, seed: int) -> list[RequestRecord]:
        flushed = await self._dispatcher.cancel_all("episode reset")
        self._dispatcher.new_episode(seed)
        return flushed

    def run_window(self, action: ServeAction, arrivals: list[Arrival], t0: float, dt: float) -> WindowReport:
        self._check_open()
        started = time.monotonic()
        c = self.config
        prompts = {
            a.request_id: self._prompts.build(min(a.prompt_tokens, c.max_prompt_tokens),
                                              salt=a.request_id + 1_000_003 * self._seed)
            for a in arrivals[: c.max_requests_per_step]
        }
        # Over-cap arrivals are rejected on release; they need no prompt.
        prompts.update({a.request_id: "" for a in arrivals[c.max_requests_per_step:]})
        remaining = c.step_timeout_s - (time.monotonic() - started)
        wall = max(0.0, min(dt, remaining - REPORT_MARGIN_S))
        future = asyncio.run_coroutine_threadsafe(
            self._dispatcher.run_window(action, arrivals, prompts, t0, dt, wall_s=wall), self._loop)
        try:
            return future.result(timeout=max(0.0, c.step_timeout_s - (time.monotonic() - started)))
        except FutureTimeout:
            future.cancel()
            raise GatewayStepTimeout(
                f"the gateway's event loop did not return the window report within "
                f"LLMSERVE_REAL_STEP_TIMEOUT_S={c.step_timeout_s:g} s; the client machine is overloaded"
            ) from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.last_flush = self._call(self._shutdown(), timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()
            if self._recorder is not None:
                self._recorder.close()

    async def _shutdown(self) -> list[RequestRecord]:
        flushed = await self._dispatcher.stop()
        await self._dispatcher.client.aclose()
        return flushed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("GatewayBackend is closed")
