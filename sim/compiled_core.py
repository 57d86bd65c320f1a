"""The engine's event loop compiled (numba), over arrays: sim/array_engine.py drives it.

The same loop as sim/engine.py's `Engine`, operation for operation, so the two give bit-identical
results (tests/test_array_engine.py plays random actions through both): the same float operations in
the same order (no fastmath), CPython's heapq algorithm for every heap (so the heaps' layouts, which
the pending report walks, are the same), the same tie-breaks. Requests are rows of two arrays, `F`
(floats) and `Ix` (ints); the engine's scalars are two more (`SF`, `SI`); its ordered collections
(decoding map, prefilling list, transfers heap, joiners, waiting heap) are rows of `C`, each with its
length in `SI`. What a window measured goes to output arrays the wrapper turns into records.

Scope: engines without prefix ids, slots or prompt breaks, with a kernel-fitted step-time model
(sim/step_time.py `StepTimeModel`): the wrapper refuses the rest, which the Python engine serves.

Every function here also runs uncompiled (numba absent: `njit_borrowing` is the identity), slowly: the wrapper
only uses this module where numba imports, and the differential test runs where it does.
"""

from __future__ import annotations

import math

import numpy as np
from llmserve_env.shared.jit import HAVE_NUMBA, njit_borrowing  # noqa: F401 - HAVE_NUMBA: the wrapper asks here
from llmserve_env.shared.records import OK as RB_OK
from llmserve_env.shared.records import QUEUED as RB_QUEUED
from llmserve_env.shared.records import REJECTED as RB_REJECTED
from llmserve_env.shared.records import RUNNING as RB_RUNNING
from llmserve_env.sim.engine import SAMPLES_PER_WINDOW
from llmserve_env.sim.engine import steps_to_cover as engine_steps_to_cover

INF = math.inf
BLOCK = 16  # shared/admission.py KV_BLOCK_TOKENS
INV_BLOCK = 1.0 / BLOCK

# request states (sim/request.py)
WAITING, PREFILL, TRANSFER, DECODE, DONE = 0, 1, 2, 3, 4
# request float columns
F_ARR, F_ACC, F_E, F_PROG, F_EMIT, F_FT, F_DISP, F_FIN, F_READY = range(9)
NF = 9
# a request row's float columns before it is used (times not yet reached are NaN): a fresh state's rows and
# the rows compaction frees (int columns start at 0)
FRESH_F = np.zeros(NF)
FRESH_F[[F_FT, F_DISP, F_FIN]] = math.nan
# request int columns
(I_RID, I_PRIO, I_PROMPT, I_TARGET, I_STATE, I_PTGT, I_PFD, I_BLK, I_SYNC, I_FINIT, I_GEN, I_REP, I_ADM,
 I_PRE, I_ATT, I_STATUS, I_OUT, I_RHIT) = range(18)
NI = 18
STATUS_LIVE, STATUS_OK, STATUS_REJECTED = 0, 1, 2
# engine float scalars
(SF_CTX, SF_PER, SF_CLOCK, SF_PCLOCK, SF_DCLOCK, SF_NEXT_SAMPLE, SF_T0, SF_DT, SF_SPEC_ACC, SF_BUSY,
 SF_SHARE) = range(11)
NSF = 11
# engine int scalars
(SI_ITER, SI_VER, SI_MEMO_VER, SI_MEMO_IT, SI_MEMO_TOT, SI_CAP, SI_KVTOT, SI_KVUSED, SI_ADM, SI_DEPTH,
 SI_PREBLK, SI_ARR_IDX, SI_NREQ, SI_PR, SI_BUDGET, SI_OUT_TOK, SI_PROMPT_TOK, SI_EVICT, SI_SPEC_PROP, SI_ITERS,
 SI_REJ, SI_NDEC, SI_NPRE, SI_NTR, SI_NFRESH, SI_NFH, SI_NW, SI_NFIN, SI_NFT, SI_NITL, SI_NSAMP) = range(31)
NSI = 31
# rows of C: the ordered collections (request indices)
C_DEC, C_PRE, C_TR, C_FRESH, C_WQ, C_SCRATCH, C_CHUNK, C_CHUNK_C, C_EVICTED = range(9)
NC = 9
# step-time model scalars (sim/step_time.py StepTimeModel)
(M_TFIX, M_TFIXD, M_DEC_C0, M_DEC_SEQ, M_DEC_CTX, M_DDEC_C0, M_DDEC_SEQ, M_DDEC_CTX, M_PRE_LAYERS, M_PF_C0,
 M_PF_BW, M_PF_TF, M_PF_P, M_HEADS, M_KVH, M_HD, M_ELEM, M_XC0, M_XPT) = range(19)
NM = 19
# run() results
RUN_DONE, RUN_ROOM = 0, 1  # finished to t_end; stopped early for want of output room (grow and call again)
MAX_SAMPLES = 64


# ----------------------------------------------------------------------------------- heaps (CPython's heapq)
# kinds: 0 waiting (key per priority routing), 1 transfers (ready, rid), the finish heap has its own


@njit_borrowing
def _less(kind, a, b, F, Ix, pr):
    if kind == 0:
        if pr:
            pa, pb = Ix[a, I_PRIO], Ix[b, I_PRIO]
            if pa != pb:
                return pa < pb
        fa, fb = F[a, F_ARR], F[b, F_ARR]
        if fa != fb:
            return fa < fb
        return Ix[a, I_RID] < Ix[b, I_RID]
    fa, fb = F[a, F_READY], F[b, F_READY]
    if fa != fb:
        return fa < fb
    return Ix[a, I_RID] < Ix[b, I_RID]


@njit_borrowing
def _siftdown(h, start, pos, kind, F, Ix, pr):
    item = h[pos]
    while pos > start:
        parent = (pos - 1) >> 1
        if _less(kind, item, h[parent], F, Ix, pr):
            h[pos] = h[parent]
            pos = parent
            continue
        break
    h[pos] = item


@njit_borrowing
def _siftup(h, pos, end, kind, F, Ix, pr):
    start = pos
    item = h[pos]
    child = 2 * pos + 1
    while child < end:
        right = child + 1
        if right < end and not _less(kind, h[child], h[right], F, Ix, pr):
            child = right
        h[pos] = h[child]
        pos = child
        child = 2 * pos + 1
    h[pos] = item
    _siftdown(h, start, pos, kind, F, Ix, pr)


@njit_borrowing
def heap_push(h, n, item, kind, F, Ix, pr):
    h[n] = item
    _siftdown(h, 0, n, kind, F, Ix, pr)
    return n + 1


@njit_borrowing
def heap_pop(h, n, kind, F, Ix, pr):
    """(popped, new length)."""
    n -= 1
    last = h[n]
    if n > 0:
        top = h[0]
        h[0] = last
        _siftup(h, 0, n, kind, F, Ix, pr)
        return top, n
    return last, n


@njit_borrowing
def heapify(h, n, kind, F, Ix, pr):
    for i in range(n // 2 - 1, -1, -1):
        _siftup(h, i, n, kind, F, Ix, pr)


# the finish heap: rows (finish iteration, rid, gen, request index), compared lexicographically on the first three


@njit_borrowing
def _fless(H, a, b):
    if H[a, 0] != H[b, 0]:
        return H[a, 0] < H[b, 0]
    if H[a, 1] != H[b, 1]:
        return H[a, 1] < H[b, 1]
    return H[a, 2] < H[b, 2]


@njit_borrowing
def _fset(H, dst, src):
    H[dst, 0] = H[src, 0]
    H[dst, 1] = H[src, 1]
    H[dst, 2] = H[src, 2]
    H[dst, 3] = H[src, 3]


@njit_borrowing
def _fsiftdown(H, start, pos):
    # the item being placed is parked in the row past the end (H has one spare row)
    spare = H.shape[0] - 1
    _fset(H, spare, pos)
    while pos > start:
        parent = (pos - 1) >> 1
        if _fless(H, spare, parent):
            _fset(H, pos, parent)
            pos = parent
            continue
        break
    _fset(H, pos, spare)


@njit_borrowing
def _fsiftup(H, pos, end):
    spare = H.shape[0] - 1
    start = pos
    _fset(H, spare, pos)
    child = 2 * pos + 1
    while child < end:
        right = child + 1
        if right < end and not _fless(H, child, right):
            child = right
        _fset(H, pos, child)
        pos = child
        child = 2 * pos + 1
    _fset(H, pos, spare)
    _fsiftdown(H, start, pos)


@njit_borrowing
def fheap_push(H, n, fin, rid, gen, idx):
    H[n, 0] = fin
    H[n, 1] = rid
    H[n, 2] = gen
    H[n, 3] = idx
    _fsiftdown(H, 0, n)
    return n + 1


@njit_borrowing
def fheap_pop(H, n):
    """Removes the top entry (read it before); returns the new length."""
    n -= 1
    if n > 0:
        _fset(H, 0, n)
        _fsiftup(H, 0, n)
    return n


@njit_borrowing
def fheapify(H, n):
    for i in range(n // 2 - 1, -1, -1):
        _fsiftup(H, i, n)


# ----------------------------------------------------------------------------------- ordered lists


@njit_borrowing
def list_remove(C, row, n, item):
    """Remove the first `item` from C[row, :n] keeping the order (list.remove); returns the new length."""
    k = 0
    while C[row, k] != item:
        k += 1
    for j in range(k, n - 1):
        C[row, j] = C[row, j + 1]
    return n - 1


@njit_borrowing
def list_has(C, row, n, item):
    for k in range(n):
        if C[row, k] == item:
            return True
    return False


# ----------------------------------------------------------------------------------- physics


@njit_borrowing
def tokens_per_step(accept, depth):
    """Expected tokens a verification step emits: (1 - a^(g+1)) / (1 - a) (sim/engine.py)."""
    if depth <= 0:
        return 1.0
    if accept >= 1.0:
        return float(depth + 1)
    return (1.0 - math.pow(accept, float(depth + 1))) / (1.0 - accept)


# the Python engine's own closed form, compiled (one definition)
steps_to_cover = njit_borrowing(engine_steps_to_cover)


@njit_borrowing
def iteration_s(ms, dense, head, ddense, dhead, decode_seqs, ctx_sum, depth, C, nchunks, Ix, prefill_tokens,
                sampled_prefills):
    """StepTimeModel.iteration_s, the chunks being C[C_CHUNK/C_CHUNK_C, :nchunks] (new tokens, prefilled)."""
    q = decode_seqs * (depth + 1)
    t = ms[M_TFIX] + dense[q + prefill_tokens] + head[q + sampled_prefills]
    if decode_seqs:
        dec = ms[M_DEC_C0] + ms[M_DEC_SEQ] * decode_seqs + ms[M_DEC_CTX] * ctx_sum
        draft = 0.0
        if depth > 0:
            one = (ms[M_TFIXD] + ddense[decode_seqs] + dhead[decode_seqs] + ms[M_DDEC_C0]
                   + ms[M_DDEC_SEQ] * decode_seqs + ms[M_DDEC_CTX] * ctx_sum)
            draft = depth * one
        t += dec + draft
    if nchunks:
        q_elems = 0.0
        kv_elems = 0.0
        flop_units = 0.0
        for j in range(nchunks):
            c = C[C_CHUNK_C, j]
            ctx = Ix[C[C_CHUNK, j], I_PFD]
            q_elems += c
            kv_elems += ctx + c
            flop_units += c * (ctx + (c + 1) * 0.5)
        h, kvh, hd = ms[M_HEADS], ms[M_KVH], ms[M_HD]
        nbytes = ms[M_ELEM] * (2.0 * q_elems * h * hd + 2.0 * kv_elems * kvh * hd)
        flops = 4.0 * h * hd * flop_units
        p = ms[M_PF_P]
        mem = nbytes / (ms[M_PF_BW] * 1e3)
        comp = flops / (ms[M_PF_TF] * 1e6)
        t += ms[M_PRE_LAYERS] * (ms[M_PF_C0] + (mem ** p + comp ** p) ** (1.0 / p))
    return t


@njit_borrowing
def decode_slope(ms, depth):
    return ms[M_DEC_CTX] + (depth * ms[M_DDEC_CTX] if depth > 0 else 0.0)


# ----------------------------------------------------------------------------------- KV accounting


@njit_borrowing
def blocks_held(F, Ix, i, it):
    p = F[i, F_PROG] + (it - Ix[i, I_SYNC]) * F[i, F_E]
    if p > Ix[i, I_TARGET]:
        p = float(Ix[i, I_TARGET])
    return -(-math.ceil(Ix[i, I_PROMPT] + p) // BLOCK)


@njit_borrowing
def decode_blocks_exact(F, Ix, SI, C, k):
    it = SI[SI_ITER] + k
    if SI[SI_MEMO_IT] == it and SI[SI_MEMO_VER] == SI[SI_VER]:
        return SI[SI_MEMO_TOT]
    total = 0
    for j in range(SI[SI_NDEC]):
        r = C[C_DEC, j]
        p = F[r, F_PROG] + (it - Ix[r, I_SYNC]) * F[r, F_E]
        if p > Ix[r, I_TARGET]:
            p = float(Ix[r, I_TARGET])
        total += -(-math.ceil(Ix[r, I_PROMPT] + p) // BLOCK)
    SI[SI_MEMO_VER] = SI[SI_VER]
    SI[SI_MEMO_IT] = it
    SI[SI_MEMO_TOT] = total
    return total


@njit_borrowing
def decode_kv_limit(F, Ix, SF, SI, C, kcap):
    free = SI[SI_KVTOT] - SI[SI_KVUSED]
    n = SI[SI_NDEC]
    grown = SF[SF_CTX] + kcap * SF[SF_PER]
    if (grown + n) * INV_BLOCK + n <= free:
        return kcap
    if decode_blocks_exact(F, Ix, SI, C, 1) > free:
        return 0
    lo, hi = 1, kcap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_blocks_exact(F, Ix, SI, C, mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


# ----------------------------------------------------------------------------------- victims


@njit_borrowing
def _vgreater(a, b, F, Ix, pr):
    """victim_key(a) > victim_key(b) (shared/admission.py)."""
    if pr:
        pa, pb = Ix[a, I_PRIO], Ix[b, I_PRIO]
        if pa != pb:
            return pa > pb
        fa, fb = F[a, F_ARR], F[b, F_ARR]
        if fa != fb:
            return fa > fb
        return Ix[a, I_RID] > Ix[b, I_RID]
    return Ix[a, I_ADM] > Ix[b, I_ADM]


@njit_borrowing
def _in_chunks(C, nchunks, r):
    for j in range(nchunks):
        if C[C_CHUNK, j] == r:
            return True
    return False


@njit_borrowing
def victim(F, Ix, SI, C, unified, nchunks, use_chunks):
    """The largest victim_key among the pool: with use_chunks, the pass's unscheduled requests
    (`Engine._unscheduled`), else `Engine._victim_pool(unified)`. -1: none."""
    pr = SI[SI_PR]
    best = -1
    include_dec = unified or not use_chunks
    if include_dec:
        for j in range(SI[SI_NDEC]):
            r = C[C_DEC, j]
            if best < 0 or _vgreater(r, best, F, Ix, pr):
                best = r
    include_pre = use_chunks or unified
    if include_pre:
        for j in range(SI[SI_NPRE]):
            r = C[C_PRE, j]
            if use_chunks and _in_chunks(C, nchunks, r):
                continue
            if best < 0 or _vgreater(r, best, F, Ix, pr):
                best = r
    return best


@njit_borrowing
def victim_order(F, Ix, SI, C):
    """`Scheduler.victim_order(_victim_pool(True))` into C[C_SCRATCH]: decoding then prefilling requests,
    sorted by victim_key, largest first (keys are unique). Returns the count."""
    pr = SI[SI_PR]
    n = 0
    for j in range(SI[SI_NDEC]):
        C[C_SCRATCH, n] = C[C_DEC, j]
        n += 1
    for j in range(SI[SI_NPRE]):
        C[C_SCRATCH, n] = C[C_PRE, j]
        n += 1
    for a in range(1, n):  # insertion sort, descending
        x = C[C_SCRATCH, a]
        b = a - 1
        while b >= 0 and _vgreater(x, C[C_SCRATCH, b], F, Ix, pr):
            C[C_SCRATCH, b + 1] = C[C_SCRATCH, b]
            b -= 1
        C[C_SCRATCH, b + 1] = x
    return n


# ----------------------------------------------------------------------------------- state changes


@njit_borrowing
def push_waiting(F, Ix, SI, C, r):
    SI[SI_NW] = heap_push(C[C_WQ], SI[SI_NW], r, 0, F, Ix, SI[SI_PR])


@njit_borrowing
def preempt(F, Ix, SF, SI, C, r, t):
    st = Ix[r, I_STATE]
    if st == DECODE:
        p = F[r, F_PROG] + (SI[SI_ITER] - Ix[r, I_SYNC]) * F[r, F_E]
        SF[SF_CTX] -= Ix[r, I_PROMPT] + p
        SF[SF_PER] -= F[r, F_E]
        SI[SI_NDEC] = list_remove(C, C_DEC, SI[SI_NDEC], r)
        SI[SI_VER] += 1
        Ix[r, I_GEN] += 1
        tg = float(Ix[r, I_TARGET])
        F[r, F_PROG] = tg if tg < p else p
        F[r, F_EMIT] = t
        if list_has(C, C_FRESH, SI[SI_NFRESH], r):
            SI[SI_NFRESH] = list_remove(C, C_FRESH, SI[SI_NFRESH], r)
    elif st == PREFILL:
        SI[SI_NPRE] = list_remove(C, C_PRE, SI[SI_NPRE], r)
        SI[SI_KVUSED] -= Ix[r, I_BLK]
    else:
        return
    Ix[r, I_BLK] = 0
    Ix[r, I_PFD] = 0
    Ix[r, I_PTGT] = Ix[r, I_PROMPT] + int(F[r, F_PROG])
    Ix[r, I_STATE] = WAITING
    Ix[r, I_PRE] += 1
    SI[SI_EVICT] += 1
    push_waiting(F, Ix, SI, C, r)
    SI[SI_PREBLK] = 0


@njit_borrowing
def reject(F, Ix, SI, fin_out, r, t):
    Ix[r, I_STATE] = DONE
    Ix[r, I_STATUS] = STATUS_REJECTED
    F[r, F_FIN] = t
    out = int(F[r, F_PROG])
    Ix[r, I_OUT] = out
    SI[SI_OUT_TOK] += out - Ix[r, I_REP]
    fin_out[SI[SI_NFIN]] = r
    SI[SI_NFIN] += 1
    SI[SI_REJ] += 1


@njit_borrowing
def finish(F, Ix, SF, SI, C, fin_out, r, t):
    if Ix[r, I_STATE] == DECODE:
        SF[SF_CTX] -= Ix[r, I_PROMPT] + F[r, F_PROG] + (SI[SI_ITER] - Ix[r, I_SYNC]) * F[r, F_E]
        SF[SF_PER] -= F[r, F_E]
        SI[SI_NDEC] = list_remove(C, C_DEC, SI[SI_NDEC], r)
        SI[SI_VER] += 1
    Ix[r, I_STATE] = DONE
    Ix[r, I_STATUS] = STATUS_OK
    F[r, F_FIN] = t
    tg = Ix[r, I_TARGET]
    Ix[r, I_OUT] = tg
    SI[SI_OUT_TOK] += tg - Ix[r, I_REP]
    Ix[r, I_REP] = tg
    fin_out[SI[SI_NFIN]] = r
    SI[SI_NFIN] += 1
    SI[SI_PREBLK] = 0


@njit_borrowing
def finish_due(F, Ix, SF, SI, C, H, fin_out, t):
    it = SI[SI_ITER]
    while SI[SI_NFH] and H[0, 0] <= it:
        gen, r = H[0, 2], H[0, 3]
        SI[SI_NFH] = fheap_pop(H, SI[SI_NFH])
        if gen == Ix[r, I_GEN] and Ix[r, I_STATE] == DECODE:
            finish(F, Ix, SF, SI, C, fin_out, r, t)


@njit_borrowing
def join_decode(F, Ix, SF, SI, C, H, r):
    Ix[r, I_STATE] = DECODE
    it = SI[SI_ITER]
    Ix[r, I_SYNC] = it
    e = tokens_per_step(F[r, F_ACC], SI[SI_DEPTH])
    F[r, F_E] = e
    fin = it + max(1, math.ceil((Ix[r, I_TARGET] - F[r, F_PROG]) / e - 1e-9))
    Ix[r, I_FINIT] = fin
    C[C_DEC, SI[SI_NDEC]] = r
    SI[SI_NDEC] += 1
    SI[SI_VER] += 1
    SF[SF_CTX] += Ix[r, I_PROMPT] + F[r, F_PROG]
    SF[SF_PER] += e
    SI[SI_NFH] = fheap_push(H, SI[SI_NFH], fin, Ix[r, I_RID], Ix[r, I_GEN], r)


@njit_borrowing
def complete_prefill(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, r, t, ms, split):
    SI[SI_NPRE] = list_remove(C, C_PRE, SI[SI_NPRE], r)
    SI[SI_KVUSED] -= Ix[r, I_BLK]
    Ix[r, I_BLK] = 0
    if math.isnan(F[r, F_FT]):
        F[r, F_FT] = t
        ft_idx[SI[SI_NFT]] = r
        ft_val[SI[SI_NFT]] = t - F[r, F_ARR]
        SI[SI_NFT] += 1
        F[r, F_PROG] = 1.0
    else:
        F[r, F_PROG] = float(int(F[r, F_PROG]) + 1)
        itl_v[SI[SI_NITL]] = t - F[r, F_EMIT]
        itl_n[SI[SI_NITL]] = 1
        SI[SI_NITL] += 1
    F[r, F_EMIT] = t
    if F[r, F_PROG] >= Ix[r, I_TARGET]:
        finish(F, Ix, SF, SI, C, fin_out, r, t)
    elif split:
        Ix[r, I_STATE] = TRANSFER
        b = -(-Ix[r, I_PFD] // BLOCK)
        Ix[r, I_BLK] = b
        SI[SI_KVUSED] += b
        F[r, F_READY] = t + (ms[M_XC0] + Ix[r, I_PFD] * ms[M_XPT])
        SI[SI_NTR] = heap_push(C[C_TR], SI[SI_NTR], r, 1, F, Ix, SI[SI_PR])
    else:
        join_decode(F, Ix, SF, SI, C, H, r)


@njit_borrowing
def process_joins(F, Ix, SF, SI, C, H, t):
    while SI[SI_NTR] and F[C[C_TR, 0], F_READY] <= t:
        r, ntr = heap_pop(C[C_TR], SI[SI_NTR], 1, F, Ix, SI[SI_PR])
        SI[SI_NTR] = ntr
        SI[SI_KVUSED] -= Ix[r, I_BLK]
        Ix[r, I_BLK] = 0
        join_decode(F, Ix, SF, SI, C, H, r)
        C[C_FRESH, SI[SI_NFRESH]] = r
        SI[SI_NFRESH] += 1


@njit_borrowing
def admit_arrivals(F, Ix, SI, C, t):
    i = SI[SI_ARR_IDX]
    n = SI[SI_NREQ]
    i0 = i
    while i < n and F[i, F_ARR] <= t:
        push_waiting(F, Ix, SI, C, i)
        i += 1
    if i != i0:
        SI[SI_ARR_IDX] = i
        SI[SI_PREBLK] = 0


@njit_borrowing
def next_arrival(F, SI):
    return F[SI[SI_ARR_IDX], F_ARR] if SI[SI_ARR_IDX] < SI[SI_NREQ] else INF


# ----------------------------------------------------------------------------------- scheduling


@njit_borrowing
def plan_prefill(F, Ix, SF, SI, C, fin_out, t, budget, unified, preempted):
    """`Engine._plan_prefill` without prefix caches, slots or prompt breaks: the chunks go to
    C[C_CHUNK] (request) and C[C_CHUNK_C] (tokens); returns their count."""
    nch = 0
    if budget <= 0:
        return 0
    ahead = 1 if unified else 0
    exact = False
    nd = SI[SI_NDEC]
    grown = SF[SF_CTX] + ahead * SF[SF_PER]
    free = (SI[SI_KVTOT] - SI[SI_KVUSED]) - ((grown + nd) * INV_BLOCK + nd)
    npre = SI[SI_NPRE]
    if npre:
        for j in range(npre):  # a copy: preemptions below change the list
            C[C_SCRATCH, j] = C[C_PRE, j]
        for j in range(npre):
            r = C[C_SCRATCH, j]
            if budget <= 0:
                break
            if Ix[r, I_STATE] != PREFILL:
                continue
            c = min(Ix[r, I_PTGT] - Ix[r, I_PFD], budget)
            need = -(-(Ix[r, I_PFD] + c) // BLOCK) - Ix[r, I_BLK]
            if need > free:
                free = float(SI[SI_KVTOT] - SI[SI_KVUSED] - decode_blocks_exact(F, Ix, SI, C, ahead))
            while need > free:
                v = victim(F, Ix, SI, C, unified, nch, True)
                if v < 0:
                    break
                preempt(F, Ix, SF, SI, C, v, t)
                preempted = True
                if v == r:
                    break
                free = float(SI[SI_KVTOT] - SI[SI_KVUSED] - decode_blocks_exact(F, Ix, SI, C, ahead))
            if Ix[r, I_STATE] != PREFILL or need > free:
                break
            Ix[r, I_BLK] += need
            SI[SI_KVUSED] += need
            free -= need
            C[C_CHUNK, nch] = r
            C[C_CHUNK_C, nch] = c
            nch += 1
            budget -= c
    if preempted:
        return nch
    pr = SI[SI_PR]
    total = SI[SI_KVTOT]
    cap = SI[SI_CAP]
    n_running = SI[SI_NDEC] + SI[SI_NPRE] + SI[SI_NTR]
    nev = 0
    while budget > 0 and SI[SI_NW]:
        r = C[C_WQ, 0]
        if -(-(Ix[r, I_PROMPT] + Ix[r, I_TARGET]) // BLOCK) > total:
            _, nw = heap_pop(C[C_WQ], SI[SI_NW], 0, F, Ix, pr)
            SI[SI_NW] = nw
            reject(F, Ix, SI, fin_out, r, t)
            continue
        evicted = False
        for j in range(nev):
            if C[C_EVICTED, j] == r:
                evicted = True
        if evicted:
            break
        c = min(Ix[r, I_PTGT], budget)
        need = -(-c // BLOCK)
        if not exact and n_running < cap and need > free:
            exact = True
            free = float(total - SI[SI_KVUSED] - decode_blocks_exact(F, Ix, SI, C, ahead))
        # AdmissionLimits.admits(n_running, total - free, need)
        admits = n_running == 0 or (n_running < cap and (total - free) + need <= total)
        if not admits:
            if pr:
                v = victim(F, Ix, SI, C, unified, nch, True)
                if v >= 0 and Ix[v, I_PRIO] > Ix[r, I_PRIO]:
                    preempt(F, Ix, SF, SI, C, v, t)
                    C[C_EVICTED, nev] = v
                    nev += 1
                    n_running -= 1
                    free = float(total - SI[SI_KVUSED] - decode_blocks_exact(F, Ix, SI, C, ahead))
                    exact = True
                    continue
            break
        _, nw = heap_pop(C[C_WQ], SI[SI_NW], 0, F, Ix, pr)
        SI[SI_NW] = nw
        Ix[r, I_STATE] = PREFILL
        SI[SI_ADM] += 1
        Ix[r, I_ADM] = SI[SI_ADM]
        if math.isnan(F[r, F_DISP]):
            F[r, F_DISP] = t
            Ix[r, I_ATT] = 1
        Ix[r, I_BLK] = need
        SI[SI_KVUSED] += need
        free -= need
        C[C_PRE, SI[SI_NPRE]] = r
        SI[SI_NPRE] += 1
        n_running += 1
        C[C_CHUNK, nch] = r
        C[C_CHUNK_C, nch] = c
        nch += 1
        budget -= c
    return nch


@njit_borrowing
def advance_decode(F, SF, SI, C, itl_v, itl_n, k, total, first, n, t_new):
    SI[SI_ITER] += k
    SF[SF_CTX] += k * SF[SF_PER]
    g = SI[SI_DEPTH]
    if g:
        SI[SI_SPEC_PROP] += g * n * k
        SF[SF_SPEC_ACC] += k * (SF[SF_PER] - n)
    nf = SI[SI_NFRESH]
    m = SI[SI_NITL]
    if nf:
        t_first_end = t_new - total + first
        for j in range(nf):
            itl_v[m] = t_first_end - F[C[C_FRESH, j], F_EMIT]
            itl_n[m] = 1
            m += 1
        if n > nf:
            itl_v[m] = first
            itl_n[m] = n - nf
            m += 1
        if k > 1:
            itl_v[m] = (total - first) / (k - 1)
            itl_n[m] = n * (k - 1)
            m += 1
        SI[SI_NFRESH] = 0
    else:
        itl_v[m] = total / k
        itl_n[m] = n * k
        m += 1
    SI[SI_NITL] = m


@njit_borrowing
def run_chunks(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, nch, t, ms, dense, head, ddense, dhead,
               n, split):
    g = SI[SI_DEPTH]
    tokens = 0
    completing = 0
    for j in range(nch):
        r = C[C_CHUNK, j]
        c = C[C_CHUNK_C, j]
        tokens += c
        if Ix[r, I_PFD] + c >= Ix[r, I_PTGT]:
            completing += 1
    dt_it = iteration_s(ms, dense, head, ddense, dhead, n, SF[SF_CTX], g, C, nch, Ix, tokens, completing)
    t_new = t + dt_it
    SI[SI_ITERS] += 1
    SI[SI_PROMPT_TOK] += tokens
    if n:
        advance_decode(F, SF, SI, C, itl_v, itl_n, 1, dt_it, dt_it, n, t_new)
    for j in range(nch):
        r = C[C_CHUNK, j]
        Ix[r, I_PFD] += C[C_CHUNK_C, j]
        if Ix[r, I_PFD] >= Ix[r, I_PTGT]:
            complete_prefill(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, r, t_new, ms, split)
    if n:
        if SI[SI_NFH] and H[0, 0] <= SI[SI_ITER]:
            finish_due(F, Ix, SF, SI, C, H, fin_out, t_new)
    return dt_it


@njit_borrowing
def preempt_for_growth(F, Ix, SF, SI, C, t):
    n = victim_order(F, Ix, SI, C)
    order = C[C_SCRATCH, :n]  # (preempt writes no C_SCRATCH)
    for j in range(n):
        preempt(F, Ix, SF, SI, C, order[j], t)
        if SI[SI_NDEC] == 0 or decode_kv_limit(F, Ix, SF, SI, C, 1) > 0:
            break
    return n > 0


@njit_borrowing
def decode_run(F, Ix, SF, SI, C, H, fin_out, itl_v, itl_n, t, t_end, ms, dense, head, ddense, dhead, horizon,
               unified):
    """`Engine._decode_run`; NaN for None (preempted)."""
    while SI[SI_NFH] and (H[0, 2] != Ix[H[0, 3], I_GEN] or Ix[H[0, 3], I_STATE] != DECODE):
        SI[SI_NFH] = fheap_pop(H, SI[SI_NFH])
    n = SI[SI_NDEC]
    g = SI[SI_DEPTH]
    context, per_iter = SF[SF_CTX], SF[SF_PER]
    a = iteration_s(ms, dense, head, ddense, dhead, n, context, g, C, 0, Ix, 0, 0)
    b = decode_slope(ms, g) * per_iter
    it = SI[SI_ITER]
    kcap = max(1, H[0, 0] - it) if SI[SI_NFH] else 1
    fresh = SI[SI_NFRESH]
    if fresh:
        kcap = 1
    stop = min(t_end, horizon)
    if kcap > 1:
        kcap = min(kcap, steps_to_cover(a, b, stop - t))
    if (context + kcap * per_iter + n) * INV_BLOCK + n <= SI[SI_KVTOT] - SI[SI_KVUSED]:
        k = kcap
    else:
        k = decode_kv_limit(F, Ix, SF, SI, C, kcap)
    if k == 0:
        v = victim(F, Ix, SI, C, unified, 0, False)
        if v >= 0:
            preempt(F, Ix, SF, SI, C, v, t)
        return math.nan
    total = k * a + b * k * (k - 1) * 0.5
    t_new = t + total
    SI[SI_ITERS] += k
    if fresh:
        advance_decode(F, SF, SI, C, itl_v, itl_n, k, total, a, n, t_new)
    else:
        SI[SI_ITER] = it + k
        SF[SF_CTX] = context + k * per_iter
        if g:
            SI[SI_SPEC_PROP] += g * n * k
            SF[SF_SPEC_ACC] += k * (per_iter - n)
        m = SI[SI_NITL]
        itl_v[m] = total / k
        itl_n[m] = n * k
        SI[SI_NITL] = m + 1
    if SI[SI_NFH] and H[0, 0] <= SI[SI_ITER]:
        finish_due(F, Ix, SF, SI, C, H, fin_out, t_new)
    return t_new


@njit_borrowing
def sample(F, Ix, SF, SI, C, samp_f, samp_i, t):
    used = SI[SI_KVUSED] + decode_blocks_exact(F, Ix, SI, C, 0)
    m = SI[SI_NSAMP]
    samp_f[m] = t
    samp_i[m, 0] = SI[SI_NDEC] + SI[SI_NPRE] + SI[SI_NTR]
    samp_i[m, 1] = SI[SI_NW]
    samp_i[m, 2] = used
    SI[SI_NSAMP] = m + 1
    SF[SF_NEXT_SAMPLE] = SF[SF_NEXT_SAMPLE] + SF[SF_DT] / SAMPLES_PER_WINDOW


@njit_borrowing
def _room(SI, itl_cap, H):
    """Room for one more pass: its ITL entries (the joiners' and a few more), a sample, and the finish
    heap's pushes (every request that may join the decoding ones)."""
    joins = SI[SI_NTR] + SI[SI_NPRE] + min(SI[SI_NW] + SI[SI_NREQ] - SI[SI_ARR_IDX], SI[SI_CAP])
    return (SI[SI_NITL] + SI[SI_NFRESH] + joins + 8 <= itl_cap and SI[SI_NSAMP] + 2 <= MAX_SAMPLES
            and SI[SI_NFH] + joins + 2 < H.shape[0])


@njit_borrowing
def run_unified(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, samp_f, samp_i, t_end, ms, dense, head,
                ddense, dhead):
    clock = SF[SF_CLOCK]
    budget0 = SI[SI_BUDGET]
    per_seq = SI[SI_DEPTH] + 1
    itl_cap = itl_v.shape[0]
    while clock < t_end:
        if not _room(SI, itl_cap, H):
            SF[SF_CLOCK] = clock
            return RUN_ROOM
        t = clock
        if t >= SF[SF_NEXT_SAMPLE]:
            sample(F, Ix, SF, SI, C, samp_f, samp_i, t)
        if SI[SI_ARR_IDX] < SI[SI_NREQ] and F[SI[SI_ARR_IDX], F_ARR] <= t:
            admit_arrivals(F, Ix, SI, C, t)
        if SI[SI_NTR]:
            process_joins(F, Ix, SF, SI, C, H, t)
        n = SI[SI_NDEC]
        preempted = False
        if n and ((SF[SF_CTX] + SF[SF_PER] + n) * INV_BLOCK + n > SI[SI_KVTOT] - SI[SI_KVUSED]) \
                and decode_kv_limit(F, Ix, SF, SI, C, 1) == 0:
            preempted = preempt_for_growth(F, Ix, SF, SI, C, t)
            n = SI[SI_NDEC]
        if SI[SI_NPRE] or SI[SI_NW]:
            nch = plan_prefill(F, Ix, SF, SI, C, fin_out, t, budget0 - n * per_seq, True, preempted)
            if nch:
                dt_it = run_chunks(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, nch, t, ms, dense,
                                   head, ddense, dhead, SI[SI_NDEC], False)
                SF[SF_BUSY] += dt_it
                clock = t + dt_it
                continue
        if SI[SI_NDEC]:
            horizon = F[C[C_TR, 0], F_READY] if SI[SI_NTR] else INF
            if preempted:
                horizon = t
            elif SI[SI_PR] or (not SI[SI_NW] and n + SI[SI_NPRE] + SI[SI_NTR] < SI[SI_CAP]):
                nxt = F[SI[SI_ARR_IDX], F_ARR] if SI[SI_ARR_IDX] < SI[SI_NREQ] else INF
                if nxt < horizon:
                    horizon = nxt
            t_new = decode_run(F, Ix, SF, SI, C, H, fin_out, itl_v, itl_n, t, t_end, ms, dense, head, ddense, dhead,
                               horizon, True)
            if not math.isnan(t_new):
                SF[SF_BUSY] += t_new - t
                clock = t_new
            continue
        if preempted:
            continue
        nxt = min(next_arrival(F, SI), F[C[C_TR, 0], F_READY] if SI[SI_NTR] else INF, t_end)
        clock = nxt if nxt > t else t_end
    SF[SF_CLOCK] = clock
    return RUN_DONE


@njit_borrowing
def run_split(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, samp_f, samp_i, t_end, mp, pdense, phead,
              pddense, pdhead, md, ddense_, dhead_, dddense, ddhead):
    share = SF[SF_SHARE]
    itl_cap = itl_v.shape[0]
    while True:
        if not _room(SI, itl_cap, H):
            return RUN_ROOM
        if SI[SI_NPRE] or (SI[SI_NW] and not SI[SI_PREBLK]):
            pnext = SF[SF_PCLOCK]
        else:
            pnext = max(SF[SF_PCLOCK], next_arrival(F, SI))
        if SI[SI_NDEC] or SI[SI_NFRESH]:
            dnext = SF[SF_DCLOCK]
        elif SI[SI_NTR]:
            dnext = max(SF[SF_DCLOCK], F[C[C_TR, 0], F_READY])
        else:
            dnext = INF
        now = min(pnext, dnext)
        if now >= t_end:
            SF[SF_PCLOCK] = max(SF[SF_PCLOCK], min(pnext, t_end))
            SF[SF_DCLOCK] = max(SF[SF_DCLOCK], min(dnext, t_end))
            break
        if now >= SF[SF_NEXT_SAMPLE]:
            sample(F, Ix, SF, SI, C, samp_f, samp_i, now)
        if pnext <= dnext:
            t = pnext
            SF[SF_PCLOCK] = t
            admit_arrivals(F, Ix, SI, C, t)
            nch = plan_prefill(F, Ix, SF, SI, C, fin_out, t, SI[SI_BUDGET], False, False)
            if not nch:
                SI[SI_PREBLK] = 1
                continue
            dt_it = run_chunks(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, nch, t, mp, pdense, phead,
                               pddense, pdhead, 0, True)
            SF[SF_BUSY] += dt_it * share
            SF[SF_PCLOCK] = t + dt_it
        else:
            t = dnext
            SF[SF_DCLOCK] = t
            process_joins(F, Ix, SF, SI, C, H, t)
            if not SI[SI_NDEC]:
                continue
            horizon = min(pnext, F[C[C_TR, 0], F_READY] if SI[SI_NTR] else INF)
            blocked = SI[SI_PREBLK]
            t_new = decode_run(F, Ix, SF, SI, C, H, fin_out, itl_v, itl_n, t, t_end, md, ddense_, dhead_, dddense,
                               ddhead, horizon, False)
            if not math.isnan(t_new):
                SF[SF_BUSY] += (t_new - t) * (1.0 - share)
                SF[SF_DCLOCK] = t_new
            if blocked and not SI[SI_PREBLK]:
                SF[SF_PCLOCK] = max(SF[SF_PCLOCK], SF[SF_DCLOCK])
    return RUN_DONE


# ----------------------------------------------------------------------------------- policy changes


@njit_borrowing
def resync_decoding(F, Ix, SF, SI, C, H):
    it, g = SI[SI_ITER], SI[SI_DEPTH]
    context = 0.0
    per_iter = 0.0
    n = SI[SI_NDEC]
    for j in range(n):
        r = C[C_DEC, j]
        p = F[r, F_PROG] + (it - Ix[r, I_SYNC]) * F[r, F_E]
        target = Ix[r, I_TARGET]
        if p >= target:
            p = float(target)
        F[r, F_PROG] = p
        Ix[r, I_SYNC] = it
        e = tokens_per_step(F[r, F_ACC], g)
        F[r, F_E] = e
        Ix[r, I_GEN] += 1
        fin = it + max(1, math.ceil((target - p) / e - 1e-9))
        Ix[r, I_FINIT] = fin
        H[j, 0] = fin
        H[j, 1] = Ix[r, I_RID]
        H[j, 2] = Ix[r, I_GEN]
        H[j, 3] = r
        context += Ix[r, I_PROMPT] + p
        per_iter += e
    fheapify(H, n)
    SI[SI_NFH] = n
    SI[SI_VER] += 1
    SF[SF_CTX] = context
    SF[SF_PER] = per_iter


@njit_borrowing
def reprioritise(F, Ix, SI, C, pr):
    """`Scheduler.configure`: the waiting heap re-keyed and heapified in place."""
    if pr != SI[SI_PR]:
        SI[SI_PR] = pr
        heapify(C[C_WQ], SI[SI_NW], 0, F, Ix, pr)


@njit_borrowing
def shrink_to_pool(F, Ix, SF, SI, C, now):
    """`Engine.configure`'s preemptions for a smaller pool, in victim order."""
    decode_blocks = decode_blocks_exact(F, Ix, SI, C, 0)
    if SI[SI_KVUSED] + decode_blocks > SI[SI_KVTOT]:
        n = victim_order(F, Ix, SI, C)
        order = C[C_SCRATCH, :n]  # (preempt writes no C_SCRATCH)
        for j in range(n):
            v = order[j]
            if SI[SI_KVUSED] + decode_blocks <= SI[SI_KVTOT]:
                break
            if Ix[v, I_STATE] == DECODE:
                decode_blocks -= blocks_held(F, Ix, v, SI[SI_ITER])
            preempt(F, Ix, SF, SI, C, v, now)
    SI[SI_PREBLK] = 0


# ----------------------------------------------------------------------------------- reporting


@njit_borrowing
def _settle(Ix, pend_idx, pend_cur, m, r, cur):
    """Request r pending at slot m with `cur` output tokens; returns the tokens produced since its last report."""
    new = cur - Ix[r, I_REP]
    Ix[r, I_REP] = cur
    pend_idx[m] = r
    pend_cur[m] = cur
    return new


@njit_borrowing
def close_window(F, Ix, SF, SI, C, pend_idx, pend_cur):
    """`Engine.close_window`'s arithmetic: the pending requests in report order (prefilling, in transfer,
    decoding, waiting) with their output tokens; the exact re-sums; the KV blocks used. Returns (pending count, blocks used)."""
    it = SI[SI_ITER]
    m = 0
    new_tokens = 0
    for row, cnt in ((C_PRE, SI[SI_NPRE]), (C_TR, SI[SI_NTR])):
        for j in range(cnt):
            r = C[row, j]
            new_tokens += _settle(Ix, pend_idx, pend_cur, m, r, int(F[r, F_PROG]))
            m += 1
    context = 0.0
    per_iter = 0.0
    decode_blocks = 0
    for j in range(SI[SI_NDEC]):
        r = C[C_DEC, j]
        p = F[r, F_PROG] + (it - Ix[r, I_SYNC]) * F[r, F_E]
        context += Ix[r, I_PROMPT] + p
        per_iter += F[r, F_E]
        tg = Ix[r, I_TARGET]
        if p < tg:
            decode_blocks += -(-math.ceil(Ix[r, I_PROMPT] + p) // BLOCK)
            cur = int(p)
        else:
            decode_blocks += -(-(Ix[r, I_PROMPT] + tg) // BLOCK)
            cur = tg
        new_tokens += _settle(Ix, pend_idx, pend_cur, m, r, cur)
        m += 1
    SF[SF_CTX] = context
    SF[SF_PER] = per_iter
    for j in range(SI[SI_NW]):
        r = C[C_WQ, j]
        new_tokens += _settle(Ix, pend_idx, pend_cur, m, r, int(F[r, F_PROG]))
        m += 1
    SI[SI_OUT_TOK] += new_tokens
    return m, SI[SI_KVUSED] + decode_blocks


@njit_borrowing
def gather_finished(F, Ix, rows, ints, floats):
    """The finished requests `rows` as a report's columns (shared/records.py: ints in `_INT_COLUMNS` order,
    floats in `_FLOAT_COLUMNS`, one row per column): status ok or rejected, the finish time and output
    tokens they ended with. Returns how many were rejected."""
    rejected = 0
    for j in range(rows.shape[0]):
        r = rows[j]
        ok = Ix[r, I_STATUS] == STATUS_OK
        _gather(F, Ix, r, j, ints, floats, RB_OK if ok else RB_REJECTED, F[r, F_FIN], Ix[r, I_OUT])
        rejected += 0 if ok else 1
    return rejected


@njit_borrowing
def gather_pending(F, Ix, rows, cur, ints, floats):
    """The pending requests `rows` (close_window's order) as a report's columns, as `gather_finished`:
    queued while waiting, else running; no finish time; `cur` output tokens so far."""
    for j in range(rows.shape[0]):
        r = rows[j]
        status = RB_QUEUED if Ix[r, I_STATE] == WAITING else RB_RUNNING
        _gather(F, Ix, r, j, ints, floats, status, math.nan, cur[j])


@njit_borrowing
def _gather(F, Ix, r, j, ints, floats, status, finish, out):
    ints[0, j] = Ix[r, I_RID]
    ints[1, j] = Ix[r, I_PRIO]
    ints[2, j] = Ix[r, I_PROMPT]
    ints[3, j] = Ix[r, I_TARGET]
    ints[4, j] = status
    ints[5, j] = out
    ints[6, j] = Ix[r, I_PRE]
    ints[7, j] = Ix[r, I_ATT]
    floats[0, j] = F[r, F_ARR]
    floats[1, j] = F[r, F_DISP]
    floats[2, j] = F[r, F_FT]
    floats[3, j] = finish
    floats[4, j] = 0.0  # the simulator charges per window, not per request


@njit_borrowing
def end_unified(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, samp_f, samp_i, t_end, dt, pend_idx,
                pend_cur, pint, pflt, fint, fflt, ft_rid, ms, dense, head, ddense, dhead):
    """A unified engine's window end in one call (ArrayEngine.end_window's steps, in its order): `run_unified`
    to t_end; the arrivals due admitted; the busy time less what runs past t_end (returned: the carry); the
    pending requests closed (`close_window`); the pending and finished requests gathered as report columns into
    pint/pflt and fint/fflt (`gather_pending`, `gather_finished`; room for every row), the first tokens' request
    ids into ft_rid. Returns (status, carry, pending count, KV blocks used, rejected); on RUN_ROOM only the status
    means anything (grow the buffers and call again). The counts of finished requests, first tokens and ITL
    samples are SI's."""
    status = run_unified(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, samp_f, samp_i, t_end, ms,
                         dense, head, ddense, dhead)
    if status != RUN_DONE:
        return status, 0.0, 0, 0, 0
    admit_arrivals(F, Ix, SI, C, INF)
    ou = SF[SF_CLOCK] - t_end  # as Engine.run (sim/engine.py): max(0, clock - t_end)
    if not ou > 0.0:
        ou = 0.0
    m, used, rejected = _close_gather(F, Ix, SF, SI, C, fin_out, ft_idx, pend_idx, pend_cur, pint, pflt, fint, fflt,
                                      ft_rid, SF[SF_BUSY] - ou, dt)
    return status, ou, m, used, rejected


@njit_borrowing
def end_split(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, samp_f, samp_i, t_end, dt, pend_idx,
              pend_cur, pint, pflt, fint, fflt, ft_rid, mp, pdense, phead, pddense, pdhead, md, ddense_, dhead_, dddense,
              ddhead):
    """`end_unified` of a split engine: `run_split` to t_end, the busy time less what each lane runs past t_end
    (weighted by the prefill lane's compute share; returned: the two carries), as Engine.run. Returns
    (status, prefill carry, decode carry, pending count, KV blocks used, rejected)."""
    status = run_split(F, Ix, SF, SI, C, H, fin_out, ft_idx, ft_val, itl_v, itl_n, samp_f, samp_i, t_end, mp, pdense,
                       phead, pddense, pdhead, md, ddense_, dhead_, dddense, ddhead)
    if status != RUN_DONE:
        return status, 0.0, 0.0, 0, 0, 0
    admit_arrivals(F, Ix, SI, C, INF)
    share = SF[SF_SHARE]
    op = SF[SF_PCLOCK] - t_end  # max(0, clock - t_end) per lane
    if not op > 0.0:
        op = 0.0
    od = SF[SF_DCLOCK] - t_end
    if not od > 0.0:
        od = 0.0
    m, used, rejected = _close_gather(F, Ix, SF, SI, C, fin_out, ft_idx, pend_idx, pend_cur, pint, pflt, fint, fflt,
                                      ft_rid, SF[SF_BUSY] - (op * share + od * (1.0 - share)), dt)
    return status, op, od, m, used, rejected


@njit_borrowing
def _close_gather(F, Ix, SF, SI, C, fin_out, ft_idx, pend_idx, pend_cur, pint, pflt, fint, fflt, ft_rid, busy, dt):
    """A window's end after its loop: the busy time set (`busy`, the loop's less what runs past the window,
    clamped to [0, dt] as Engine.run does), the window closed (`close_window`) and its report columns
    gathered (room for every row): the pending requests into pint/pflt, the finished into fint/fflt, the first
    tokens' request ids into ft_rid. Returns (pending count, KV blocks used, rejected)."""
    if 0.0 > busy:
        busy = 0.0
    if dt < busy:
        busy = dt
    SF[SF_BUSY] = busy
    m, used = close_window(F, Ix, SF, SI, C, pend_idx, pend_cur)
    gather_pending(F, Ix, pend_idx[:m], pend_cur[:m], pint, pflt)
    rejected = gather_finished(F, Ix, fin_out[:SI[SI_NFIN]], fint, fflt)
    for j in range(SI[SI_NFT]):
        ft_rid[j] = Ix[ft_idx[j], I_RID]
    return m, used, rejected


# the counters a window's measurements read, cleared as each window opens and once they are taken
WINDOW_COUNTERS = (SI_NFIN, SI_NFT, SI_NITL, SI_NSAMP, SI_OUT_TOK, SI_PROMPT_TOK, SI_EVICT, SI_SPEC_PROP, SI_ITERS,
                   SI_REJ)


@njit_borrowing
def clear_window(SF, SI):
    """An empty set of window measurements: the window counters and the accepted draft tokens at zero."""
    for k in WINDOW_COUNTERS:
        SI[k] = 0
    SF[SF_SPEC_ACC] = 0.0


@njit_borrowing
def open_window(SF, SI, t0, dt, busy):
    """`ArrayEngine.start_window`'s scalars in one call: the counters cleared, the window's start, length, first
    sample time and the busy time carried into it set. Returns how many rows hold finished requests."""
    clear_window(SF, SI)
    SF[SF_T0] = t0
    SF[SF_DT] = dt
    SF[SF_NEXT_SAMPLE] = t0 + dt / SAMPLES_PER_WINDOW
    SF[SF_BUSY] = busy
    return SI[SI_NREQ] - (SI[SI_NDEC] + SI[SI_NPRE] + SI[SI_NTR] + SI[SI_NW])


@njit_borrowing
def add_rows(F, Ix, SI, arrival_s, request_id, priority, prompt, output):
    """Rows for a window's arrivals after the last (`ArrayEngine._add`: one call for the seven column writes);
    their acceptance rates are written apart (drawn, or owed)."""
    n0 = SI[SI_NREQ]
    for j in range(arrival_s.shape[0]):
        r = n0 + j
        F[r, F_ARR] = arrival_s[j]
        Ix[r, I_RID] = request_id[j]
        Ix[r, I_PRIO] = priority[j]
        Ix[r, I_PROMPT] = prompt[j]
        Ix[r, I_PTGT] = prompt[j]
        Ix[r, I_TARGET] = output[j]
    SI[SI_NREQ] = n0 + arrival_s.shape[0]


@njit_borrowing
def compact(F, Ix, SI, C, H, new):
    """Drop the finished requests' rows in place, the others keeping their order (`ArrayEngine._compact`):
    `new[:n]` gets each old row's new index (-1: dropped); the freed rows are reset to a fresh state's, the
    ordered rows of C renumbered, the finish heap keeps the live requests' entries (renumbered) and is
    re-heapified. Returns the rows kept."""
    n = SI[SI_NREQ]
    m = 0
    for i in range(n):
        if Ix[i, I_STATE] == DONE:
            new[i] = -1
            continue
        new[i] = m
        if m != i:
            for c in range(NF):
                F[m, c] = F[i, c]
            for c in range(NI):
                Ix[m, c] = Ix[i, c]
        m += 1
    for i in range(m, n):
        for c in range(NF):
            F[i, c] = FRESH_F[c]
        for c in range(NI):
            Ix[i, c] = 0
    for row, cnt in ((C_DEC, SI[SI_NDEC]), (C_PRE, SI[SI_NPRE]), (C_TR, SI[SI_NTR]), (C_FRESH, SI[SI_NFRESH]),
                     (C_WQ, SI[SI_NW])):
        for j in range(cnt):
            C[row, j] = new[C[row, j]]
    k = 0
    for j in range(SI[SI_NFH]):
        r = new[H[j, 3]]
        if r >= 0:
            H[k, 0] = H[j, 0]
            H[k, 1] = H[j, 1]
            H[k, 2] = H[j, 2]
            H[k, 3] = r
            k += 1
    fheapify(H, k)
    SI[SI_NFH] = k
    SI[SI_NREQ] = m
    SI[SI_ARR_IDX] = m
    return m


@njit_borrowing
def renumber_owed(new, rows, draws, row, draw, since, out_rows, out_draws):
    """The rows of the acceptance-rate draws still owed after a compaction (`ArrayEngine._compact`; `new`: each old
    row's new index, -1 where dropped), with their places among the draws, into out_rows/out_draws: those held
    through earlier compactions (`rows`, `draws`), then the block owed since (rows row.., places draw.., `since`
    of them), the dropped left out, in order. Returns how many."""
    k = 0
    for j in range(rows.shape[0]):
        r = new[rows[j]]
        if r >= 0:
            out_rows[k] = r
            out_draws[k] = draws[j]
            k += 1
    for j in range(since):
        r = new[row + j]
        if r >= 0:
            out_rows[k] = r
            out_draws[k] = draw + j
            k += 1
    return k


@njit_borrowing
def outstanding_tokens(F, Ix, SI, C):
    """`Engine.outstanding_tokens` (shared/routing.py `outstanding_work` per request)."""
    it = SI[SI_ITER]
    total = 0.0
    for r in range(SI[SI_ARR_IDX], SI[SI_NREQ]):
        total += _work(F, Ix, r, it)
    for row, cnt in ((C_WQ, SI[SI_NW]), (C_PRE, SI[SI_NPRE]), (C_TR, SI[SI_NTR]), (C_DEC, SI[SI_NDEC])):
        for j in range(cnt):
            total += _work(F, Ix, C[row, j], it)
    return total


@njit_borrowing
def _work(F, Ix, r, it):
    if Ix[r, I_STATE] == DECODE:
        p = F[r, F_PROG] + (it - Ix[r, I_SYNC]) * F[r, F_E]
        prog = p if p < Ix[r, I_TARGET] else float(Ix[r, I_TARGET])
    else:
        prog = F[r, F_PROG]
    produced = int(prog)
    started = not math.isnan(F[r, F_FT])
    return max(0, Ix[r, I_TARGET] - produced) + (0 if started else Ix[r, I_PROMPT] - Ix[r, I_RHIT])


def empty_state(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(F, Ix, SF, SI, C, H) of an engine with room for `capacity` requests."""
    F = np.empty((capacity, NF))
    F[:] = FRESH_F
    return (F, np.zeros((capacity, NI), dtype=np.int64), np.zeros(NSF), np.zeros(NSI, dtype=np.int64),
            np.zeros((NC, capacity), dtype=np.int64), np.zeros((2 * capacity + 1, 4), dtype=np.int64))
