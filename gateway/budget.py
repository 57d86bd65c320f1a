"""The spend guard: HTTP attempts, tokens and dollars per episode.

Each attempt reserves its worst case before it is sent (prompt + max_tokens tokens, and their
price), so a burst of concurrent requests cannot overshoot the limit; when the attempt ends the
reservation is replaced by what it actually used. Once an attempt would not fit, the guard is
exhausted: that request and every later one end `rejected` (or `error` for a retry) with the
message below, and the backend reports it in the window's notes and logs it once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class BudgetExceededError(RuntimeError):
    """An attempt would take the episode past a spend limit."""


@dataclass(slots=True)
class Reservation:
    tokens: int
    usd: float


@dataclass(slots=True)
class SpendGuard:
    max_requests: int
    max_tokens: int
    max_usd: float
    requests: int = 0
    tokens: int = 0
    usd: float = 0.0
    exhausted: str | None = None

    def reserve(self, tokens: int, usd: float) -> Reservation:
        """Claim one attempt's worst case, or raise BudgetExceededError (and stay exhausted)."""
        if self.exhausted is None:
            if self.requests + 1 > self.max_requests:
                self.exhausted = f"{self.max_requests} requests"
            elif self.tokens + tokens > self.max_tokens:
                self.exhausted = f"{self.max_tokens} tokens"
            elif self.usd + usd > self.max_usd:
                self.exhausted = f"${self.max_usd:.2f}"
        if self.exhausted is not None:
            raise BudgetExceededError(
                f"real-mode spend limit reached ({self.exhausted} per episode: LLMSERVE_REAL_MAX_"
                "REQUESTS/TOKENS/USD_PER_EPISODE); further requests are rejected until reset"
            )
        self.requests += 1
        self.tokens += tokens
        self.usd += usd
        return Reservation(tokens, usd)

    def settle(self, reservation: Reservation, tokens: int, usd: float) -> None:
        """Replace a reservation by what the attempt actually used."""
        self.tokens += tokens - reservation.tokens
        self.usd += usd - reservation.usd
        reservation.tokens, reservation.usd = tokens, usd

    def snapshot(self) -> dict[str, object]:
        return {"requests": self.requests, "tokens": self.tokens, "usd": round(self.usd, 6),
                "exhausted": self.exhausted}


@dataclass(slots=True, eq=False)
class ProcessGuard:
    """The server-wide caps, over every episode of the process: dollars spent and requests in flight.

    Dollars are reserved and settled like the per-episode guard's (and checked before it), and stay
    spent until the process restarts. In-flight slots are taken at admission and given back when
    a request ends; episodes blocked on a full process wait in `waiting` and are woken when a slot
    frees (all on the gateway's one loop, so no locks).
    """

    max_usd: float
    max_inflight: int
    usd: float = 0.0
    inflight: int = 0
    exhausted: str | None = None
    waiting: set = field(default_factory=set)

    def check(self, usd: float) -> None:
        if self.exhausted is None and self.usd + usd > self.max_usd:
            self.exhausted = f"${self.max_usd:.2f}"
        if self.exhausted is not None:
            raise BudgetExceededError(
                f"real-mode spend limit reached ({self.exhausted} for the whole server: "
                "LLMSERVE_REAL_MAX_USD_TOTAL); further requests are rejected until the server restarts")

    def reserve(self, usd: float) -> Reservation:
        self.check(usd)
        self.usd += usd
        return Reservation(0, usd)

    def settle(self, reservation: Reservation, usd: float) -> None:
        self.usd += usd - reservation.usd
        reservation.usd = usd

    @property
    def full(self) -> bool:
        return self.inflight >= self.max_inflight
