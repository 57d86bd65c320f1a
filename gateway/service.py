"""Real mode's one event loop per process, and what every episode on it shares.

One daemon thread runs one asyncio loop for the whole process, started by the first real-mode
episode. Every episode's dispatcher lives on it; an idle episode is a few objects on that loop: no
thread, no task, no timer but its abandonment timer (the lag monitor samples only while some episode
has work). Episodes share the streaming client (one connection pool per endpoint and key), the record
file (one writer per path) and the server-wide caps (`ProcessGuard`).

For the server (the lead wires these):
- `shutdown()`: cancel every episode's queued and in-flight requests, record them, flush and close
  the record files, close the connections, stop the loop. Registered with `atexit` too, so an
  orderly exit after SIGTERM (uvicorn's) records everything even where no hook calls it.
- `endpoint_health()` / `endpoint_health_async()`: whether the configured endpoint answers, from a
  probe at most PROBE_MAX_AGE_S old and from what the last requests saw; None outside real mode.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import openai
from llmserve_env.gateway.budget import ProcessGuard
from llmserve_env.gateway.config import GatewayConfig
from llmserve_env.gateway.dispatcher import Dispatcher
from llmserve_env.gateway.http11 import Http11Pool
from llmserve_env.gateway.looplag import LoopLagMonitor
from llmserve_env.gateway.pricing import TierTable
from llmserve_env.gateway.probe import ProbeResult, probe_endpoint
from llmserve_env.gateway.recorder import JsonlRecorder
from llmserve_env.gateway.streaming import AiohttpStreamClient, RawStreamClient, SdkStreamClient, StreamClient
from llmserve_env.gateway.tokens import count_tokens
from llmserve_env.shared.backend import RequestRecord

logger = logging.getLogger("llmserve_env.gateway")

# batch_cap allows 512 in flight per episode; the pool is shared, LLMSERVE_REAL_MAX_INFLIGHT_TOTAL bounds it.
MAX_CONNECTIONS = 1024
# /health's probe is at most this old, so a dead endpoint shows within a second with no request sent.
PROBE_MAX_AGE_S = 1.0


class GatewayClosedError(RuntimeError):
    """The episode's backend was ended by the service's shutdown."""


def build_stream_client(config: GatewayConfig, http_client: Any = None) -> StreamClient:
    """The configured client. `http_client` (an httpx/httpx2 AsyncClient for the SDK) is for tests (respx)."""
    key = config.api_key.reveal()
    if config.client == "sdk":
        sdk = openai.AsyncOpenAI(api_key=key, base_url=config.base_url, max_retries=0, http_client=http_client)
        return SdkStreamClient(sdk, config.stall_timeout_s)
    if http_client is not None:
        raise ValueError("http_client is for LLMSERVE_REAL_CLIENT=sdk; the raw and aiohttp clients have their own pool")
    if config.client == "aiohttp":
        return AiohttpStreamClient(config.base_url, key, config.stall_timeout_s, MAX_CONNECTIONS)
    return RawStreamClient(Http11Pool(config.base_url, MAX_CONNECTIONS), key, config.stall_timeout_s)


@dataclass(slots=True)
class EndpointState:
    """What the process knows about its endpoint: the last probe, and the last requests' fate."""

    config: GatewayConfig
    probe: ProbeResult | None = None
    last_reached_at: float | None = None
    last_failed_at: float | None = None
    last_error: str | None = None
    failures_in_a_row: int = 0

    def saw(self, reached: bool, error: str | None) -> None:
        now = time.monotonic()
        if reached:
            self.last_reached_at, self.failures_in_a_row = now, 0
        else:
            self.last_failed_at, self.last_error = now, error
            self.failures_in_a_row += 1


class _Shared:
    """A resource shared by the episodes that use it, closed with the last."""

    __slots__ = ("value", "refs")

    def __init__(self, value: Any):
        self.value = value
        self.refs = 0


class GatewayService:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.lag = LoopLagMonitor()
        self.dispatchers: set[Dispatcher] = set()
        self._clients: dict[tuple, _Shared] = {}
        self._recorders: dict[str, _Shared] = {}
        self._guards: dict[tuple, ProcessGuard] = {}
        self._keys: dict[Dispatcher, tuple[list[tuple | None], str | None]] = {}  # its shared clients and record file
        self.endpoint: EndpointState | None = None

    # ----------------------------------------------------------------- the loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise GatewayClosedError("real mode is shutting down (the server is stopping)")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="llmserve-gateway", daemon=True)
                self._thread.start()
            return self._loop

    def submit(self, coro: Any) -> concurrent.futures.Future:
        try:
            loop = self.loop()
        except GatewayClosedError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def call(self, coro: Any, timeout: float) -> Any:
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    # ----------------------------------------------------------------- episodes (on the loop)

    async def open_dispatcher(self, config: GatewayConfig, tiers: TierTable, http_client: Any = None,
                              lag_monitor: bool = True) -> Dispatcher:
        clients: list[StreamClient] = []
        client_keys: list[tuple | None] = []
        for url in config.pool:  # one client per endpoint of the pool (LLMSERVE_REAL_ENDPOINTS)
            one = config if url == config.base_url else replace(config, base_url=url, endpoints=())
            if http_client is not None:  # a test's own client: not shared
                clients.append(build_stream_client(one, http_client))
                client_keys.append(None)
                continue
            client_key = (config.client, url, config.stall_timeout_s, config.api_key)
            shared = self._clients.get(client_key)
            if shared is None:
                shared = self._clients[client_key] = _Shared(build_stream_client(one))
            shared.refs += 1
            clients.append(shared.value)
            client_keys.append(client_key)
        recorder = None
        if config.record_path:
            path = str(Path(config.record_path).resolve())
            rec = self._recorders.get(path)
            if rec is None:
                rec = self._recorders[path] = _Shared(JsonlRecorder(path))
            rec.refs += 1
            recorder = rec.value
        guard_key = (config.base_url, config.max_usd_total, config.max_inflight_total)
        guard = self._guards.get(guard_key)
        if guard is None:
            guard = self._guards[guard_key] = ProcessGuard(config.max_usd_total, config.max_inflight_total)
        if self.endpoint is None or self.endpoint.config.base_url != config.base_url:
            self.endpoint = EndpointState(config)
        d = Dispatcher(config, clients, tiers, count_tokens, recorder=recorder,
                       lag_monitor=self.lag if lag_monitor else False, process=guard, on_endpoint=self.endpoint.saw)
        self._keys[d] = (client_keys, str(Path(config.record_path).resolve()) if config.record_path else None)
        self.dispatchers.add(d)
        await d.start()
        return d

    async def close_dispatcher(self, d: Dispatcher, reason: str) -> list[RequestRecord]:
        d.closed = reason
        try:
            return await d.stop(reason)
        finally:
            self.dispatchers.discard(d)
            client_keys, record_key = self._keys.pop(d, ([None] * len(d.clients), None))
            for client, client_key in zip(d.clients, client_keys, strict=True):
                if client_key is None:
                    await client.aclose()
                    continue
                shared = self._clients.get(client_key)
                if shared is not None:
                    shared.refs -= 1
                    if shared.refs <= 0:
                        del self._clients[client_key]
                        await shared.value.aclose()
            if record_key:
                rec = self._recorders.get(record_key)
                if rec is not None:
                    rec.refs -= 1
                    rec.value.flush()
                    if rec.refs <= 0:
                        del self._recorders[record_key]
                        rec.value.close()

    # ----------------------------------------------------------------- shutdown

    async def _shutdown_all(self, reason: str) -> int:
        n = 0
        for d in list(self.dispatchers):
            n += len(await self.close_dispatcher(d, reason))
        for rec in self._recorders.values():
            rec.value.close()
        self._recorders.clear()
        for shared in self._clients.values():
            await shared.value.aclose()
        self._clients.clear()
        await self.lag.stop()
        return n

    def shutdown(self, reason: str = "server shutting down", timeout_s: float = 10.0) -> int:
        """Cancel and record every outstanding request of every episode, flush the record files, stop
        the loop. Returns how many records the shutdown ended. Safe to call twice. The episodes it ended
        refuse further windows; a backend made afterwards starts a fresh loop (an app rebuilt in the
        same process, as tests do)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._closed = True
        if loop is None or thread is None:
            return 0
        try:
            n = asyncio.run_coroutine_threadsafe(self._shutdown_all(reason), loop).result(timeout_s)
            logger.info("real mode shut down: %d outstanding requests cancelled and recorded", n)
            return n
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
            with self._lock:
                self._loop = self._thread = None
                self._closed = False

    # ----------------------------------------------------------------- health

    def set_probe(self, config: GatewayConfig, result: ProbeResult) -> None:
        if self.endpoint is None or self.endpoint.config.base_url != config.base_url:
            self.endpoint = EndpointState(config)
        self.endpoint.probe = result

    def endpoint_health(self, max_age_s: float | None = None) -> dict[str, object] | None:
        """{"endpoint", "reachable", "probe", "requests"}; probes again when the last probe is older
        than `max_age_s` or a request failed to connect since (blocks up to LLMSERVE_REAL_PROBE_TIMEOUT_S). None when no real-mode endpoint is set."""
        state = self.endpoint
        if state is None:
            return None
        max_age_s = PROBE_MAX_AGE_S if max_age_s is None else max_age_s
        probe = state.probe
        # a request that could not connect after the last probe: probe again now rather than say "healthy"
        failed_since = (state.failures_in_a_row > 0 and state.last_failed_at is not None and probe is not None
                        and state.last_failed_at > probe.checked_at)
        if probe is None or failed_since or time.monotonic() - probe.checked_at > max_age_s:
            probe = state.probe = probe_endpoint(state.config)
        now = time.monotonic()
        return {
            "endpoint": state.config.base_url,
            "reachable": probe.reachable and not probe.key_refused,
            "probe": probe.describe() | {"age_s": round(now - probe.checked_at, 3)},
            "requests": {
                "failures_in_a_row": state.failures_in_a_row,
                "last_error": state.last_error,
                "last_reached_s_ago": None if state.last_reached_at is None else round(now - state.last_reached_at, 3),
            },
        }


SERVICE = GatewayService()


def shutdown(timeout_s: float = 10.0) -> int:
    """The server's shutdown hook: see GatewayService.shutdown."""
    return SERVICE.shutdown(timeout_s=timeout_s)


def endpoint_health(max_age_s: float | None = None) -> dict[str, object] | None:
    return SERVICE.endpoint_health(max_age_s)


async def endpoint_health_async(max_age_s: float | None = None) -> dict[str, object] | None:
    """For an async /health route: the probe runs in a worker thread, never on the caller's loop."""
    return await asyncio.to_thread(SERVICE.endpoint_health, max_age_s)



def _shutdown_at_exit() -> None:
    # At interpreter exit a log handler's stream may already be closed (pytest's capture, a closed
    # pipe): its line is dropped rather than logging's own traceback printed after the output.
    logging.raiseExceptions = False
    shutdown()


atexit.register(_shutdown_at_exit)
