"""`OpenRequests`: the requests an episode's metrics have seen arrive and not yet settled, as sorted arrays.

Each open request keeps its tenant (an index into the task's tenants), the latest first-token time that
meets its TTFT SLO and its TPOT SLO (seconds). The metrics look a window's finished and pending requests up
by id (core/settlement.py: a table by id, or a binary search) instead of a dict lookup per request (the lookups were
a third of `MetricsTracker.observe`). Ids are unique within an episode and arrive in
increasing order (shared/backend.py `Arrival`), so a window's arrivals keep the ids sorted by appending
(the settlement's call appends them: core/settlement.py `appends`); ids out of order (a planner's sampled
day after a continued one) are merged in by `add`, by a stable sort. The settlement returns the table
after each window, which the tracker sets in place of the old one."""

from __future__ import annotations

import numpy as np

_EMPTY_I = np.zeros(0, dtype=np.int64)
_EMPTY_F = np.zeros(0)


class OpenRequests:
    """Open requests as four aligned arrays, sorted by `ids` (unique)."""

    __slots__ = ("ids", "tenant", "deadline", "tpot_slo")

    def __init__(self, ids: np.ndarray = _EMPTY_I, tenant: np.ndarray = _EMPTY_I, deadline: np.ndarray = _EMPTY_F,
                 tpot_slo: np.ndarray = _EMPTY_F):
        self.ids, self.tenant, self.deadline, self.tpot_slo = ids, tenant, deadline, tpot_slo

    def __len__(self) -> int:
        return self.ids.shape[0]

    def add(self, ids: np.ndarray, tenant: np.ndarray, deadline: np.ndarray, tpot_slo: np.ndarray) -> None:
        """Open these requests, merged in by id (the settlement appends arrivals that simply follow the open
        ids itself); an id already open is refused (ValueError naming it) and nothing is added."""
        if not len(ids):
            return
        all_ids = np.concatenate((self.ids, ids))
        order = np.argsort(all_ids, kind="stable")
        all_ids = all_ids[order]
        twice = np.flatnonzero(all_ids[1:] == all_ids[:-1])
        if len(twice):
            raise ValueError(f"request {int(all_ids[twice[0]])} arrived while it is still open "
                             "(request ids are unique within an episode)")
        self.ids = all_ids
        self.tenant = np.concatenate((self.tenant, tenant))[order]
        self.deadline = np.concatenate((self.deadline, deadline))[order]
        self.tpot_slo = np.concatenate((self.tpot_slo, tpot_slo))[order]

    def copy(self) -> OpenRequests:
        """An independent copy. The arrays are shared: no method writes them in place (each replaces them),
        so a fork (the planner makes thousands) costs no copying."""
        return OpenRequests(self.ids, self.tenant, self.deadline, self.tpot_slo)
