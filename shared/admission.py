"""Admission rules shared by the simulator's scheduler and the real-mode gateway's dispatcher.

One definition of: the order in which waiting requests are considered, whether one more request
fits under the policy's limits in a scheduling pass, and which running request is preempted when
memory runs out. The simulator follows vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py,
`Scheduler.schedule()`, read at commit 00024d31); the conditions it follows are quoted below.

- A scheduling pass serves the running requests first: each gets the KV blocks for its next step
  (a decode token, or its next prefill chunk) before any waiting request is considered ("First,
  schedule the RUNNING requests": `allocate_slots` for every request in `self.running`).
- When a running request's blocks do not fit, running requests are preempted (recompute) until they
  do: the most recently admitted one (`preempted_req = self.running.pop()`, FCFS policy), or with
  `priority_routing` the lowest-priority, latest-arriving one (`max(self.running, key=lambda r:
  (r.priority, r.arrival_time))`, V1's PRIORITY policy). When the victim is the request itself,
  nothing more runs in that pass (`if preempted_req == request: break`, then `if new_blocks is
  None: break`). `victim_key` encodes both orders.
- A pass that preempted admits no waiting request ("Next, schedule the WAITING requests": `if not
  preempted_reqs ...`). Otherwise waiting requests are admitted in `waiting_key` order while fewer
  than `batch_cap` run (`if len(self.running) == self.max_num_running_reqs: break`) and the blocks
  for their first chunk are free (`if new_blocks is None: break`). `AdmissionLimits.admits` is that
  check; its `preempted_in_pass` argument is the V1 rule.
- This project's rule on top of V1: with `priority_routing` on, a waiting request that does not fit
  may evict a running request of strictly lower priority (the `victim_key` victim) to make its own
  room, and is then admitted; a request evicted in a pass is not re-admitted in the same pass. V1's
  PRIORITY policy preempts only on behalf of running requests.
- With `priority_routing` on, waiting requests are taken by (priority, arrival); off, by arrival
  (V1 FCFS; V1 prepends a preempted request to the queue, here it keeps its arrival time, which puts
  it ahead of every later arrival).

Budgets:
- `batch_cap` is the most requests running (in flight) at once. A request larger than the whole
  budget: the gateway runs it alone when nothing else runs (`AdmissionLimits.admits`, a remote
  server may still take it); the simulator rejects one that needs more KV blocks than the pool holds.
- The KV budget is a token budget: the simulator counts KV blocks of 16 tokens inside
  `kv_budget_fraction` of the memory the weights leave; the gateway counts prompt + max output
  tokens in flight against `kv_budget_fraction` of a configured in-flight token budget. The gateway
  reserves a request's whole budget when it admits it, so it never preempts and `preempted_in_pass`
  is always False there.
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


def victim_key(priority: int, arrival_s: float, admitted_seq: int, request_id: int,
               priority_routing: bool) -> tuple:
    """Sort key for preemption: the running request with the LARGEST key is preempted first.

    `admitted_seq` counts admissions to the running set (a re-admitted request gets a new one):
    off, the most recently admitted request goes first (V1 FCFS: `self.running.pop()`); on, the
    lowest priority (largest number), then the latest arrival (V1 PRIORITY: max of (priority,
    arrival_time)), the request id breaking ties."""
    if priority_routing:
        return (priority, arrival_s, request_id)
    return (admitted_seq,)


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """The limits a policy puts on what may run at once: requests, and tokens (gateway) or KV blocks
    (simulator) in use against a budget."""

    max_running: int
    token_budget: int

    def admits(self, running: int, tokens_in_use: float, tokens_needed: float,
               preempted_in_pass: bool = False) -> bool:
        """True when one more request needing `tokens_needed` fits beside what runs.

        A scheduling pass that preempted a running request admits nothing (vLLM V1: `if not
        preempted_reqs`), so the blocks it freed go to the running requests that needed them and a
        request just admitted is not the next victim. With nothing running the request is admitted
        whatever its size: a request larger than the whole budget would otherwise wait forever (it
        runs alone)."""
        if preempted_in_pass:
            return False
        if running == 0:
            return True
        return running < self.max_running and tokens_in_use + tokens_needed <= self.token_budget


def token_budget(kv_budget_fraction: float, capacity_tokens: int) -> int:
    """The token budget a `kv_budget_fraction` buys out of `capacity_tokens` (at least one block)."""
    return max(KV_BLOCK_TOKENS, int(kv_budget_fraction * capacity_tokens))
