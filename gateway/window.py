"""What the dispatcher measured since the last report, and turning it into a `WindowReport`.

Output tokens are counted one per streamed text chunk as chunks arrive (so unfinished requests
show their progress); when a request ends, its window gets the difference between its final
count (usage, or a tiktoken count of the text) and the chunks counted, so the windows of an
episode add up to the records' output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve_env.shared.backend import RequestRecord


@dataclass(slots=True)
class WindowAccumulator:
    finished: list[RequestRecord] = field(default_factory=list)
    first_tokens: list[tuple[int, str, float]] = field(default_factory=list)
    itl_samples: list[tuple[float, int]] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cost_usd: float = 0.0
    attempts: int = 0
    retries: int = 0
    rejected: int = 0
    errors: int = 0
    timeouts: int = 0
    cancelled: int = 0
    abandoned: int = 0  # requests cancelled because the episode's client went quiet
    model_mismatches: int = 0
    model_mismatch: str | None = None  # one example, for the notes
    failure: str | None = None  # the last error or timeout's message, for the observation
    process_capped: bool = False  # admission waited for the server-wide in-flight cap
    # prefix caching (arrivals with prefix ids that ended ok in the window): prompt tokens and cached
    # tokens as the engine counted them, over the requests whose engine said (measured), and how many
    # ended without the engine saying (unmeasured)
    prefix_query: int = 0
    prefix_hit: int = 0
    prefix_measured: int = 0
    prefix_unmeasured: int = 0
    # Busy time: seconds with at least one request in flight (loop clock).
    busy_s: float = 0.0
    busy_since: float | None = None

    def set_running(self, running: int, now: float) -> None:
        """Call whenever the in-flight count changes."""
        if running > 0 and self.busy_since is None:
            self.busy_since = now
        elif running == 0 and self.busy_since is not None:
            self.busy_s += now - self.busy_since
            self.busy_since = None

    def close_busy(self, now: float) -> float:
        """Busy seconds up to `now`; restarts the count (still busy requests carry on)."""
        busy = self.busy_s
        if self.busy_since is not None:
            busy += now - self.busy_since
            self.busy_since = now
        self.busy_s = 0.0
        return busy

    def take(self) -> WindowAccumulator:
        """Hand over what was gathered and start afresh (busy state carries over)."""
        out = WindowAccumulator(
            finished=self.finished, first_tokens=self.first_tokens, itl_samples=self.itl_samples,
            output_tokens=max(0, self.output_tokens), prompt_tokens=self.prompt_tokens, cost_usd=self.cost_usd,
            attempts=self.attempts, retries=self.retries, rejected=self.rejected, errors=self.errors,
            timeouts=self.timeouts, cancelled=self.cancelled, abandoned=self.abandoned,
            model_mismatches=self.model_mismatches, model_mismatch=self.model_mismatch,
            failure=self.failure, process_capped=self.process_capped,
            prefix_query=self.prefix_query, prefix_hit=self.prefix_hit, prefix_measured=self.prefix_measured,
            prefix_unmeasured=self.prefix_unmeasured,
        )
        self.prefix_query = self.prefix_hit = self.prefix_measured = self.prefix_unmeasured = 0
        self.finished, self.first_tokens, self.itl_samples = [], [], []
        # A negative correction (usage below the chunks counted) is carried, never dropped.
        self.output_tokens = min(0, self.output_tokens)
        self.prompt_tokens = self.attempts = self.retries = self.rejected = 0
        self.errors = self.timeouts = self.cancelled = self.abandoned = self.model_mismatches = 0
        self.model_mismatch = self.failure = None
        self.process_capped = False
        self.cost_usd = 0.0
        return out
