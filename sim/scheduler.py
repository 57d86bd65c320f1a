"""Who waits, who runs next, who is preempted: the shared admission rules applied to SimRequests.

- The waiting queue is ordered by `shared.admission.waiting_key` (arrival order; priority first
  when `priority_routing` is on). Preempted requests go back into it and keep their arrival time,
  so they resume ahead of later arrivals, as vLLM's recompute preemption does.
- A request is admitted while fewer than `batch_cap` run, the KV blocks for its first chunk are
  free, and the scheduling pass has not preempted (`shared.admission.AdmissionLimits.admits`, vLLM
  V1's rule); the engine checks it where it plans a prefill (sim/engine.py `_plan_prefill`).
- The preemption victim is the running request with the largest `shared.admission.victim_key`
  (the most recently admitted; lowest priority, then latest arrival, when `priority_routing` is on).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from llmserve_env.shared.admission import victim_key, waiting_key
from llmserve_env.sim.request import SimRequest


class Scheduler:
    __slots__ = ("heap", "priority_routing")

    def __init__(self) -> None:
        self.heap: list[tuple[tuple, int, SimRequest]] = []
        self.priority_routing = False

    def configure(self, priority_routing: bool) -> None:
        if priority_routing != self.priority_routing:
            self.priority_routing = priority_routing
            # re-keyed in place and heapified: the keys are unique (the request id is in them), so the
            # pop order is the one pushing each again would give, in O(n) rather than O(n log n). The
            # requests themselves are unchanged (their pending snapshots still hold).
            entries = []
            for entry in self.heap:
                r = entry[2]
                r.wkey = waiting_key(r.priority, r.arrival, r.rid, priority_routing)
                entries.append((r.wkey, r.rid, r))
            heapq.heapify(entries)
            self.heap[:] = entries  # the same list: the engine's loops hold it

    def push(self, r: SimRequest) -> None:
        r.wkey = waiting_key(r.priority, r.arrival, r.rid, self.priority_routing)
        r.queued_clean = False
        heapq.heappush(self.heap, (r.wkey, r.rid, r))

    def pop(self) -> SimRequest:
        return heapq.heappop(self.heap)[2]

    def waiting(self) -> Iterable[SimRequest]:
        return (entry[2] for entry in self.heap)

    def victim_order(self, candidates: Iterable[SimRequest]) -> list[SimRequest]:
        """`candidates` in preemption order: repeated `victim` calls would pick them in this order."""
        pr = self.priority_routing
        return sorted(candidates, key=lambda r: victim_key(r.priority, r.arrival, r.admitted_seq, r.rid, pr),
                      reverse=True)

    def victim(self, candidates: Iterable[SimRequest]) -> SimRequest | None:
        """The request to preempt among `candidates` (largest victim_key), or None."""
        pr = self.priority_routing
        best, best_key = None, None
        for r in candidates:
            k = victim_key(r.priority, r.arrival, r.admitted_seq, r.rid, pr)
            if best_key is None or k > best_key:
                best, best_key = r, k
        return best
