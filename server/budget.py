"""The server-wide budget of paid model calls that `GET /baseline?use_openai=true` draws on.

A run reserves its worst case before it starts (one chat-completion request per window of every
task it plays: the route's client makes no retries, so a window is one request, answered or not)
and is refused when the reserve does not fit. Reservations are never returned: the budget counts
requests that may have been billed, for the server's lifetime, every client together.
"""

from __future__ import annotations

import threading


class CallBudget:
    """A count of requests, reserved atomically (thread-safe)."""

    def __init__(self, total: int):
        self.total = total
        self.reserved = 0
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return self.total - self.reserved

    def reserve(self, n: int) -> bool:
        """Take `n` requests from the budget; False (and nothing taken) when fewer remain."""
        with self._lock:
            if n > self.total - self.reserved:
                return False
            self.reserved += n
            return True
