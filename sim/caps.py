"""Real mode's request caps, applied in the simulator, so an episode played for real can be replayed.

The gateway sends at most LLMSERVE_REAL_MAX_REQUESTS_PER_STEP arrivals a window (the rest end
`rejected` when they arrive), cuts prompts to LLMSERVE_REAL_MAX_PROMPT_TOKENS and asks for at most
LLMSERVE_REAL_MAX_COMPLETION_TOKENS. `CappedBackend` puts the same rules in front of any backend
(the simulator), with the gateway's rule order: the first `max_requests_per_step` arrivals of a
window are served, the others are rejected at their arrival time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from llmserve_env.shared.backend import Arrival, Backend, RequestRecord, WindowReport
from llmserve_env.shared.models import ServeAction


class CapsError(ValueError):
    """A cap is unknown or not a positive integer (the message names it)."""


@dataclass(frozen=True, slots=True)
class RequestCaps:
    """None: no cap (the simulator's default)."""

    max_requests_per_step: int | None = None
    max_prompt_tokens: int | None = None
    max_completion_tokens: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise CapsError(f"caps.{f.name} must be an integer >= 1 or null, got {v!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestCaps:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise CapsError(f"unknown cap {unknown[0]!r}; allowed: {', '.join(sorted(names))}")
        return cls(**d)

    @classmethod
    def from_gateway(cls, config: Any) -> RequestCaps:
        """The caps of a gateway.config.GatewayConfig (what real mode applied)."""
        return cls(config.max_requests_per_step, config.max_prompt_tokens, config.max_completion_tokens)

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def to_dict(self) -> dict[str, int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def apply(self, arrivals: Sequence[Arrival]) -> tuple[Sequence[Arrival], list[RequestRecord]]:
        """(the arrivals sent, capped; the records of those rejected as over the per-step cap)."""
        n = self.max_requests_per_step
        sent = arrivals if n is None else arrivals[:n]
        p, c = self.max_prompt_tokens, self.max_completion_tokens
        if p is not None or c is not None:
            sent = [replace(a, prompt_tokens=min(a.prompt_tokens, p or a.prompt_tokens),
                            output_tokens=min(a.output_tokens, c or a.output_tokens)) for a in sent]
        rejected = []
        for a in arrivals[len(sent):] if n is not None else ():
            rejected.append(RequestRecord(
                request_id=a.request_id, tenant=a.tenant, priority=a.priority, arrival_s=a.arrival_s,
                prompt_tokens=min(a.prompt_tokens, p or a.prompt_tokens), target_output_tokens=a.output_tokens,
                status="rejected", finish_s=a.arrival_s, error=f"over max_requests_per_step={n}"))
        return sent, rejected


class CappedBackend:
    """`inner` behind real mode's caps (see the module docstring)."""

    def __init__(self, inner: Backend, caps: RequestCaps):
        self.inner = inner
        self.caps = caps
        self.name = inner.name

    def reset(self, seed: int) -> None:
        self.inner.reset(seed)

    def run_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float, dt: float) -> WindowReport:
        sent, rejected = self.caps.apply(arrivals)
        report = self.inner.run_window(action, sent, t0, dt)
        if rejected:
            report.finished.extend(rejected)
            report.notes["rejected"] = int(report.notes.get("rejected", 0)) + len(rejected)  # type: ignore[call-overload]
        report.notes["caps"] = self.caps.to_dict()
        return report

    def close(self) -> None:
        self.inner.close()
