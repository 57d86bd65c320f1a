"""Event-loop lag: how late the loop wakes a task that asked to sleep a fixed interval.

Every timestamp the gateway takes is taken when its coroutine runs, so lag on the loop is added
to measured TTFT/ITL. A p99 lag well below the latencies measured means the client is not the
bottleneck; a large one means the numbers describe the client, not the server.

One monitor per process (the gateway's one loop): it samples only while some episode is busy
(`acquire`/`release`), so idle episodes cost no CPU, and each episode reads the samples taken
since its last report (`since`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import deque

from llmserve_env.shared.percentiles import percentiles


class LoopLagMonitor:
    """Samples lag every `interval_s` on the running loop while held; keeps the last `max_samples`."""

    def __init__(self, interval_s: float = 0.01, max_samples: int = 100_000):
        self.interval_s = interval_s
        self._times: deque[float] = deque(maxlen=max_samples)
        self._lags: deque[float] = deque(maxlen=max_samples)
        self._task: asyncio.Task[None] | None = None
        self._holders = 0

    @property
    def running(self) -> bool:
        return self._task is not None

    def acquire(self) -> None:
        """Someone is measuring: sample (call on the loop)."""
        self._holders += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-monitor")

    def release(self) -> None:
        """One holder fewer; the sampling stops with the last."""
        self._holders = max(0, self._holders - 1)
        if self._holders == 0 and self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        self._holders = 0
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            self._times.append(now)
            self._lags.append(max(0.0, now - expected))

    def since(self, t: float) -> list[float]:
        """Lag samples taken after loop time `t`."""
        times = self._times
        if not times or times[-1] <= t:
            return []
        i = bisect.bisect_right(times, t)
        return list(self._lags)[i:]


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
