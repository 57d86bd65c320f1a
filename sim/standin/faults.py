"""Fault injection for the stand-in: which fault the next request gets, and cutting a stream."""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

FAULT_KINDS = ("ok", "429", "500", "drop", "stall")


@dataclass(slots=True)
class Faults:
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_drop: float = 0.0
    rate_stall: float = 0.0
    retry_after_s: float = 1.0
    stall_s: float = 5.0
    drop_after: int = 3
    script: deque[str] = field(default_factory=deque)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def next(self) -> str:
        """The fault for the next request: the script's next entry, else a draw from the rates."""
        if self.script:
            return self.script.popleft()
        u = self.rng.random()
        for kind, rate in (("429", self.rate_429), ("500", self.rate_500), ("drop", self.rate_drop),
                           ("stall", self.rate_stall)):
            if u < rate:
                return kind
            u -= rate
        return "ok"


class StreamDropped(Exception):
    """Raised inside a response to cut its connection mid-body (the `drop` fault)."""


class _DroppedStreams(logging.Filter):
    """Silences uvicorn's complaint about a response we cut on purpose (one per drop), nothing else."""

    INCOMPLETE = "ASGI callable returned without completing response."

    def __init__(self) -> None:
        super().__init__()
        self.pending = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.pending and record.getMessage() == self.INCOMPLETE:
            self.pending -= 1
            return False
        return True


_DROPS = _DroppedStreams()


def silence_dropped_streams() -> None:
    """Install the filter on uvicorn's error log (once)."""
    log = logging.getLogger("uvicorn.error")
    if _DROPS not in log.filters:
        log.addFilter(_DROPS)


def cut_on_drop(app: ASGIApp) -> ASGIApp:
    """Return from the ASGI call without finishing the body: uvicorn then closes the connection."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        except StreamDropped:
            _DROPS.pending += 1

    return wrapped
