"""The cluster's estimated router (sim/cluster.py `_route`) compiled: one call routes a window's arrivals.

The rule is shared/routing.py's `least_outstanding` over each replica's estimated work at the arrival's
time (`Replica.work_at`), ties to the lowest index; the replica chosen then holds that work plus the
arrival's prompt and output tokens. Here it runs over arrays, with the same float operations in the same
order (no fastmath), so the routes and the estimates are bit-identical to the Python loop's; the cluster
uses it where numba imports and no cache affinity is set (a replica is eligible from its ready time on, as
in the loop). Without numba, `njit` is the identity and the cluster keeps its Python loop.
"""

from __future__ import annotations

import numpy as np
from llmserve_env.shared.jit import njit


@njit
def route_least_work(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, est: np.ndarray,
                     choice: np.ndarray, order: np.ndarray, counts: np.ndarray) -> int:
    """Arrival j goes to replica choice[j]: of the replicas ready by arrival_s[j] (ready_s <= it), the least
    work at arrival_s[j] (est_work - rate x elapsed, at least 0); that replica's est_work becomes its work
    plus prompt[j], plus output[j] (added in that order, as the Python loop adds them, the token counts as
    floats) and its est_t arrival_s[j]. No replica ready: choice[j] = -1, nothing updated. `est`'s rows are
    the replicas' est_work, est_t, rate and ready_s; est_work and est_t are updated in place.

    Then the arrivals grouped by replica (a stable counting sort): `order` lists replica 0's arrivals in
    arrival order, then replica 1's, ..., then those no replica took; counts[i] is replica i's number
    (counts[k], k replicas: the unrouted). Returns how many no replica took."""
    est_work, est_t, rate, ready_s = est[0], est[1], est[2], est[3]
    k = est_work.shape[0]
    n = arrival_s.shape[0]
    for j in range(n):
        t = arrival_s[j]
        best = -1
        bw = 0.0
        for i in range(k):
            if ready_s[i] > t:
                continue
            w = est_work[i] - rate[i] * (t - est_t[i])
            if not w > 0.0:
                w = 0.0
            if best < 0 or w < bw:
                best, bw = i, w
        choice[j] = best
        if best >= 0:
            est_work[best] = (bw + prompt[j]) + output[j]
            est_t[best] = t
    for i in range(k + 1):
        counts[i] = 0
    for j in range(n):
        counts[choice[j] if choice[j] >= 0 else k] += 1
    start = np.empty(k + 1, dtype=np.int64)
    acc = 0
    for i in range(k + 1):
        start[i] = acc
        acc += counts[i]
    for j in range(n):
        i = choice[j] if choice[j] >= 0 else k
        order[start[i]] = j
        start[i] += 1
    return counts[k]
