"""What every policy looks like: observation in, serving action out.

A policy is stateful across the steps of one episode (a heuristic remembers its last batch cap,
the PPO encoder remembers the previous window), so `reset()` is called before each episode.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from llmserve_env.shared.models import ServeAction, ServeObservation


@runtime_checkable
class Policy(Protocol):
    """A serving policy: `reset()` before an episode, then `act(obs)` once per window."""

    name: str

    def reset(self) -> None: ...

    def act(self, obs: ServeObservation) -> ServeAction: ...


def make_action(
    batch_cap: int,
    kv_budget_fraction: float,
    speculation_depth: int = 0,
    quantization_tier: str = "FP16",
    prefill_decode_split: bool = False,
    priority_routing: bool = False,
) -> ServeAction:
    """A validated `ServeAction` from plain values (ints and floats coerced, nothing clamped)."""
    return ServeAction(
        batch_cap=int(batch_cap),
        kv_budget_fraction=float(kv_budget_fraction),
        speculation_depth=int(speculation_depth),
        quantization_tier=quantization_tier,
        prefill_decode_split=bool(prefill_decode_split),
        priority_routing=bool(priority_routing),
    )
