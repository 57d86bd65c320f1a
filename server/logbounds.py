"""Bounds on what the server logs, installed by the app itself (server/app.py's build_app), so they
hold under whichever runner serves it (uvicorn, hypercorn, gunicorn workers) and in any process.

Under a flood, logs grew without bound: repeated identical asyncio errors (EMFILE on accept wrote
85 MB in 17 s), and a plain `uvicorn server.app:app` wrote 172 MB of log in 30 s under 1,100 slow
connections. Two filters on the loggers those lines go through:

| filter           | on                                   | passes                                      |
|------------------|--------------------------------------|---------------------------------------------|
| RateLimitFilter  | asyncio, {uvicorn,hypercorn,gunicorn}.error | each distinct message once per 10 s, then says how many were not logged |
| AccessLogBudget  | {uvicorn,hypercorn,gunicorn}.access  | ACCESS_LINES_PER_S lines a second (a burst of ACCESS_BURST), then says how many were not logged |
"""

from __future__ import annotations

import logging
import time

LOG_INTERVAL_S = 10.0
ACCESS_LINES_PER_S = 50.0
ACCESS_BURST = 200.0
ERROR_LOGGERS = ("asyncio", "uvicorn.error", "hypercorn.error", "gunicorn.error")
ACCESS_LOGGERS = ("uvicorn.access", "hypercorn.access", "gunicorn.access")


class RateLimitFilter(logging.Filter):
    """Pass the first record of each message per LOG_INTERVAL_S; count the rest, report the count."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S):
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this in the last {self.interval_s:g} s not logged]"
        if len(self._last) > 1024:  # bounded memory whatever the messages
            self._last.clear()
            self._dropped.clear()
        return True


class AccessLogBudget(logging.Filter):
    """A token bucket over access-log lines: `rate` a second, `burst` at once; the next line that
    passes after some were dropped says how many."""

    def __init__(self, rate: float = ACCESS_LINES_PER_S, burst: float = ACCESS_BURST):
        super().__init__()
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = time.monotonic()
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            self._dropped += 1
            return False
        self._tokens -= 1.0
        if self._dropped:
            record.msg = f"{record.msg} [{self._dropped} access lines before this one not logged: over " \
                         f"{self.rate:g} a second]"
            self._dropped = 0
        return True


def bound_logs() -> None:
    """Install both filters (once per logger, however many apps this process builds)."""
    for names, cls in ((ERROR_LOGGERS, RateLimitFilter), (ACCESS_LOGGERS, AccessLogBudget)):
        shared = cls()
        for name in names:
            logger = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in logger.filters):
                logger.addFilter(shared)
