"""`settle_window`: which open requests a window settles, and how (core/metrics.py's rules), in one pass.

`MetricsTracker.observe` hands it the open requests (core/open_requests.py's sorted arrays), the
window's arrivals, and its finished and pending requests as columns (shared/records.py); it returns the
verdicts and the open requests after the window, and changes nothing, so the tracker can refuse a bad
report (a request finishing that was never open) before it applies them. One loop over the rows,
compiled by numba where it imports (shared/jit.py) and plain Python where not: the numpy expression of
the same rules made ~35 array calls a window, whose per-call overhead was most of the metrics' time
(issue 27).

The rules, per row (NaN stands for a missing time and compares False, as in the arrays before):

- a finished row whose request is open settles it: met if its status is ok, its first token came by
  the request's deadline (arrival + TTFT SLO) and, when it ended with >= 2 tokens and a first token,
  its TPOT is within the SLO; missed otherwise. A finished row whose request is not open (settled
  earlier, or a second row of one request in this window) is returned as `unknown` for the tracker
  to check against the requests it flagged;
- a pending row whose request is still open is missed now ("flagged") when it can no longer meet
  its SLOs: no first token and past its deadline, a first token after it, or decoding for so long
  that TPOT >= (now - first token) / (target - 1) exceeds the SLO;
- `final`: every request still open after that is missed (the backlog).

Also gathered on the way: E2E and TPOT of every finished row that ended ok (settled now or not),
TTFT from dispatch of every row whose first token came in the window, the pending rows queued.
"""

from __future__ import annotations

import numpy as np
from llmserve_env.shared.jit import HAVE_NUMBA, njit

__all__ = ["HAVE_NUMBA", "appends", "settle_window", "warm"]


@njit
def _position(ids, rid):
    """The index of `rid` in the sorted unique `ids`, -1 if absent (a binary search)."""
    lo, hi = 0, ids.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if ids[mid] < rid:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < ids.shape[0] and ids[lo] == rid else -1


@njit
def _slots(ids, rows):
    """Where `_position` would look up `rows` ids in the sorted unique `ids`, a table by id instead, when the
    ids span few enough values (at most 4 per row looked up): slots[rid - ids[0]] is rid's index, -1 where
    absent; empty otherwise. A window's pending rows can be thousands (a long queue), each looked up."""
    m = ids.shape[0]
    if m == 0:
        return np.empty(0, dtype=np.int64)
    span = ids[m - 1] - ids[0] + 1
    if span > 4 * rows + 64:
        return np.empty(0, dtype=np.int64)
    slots = np.full(span, -1, dtype=np.int64)
    base = ids[0]
    for a in range(m):
        slots[ids[a] - base] = a
    return slots


@njit
def _dispatch_ttfts(out, n, ft, disp, t0, t_end):
    """TTFT from dispatch of the rows whose first token came in [t0, t_end), appended to out[n:]."""
    for j in range(ft.shape[0]):
        f, d = ft[j], disp[j]
        if f >= t0 and f < t_end and d == d:
            out[n] = f - d
            n += 1
    return n


@njit
def appends(open_ids, a_ids):
    """True when the ids `a_ids` all come after the open ones, in increasing order (a window's arrivals
    normally do: `settle_window` appends them); else the tracker merges them in first (OpenRequests.add)."""
    n = a_ids.shape[0]
    for j in range(1, n):
        if a_ids[j] <= a_ids[j - 1]:
            return False
    return n == 0 or open_ids.shape[0] == 0 or a_ids[0] > open_ids[-1]


@njit
def settle_window(open_ids, open_tenant, open_deadline, open_tpot, a_ids, a_tenant, a_arrival, a_prompt, append,
                  slo_ttft, slo_tpot, f_id, f_status, f_arrival, f_ft, f_fin, f_out, f_disp, p_id, p_status, p_ft,
                  p_target, p_disp, t0, t_end, n_tenants, ok, queued_code, final):
    """The window's verdicts (module docstring), nothing changed. The window's arrivals (`a_*`, tenant as
    an index) are counted and, where `append`, opened first (deadline: arrival + the tenant's TTFT SLO).
    Returns (the open table after the window (ids, tenant, deadline, TPOT SLO), arrived per tenant index,
    their prompt tokens, met and missed per tenant index, output tokens of the met, backlog, unknown
    finished ids in row order, flagged ids, E2Es, TPOTs, dispatch TTFTs, pending rows queued)."""
    arrived_n = np.zeros(n_tenants, dtype=np.int64)
    prompt = 0
    na = a_ids.shape[0]
    for j in range(na):
        arrived_n[a_tenant[j]] += 1
        prompt += a_prompt[j]
    if append and na:
        m0 = open_ids.shape[0]
        open_ids = np.concatenate((open_ids, a_ids))
        open_tenant = np.concatenate((open_tenant, a_tenant))
        deadline, tpot_slo = np.empty(na), np.empty(na)
        for j in range(na):
            deadline[j] = a_arrival[j] + slo_ttft[a_tenant[j]]
            tpot_slo[j] = slo_tpot[a_tenant[j]]
        open_deadline = np.concatenate((open_deadline, deadline))
        open_tpot = np.concatenate((open_tpot, tpot_slo))
        if m0 and open_ids[m0] <= open_ids[m0 - 1]:  # `appends` was not asked: refuse rather than mis-sort
            raise ValueError("arrivals out of order: merge them in first (OpenRequests.add)")
    m = open_ids.shape[0]
    still_open = np.ones(m, dtype=np.bool_)
    slots = _slots(open_ids, f_id.shape[0] + p_id.shape[0])
    ns = slots.shape[0]
    base = open_ids[0] if m else 0
    met_n = np.zeros(n_tenants, dtype=np.int64)
    missed_n = np.zeros(n_tenants, dtype=np.int64)
    nf, npend = f_id.shape[0], p_id.shape[0]
    unknown = np.empty(nf, dtype=np.int64)
    e2es = np.empty(nf)
    tpots = np.empty(nf)
    nu = ne = nt = 0
    good = 0
    settled = 0
    for j in range(nf):
        ft, fs, out = f_ft[j], f_fin[j], f_out[j]
        done_ok = f_status[j] == ok
        ended = done_ok and fs == fs
        has_tpot = ended and ft == ft and out >= 2
        tpot = 0.0
        if ended:
            e2es[ne] = fs - f_arrival[j]
            ne += 1
        if has_tpot:
            tpot = (fs - ft) / (out - 1)
            tpots[nt] = tpot
            nt += 1
        k = f_id[j] - base  # (the lookup written out: a call costs its arrays' reference counting)
        a = (slots[k] if 0 <= k < ns else -1) if ns else _position(open_ids, f_id[j])
        if a < 0 or not still_open[a]:
            unknown[nu] = f_id[j]
            nu += 1
            continue
        still_open[a] = False
        settled += 1
        if done_ok and ft <= open_deadline[a] and (not has_tpot or tpot <= open_tpot[a]):
            met_n[open_tenant[a]] += 1
            good += out
        else:
            missed_n[open_tenant[a]] += 1
    queued = 0
    flagged = np.empty(npend, dtype=np.int64)
    nfl = 0
    for j in range(npend):
        if p_status[j] == queued_code:
            queued += 1
    if settled < m:
        for j in range(npend):
            k = p_id[j] - base
            a = (slots[k] if 0 <= k < ns else -1) if ns else _position(open_ids, p_id[j])
            if a < 0 or not still_open[a]:
                continue
            deadline_a, ft, target = open_deadline[a], p_ft[j], p_target[j]
            if ft != ft:
                late = t_end > deadline_a
            else:
                late = ft > deadline_a or (target >= 2 and t_end - ft > open_tpot[a] * (target - 1))
            if late:
                still_open[a] = False
                settled += 1
                flagged[nfl] = open_ids[a]
                nfl += 1
                missed_n[open_tenant[a]] += 1
    backlog = 0
    if final:
        for a in range(m):
            if still_open[a]:
                missed_n[open_tenant[a]] += 1
                backlog += 1
        settled = m
    left = m - settled
    ids_left = np.empty(left, dtype=np.int64)
    tenant_left = np.empty(left, dtype=np.int64)
    deadline_left, tpot_left = np.empty(left), np.empty(left)
    k = 0
    if left:
        for a in range(m):
            if still_open[a]:
                ids_left[k], tenant_left[k] = open_ids[a], open_tenant[a]
                deadline_left[k], tpot_left[k] = open_deadline[a], open_tpot[a]
                k += 1
    dispatch = np.empty(nf + npend)
    nd = _dispatch_ttfts(dispatch, 0, f_ft, f_disp, t0, t_end)
    nd = _dispatch_ttfts(dispatch, nd, p_ft, p_disp, t0, t_end)
    return (ids_left, tenant_left, deadline_left, tpot_left, arrived_n, prompt, met_n, missed_n, good, backlog,
            unknown[:nu], flagged[:nfl], e2es[:ne], tpots[:nt], dispatch[:nd], queued)


def warm() -> None:
    """Compile (or load from numba's cache) `settle_window` for the arrays the metrics pass."""
    if HAVE_NUMBA:
        i, f = np.zeros(1, dtype=np.int64), np.zeros(1)
        appends(i, i)
        for append in (True, False):
            settle_window(i[:0], i[:0], f[:0], f[:0], i, i, f, i, append, f, f, i, i, f, f, f, i, f, i, i, f, i, f,
                          0.0, 1.0, 1, 2, 0, True)
