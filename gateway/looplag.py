"""Event-loop lag: how late the loop wakes a task that asked to sleep a fixed interval.

Every timestamp the gateway takes is taken when its coroutine runs, so lag on the loop is added
to measured TTFT/ITL. A p99 lag well below the latencies measured means the client is not the
bottleneck; a large one means the numbers describe the client, not the server.
"""

from __future__ import annotations

import asyncio
import contextlib

from llmserve_env.shared.metrics import percentiles


class LoopLagMonitor:
    """Samples lag every `interval_s` on the running loop; `drain()` returns and clears the samples."""

    def __init__(self, interval_s: float = 0.01, max_samples: int = 100_000):
        self.interval_s = interval_s
        self._samples: list[float] = []
        self._max = max_samples
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            if len(self._samples) < self._max:
                self._samples.append(max(0.0, loop.time() - expected))

    def drain(self) -> list[float]:
        samples, self._samples = self._samples, []
        return samples


def lag_summary_ms(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max of lag samples, in milliseconds (zeros when there are none)."""
    if not samples:
        return {"loop_lag_p50_ms": 0.0, "loop_lag_p99_ms": 0.0, "loop_lag_max_ms": 0.0}
    p50, p99 = percentiles(samples, 50.0, 99.0)
    return {
        "loop_lag_p50_ms": round(p50 * 1000.0, 3),
        "loop_lag_p99_ms": round(p99 * 1000.0, 3),
        "loop_lag_max_ms": round(max(samples) * 1000.0, 3),
    }
