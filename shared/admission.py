"""Admission rules shared by the simulator's scheduler and the real-mode gateway's dispatcher.

One definition of: the order in which waiting requests are considered, whether one more request
fits under the policy's limits, and which running request is preempted when memory runs out.

- `batch_cap` is the most requests running (in flight) at once. A request larger than the whole
  budget: the gateway runs it alone when nothing else runs (`AdmissionLimits.admits`, a remote
  server may still take it); the simulator rejects one that needs more KV blocks than the pool holds.
- The KV budget is a token budget: the simulator counts KV blocks of 16 tokens inside
  `kv_budget_fraction` of the memory the weights leave; the gateway counts prompt + max output
  tokens in flight against `kv_budget_fraction` of a configured in-flight token budget.
- With `priority_routing` on, waiting requests are taken by (priority, arrival); off, by arrival.
- The preemption victim is the lowest-priority (largest number), newest running request when
  `priority_routing` is on, and simply the newest (vLLM's recompute policy) when off.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_BLOCK_TOKENS = 16


def blocks_for(tokens: int, block_tokens: int = KV_BLOCK_TOKENS) -> int:
    """KV blocks needed to hold `tokens` tokens (ceil division)."""
    return -(-tokens // block_tokens)


def waiting_key(priority: int, arrival_s: float, request_id: int, priority_routing: bool) -> tuple:
    """Sort key for the waiting queue: smaller goes first."""
    if priority_routing:
        return (priority, arrival_s, request_id)
    return (arrival_s, request_id)


def victim_key(priority: int, arrival_s: float, request_id: int, priority_routing: bool) -> tuple:
    """Sort key for preemption: the request with the LARGEST key is evicted first."""
    if priority_routing:
        return (priority, arrival_s, request_id)
    return (arrival_s, request_id)


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """The limits a policy puts on what may run at once, on tokens (the gateway's check; the
    simulator's engine applies the same two limits on KV blocks as it plans each iteration)."""

    max_running: int
    token_budget: int

    def admits(self, running: int, tokens_in_use: int, tokens_needed: int) -> bool:
        """True when one more request needing `tokens_needed` fits beside what runs. With nothing
        running the request is admitted whatever its size: a request larger than the whole budget
        would otherwise wait forever (it runs alone)."""
        if running == 0:
            return True
        return running < self.max_running and tokens_in_use + tokens_needed <= self.token_budget


def token_budget(kv_budget_fraction: float, capacity_tokens: int) -> int:
    """The token budget a `kv_budget_fraction` buys out of `capacity_tokens` (at least one block)."""
    return max(KV_BLOCK_TOKENS, int(kv_budget_fraction * capacity_tokens))
