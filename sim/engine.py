"""The event engine: continuous batching, one iteration at a time, with decode runs skipped in closed form.

This is the reference engine. sim/array_engine.py's `ArrayEngine` is its compiled twin (numba over arrays,
sim/compiled_core.py), bit-identical by tests/test_array_engine.py, and serves by default where it applies
(`make_engine`: numba installed, no slots or prompt breaks); a change to the physics here is made there
too, or the differential test fails.

Between events nothing changes the batch: a run of identical decode iterations has step times
t_j = A + B * j (the KV stream grows by the tokens each iteration adds), so k of them take
k * A + B * k * (k - 1) / 2 and every decoding request's progress is a linear function of the
iteration counter. The engine jumps to the next event:

    an arrival that could be admitted      a request finishing (a heap of finish iterations)
    the end of the window                  the KV pool running short (a cheap upper bound first,
    a KV transfer landing (disaggregated)   the exact block count only when memory is tight)

Iterations that contain prefill chunks are simulated one at a time (they are events themselves).

Two layouts:
- unified (prefill_decode_split off): one lane; each iteration runs every decoding request (the
  speculation depth + 1 tokens each) plus prefill chunks in what is left of the token budget, so
  decode iterations stall behind prefill chunks;
- split: a prefill lane and a decode lane, each with its share of the GPU, running concurrently;
  a request's KV moves to the decode lane (a transfer) after its prefill, and prefill chunks no
  longer slow decoding.

An iteration that starts before the window's end is simulated whole; its outputs belong to this
window even if it ends slightly after, and the engine carries the overhang into the next window.

Admission and preemption follow shared/admission.py (see sim/scheduler.py). With priority routing
on, a waiting request that does not fit may also preempt a running request of strictly lower
priority (counted as an eviction). A request that could not fit in the whole KV budget even alone
is rejected (status "rejected"). Speculation uses each request's expected tokens per step (its
acceptance rate is drawn once, at arrival), which keeps decode runs closed-form.

Prefix caching (sim/prefix_cache.py), only for arrivals carrying prefix ids: at admission a request's
cached leading units are a hit (their tokens skip prefill; at least one prompt token is computed);
the units it references are counted once, in `kv.used_fixed` (`decode_shared` takes them out of the
decoding requests' own blocks); released units stay cached as free-but-evictable blocks, evicted
(`_trim_cache`) before any preemption because admission and preemption see them as free.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from llmserve_env.shared.admission import KV_BLOCK_TOKENS, AdmissionLimits, blocks_for
from llmserve_env.shared.backend import Arrival, RequestRecord, ResourceSample
from llmserve_env.shared.routing import outstanding_work
from llmserve_env.sim.compiled_random import HAVE_COMPILED_DRAWS, beta_draws
from llmserve_env.sim.kv_cache import KVCache
from llmserve_env.sim.lanes import lane_shares
from llmserve_env.sim.prefix_cache import PrefixCache
from llmserve_env.sim.profiles import Profile
from llmserve_env.sim.prompt_breaks import PromptBreaks
from llmserve_env.sim.request import DECODE, DONE, PREFILL, TRANSFER, WAITING, SimRequest
from llmserve_env.sim.scheduler import Scheduler
from llmserve_env.sim.slot_cache import SlotCache, SlotCacheSpec
from llmserve_env.sim.step_time import IterationModel, StepTimeModel

if TYPE_CHECKING:
    from llmserve_env.shared.models import ServeAction
    from llmserve_env.shared.records import FirstTokens, ItlSamples, RequestBatch
    from llmserve_env.sim.resource_samples import SampleColumns

INF = math.inf
SAMPLES_PER_WINDOW = 2


def tokens_per_step(accept: float, depth: int) -> float:
    """Expected tokens a verification step emits: (1 - a^(g+1)) / (1 - a)."""
    if depth <= 0:
        return 1.0
    if accept >= 1.0:
        return float(depth + 1)
    return (1.0 - accept ** (depth + 1)) / (1.0 - accept)


def acceptance_rates(profile: Profile, rng: np.random.Generator, arrivals: Sequence[Arrival]) -> np.ndarray:
    """Each arrival's speculative acceptance rate, drawn from the engine's stream for every arrival whatever
    the policy (so the stream never depends on actions): Beta around its tenant's mean."""
    return tenant_acceptance_rates(profile, rng, [a.tenant for a in arrivals])


def beta_parameters(profile: Profile, tenant: str) -> tuple[float, float]:
    """A tenant's acceptance-rate distribution, Beta(a, b) around its mean: a = mean x concentration,
    b = (1 - mean) x concentration (the profile's figures)."""
    return _beta_around(profile.acceptance_mean(tenant), profile.spec_concentration)


def _beta_around(mean: float, kappa: float) -> tuple[float, float]:
    return mean * kappa, (1.0 - mean) * kappa


def beta_table(profile: Profile, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """`beta_parameters` of each tenant of `names`, in order, as the arrays (a, b): made once per set of
    figures (a window asks for the same few; the key is the means, cheaper to make than the pairs); shared,
    never written."""
    return _beta_table(profile.spec_concentration, tuple(profile.acceptance_mean(n) for n in names))


@functools.lru_cache(maxsize=64)
def _beta_table(kappa: float, means: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [_beta_around(m, kappa) for m in means]
    return np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])


def tenant_acceptance_rates(profile: Profile, rng: np.random.Generator, tenants: list[str] | np.ndarray,
                            among: tuple[str, ...] | None = None, index: np.ndarray | None = None) -> np.ndarray:
    """`acceptance_rates` of arrivals from these tenants (names, or an object array of them), in order. `among`
    and `index`: the names the tenants are drawn from and each row's index among them, where the caller knows
    them (shared/arrival_list.py `known_index`): no name is then looked up (and with one name, no set made).

    One tenant: scalar parameters and a size draw the same numbers from the same stream as equal arrays of them
    (numpy draws element by element either way) in a fifth of the time. Several: a parameter per row, drawn by
    one kernel call where numba imports (sim/compiled_random.py: NumPy's numbers, without NumPy's ~12-15 µs a
    call of checking parameter arrays), else by NumPy."""
    if not len(tenants):
        return np.empty(0)
    if index is None and not (among is not None and len(among) == 1):
        among = tuple(set(tenants))
    assert among is not None
    if len(among) == 1:  # most windows of most tasks
        a1, b1 = beta_parameters(profile, among[0])
        return rng.beta(a1, b1, size=len(tenants))
    if index is None:
        code = {name: k for k, name in enumerate(among)}
        index = np.array([code[t] for t in tenants], dtype=np.int64)
    a, b = beta_table(profile, among)
    return beta_draws(rng, a, b, index) if HAVE_COMPILED_DRAWS else rng.beta(a[index], b[index])


def acceptance_rate(profile: Profile, rng: np.random.Generator, tenant: str) -> float:
    """One arrival's rate (add_arrival): numpy draws a vector element by element, so the same arrivals in the
    same order get the rates `acceptance_rates` gives them."""
    a, b = beta_parameters(profile, tenant)
    return float(rng.beta(a, b))


def steps_to_cover(a: float, b: float, span: float) -> int:
    """Smallest k >= 1 with k*a + b*k*(k-1)/2 >= span (a > 0, b >= 0)."""
    if span <= a:
        return 1
    if b <= a * 1e-12:
        k = math.ceil(span / a)
    else:
        h = a - 0.5 * b
        k = math.ceil((-h + math.sqrt(h * h + 2.0 * b * span)) / b)
    k = max(k, 1)
    while k > 1 and (k - 1) * a + b * (k - 1) * (k - 2) * 0.5 >= span:
        k -= 1
    while k * a + b * k * (k - 1) * 0.5 < span:
        k += 1
    return k


class WindowMeasurements:
    """What one window measured, filled in by the engine as it goes."""

    __slots__ = ("finished", "first_tokens", "itl", "samples", "output_tokens", "prompt_tokens", "evictions",
                 "spec_proposed", "spec_accepted", "busy", "iterations", "rejected", "prefix_hit", "prefix_query")

    def __init__(self) -> None:
        self.finished: list[RequestRecord] | RequestBatch = []  # ArrayEngine: columns
        self.first_tokens: list[tuple[int, str, float]] | FirstTokens = []  # ArrayEngine: columns
        self.itl: list[tuple[float, int]] | ItlSamples = []  # ArrayEngine: columns
        self.samples: list[ResourceSample] | SampleColumns = []  # ArrayEngine: columns
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.evictions = 0
        self.spec_proposed = 0
        self.spec_accepted = 0.0
        self.busy = 0.0
        self.iterations = 0
        self.rejected = 0
        self.prefix_hit = 0    # prompt tokens served from the prefix cache, at first admission
        self.prefix_query = 0  # prompt tokens of first admissions of requests carrying prefix ids


class ListMeasurements(WindowMeasurements):
    """This engine's measurements: its finished requests, first tokens and ITL samples are the lists it
    appends to as it goes (ArrayEngine hands the same over as columns)."""

    __slots__ = ()
    finished: list[RequestRecord]
    first_tokens: list[tuple[int, str, float]]
    itl: list[tuple[float, int]]
    samples: list[ResourceSample]


class Engine:
    """One simulated serving engine (a replica: one GPU group). Drive it window by window."""

    def __init__(self, profile: Profile, seed: int, models: dict[tuple[str, str], IterationModel]):
        self.profile = profile
        self.models = models
        self.rng = np.random.default_rng([int(seed), 0x5EED51])  # engine stream, separate from the workload's
        self.sched = Scheduler()
        self.kv = KVCache()
        self.pcache = PrefixCache()  # sim/prefix_cache.py; stays empty unless arrivals carry prefix ids
        # an engine with slots and a prompt cache (llama-server) instead of vLLM's block cache, when the
        # profile says so (sim/slot_cache.py): every request then runs in a slot
        spec = SlotCacheSpec.from_engine(profile.raw.get("engine", {}))
        self.slots = SlotCache(spec) if spec is not None else None
        # llama-server's context checkpoints stop a prompt's prefill between iterations (sim/prompt_breaks.py)
        self.breaks = PromptBreaks.from_engine(profile.raw.get("engine", {}))
        self.decode_shared = 0       # cached-unit blocks the decoding requests reference (counted in kv.used_fixed)
        self.decoding: dict[int, SimRequest] = {}
        self.prefilling: list[SimRequest] = []
        self.transfers: list[tuple[float, int, SimRequest]] = []
        self.fresh: list[SimRequest] = []  # joined from a transfer: first decode gap is not an iteration
        self.fin_heap: list[tuple[int, int, int, SimRequest]] = []
        self.decode_iter = 0                 # decode iterations executed so far
        self.decode_context_tokens = 0.0     # summed context of the decoding requests (tokens)
        self.decode_tokens_per_iter = 0.0    # summed tokens per decode iteration of the decoding requests
        # bumped whenever a request joins or leaves the decoding map or the depth re-bases them: the KV
        # blocks they hold at an iteration are a function of (version, iteration) alone
        self.decode_version = 0
        self._blocks_memo = (-1, -1, 0)      # (decode_version, iteration, their blocks): the last exact count
        self.clock_s = 0.0                   # the unified lane's clock
        self.prefill_clock_s = 0.0           # the prefill lane's clock (split)
        self.decode_clock_s = 0.0            # the decode lane's clock (split)
        self.carry = (0.0, 0.0, 0.0)  # busy overhang per lane into the next window
        self.action_key: tuple | None = None
        self.batch_cap = 1
        self.limits = AdmissionLimits(1, 1)  # batch_cap and the KV pool's blocks, set by configure
        self.admissions = 0                  # requests admitted to the running set so far (victim order)
        self.depth = 0
        self.split = False
        self.pre_blocked = False
        self.arrivals: list[SimRequest] = []
        self.arrival_idx = 0                 # arrivals[arrival_idx:] have not reached the queue yet
        self.acc = ListMeasurements()
        self.next_sample = INF
        self.t0 = 0.0
        self.dt = 1.0
        # Step-time models: the unified lane's (FP16 until `configure` picks the tier) and, while
        # prefill and decode are split, each lane's (built only then; None before the first split).
        self.unified_model: IterationModel = self._model("FP16", "unified")
        self.prefill_model: IterationModel | None = None
        self.decode_model: IterationModel | None = None

    # ----------------------------------------------------------------------------------- policy

    def configure(self, batch_cap: int, kv_fraction: float, depth: int, tier: str, split: bool,
                  priority_routing: bool) -> None:
        p = self.profile
        key = (batch_cap, kv_fraction, depth, tier, split, priority_routing)
        if key == self.action_key:
            return
        self.action_key = key
        self.batch_cap = batch_cap
        self.kv.configure(p, tier, depth > 0, kv_fraction)
        self.limits = AdmissionLimits(batch_cap, self.kv.total)
        self.sched.configure(priority_routing)
        if split != self.split:
            if split:
                self.prefill_clock_s = self.decode_clock_s = self.clock_s
            else:
                self.clock_s = max(self.prefill_clock_s, self.decode_clock_s)
            self.split = split
        self.unified_model = self._model(tier, "unified")
        if split:  # the lanes' models are only needed while disaggregated
            self.prefill_model = self._model(tier, "prefill")
            self.decode_model = self._model(tier, "decode")
        if depth != self.depth:
            self.depth = depth
            self._resync_decoding()
        now = max(self.prefill_clock_s, self.decode_clock_s) if self.split else self.clock_s
        decode_blocks = self._decode_blocks_exact(0)
        if self.kv.used_fixed + decode_blocks > self.kv.total:
            # A smaller pool: preempt in victim order until what is left fits. Counted down per victim
            # rather than recounted per victim (that was quadratic in the running requests).
            for victim in self.sched.victim_order(self._victim_pool(True)):
                if self.kv.used_fixed + decode_blocks <= self.kv.total:
                    break
                if victim.state == DECODE:
                    decode_blocks -= self._blocks_held(victim, self.decode_iter)
                self._preempt(victim, now)  # a prefilling victim's blocks leave kv.used_fixed here
        self._trim_cache()  # a smaller pool holds fewer evictable cached units
        self.pre_blocked = False

    def _model(self, tier: str, lane: str) -> IterationModel:
        key = (tier, lane)
        m = self.models.get(key)
        if m is None:
            m = self.models[key] = StepTimeModel(self.profile, tier, *lane_shares(self.profile, lane))
        return m

    def _resync_decoding(self) -> None:
        """Re-base every decoding request at the current iteration (the depth changed their rate)."""
        it, g = self.decode_iter, self.depth
        heap = []
        context = per_iter = 0.0  # summed in the decode map's order, as before (same floats)
        ceil = math.ceil
        for r in self.decoding.values():
            p = r.progress + (it - r.sync_iter) * r.e  # progress_at, inlined: every request here decodes
            target = r.target
            if p >= target:
                p = float(target)
            r.progress = p
            r.sync_iter = it
            e = r.e = tokens_per_step(r.accept, g)
            gen = r.gen = r.gen + 1
            fin = r.finish_iter = it + max(1, ceil((target - p) / e - 1e-9))
            heap.append((fin, r.rid, gen, r))
            context += r.prompt + p
            per_iter += e
        heapq.heapify(heap)
        self.fin_heap = heap
        self.decode_version += 1
        self.decode_context_tokens, self.decode_tokens_per_iter = context, per_iter

    # ----------------------------------------------------------------------------------- window

    def start_window(self, arrivals: Sequence[Arrival], t0: float, dt: float) -> None:
        self.acc = ListMeasurements()
        self.t0, self.dt = t0, dt
        self.next_sample = t0 + dt / SAMPLES_PER_WINDOW
        reqs = []
        if arrivals:
            accepts = acceptance_rates(self.profile, self.rng, arrivals).tolist()
            reqs = [self._request_for(a, acc) for a, acc in zip(arrivals, accepts, strict=True)]
        self.arrivals, self.arrival_idx = reqs, 0
        cu, cp, cd = self.carry
        share = self.profile.split_prefill_compute_share
        self.acc.busy = min(cu, dt) + share * min(cp, dt) + (1.0 - share) * min(cd, dt)

    def _request_for(self, a: Arrival, accept: float) -> SimRequest:
        rec = RequestRecord(a.request_id, a.tenant, a.priority, a.arrival_s, a.prompt_tokens, a.output_tokens)
        r = SimRequest(rec, accept)
        if a.prefix_ids is not None:
            # prefix-unique ids are the cache's keys (shared/backend.py `Arrival`): the full units
            # of the prompt and answer
            self.pcache.bind(a.prefix_block_tokens)
            keys = a.prefix_ids[:(a.prompt_tokens + a.output_tokens) // a.prefix_block_tokens]
            if self.slots is None:
                r.pkeys = keys
            else:
                self.slots.unit = self.pcache.block_tokens
                r.skeys = keys
        return r

    # A window arrival by arrival (ClusterBackend's tracked router, sim/cluster.py): begin_window, then
    # per arrival advance(its time) and add_arrival, then end_window. Between the calls the engine's
    # requests are its true state at the clock, which is what the router reads (outstanding_tokens).

    def begin_window(self, action: ServeAction, t0: float, dt: float, arrivals: Sequence[Arrival] | None = None) -> None:
        """Configure for `action` and open a window with `arrivals` (none: add_arrival brings them)."""
        self.configure(action.batch_cap, action.kv_budget_fraction, action.speculation_depth,
                       action.quantization_tier, action.prefill_decode_split, action.priority_routing)
        self.start_window(arrivals or [], t0, dt)

    def add_arrival(self, a: Arrival, routed_hit: int = 0) -> None:
        """One arrival of the open window, no earlier than the last one added. Its acceptance rate is
        drawn here, one arrival at a time (start_window draws a window's at once; numpy's Generator
        draws a vector element by element, so the same arrivals in the same order get the same rates,
        but an engine's arrivals differ with its routes). `routed_hit`: the prompt tokens the router
        counted as cached, left out of its outstanding work (outstanding_tokens)."""
        r = self._request_for(a, acceptance_rate(self.profile, self.rng, a.tenant))
        r.routed_hit = routed_hit
        self.arrivals.append(r)

    def advance(self, t: float) -> None:
        """Run the lanes to `t` (an iteration that starts before it is simulated whole) and stop there,
        the window still open: run() continues from here."""
        if self.split:
            self._run_split(t)
        else:
            self._run_unified(t)

    def end_window(self) -> tuple[list[RequestRecord], int, float, WindowMeasurements]:
        """Run to the window's end and close it: serve_window's return, for a window begun with begin_window."""
        self.run(self.t0 + self.dt)
        pending, used, mem = self.close_window()
        return pending, used, mem, self.take_measurements()

    def outstanding_tokens(self) -> float:
        """Tokens still to process for every request the engine holds (queued, not yet reached, prefilling,
        in transfer, decoding), by shared/routing.py's rule as the gateway counts them: a request's prompt
        less its routed hit until its first token, then its output still to come."""
        it = self.decode_iter
        total = 0.0
        for group in (self.arrivals[self.arrival_idx:], self.sched.waiting(), self.prefilling,
                      (e[2] for e in self.transfers), self.decoding.values()):
            for r in group:
                total += outstanding_work(r.prompt - r.routed_hit, r.target, int(r.progress_at(it)),
                                          r.rec.first_token_s is not None)
        return total

    def serve_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float,
                     dt: float) -> tuple[list[RequestRecord], int, float, WindowMeasurements]:
        """One window under `action`, start to close: the driver SimBackend.run_window and each of
        ClusterBackend's replicas share. (pending records, KV blocks used, GPU memory used in GB,
        the window's measurements)."""
        self.begin_window(action, t0, dt, arrivals)
        return self.end_window()

    def run(self, t_end: float) -> None:
        """Run to the window's end `t_end` and settle the window (every arrival queued, the busy time's
        overhang carried): once per window."""
        self.advance(t_end)
        self._admit_arrivals(INF)
        # every arrival is queued now: drop the window's list, whose finished requests a fork would copy
        # (a 10 s cluster window holds ~200, most of them done)
        self.arrivals, self.arrival_idx = [], 0
        share = self.profile.split_prefill_compute_share
        if self.split:
            op, od = max(0.0, self.prefill_clock_s - t_end), max(0.0, self.decode_clock_s - t_end)
            self.acc.busy -= op * share + od * (1.0 - share)
            self.carry = (0.0, op, od)
        else:
            ou = max(0.0, self.clock_s - t_end)
            self.acc.busy -= ou
            self.carry = (ou, 0.0, 0.0)
        self.acc.busy = min(max(self.acc.busy, 0.0), self.dt)

    # ----------------------------------------------------------------------------------- arrivals

    def _admit_arrivals(self, t: float) -> None:
        arr, i = self.arrivals, self.arrival_idx
        n = len(arr)
        while i < n and arr[i].arrival <= t:
            self.sched.push(arr[i])
            i += 1
        if i != self.arrival_idx:
            self.arrival_idx = i
            self.pre_blocked = False

    def _next_arrival(self) -> float:
        return self.arrivals[self.arrival_idx].arrival if self.arrival_idx < len(self.arrivals) else INF

    # ----------------------------------------------------------------------------------- KV accounting

    @staticmethod
    def _blocks_held(r: SimRequest, it: int) -> int:
        """KV blocks a decoding request holds at decode iteration `it`."""
        p = r.progress + (it - r.sync_iter) * r.e
        if p > r.target:
            p = r.target
        return -(-math.ceil(r.prompt + p) // KV_BLOCK_TOKENS) - r.pshared

    def _decode_blocks_exact(self, k: int) -> int:
        it = self.decode_iter + k
        memo = self._blocks_memo
        if memo[1] == it and memo[0] == self.decode_version:
            # asked again in the same scheduling pass (the growth check, then each admission's): unchanged
            return memo[2] - self.decode_shared
        total = 0
        for r in self.decoding.values():
            p = r.progress + (it - r.sync_iter) * r.e
            if p > r.target:
                p = r.target
            total += -(-math.ceil(r.prompt + p) // KV_BLOCK_TOKENS)  # _blocks_held, inlined: hot loop
        self._blocks_memo = (self.decode_version, it, total)
        return total - self.decode_shared  # shared cached units are counted once, in kv.used_fixed

    def _decode_kv_limit(self, kcap: int) -> int:
        """Most decode iterations (<= kcap) whose KV growth fits; 0 when even one does not."""
        free = self.kv.total - self.kv.used_fixed
        n = len(self.decoding)
        grown = self.decode_context_tokens + kcap * self.decode_tokens_per_iter
        if (grown + n) * (1.0 / KV_BLOCK_TOKENS) + n - self.decode_shared <= free:
            return kcap
        if self._decode_blocks_exact(1) > free:
            return 0
        lo, hi = 1, kcap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._decode_blocks_exact(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _running(self) -> int:
        return len(self.decoding) + len(self.prefilling) + len(self.transfers)

    def _victim_pool(self, unified: bool) -> list[SimRequest]:
        """The requests a preemption may pick from: decoding ones, and prefilling ones too when unified."""
        return [*self.decoding.values(), *self.prefilling] if unified else list(self.decoding.values())

    # ----------------------------------------------------------------------------------- state changes

    def _preempt(self, r: SimRequest, t: float) -> None:
        if r.pkeys:
            self._trim_cache()  # evictions due by now, before this request's units join the evictable ones
        if r.state == DECODE:
            self.decode_shared -= r.pshared
            p = r.progress + (self.decode_iter - r.sync_iter) * r.e
            self.decode_context_tokens -= r.prompt + p
            self.decode_tokens_per_iter -= r.e
            del self.decoding[r.rid]
            self.decode_version += 1
            r.gen += 1
            r.progress = min(p, float(r.target))
            r.last_emit_s = t
            if r in self.fresh:
                self.fresh.remove(r)
        elif r.state == PREFILL:
            self.prefilling.remove(r)
            self.kv.used_fixed -= r.blocks
        else:
            return
        if r.pkeys:
            # KV computed so far: the prompt and every output token but the last sampled one (decoding),
            # or the chunks prefilled
            self._release_prefix(r, r.prompt + int(r.progress) - 1 if r.state == DECODE else r.prefilled)
        elif r.pslot >= 0:
            self._release_slot(r, r.prompt + int(r.progress) - 1 if r.state == DECODE else r.prefilled, t)
        r.blocks = 0
        r.prefilled = 0
        r.prefill_target = r.prompt + int(r.progress)
        r.state = WAITING
        r.rec.preemptions += 1
        self.acc.evictions += 1
        self.sched.push(r)
        self.pre_blocked = False

    def cached_units(self, keys: tuple[int, ...], cap: int) -> int:
        """Leading units of `keys` (at most `cap`) this engine's cache holds now: what a router that reads
        the engines' caches (llm-d's precise prefix scorer, Dynamo's KV events) sees."""
        if self.slots is not None:
            return self.slots.match(keys, cap)
        return self.pcache.match(keys, cap)[0] if self.pcache.block_tokens else 0

    @property
    def cached_blocks(self) -> int:
        """KV blocks holding cached prefix units: the block cache's, or the slots' (sim/slot_cache.py)."""
        return self.slots.cached_blocks if self.slots is not None else self.pcache.cached_blocks

    def _release_slot(self, r: SimRequest, computed: int, t: float) -> None:
        """The request leaves its slot (sim/slot_cache.py), which keeps the tokens it computed."""
        assert self.slots is not None
        self.slots.release(r.pslot, r.skeys or (), computed, t)
        r.pslot = -1

    def _release_prefix(self, r: SimRequest, computed: int) -> None:
        """Drop a request's references to cached units; units nobody references stay cached, evictable.

        Units with ids past the prompt (a conversation's answer, which its next turn resends) whose
        tokens were computed join the cache as they are freed, as V1 caches every full block, generated
        tokens included: the request's own blocks become evictable cached ones (in-use + evictable
        blocks do not change)."""
        pc = self.pcache
        keys = r.pkeys or ()
        n = min(computed // pc.block_tokens, len(keys))
        if n > r.phold:
            self.kv.used_fixed += pc.acquire(keys, r.phold, n) * pc.unit_blocks
            r.phold = n
        self.kv.used_fixed -= pc.release(keys, r.phold) * pc.unit_blocks
        r.phold = r.pshared = 0

    def _cache_computed(self, r: SimRequest) -> None:
        """Units the request's prefill has now covered join the cache (or, already there, are shared):
        their blocks move from the request's own to the cache's in-use blocks."""
        pc = self.pcache
        keys = r.pkeys or ()
        n = min(r.prefilled // pc.block_tokens, len(keys))
        if n <= r.phold:
            return
        moved = (n - r.phold) * pc.unit_blocks
        fresh = pc.acquire(keys, r.phold, n) * pc.unit_blocks
        r.blocks -= moved
        self.kv.used_fixed += fresh - moved
        r.phold, r.pshared = n, n * pc.unit_blocks

    def _trim_cache(self) -> None:
        """Evict least recently released units until in-use + evictable blocks fit the pool.

        Used blocks only grow between releases (decode runs, prefill chunks, admissions), so trimming
        before each release and before each lookup evicts what V1 would have evicted by then. The
        decoding requests' blocks are their upper bound (context / 16 + 1 each; sim/prefix_cache.py)."""
        pc = self.pcache
        if not pc.free_units:
            return
        kv = self.kv
        n = len(self.decoding)
        upper = self.decode_context_tokens * (1.0 / KV_BLOCK_TOKENS) + n - self.decode_shared
        excess = kv.used_fixed + upper + pc.free_blocks - kv.total
        if excess > 0:
            pc.evict(math.ceil(excess / pc.unit_blocks))

    def _reject(self, r: SimRequest, t: float, why: str) -> None:
        r.state = DONE
        rec = r.rec
        rec.status = "rejected"
        rec.error = why
        rec.finish_s = t
        rec.output_tokens = int(r.progress)
        self.acc.output_tokens += rec.output_tokens - r.reported
        self.acc.finished.append(rec)  # this engine's are records (ArrayEngine's columns)
        self.acc.rejected += 1

    def _finish(self, r: SimRequest, t: float) -> None:
        if r.state == DECODE:
            self.decode_context_tokens -= r.prompt + r.progress + (self.decode_iter - r.sync_iter) * r.e
            self.decode_tokens_per_iter -= r.e
            self.decode_shared -= r.pshared
            del self.decoding[r.rid]
            self.decode_version += 1
        if r.pkeys:
            self._release_prefix(r, r.prompt + r.target - 1)  # the callers trimmed the cache at this instant first
        elif r.pslot >= 0:
            self._release_slot(r, r.prompt + r.target - 1, t)
        r.state = DONE
        rec = r.rec
        rec.status = "ok"
        rec.finish_s = t
        rec.output_tokens = r.target
        self.acc.output_tokens += r.target - r.reported
        r.reported = r.target
        self.acc.finished.append(rec)  # this engine's are records (ArrayEngine's columns)
        self.pre_blocked = False

    def _finish_due(self, t: float) -> None:
        h, it = self.fin_heap, self.decode_iter
        if self.pcache.free_units:
            self._trim_cache()  # at the run's peak, before the finishing requests free anything
        while h and h[0][0] <= it:
            _, _, gen, r = heapq.heappop(h)
            if gen == r.gen and r.state == DECODE:
                self._finish(r, t)

    def _join_decode(self, r: SimRequest) -> None:
        r.state = DECODE
        r.sync_iter = self.decode_iter
        r.e = tokens_per_step(r.accept, self.depth)
        r.finish_iter = self.decode_iter + max(1, math.ceil((r.target - r.progress) / r.e - 1e-9))
        self.decoding[r.rid] = r
        self.decode_version += 1
        self.decode_context_tokens += r.prompt + r.progress
        self.decode_tokens_per_iter += r.e
        self.decode_shared += r.pshared
        heapq.heappush(self.fin_heap, (r.finish_iter, r.rid, r.gen, r))

    def _complete_prefill(self, r: SimRequest, t: float, model: IterationModel, split: bool) -> None:
        """The last chunk ran: the request samples a token (its first, or the next after recompute)."""
        self.prefilling.remove(r)
        self.kv.used_fixed -= r.blocks
        r.blocks = 0
        rec = r.rec
        if rec.first_token_s is None:
            rec.first_token_s = t
            self.acc.first_tokens.append((r.rid, r.tenant, t - r.arrival))
            r.progress = 1.0
        else:
            r.progress = float(int(r.progress) + 1)
            self.acc.itl.append((t - r.last_emit_s, 1))
        r.last_emit_s = t
        if r.progress >= r.target:
            if r.pkeys:
                self._trim_cache()
            self._finish(r, t)
        elif split:
            r.state = TRANSFER
            r.blocks = blocks_for(r.prefilled) - r.pshared
            self.kv.used_fixed += r.blocks
            ready = t + model.transfer_s(r.prefilled)
            heapq.heappush(self.transfers, (ready, r.rid, r))
        else:
            self._join_decode(r)

    def _process_joins(self, t: float) -> None:
        tr = self.transfers
        while tr and tr[0][0] <= t:
            _, _, r = heapq.heappop(tr)
            self.kv.used_fixed -= r.blocks
            r.blocks = 0
            self._join_decode(r)
            self.fresh.append(r)

    # ----------------------------------------------------------------------------------- scheduling

    def _plan_prefill(self, t: float, budget: int, unified: bool,
                      preempted: bool = False) -> list[tuple[SimRequest, int]]:
        """Chunks for this iteration: running prefills first, then admissions in waiting order.

        vLLM V1's `Scheduler.schedule()` (shared/admission.py): each running prefill gets the blocks
        for its next chunk first, preempting the `victim_key` victim until it fits (when the victim
        is the request itself, no further running request is served); a pass that preempted, here or
        for the decoding requests' growth before (`preempted`), admits no waiting request.
        """
        chunks: list[tuple[SimRequest, int]] = []
        if budget <= 0:
            return chunks
        kv, sched = self.kv, self.sched
        ahead = 1 if unified else 0
        exact = False
        nd = len(self.decoding)
        grown = self.decode_context_tokens + ahead * self.decode_tokens_per_iter
        free = kv.total - kv.used_fixed - ((grown + nd) * (1.0 / KV_BLOCK_TOKENS) + nd - self.decode_shared)

        for r in list(self.prefilling) if self.prefilling else ():
            if budget <= 0:
                break
            if r.state != PREFILL:  # preempted above for an earlier running prefill
                continue
            c = min(r.prefill_target - r.prefilled, budget)
            if self.breaks is not None:
                c = min(c, self.breaks.room(r.prefilled, r.prefill_target))
            need = blocks_for(r.prefilled + c) - r.blocks - r.pshared
            if need > free:
                free = kv.total - kv.used_fixed - self._decode_blocks_exact(ahead)
            while need > free:
                victim = sched.victim(self._unscheduled(chunks, unified))  # r is in it: not scheduled yet
                if victim is None:
                    break
                self._preempt(victim, t)
                preempted = True
                if victim is r:
                    break
                free = kv.total - kv.used_fixed - self._decode_blocks_exact(ahead)
            if r.state != PREFILL or need > free:
                break  # V1: `if new_blocks is None: break` (nothing after it runs in this pass)
            r.blocks += need
            kv.used_fixed += need
            free -= need
            chunks.append((r, c))
            budget -= c
        if preempted:
            return chunks
        pr = sched.priority_routing
        waiting = sched.heap
        limits = self.limits
        total = kv.total
        n_running = len(self.decoding) + len(self.prefilling) + len(self.transfers)
        evicted: set[int] = set()
        while budget > 0 and waiting:
            r = waiting[0][2]
            if -(-(r.prompt + r.target) // KV_BLOCK_TOKENS) > total:
                sched.pop()
                self._reject(r, t, "request needs more KV blocks than the whole budget")
                continue
            if r.rid in evicted:
                break  # evicted in this pass for a higher-priority request: not re-admitted in it
            keys = r.pkeys
            plan = None
            if self.slots is not None:
                # a slot engine (sim/slot_cache.py): a request waits for an idle slot; the slot it would
                # take gives its hit (no blocks shared: each slot keeps its own KV)
                if not self.slots.idle():
                    break
                plan = self.slots.plan(r.skeys or (), r.prompt)
                hit = plan[2]
                base = hit * self.slots.unit
                c = min(r.prefill_target - base, budget)
                if self.breaks is not None:
                    c = min(c, self.breaks.room(base, r.prefill_target))
                need = own = -(-(base + c) // KV_BLOCK_TOKENS)
            elif keys:
                # prefix cache (sim/prefix_cache.py): the longest cached run of the request's leading
                # units is a hit, leaving at least one token to compute; evictable units it revives
                # become in-use blocks, so they count in what the admission needs
                self._trim_cache()
                pc = self.pcache
                hit, revive = pc.match(keys, (r.prefill_target - 1) // pc.block_tokens)
                base = hit * pc.block_tokens
                c = min(r.prefill_target - base, budget)
                if self.breaks is not None:
                    c = min(c, self.breaks.room(base, r.prefill_target))
                own = -(-(base + c) // KV_BLOCK_TOKENS) - hit * pc.unit_blocks
                need = own + revive * pc.unit_blocks
            else:
                hit = base = 0
                c = min(r.prefill_target, budget)
                if self.breaks is not None:
                    c = min(c, self.breaks.room(0, r.prefill_target))
                need = own = -(-c // KV_BLOCK_TOKENS)
            if not exact and n_running < self.batch_cap and need > free:
                exact = True
                free = total - kv.used_fixed - self._decode_blocks_exact(ahead)
            if not limits.admits(n_running, total - free, need):
                if pr:
                    victim = sched.victim(self._unscheduled(chunks, unified))
                    if victim is not None and victim.priority > r.priority:
                        self._preempt(victim, t)
                        evicted.add(victim.rid)
                        n_running -= 1
                        free = total - kv.used_fixed - self._decode_blocks_exact(ahead)
                        exact = True
                        continue
                break
            sched.pop()
            r.state = PREFILL
            self.admissions += 1
            r.admitted_seq = self.admissions
            rec = r.rec
            if rec.dispatch_s is None:
                rec.dispatch_s = t
                rec.attempts = 1
                if keys is not None or r.skeys is not None:
                    self.acc.prefix_query += r.prompt
                    self.acc.prefix_hit += base
            if plan is not None:
                r.pslot = self.slots.take(plan)  # type: ignore[union-attr]
                r.prefilled = base
            elif hit:
                pc = self.pcache
                kv.used_fixed += pc.acquire(keys or (), 0, hit) * pc.unit_blocks
                r.phold, r.pshared = hit, hit * pc.unit_blocks
                r.prefilled = base
            r.blocks = own
            kv.used_fixed += own
            free -= need
            self.prefilling.append(r)
            n_running += 1
            chunks.append((r, c))
            budget -= c
        return chunks

    def _unscheduled(self, chunks: list[tuple[SimRequest, int]], unified: bool) -> list[SimRequest]:
        """The preemption pool of a scheduling pass: running requests without a chunk in it yet."""
        scheduled = {c[0].rid for c in chunks}
        out = [r for r in self.prefilling if r.rid not in scheduled]
        return (list(self.decoding.values()) + out) if unified else out

    def _run_chunks(self, chunks: list[tuple[SimRequest, int]], t: float, model: IterationModel, n: int,
                    split: bool) -> float:
        """Execute one iteration with `chunks` (and `n` decoding requests); return its duration."""
        g = self.depth
        tokens = 0
        completing = 0
        shapes = []
        for r, c in chunks:
            shapes.append((c, r.prefilled))
            tokens += c
            if r.prefilled + c >= r.prefill_target:
                completing += 1
        dt_it = model.iteration_s(n, self.decode_context_tokens, g, shapes, tokens, completing)
        t_new = t + dt_it
        self.acc.iterations += 1
        self.acc.prompt_tokens += tokens
        if n:
            self._advance_decode(1, dt_it, dt_it, n, t_new)
        for r, c in chunks:
            r.prefilled += c
            if r.pkeys and r.prefilled >= (r.phold + 1) * self.pcache.block_tokens and r.phold < len(r.pkeys):
                self._cache_computed(r)  # a unit more is computed
            if r.prefilled >= r.prefill_target:
                self._complete_prefill(r, t_new, model, split)
        if n:
            h = self.fin_heap
            if h and h[0][0] <= self.decode_iter:  # _finish_due's own first test, saving the call
                self._finish_due(t_new)
        return dt_it

    def _advance_decode(self, k: int, total: float, first: float, n: int, t_new: float) -> None:
        """Account for k decode iterations of n requests lasting `total` seconds (the first `first`)."""
        self.decode_iter += k
        self.decode_context_tokens += k * self.decode_tokens_per_iter
        acc = self.acc
        g = self.depth
        if g:
            acc.spec_proposed += g * n * k
            acc.spec_accepted += k * (self.decode_tokens_per_iter - n)
        if self.fresh:
            nf = len(self.fresh)
            t_first_end = t_new - total + first
            for r in self.fresh:
                acc.itl.append((t_first_end - r.last_emit_s, 1))
            if n > nf:
                acc.itl.append((first, n - nf))
            if k > 1:
                acc.itl.append(((total - first) / (k - 1), n * (k - 1)))
            self.fresh.clear()
        else:
            acc.itl.append((total / k, n * k))

    def _preempt_for_growth(self, t: float) -> bool:
        """Preempt in victim order until the decoding requests' next iteration fits; True if any was.

        vLLM V1 `Scheduler.schedule()`: a running request whose new slots do not fit preempts the
        most recently admitted running request (`self.running.pop()`; PRIORITY: the lowest-priority,
        latest-arriving one) until they do. Prefilling requests are running requests too."""
        victims = self.sched.victim_order(self._victim_pool(True))
        for victim in victims:
            self._preempt(victim, t)
            if not self.decoding or self._decode_kv_limit(1) > 0:
                break
        return bool(victims)

    def _decode_run(self, t: float, t_end: float, model: IterationModel, horizon: float,
                    unified: bool) -> float | None:
        """Run decode-only iterations from t until the next event; return the new clock (None: preempted)."""
        h = self.fin_heap
        heappop = heapq.heappop
        while h and (h[0][2] != h[0][3].gen or h[0][3].state != DECODE):
            heappop(h)
        n = len(self.decoding)
        g = self.depth
        context, per_iter = self.decode_context_tokens, self.decode_tokens_per_iter
        a = model.iteration_s(n, context, g, [], 0, 0)
        b = model.decode_slope(g, n) * per_iter
        it = self.decode_iter
        kcap = max(1, h[0][0] - it) if h else 1
        fresh = self.fresh
        if fresh:
            kcap = 1
        stop = min(t_end, horizon)
        if kcap > 1:
            kcap = min(kcap, steps_to_cover(a, b, stop - t))
        # _decode_kv_limit(kcap), its cheap upper bound inlined (memory is plentiful in most runs)
        if ((context + kcap * per_iter + n) * (1.0 / KV_BLOCK_TOKENS) + n - self.decode_shared
                <= self.kv.total - self.kv.used_fixed):
            k = kcap
        else:
            k = self._decode_kv_limit(kcap)
        if k == 0:
            victim = self.sched.victim(self._victim_pool(unified))
            if victim is not None:
                self._preempt(victim, t)
            return None
        total = k * a + b * k * (k - 1) * 0.5
        t_new = t + total
        acc = self.acc
        acc.iterations += k
        if fresh:
            self._advance_decode(k, total, a, n, t_new)
        else:  # _advance_decode without joiners, inlined
            self.decode_iter = it = it + k
            self.decode_context_tokens = context + k * per_iter
            if g:
                acc.spec_proposed += g * n * k
                acc.spec_accepted += k * (per_iter - n)
            acc.itl.append((total / k, n * k))
        if h and h[0][0] <= self.decode_iter:
            self._finish_due(t_new)
        return t_new

    # ----------------------------------------------------------------------------------- loops

    def _sample(self, t: float) -> None:
        used = self.kv.used_fixed + self._decode_blocks_exact(0)
        self.acc.samples.append(ResourceSample(t, self._running(), len(self.sched.heap), used, self.kv.total,
                                               self.kv.memory_gib(used)))
        self.next_sample = self.next_sample + self.dt / SAMPLES_PER_WINDOW

    def _run_unified(self, t_end: float) -> None:
        model, acc, sched, kv = self.unified_model, self.acc, self.sched, self.kv
        decoding, arrivals = self.decoding, self.arrivals
        prefilling, transfers = self.prefilling, self.transfers  # changed in place only, never rebound here
        waiting = sched.heap
        budget0 = self.profile.token_budget
        per_seq = self.depth + 1
        n_arr = len(arrivals)
        clock = self.clock_s  # the lane's clock, kept local in the loop (nothing it calls reads it)
        while clock < t_end:
            t = clock
            if t >= self.next_sample:
                self._sample(t)
            if self.arrival_idx < n_arr and arrivals[self.arrival_idx].arrival <= t:
                self._admit_arrivals(t)
            if transfers:
                self._process_joins(t)
            n = len(decoding)
            preempted = False
            # _decode_kv_limit(1) == 0, its cheap upper bound inlined (memory is plentiful most passes)
            if n and ((self.decode_context_tokens + self.decode_tokens_per_iter + n) * (1.0 / KV_BLOCK_TOKENS) + n
                      - self.decode_shared > kv.total - kv.used_fixed) and self._decode_kv_limit(1) == 0:
                preempted = self._preempt_for_growth(t)
                n = len(decoding)
            if prefilling or waiting:
                chunks = self._plan_prefill(t, budget0 - n * per_seq, unified=True, preempted=preempted)
                if chunks:
                    dt_it = self._run_chunks(chunks, t, model, len(decoding), split=False)
                    acc.busy += dt_it
                    clock = t + dt_it
                    continue
            if decoding:
                horizon = transfers[0][0] if transfers else INF
                if preempted:
                    # one iteration: the next pass may admit into what the preemption freed (V1
                    # schedules every step); without a preemption free blocks only shrink until a
                    # request finishes, so a blocked queue stays blocked for the whole decode run
                    horizon = t
                elif sched.priority_routing or (not waiting and n + len(prefilling) + len(transfers)
                                                < self.batch_cap):
                    nxt = arrivals[self.arrival_idx].arrival if self.arrival_idx < n_arr else INF
                    if nxt < horizon:
                        horizon = nxt
                t_new = self._decode_run(t, t_end, model, horizon, unified=True)
                if t_new is not None:
                    acc.busy += t_new - t
                    clock = t_new
                continue
            if preempted:
                continue  # nothing ran in this pass; the next one (same clock) may admit
            nxt = min(self._next_arrival(), transfers[0][0] if transfers else INF, t_end)
            clock = nxt if nxt > t else t_end
        self.clock_s = clock

    def _run_split(self, t_end: float) -> None:
        prefill_model, decode_model = self.prefill_model, self.decode_model
        if prefill_model is None or decode_model is None:
            raise RuntimeError("split lanes run before configure() built their step-time models")
        share = self.profile.split_prefill_compute_share
        while True:
            if self.prefilling or (self.sched.heap and not self.pre_blocked):
                pnext = self.prefill_clock_s
            else:  # idle or blocked: woken by an arrival, or by the decode lane freeing room
                pnext = max(self.prefill_clock_s, self._next_arrival())
            if self.decoding or self.fresh:
                dnext = self.decode_clock_s
            elif self.transfers:
                dnext = max(self.decode_clock_s, self.transfers[0][0])
            else:
                dnext = INF
            now = min(pnext, dnext)
            if now >= t_end:
                self.prefill_clock_s = max(self.prefill_clock_s, min(pnext, t_end))
                self.decode_clock_s = max(self.decode_clock_s, min(dnext, t_end))
                break
            if now >= self.next_sample:
                self._sample(now)
            if pnext <= dnext:
                t = pnext
                self.prefill_clock_s = t
                self._admit_arrivals(t)
                chunks = self._plan_prefill(t, self.profile.token_budget, unified=False)
                if not chunks:
                    self.pre_blocked = True
                    continue
                dt_it = self._run_chunks(chunks, t, prefill_model, 0, split=True)
                self.acc.busy += dt_it * share
                self.prefill_clock_s = t + dt_it
            else:
                t = dnext
                self.decode_clock_s = t
                self._process_joins(t)
                if not self.decoding:
                    continue
                horizon = min(pnext, self.transfers[0][0] if self.transfers else INF)
                blocked = self.pre_blocked
                t_new = self._decode_run(t, t_end, decode_model, horizon, unified=False)
                if t_new is not None:
                    self.acc.busy += (t_new - t) * (1.0 - share)
                    self.decode_clock_s = t_new
                if blocked and not self.pre_blocked:
                    # room freed at the decode lane's clock; the prefill lane cannot use it earlier
                    self.prefill_clock_s = max(self.prefill_clock_s, self.decode_clock_s)

    # ----------------------------------------------------------------------------------- reporting

    def take_measurements(self) -> WindowMeasurements:
        """The closed window's measurements, handed over to the report: the engine keeps an empty set, so
        a fork between windows does not copy what the report already carries (~2/3 of a fork's records)."""
        acc, self.acc = self.acc, ListMeasurements()
        return acc

    def close_window(self) -> tuple[list[RequestRecord], int, float]:
        """Exact re-sums, output tokens of live requests, the end sample; returns (pending, kv used, memory)."""
        it = self.decode_iter
        acc = self.acc
        pending: list[RequestRecord] = []
        new_tokens = 0

        def settle(group) -> None:
            nonlocal new_tokens
            for r in group:
                cur = int(r.progress_at(it))
                if cur != r.reported:
                    new_tokens += cur - r.reported
                    r.reported = cur
                pending.append(r.snapshot_tokens(cur))

        settle(self.prefilling)
        settle([e[2] for e in self.transfers])
        # Decoding requests, inlined (most pending requests decode): the exact re-sums of their context
        # and tokens per iteration, the KV blocks they hold, output tokens since the last report, and
        # the snapshot, in one pass.
        context = per_iter = 0.0
        decode_blocks = 0
        for r in self.decoding.values():
            p = r.progress + (it - r.sync_iter) * r.e
            context += r.prompt + p
            per_iter += r.e
            pc = p if p < r.target else r.target
            decode_blocks += -(-math.ceil(r.prompt + pc) // KV_BLOCK_TOKENS)  # _blocks_held, inlined
            cur = int(p) if p < r.target else r.target
            if cur != r.reported:
                new_tokens += cur - r.reported
                r.reported = cur
            pending.append(r.snapshot_tokens(cur))
        self.decode_context_tokens, self.decode_tokens_per_iter = context, per_iter
        for entry in self.sched.heap:
            r = entry[2]
            snap = r.snap
            if r.queued_clean and snap is not None:  # waiting, unchanged since its last snapshot (sim/request.py)
                pending.append(snap)
                continue
            cur = int(r.progress)  # progress_at, for a waiting request
            if cur != r.reported:
                new_tokens += cur - r.reported
                r.reported = cur
            pending.append(r.snapshot_tokens(cur))
            r.queued_clean = True
        acc.output_tokens += new_tokens
        used = self.kv.used_fixed + decode_blocks - self.decode_shared
        if self.pcache.free_units:
            self._trim_cache()  # the cached blocks reported are the ones still held at the window's end
        mem = self.kv.memory_gib(used)
        end = self.t0 + self.dt
        acc.samples.append(ResourceSample(end, self._running(), len(self.sched.heap), used, self.kv.total, mem))
        return pending, used, mem
