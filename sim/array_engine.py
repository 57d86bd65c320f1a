"""`ArrayEngine`: sim/engine.py's `Engine` with its event loop compiled (sim/compiled_core.py), over arrays.

The same interface and, bit for bit, the same results as `Engine` (tests/test_array_engine.py plays
random actions through both, window by window): what changes is where the requests live (rows of
arrays rather than objects) and who runs the loop (numba rather than CPython). The finished and pending
requests are handed over as columns (shared/records.py `RequestBatch`), read as records only by a
reader that asks for them.

`supports(profile)` says whether a profile is in its scope (no slots or prompt breaks, a kernel-fitted
step-time model); arrivals carrying prefix ids are refused (ValueError): the Python engine serves
prefix caching. `make_engine` picks this engine where numba imports and the profile is in scope, the
Python engine elsewhere; `LLMSERVE_SIM_CORE=python` forces the Python engine, `compiled` requires
this one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llmserve_env.shared import records as rb
from llmserve_env.shared.arrival_list import ArrivalColumns, arrival_columns
from llmserve_env.shared.backend import Arrival, RequestRecord
from llmserve_env.shared.records import FirstTokens, ItlSamples, RequestBatch
from llmserve_env.sim import compiled_core as cc
from llmserve_env.sim.compiled_random import HAVE_COMPILED_DRAWS, beta_draws
from llmserve_env.sim.engine import (
    Engine,
    WindowMeasurements,
    tenant_acceptance_rates,
)
from llmserve_env.sim.kv_cache import KVCache
from llmserve_env.sim.lanes import lane_shares
from llmserve_env.sim.profiles import Profile
from llmserve_env.sim.prompt_breaks import PromptBreaks
from llmserve_env.sim.resource_samples import Block, SampleColumns
from llmserve_env.sim.slot_cache import SlotCacheSpec
from llmserve_env.sim.step_time import IterationModel, StepTimeModel

if TYPE_CHECKING:
    from llmserve_env.shared.models import ServeAction

INF = math.inf
CORES = ("auto", "python", "compiled")
SIM_CORE_ENV = "LLMSERVE_SIM_CORE"
SIM_CORE_HELP = ("which engine the simulator runs: `auto` the compiled one (numba, sim/array_engine.py) where it "
                 "applies, else the Python one; `python` always the Python one (sim/engine.py); `compiled` the "
                 "compiled one or an error. Both give bit-identical episodes")
# Finished requests' rows are dropped (`ArrayEngine._compact`) at a window's start once there are this many and
# at least as many as live ones: forks copy every row, and a long episode would otherwise keep them all
COMPACT_MIN_DONE = 256
# Rows an engine starts with: it holds up to about 2 x COMPACT_MIN_DONE before a compaction, so a busy engine
# reached 512 anyway through three doublings (each a copy of every per-request array: ~1 % of a cluster
# episode, where every new replica's engine grew so); the size changes no result (tests/test_array_engine.py).
INITIAL_ROWS = 2 * COMPACT_MIN_DONE
REJECTED_WHY = "request needs more KV blocks than the whole budget"  # sim/engine.py's words

# A model's packed arrays, keyed by the model object's id (the model kept alive beside them): shared by every
# engine and fork, never written
_PACKED: dict[int, tuple[IterationModel, tuple[np.ndarray, ...]]] = {}


def _packed(model: StepTimeModel) -> tuple[np.ndarray, ...]:
    got = _PACKED.get(id(model))
    if got is not None and got[0] is model:
        return got[1]
    ms = np.zeros(cc.NM)
    pf = model.pre_fit
    for k, v in ((cc.M_TFIX, model.t_fixed), (cc.M_TFIXD, model.t_fixed_draft), (cc.M_DEC_C0, model.dec_c0),
                 (cc.M_DEC_SEQ, model.dec_seq), (cc.M_DEC_CTX, model.dec_ctx), (cc.M_DDEC_C0, model.ddec_c0),
                 (cc.M_DDEC_SEQ, model.ddec_seq), (cc.M_DDEC_CTX, model.ddec_ctx), (cc.M_PRE_LAYERS, model.pre_layers),
                 (cc.M_PF_C0, pf.c0_us), (cc.M_PF_BW, pf.bw_gbs), (cc.M_PF_TF, pf.tflops), (cc.M_PF_P, pf.p),
                 (cc.M_HEADS, model.heads), (cc.M_KVH, model.kv_heads), (cc.M_HD, model.head_dim),
                 (cc.M_ELEM, model.attn_elem_bytes), (cc.M_XC0, model.xfer_c0), (cc.M_XPT, model.xfer_per_token)):
        ms[k] = v
    arrays = (ms, np.asarray(model.dense, dtype=float), np.asarray(model.head, dtype=float),
              np.asarray(model.draft_dense, dtype=float), np.asarray(model.draft_head, dtype=float))
    _PACKED[id(model)] = (model, arrays)
    return arrays


def supports(profile: Profile, models: dict) -> bool:
    """True when the compiled engine serves this profile as the Python one does."""
    engine = profile.raw.get("engine", {})
    if SlotCacheSpec.from_engine(engine) is not None or PromptBreaks.from_engine(engine) is not None:
        return False
    return not models or all(type(m) is StepTimeModel for m in models.values())


def core_choice() -> str:
    core = os.environ.get(SIM_CORE_ENV, "auto")
    if core not in CORES:
        raise ValueError(f"{SIM_CORE_ENV} must be one of {', '.join(CORES)}, got {core!r}")
    return core


def make_engine(profile: Profile, seed: int, models: dict) -> Engine | ArrayEngine:
    """The compiled engine where it applies (numba installed, the profile in scope), else the Python one."""
    core = core_choice()
    if core == "python":
        return Engine(profile, seed, models)
    ok = cc.HAVE_NUMBA and supports(profile, models)
    if core == "compiled" and not ok:
        why = "numba is not installed" if not cc.HAVE_NUMBA else f"profile {profile.id} is outside its scope"
        raise RuntimeError(f"LLMSERVE_SIM_CORE=compiled: {why}")
    return ArrayEngine(profile, seed, models) if ok else Engine(profile, seed, models)


@dataclass(slots=True)
class WindowEnd:
    """A compiled engine's window after its loop (`ArrayEngine.end_in_place`): how many pending and finished
    requests, first tokens and ITL samples its buffers hold, how many of the finished were rejected, the KV
    blocks used and their GPU memory, and the window's counters (`acc`, its requests not yet set)."""

    engine: ArrayEngine
    pending: int
    finished: int
    first_tokens: int
    itl: int
    rejected: int
    used: int
    mem: float
    acc: WindowMeasurements


class ArrayEngine:
    """One simulated serving engine, its loop compiled: drive it as `Engine` (see there)."""

    def __init__(self, profile: Profile, seed: int, models: dict[tuple[str, str], IterationModel]):
        self.profile = profile
        self.models = models
        self.seed = seed
        self.rng = np.random.default_rng([int(seed), 0x5EED51])  # the engine stream, as Engine's
        # Prefix caching is outside this engine's scope, and whether arrivals carry prefix ids is known only when
        # they come: until the first request, every call is logged, so that an engine whose first arrivals carry
        # prefix ids hands over to a Python `Engine` that replays the log (the same calls: the same state), and
        # forwards every call to it from then on (`_py`).
        self._log: list[tuple[str, tuple]] | None = []
        self._py: Engine | None = None
        self.kv = KVCache()
        self.F, self.Ix, self.SF, self.SI, self.C, self.H = cc.empty_state(INITIAL_ROWS)
        self.SF[cc.SF_NEXT_SAMPLE] = INF
        self.SF[cc.SF_DT] = 1.0
        self.SF[cc.SF_SHARE] = profile.split_prefill_compute_share
        self.SI[cc.SI_MEMO_IT] = -1
        self.SI[cc.SI_CAP] = 1
        self.SI[cc.SI_KVTOT] = 1
        self.SI[cc.SI_BUDGET] = profile.token_budget
        self.tenants = np.empty(INITIAL_ROWS, dtype=object)  # each request's tenant name
        self.fin_out = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self.ft_idx = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self.ft_val = np.zeros(INITIAL_ROWS)
        self.itl_v = np.zeros(1024)
        self.itl_n = np.zeros(1024, dtype=np.int64)
        self.samp_f = np.zeros(cc.MAX_SAMPLES)
        self.samp_i = np.zeros((cc.MAX_SAMPLES, 3), dtype=np.int64)
        self.pend_idx = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self.pend_cur = np.zeros(INITIAL_ROWS, dtype=np.int64)
        # end_unified's report columns (pending ints/floats, finished ints/floats, first tokens' ids), a row per
        # request: the kernels allocate nothing (shared/jit.py `njit_borrowing`), the report gets copies
        self.out_pi, self.out_pf = np.zeros((8, INITIAL_ROWS), dtype=np.int64), np.zeros((5, INITIAL_ROWS))
        self.out_fi, self.out_ff = np.zeros((8, INITIAL_ROWS), dtype=np.int64), np.zeros((5, INITIAL_ROWS))
        self.out_ft = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self.samples: list[Block] = []  # the window's resource samples so far (sim/resource_samples.py)
        # Acceptance rates owed (`_add`): while the engine proposes no draft tokens nothing reads a request's rate,
        # so the draws wait, in arrival order, until it speculates (`_settle_rates`). Every owed draw's tenant, in
        # order; the rows still held of those owed before the last compaction (and their places among the draws:
        # a dropped row's draw is still made, in turn); those owed since fill consecutive rows from `_owed_block`'s
        # row on (its first draw's place beside it)
        self._owed_tenants: list[np.ndarray] = []
        self._owed_known: list[tuple[tuple[str, ...], np.ndarray] | None] = []  # each batch's `known_index`
        self._owed_count = 0
        self._owed_rows = self._owed_draws = np.empty(0, dtype=np.int64)
        self._owed_block = (0, 0)
        self.action_key: tuple | None = None
        self.tier = "FP16"
        self.split = False
        self.carry = (0.0, 0.0, 0.0)
        self.t0 = 0.0
        self.dt = 1.0
        # the step-time models the loop runs under (configure's tier and lane: unified, or prefill then decode),
        # packed once per action change rather than looked up every window
        self._lanes = self._model("FP16", "unified")

    # ----------------------------------------------------------------------------------- storage

    def _grow(self, need: int) -> None:
        """Room for `need` requests in every per-request array (doubling)."""
        cap = self.F.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        F, Ix, _, _, C, _ = cc.empty_state(new)
        F[:cap] = self.F
        Ix[:cap] = self.Ix
        C[:, :cap] = self.C
        H = np.zeros((max(2 * new + 1, self.H.shape[0]), 4), dtype=np.int64)
        H[:self.H.shape[0] - 1] = self.H[:-1]
        self.F, self.Ix, self.C, self.H = F, Ix, C, H
        for name in ("tenants", "fin_out", "ft_idx", "ft_val", "pend_idx", "pend_cur", "out_ft"):
            old = getattr(self, name)
            arr = np.zeros(new, dtype=old.dtype)
            arr[:cap] = old
            setattr(self, name, arr)
        for name in ("out_pi", "out_pf", "out_fi", "out_ff"):  # outputs only: nothing to keep
            old = getattr(self, name)
            setattr(self, name, np.zeros((old.shape[0], new), dtype=old.dtype))

    def _compact(self) -> None:
        """Drop the finished requests' rows, keeping the others' order (between windows: every arrival is queued,
        the window's outputs were taken). The ordered rows of C and the heaps keep their layouts with the requests
        renumbered; the finish heap loses the entries of finished requests (stale entries, which every pop skips:
        the pops' order is its keys' order, unique, whatever the layout). One kernel call (compiled_core.compact)."""
        SI = self.SI
        n = int(SI[cc.SI_NREQ])
        if int(SI[cc.SI_ARR_IDX]) != n:
            return
        new = np.empty(n, dtype=np.int64)
        m = cc.compact(self.F, self.Ix, SI, self.C, self.H, new)
        self.tenants[:m] = self.tenants[:n][new[:n] >= 0]
        if self._owed_count:  # the owed rows still held, renumbered (one kernel call rather than ~8 array calls)
            row, draw = self._owed_block
            since = self._owed_count - draw
            size = len(self._owed_rows) + since
            rows, draws = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
            k = cc.renumber_owed(new, self._owed_rows, self._owed_draws, row, draw, since, rows, draws)
            self._owed_rows, self._owed_draws = rows[:k], draws[:k]
            self._owed_block = (m, self._owed_count)

    def _more_room(self) -> None:
        """The loop stopped for want of output room: double the ITL buffer and the finish heap."""
        for name in ("itl_v", "itl_n"):
            old = getattr(self, name)
            arr = np.zeros(2 * old.shape[0], dtype=old.dtype)
            arr[:old.shape[0]] = old
            setattr(self, name, arr)
        H = np.zeros((2 * self.H.shape[0], 4), dtype=np.int64)
        H[:self.H.shape[0] - 1] = self.H[:-1]
        self.H = H

    def _model(self, tier: str, lane: str) -> tuple[np.ndarray, ...]:
        key = (tier, lane)
        m = self.models.get(key)
        if m is None:
            m = self.models[key] = StepTimeModel(self.profile, tier, *lane_shares(self.profile, lane))
        if type(m) is not StepTimeModel:
            raise TypeError(f"ArrayEngine runs kernel-fitted step-time models, not {type(m).__name__}")
        return _packed(m)

    # ----------------------------------------------------------------------------------- policy

    def configure(self, batch_cap: int, kv_fraction: float, depth: int, tier: str, split: bool,
                  priority_routing: bool) -> None:
        if self._py is not None:
            return self._py.configure(batch_cap, kv_fraction, depth, tier, split, priority_routing)
        if self._log is not None:
            self._log.append(("configure", (batch_cap, kv_fraction, depth, tier, split, priority_routing)))
        key = (batch_cap, kv_fraction, depth, tier, split, priority_routing)
        if key == self.action_key:
            return None
        self.action_key = key
        SF, SI = self.SF, self.SI
        self.kv.configure(self.profile, tier, depth > 0, kv_fraction)
        SI[cc.SI_CAP] = batch_cap
        SI[cc.SI_KVTOT] = self.kv.total
        if depth and self._owed_count:  # the rates are read from now on (resync_decoding, join_decode)
            self._settle_rates()
        if int(priority_routing) != SI[cc.SI_PR]:  # (the kernel checks too: this saves the call)
            cc.reprioritise(self.F, self.Ix, SI, self.C, int(priority_routing))
        if split != self.split:
            if split:
                SF[cc.SF_PCLOCK] = SF[cc.SF_DCLOCK] = SF[cc.SF_CLOCK]
            else:
                SF[cc.SF_CLOCK] = max(SF[cc.SF_PCLOCK], SF[cc.SF_DCLOCK])
            self.split = split
        self.tier = tier
        self._lanes = (*self._model(tier, "prefill"), *self._model(tier, "decode")) if split else \
            self._model(tier, "unified")
        if depth != SI[cc.SI_DEPTH]:
            SI[cc.SI_DEPTH] = depth
            if SI[cc.SI_NDEC] > self.H.shape[0] - 1:
                self._more_room()
            cc.resync_decoding(self.F, self.Ix, SF, SI, self.C, self.H)
        now = max(SF[cc.SF_PCLOCK], SF[cc.SF_DCLOCK]) if split else SF[cc.SF_CLOCK]
        cc.shrink_to_pool(self.F, self.Ix, SF, SI, self.C, now)
        return None

    def _hand_over(self, prefixed: bool) -> bool:
        """True when arrivals go to the Python engine (`prefixed`: they carry prefix ids; see __init__)."""
        if self._py is not None:
            return True
        if not prefixed:
            return False
        if self._log is None:
            raise ValueError("arrivals with prefix ids after requests without: the compiled engine serves no prefix "
                             "caching (LLMSERVE_SIM_CORE=python serves them)")
        py = Engine(self.profile, self.seed, self.models)
        for name, args in self._log:
            getattr(py, name)(*args)
        self._py, self._log, self.kv = py, None, py.kv
        return True

    # ----------------------------------------------------------------------------------- window

    def start_window(self, arrivals: Sequence[Arrival], t0: float, dt: float) -> None:
        # no arrivals (a cluster's idle replica, most windows): no columns to gather (~9 us), nothing to hand over
        cols = arrival_columns(arrivals) if self._py is None and len(arrivals) else None
        if self._py is not None or (cols is not None and self._hand_over(cols.prefixed)):
            assert self._py is not None
            self._py.start_window(arrivals, t0, dt)
            return None
        if self._log is not None:
            if arrivals:
                self._log = None
            else:
                self._log.append(("start_window", ([], t0, dt)))
        cu, cp, cd = self.carry
        share = self.profile.split_prefill_compute_share
        busy = min(cu, dt) + share * min(cp, dt) + (1.0 - share) * min(cd, dt)
        # the counters cleared, the window's clocks and carried busy time set (one call); rows of finished requests
        done = cc.open_window(self.SF, self.SI, t0, dt, busy)
        self.samples = []
        self.t0, self.dt = t0, dt
        if done >= COMPACT_MIN_DONE and 2 * done >= self.SI[cc.SI_NREQ]:
            self._compact()
        if cols is not None:
            self._add(cols)
        return None

    def _add(self, cols: ArrivalColumns) -> None:
        """Rows for these arrivals, with their acceptance rates: drawn here for a window's arrivals at once where
        the engine speculates, else owed (`_settle_rates`: drawn in turn once it does)."""
        SI = self.SI
        n0 = int(SI[cc.SI_NREQ])
        n = len(cols)
        self._grow(n0 + n)
        F = self.F
        rows = slice(n0, n0 + n)
        if SI[cc.SI_DEPTH]:
            if self._owed_count:
                self._settle_rates()
            known = cols.known_index
            F[rows, cc.F_ACC] = tenant_acceptance_rates(self.profile, self.rng, cols.tenant, *(known or ()))
        else:
            if not self._owed_count:
                self._owed_block = (n0, 0)
            self._owed_tenants.append(cols.tenant)
            self._owed_known.append(cols.known_index)
            self._owed_count += n
        self.tenants[rows] = cols.tenant
        cc.add_rows(F, self.Ix, SI, cols.arrival_s, cols.request_id, cols.priority, cols.prompt_tokens,
                    cols.output_tokens)

    def _settle_rates(self) -> None:
        """The owed acceptance rates drawn, in arrival order, as `_add` would have drawn them (the same numbers:
        NumPy and the compiled draws go row by row, one tenant or several), into the rows still held."""
        parts, known = self._owed_tenants, self._owed_known
        tenants = parts[0] if len(parts) == 1 else np.concatenate(parts)
        among = known[0][0] if known[0] is not None else None
        if among is not None and all(k is not None and k[0] == among for k in known):  # no name looked up
            index = known[0][1] if len(known) == 1 else np.concatenate([k[1] for k in known])  # type: ignore[index]
            rates = tenant_acceptance_rates(self.profile, self.rng, tenants, among, index)
        else:
            rates = tenant_acceptance_rates(self.profile, self.rng, tenants)
        row, draw = self._owed_block  # those owed since the last compaction: one block of rows
        F = self.F
        F[row:row + self._owed_count - draw, cc.F_ACC] = rates[draw:]
        if len(self._owed_rows):
            F[self._owed_rows, cc.F_ACC] = rates[self._owed_draws]
        self._owed_tenants, self._owed_known, self._owed_count = [], [], 0
        self._owed_rows = self._owed_draws = np.empty(0, dtype=np.int64)

    def begin_window(self, action: ServeAction, t0: float, dt: float, arrivals: Sequence[Arrival] | None = None) -> None:
        self.configure(action.batch_cap, action.kv_budget_fraction, action.speculation_depth,
                       action.quantization_tier, action.prefill_decode_split, action.priority_routing)
        self.start_window(arrivals or [], t0, dt)

    def add_arrival(self, a: Arrival, routed_hit: int = 0) -> None:
        if self._hand_over(a.prefix_ids is not None):
            assert self._py is not None
            self._py.add_arrival(a, routed_hit)
            return None
        self._log = None
        self._add(ArrivalColumns.of([a]))
        self.Ix[int(self.SI[cc.SI_NREQ]) - 1, cc.I_RHIT] = routed_hit
        return None

    def advance(self, t: float) -> None:
        if self._py is not None:
            return self._py.advance(t)
        if self._log is not None:
            self._log.append(("advance", (t,)))
        while True:
            run = cc.run_split if self.split else cc.run_unified
            status = run(self.F, self.Ix, self.SF, self.SI, self.C, self.H, self.fin_out, self.ft_idx, self.ft_val,
                         self.itl_v, self.itl_n, self.samp_f, self.samp_i, t, *self._lanes)
            if status == cc.RUN_DONE:
                return None
            self._flush_samples()
            self._more_room()

    def _flush_samples(self) -> None:
        """The loop stopped for want of room: its samples so far kept (copies), the buffer emptied."""
        n = int(self.SI[cc.SI_NSAMP])
        if n:
            self._sample_block(n, None)
            self.SI[cc.SI_NSAMP] = 0

    def _sample_block(self, n: int, close: tuple[float, int, int, int] | None) -> None:
        """The sample buffer's first n rows (copies), then `close` (the window-end sample, or None), kept with the
        KV pool's figures (sim/resource_samples.py `Block`)."""
        kv = self.kv
        self.samples.append((self.samp_f[:n].copy(), self.samp_i[:n].copy(), close, kv.total, kv.weights_gib,
                             kv.block_bytes, kv.gpus))

    def end_window(self) -> tuple[list[RequestRecord] | RequestBatch, int, float, WindowMeasurements]:
        """`run`, `close_window` and `take_measurements` (sim/engine.py's end_window) in the same kernel call as
        the window's loop (compiled_core.end_unified / end_split): the same state after, the same report."""
        if self._py is not None:
            return self._py.end_window()
        return self.report(self.end_in_place())

    def report(self, end: WindowEnd) -> tuple[RequestBatch, int, float, WindowMeasurements]:
        """`end_window`'s return, its requests, first tokens and ITL samples copied out of the buffers `end_in_place`
        left them in (`end`: this engine's last, no window begun since)."""
        pi, pf, pt, fi, ff, ft, t_rid, t_ten, t_val, gap, count = self.outputs(end)  # (the tenants gathered: copies)
        acc = end.acc
        acc.finished = RequestBatch.from_blocks(fi.copy(), ff.copy(), ft, rejected_messages(fi[4], end.rejected), {})
        acc.first_tokens = FirstTokens(t_rid.copy(), t_ten, t_val.copy())
        acc.itl = ItlSamples(gap.copy(), count.copy())
        return RequestBatch.from_blocks(pi.copy(), pf.copy(), pt, {}, {}), end.used, end.mem, acc

    def outputs(self, end: WindowEnd) -> tuple[np.ndarray, ...]:
        """The window's outputs as they lie in this engine's buffers after `end_in_place` (`end`, no window begun
        since): views, the tenant columns gathered. In order: the pending requests' int and float blocks
        (shared/records.py's column order) and tenants, the finished requests' likewise, the first tokens' request
        ids, tenants and TTFTs, the ITL samples' gaps and counts."""
        m, n, k, r = end.pending, end.finished, end.first_tokens, end.itl
        tenants = self.tenants
        return (self.out_pi[:, :m], self.out_pf[:, :m], tenants[self.pend_idx[:m]],
                self.out_fi[:, :n], self.out_ff[:, :n], tenants[self.fin_out[:n]],
                self.out_ft[:k], tenants[self.ft_idx[:k]], self.ft_val[:k], self.itl_v[:r], self.itl_n[:r])

    def end_in_place(self) -> WindowEnd:
        """`end_window` with the window's requests, first tokens and ITL samples left in this engine's buffers (valid
        until its next window): `end_window` copies them into its report, a cluster into its window's joined
        columns (sim/window_join.py). Only for the compiled engine's own windows (not after a hand-over)."""
        assert self._py is None, "end_in_place: this engine handed its requests to the Python engine"
        if self._log is not None:  # no request yet: the call a Python engine replays (see __init__)
            self._log.append(("end_window", ()))
        t_end = self.t0 + self.dt
        while True:
            args = (self.F, self.Ix, self.SF, self.SI, self.C, self.H, self.fin_out, self.ft_idx, self.ft_val,
                    self.itl_v, self.itl_n, self.samp_f, self.samp_i, t_end, self.dt, self.pend_idx, self.pend_cur,
                    self.out_pi, self.out_pf, self.out_fi, self.out_ff, self.out_ft)
            if self.split:
                status, op, od, m, used, rejected = cc.end_split(*args, *self._lanes)
                carry = (0.0, op, od)
            else:
                status, ou, m, used, rejected = cc.end_unified(*args, *self._lanes)
                carry = (ou, 0.0, 0.0)
            if status == cc.RUN_DONE:
                break
            self._flush_samples()
            self._more_room()
        self.carry = carry
        si = self.SI.tolist()  # one conversion: Python ints
        mem = self._close_samples(used, si)
        acc = WindowMeasurements()
        end = WindowEnd(self, m, si[cc.SI_NFIN], si[cc.SI_NFT], si[cc.SI_NITL], rejected, used, mem, acc)
        self._measured(acc, si)
        return end

    def outstanding_tokens(self) -> float:
        if self._py is not None:
            return self._py.outstanding_tokens()
        return float(cc.outstanding_tokens(self.F, self.Ix, self.SI, self.C))

    def serve_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float,
                     dt: float) -> tuple[list[RequestRecord] | RequestBatch, int, float, WindowMeasurements]:
        self.begin_window(action, t0, dt, arrivals)
        return self.end_window()

    # ----------------------------------------------------------------------------------- reporting

    def cached_units(self, keys: tuple[int, ...], cap: int) -> int:
        return self._py.cached_units(keys, cap) if self._py is not None else 0  # no prefix cache here

    @property
    def cached_blocks(self) -> int:
        return self._py.cached_blocks if self._py is not None else 0

    def _measured(self, acc: WindowMeasurements, si: list[int]) -> None:
        """The window's counters (`si`: SI as a list) into `acc`, then cleared."""
        sf = self.SF.tolist()  # one conversion: Python floats
        acc.samples = SampleColumns(self.samples)
        acc.output_tokens = si[cc.SI_OUT_TOK]
        acc.prompt_tokens = si[cc.SI_PROMPT_TOK]
        acc.evictions = si[cc.SI_EVICT]
        acc.spec_proposed = si[cc.SI_SPEC_PROP]
        acc.spec_accepted = sf[cc.SF_SPEC_ACC]
        acc.busy = sf[cc.SF_BUSY]
        acc.iterations = si[cc.SI_ITERS]
        acc.rejected = si[cc.SI_REJ]
        cc.clear_window(self.SF, self.SI)  # an empty set of window measurements (Engine's fresh WindowMeasurements)
        self.samples = []

    def _close_samples(self, used: int, si: list[int]) -> float:
        """The window's last samples taken (the buffer's rows, then the resources at the window's end, after the
        close; `si`: SI as a list; the buffer is emptied with the window's counters); returns the GPU memory
        `used` KV blocks take."""
        self._sample_block(si[cc.SI_NSAMP], (self.t0 + self.dt, si[cc.SI_NDEC] + si[cc.SI_NPRE] + si[cc.SI_NTR],
                                             si[cc.SI_NW], used))
        return self.kv.memory_gib(used)


def rejected_messages(status: np.ndarray, rejected: int) -> dict[int, str]:
    """The error map (row -> reason) of finished requests whose `status` column is given (`rejected` of them
    rejected: none looked for where it is 0)."""
    if not rejected:
        return {}
    return dict.fromkeys(np.flatnonzero(status == rb.REJECTED).tolist(), REJECTED_WHY)


_WARM = False


def warm() -> None:
    """Compile (or load from numba's cache) every kernel before the first episode needs them: a few windows of
    a small engine, unified and split, with speculation and priority routing. Once per process; ~15 s the
    first time on a fresh checkout (2-core machine), well under a second from the cache after."""
    global _WARM
    if _WARM or not cc.HAVE_NUMBA or core_choice() == "python":
        return
    from llmserve_env.shared.models import ServeAction
    from llmserve_env.sim.profiles import load_profile

    profile = load_profile("h100-llama3.1-8b")
    eng = ArrayEngine(profile, 0, {})
    arrivals = [Arrival(i, 0.01 * i, 200 + 50 * i, 20 + i, priority=i % 2) for i in range(8)]
    for k, split in enumerate((False, True, False)):
        action = ServeAction(batch_cap=4, kv_budget_fraction=0.5, speculation_depth=2 * k,
                             quantization_tier="FP16", prefill_decode_split=split, priority_routing=k == 1)
        eng.begin_window(action, float(k), 1.0, arrivals if k == 0 else None)
        if k == 1:
            eng.add_arrival(Arrival(100, 1.5, 100, 10, priority=0))
            eng.outstanding_tokens()
        eng.end_window()
    F, Ix, _, SI, C, H = cc.empty_state(4)
    cc.compact(F, Ix, SI, C, H, np.empty(4, dtype=np.int64))  # (an engine compacts only after 256 finished requests)
    none = np.empty(0, dtype=np.int64)
    cc.renumber_owed(np.zeros(4, dtype=np.int64), none, none, 0, 0, 0, none, none)
    from llmserve_env.shared.routing import outstanding_work_by_segment
    from llmserve_env.sim.compiled_routing import route_least_work  # the cluster's router

    one = np.ones(2)
    ints = np.ones(2, dtype=np.int64)
    route_least_work(one, ints, ints, np.zeros((4, 2)), np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64),
                     np.empty(3, dtype=np.int64))
    outstanding_work_by_segment(ints, ints, ints, ints > 0, (0, 1, 2))  # the cluster's estimate of each replica's work
    if HAVE_COMPILED_DRAWS:  # several tenants' acceptance rates (the windows above have one tenant: NumPy's call)
        beta_draws(np.random.default_rng(0), one, one, np.zeros(2, dtype=np.int64))
    _WARM = True
