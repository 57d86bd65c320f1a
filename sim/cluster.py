"""`ClusterBackend`: N replicas of one profile's engine behind a router (the cluster tasks' `sim` mode).

    backend = ClusterBackend("h100-llama3.1-8b", replicas=(1, 8), initial=2)
    backend.reset(seed)
    report = backend.run_window(action, arrivals, t0, dt)   # action.replicas scales the cluster

Each replica is the single-server simulator's engine (`sim.array_engine.make_engine`), driven exactly as `SimBackend`
drives it (Engine.serve_window: configure / start_window / run / close_window); the six per-replica knobs apply to every
replica. What is added is the cluster around them:

Replica life cycle:

    requested -> starting -> ready -> draining -> gone

- requested / starting: `action.replicas` above the live count (starting + ready) requests new replicas
  at the window's start. A starting replica is billed and serves nothing; it becomes ready
  `profile.cold_start_s()` later (the FP16 checkpoint read at the profile's cited load bandwidth plus
  engine start-up; figures and sources in the profile's `cluster` block and provenance). It can take
  requests from that instant, mid-window.
- scaling down: `action.replicas` below the live count first cancels starting replicas (newest first;
  billed until the cancel), then drains ready ones (least outstanding work first). A draining replica
  takes no new request; its queued and running requests finish there under the current knobs (none is
  moved), and it is gone at the end of the window in which its last request finishes.
- cost: every replica is billed per second (tp x price per GPU-hour) from its request until it is gone.
  While the live count is at least 1 there is always a ready replica: cancelling a starting replica
  comes before draining a ready one, and the range's minimum is at least 1.

Router: least outstanding work, estimated. Each arrival goes to the ready replica with the least
estimated outstanding work (prompt + output tokens still to process), ties to the lowest index. The
estimate is the router's own book-keeping, as a production router keeps it (it sees no engine's queue
mid-window): at each window's start it is reset to the true outstanding tokens of the replica's queued
and running requests, it grows by each request routed there, and it drains at the replica's measured
processing rate (prompt + output tokens per busy second in its last window; a new replica starts from
the cluster's mean).

Router "tracked" (opt-in, `ClusterBackend(..., router="tracked")`): each arrival is routed on the replicas'
true outstanding work at its arrival time, as the real-mode gateway sees its in-flight requests
(gateway/dispatcher.py): every eligible replica's engine is first run to the arrival's time (an iteration
that starts before it is simulated whole, as at a window's end), the work is summed over the requests it
holds then (shared/routing.py `outstanding_work`, a request's routed cache hit left out until its first
token, as the gateway leaves out its routed hit), and the arrival is handed to the chosen engine at once
(sim/engine.py `begin_window` / `advance` / `add_arrival` / `end_window`). With `cache_affinity` set, a
replica's cached share is its engine's cache at that instant plus what was routed there this window.
Each engine draws an arrival's speculation acceptance as it receives it, rather than a window's at once;
the routes differ from the estimated router's, so the engines' random streams do too: tracked episodes
are their own (deterministic) trajectories, not the default's. An engine run to every arrival's time has
its decode runs cut there; the engine skips scheduling passes within a decode run while its queue is
blocked, so under KV pressure (a prefill that preempted itself) a cut can re-admit a waiting request
sooner: even a single replica's tracked run then differs from its estimated one (without that pressure
they agree). Routing costs O(requests held) per arrival and replica. The default, "estimated", is unchanged.

Scenario families only (`disruptions`, shared/scenarios.py; None on every other task, which then
behaves exactly as without it): each replica's cold start is the profile's times a drawn log-normal
factor, and a spot preemption reclaims replica i at a drawn time after its request. A reclaimed
replica is gone at the start of the first window at or after that time (within AWS's two-minute
notice of a 10 s window), its queued and running requests are lost (finished `preempted`: missed),
and the target is requested again, as a Kubernetes ReplicaSet replaces a lost pod, through a new
cold start. Arrivals that find no ready replica (the last one reclaimed) are rejected.

Forkable (`fork()`, what `Episode.fork` and the planner use): the copy holds its own replicas,
engines and router estimates; the profile and step-time models are shared.

Deterministic: replica i of an episode with seed s draws its engine randomness from seed
s x MAX_REPLICAS + i, and nothing depends on wall-clock time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from llmserve_env.shared.arrival_list import ArrivalColumns, ArrivalList, arrival_columns
from llmserve_env.shared.backend import Arrival, RequestRecord, ResourceSample, WindowReport
from llmserve_env.shared.jit import HAVE_NUMBA
from llmserve_env.shared.models import KNOBS, MAX_REPLICAS, ServeAction
from llmserve_env.shared.prefix_routing import affinity_choice, hit_cap_units
from llmserve_env.shared.records import FirstTokens, ItlSamples, RequestBatch
from llmserve_env.shared.routing import least_outstanding, outstanding_work_by_segment
from llmserve_env.shared.scenarios import ReplicaDisruptions
from llmserve_env.sim.array_engine import ArrayEngine, WindowEnd, make_engine
from llmserve_env.sim.backend import _models_for
from llmserve_env.sim.compiled_routing import route_least_work
from llmserve_env.sim.engine import Engine, WindowMeasurements
from llmserve_env.sim.fork import fork_engine
from llmserve_env.sim.profiles import Profile, load_profile
from llmserve_env.sim.resource_samples import SampleColumns
from llmserve_env.sim.routed_prefixes import RoutedPrefixes
from llmserve_env.sim.window_join import join_ends

STARTING, READY, DRAINING, GONE = "starting", "ready", "draining", "gone"
ROUTERS = ("estimated", "tracked")  # the module docstring's two routers


@dataclass(slots=True)
class Replica:
    """One replica: its life-cycle times, its engine once ready, and the router's estimate of its work."""

    index: int
    requested_s: float
    ready_s: float
    state: str = STARTING
    engine: Engine | ArrayEngine | None = None
    gone_s: float | None = None
    rate_tps: float = 0.0      # measured prompt + output tokens per busy second, last window
    est_work: float = 0.0      # router's outstanding-work estimate (tokens) at est_t
    est_t: float = 0.0
    preempt_s: float = math.inf  # when a spot preemption reclaims it (scenario families)
    # its requests at the last window's end (families)
    pending: RequestBatch = field(default_factory=lambda: RequestBatch.from_records([]))

    def work_at(self, t: float) -> float:
        w = self.est_work - self.rate_tps * (t - self.est_t)
        return w if w > 0.0 else 0.0

    def billed_s(self, t0: float, t1: float) -> float:
        end = t1 if self.gone_s is None else min(t1, self.gone_s)
        return max(0.0, end - max(t0, self.requested_s))


def _outstanding_tokens(pending: RequestBatch, bounds: Sequence[int]) -> list[int]:
    """The outstanding work of each replica's rows of `pending` (bounds[i]..bounds[i+1]-1: replica i's)."""
    first = pending.first_token_s
    return outstanding_work_by_segment(pending.prompt_tokens, pending.target_output_tokens, pending.output_tokens,
                                       first == first, bounds)  # NaN: no first token yet


class ClusterBackend:
    """A simulated cluster of identical serving replicas with a cold start, drain and per-second billing."""

    name = "sim"

    def __init__(self, profile_id: str | Profile = "h100-llama3.1-8b", replicas: tuple[int, int] = (1, 8),
                 initial: int = 1, disruptions: ReplicaDisruptions | None = None, router: str = "estimated"):
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
        self.router = router
        self.profile = profile_id if isinstance(profile_id, Profile) else load_profile(profile_id)
        lo, hi = replicas
        if not 1 <= lo <= initial <= hi <= MAX_REPLICAS:
            raise ValueError(f"replicas range {replicas} and initial {initial}: need 1 <= min <= initial <= max "
                             f"<= {MAX_REPLICAS}")
        self.range = (lo, hi)
        self.initial = initial
        self.disruptions = disruptions
        self.cold_start_s = self.profile.cold_start_s()
        self.price_per_s = self.profile.replica_price_per_s()
        self._models = _models_for(self.profile)
        self.reset(0)

    # ----------------------------------------------------------------------------------- life cycle

    def reset(self, seed: int) -> None:
        self.seed = int(seed)
        self.replicas: list[Replica] = []
        for _ in range(self.initial):  # ready at t = 0 (started before the episode; not billed before it)
            r = self._request(0.0)
            r.ready_s = 0.0
        self.target = self.initial
        self.preempted = 0
        self._unrouted: list[Arrival] = []

    def _request(self, t: float) -> Replica:
        r = Replica(len(self.replicas), t, t + self.cold_start_s)
        if self.disruptions is not None:
            factor, life = self.disruptions.draw(self.seed, r.index)
            r.ready_s, r.preempt_s = t + self.cold_start_s * factor, t + life
        self.replicas.append(r)
        return r

    def _reclaim(self, t: float) -> list[RequestRecord]:
        """Spot preemption at a window's start (module docstring): the reclaimed replicas' requests, lost."""
        lost: list[RequestRecord] = []
        before = self.preempted
        for r in self.replicas:
            if r.state != GONE and r.preempt_s <= t:
                lost += [dataclasses.replace(rec, status="preempted", finish_s=t,
                                             error="replica reclaimed (spot preemption)") for rec in r.pending.records()]
                r.state, r.gone_s, r.engine, r.pending = GONE, t, None, RequestBatch.from_records([])
                self.preempted += 1
        if self.preempted > before:
            self._scale(self.target, t)
        return lost

    def _make_ready(self, r: Replica) -> None:
        r.engine = make_engine(self.profile, self.seed * MAX_REPLICAS + r.index, self._models)
        r.state = READY
        r.est_t = r.ready_s
        rates = [x.rate_tps for x in self.replicas if x.state in (READY, DRAINING) and x.rate_tps > 0]
        r.rate_tps = sum(rates) / len(rates) if rates else 0.0

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state in (STARTING, READY)]

    def _scale(self, target: int, t: float) -> None:
        self.target = target
        live = self.live()
        for _ in range(target - len(live)):
            self._request(t)
        excess = len(live) - target
        if excess <= 0:
            return
        for r in sorted((r for r in live if r.state == STARTING), key=lambda r: -r.index)[:excess]:
            r.state, r.gone_s = GONE, t
            excess -= 1
        ready = sorted((r for r in live if r.state == READY), key=lambda r: (r.work_at(t), -r.index))
        for r in ready[:excess]:
            r.state = DRAINING

    def counts(self) -> dict[str, int]:
        out = {STARTING: 0, READY: 0, DRAINING: 0}
        for r in self.replicas:
            if r.state in out:
                out[r.state] += 1
        return out

    # ----------------------------------------------------------------------------------- one window

    def _route(self, arrivals: Sequence[Arrival], affinity: float | None = None) -> Mapping[int, Sequence[Arrival]]:
        """Each arrival to a replica ready by its arrival time: least outstanding work (shared/routing.py),
        or with `action.cache_affinity` set, its cached share per replica (the engine's cache at the
        window's start plus what was routed there since) weighed against that work
        (shared/prefix_routing.py); a hit's tokens are not added to the replica's work."""
        ready = [r for r in self.replicas if r.state == READY]
        if affinity is None and HAVE_NUMBA and ready:  # the compiled router reads the arrivals' columns
            return self._route_compiled(arrivals, arrival_columns(arrivals), ready)
        routed: dict[int, list[Arrival]] = {r.index: [] for r in ready}
        sent: dict[int, RoutedPrefixes] = {r.index: RoutedPrefixes() for r in ready} if affinity is not None else {}
        # every ready replica takes every arrival when all were ready by the first one (the usual case)
        first = min((a.arrival_s for a in arrivals), default=0.0)
        everyone = bool(ready) and all(r.ready_s <= first for r in ready)
        for a in arrivals:
            t = a.arrival_s
            eligible = ready if everyone else self._eligible(ready, a)
            if not eligible:  # only after a spot preemption: otherwise a ready replica exists from t0 on
                continue
            work = [r.work_at(t) for r in eligible]
            i, hit = self._choose(a, eligible, work, affinity, sent)
            best = eligible[i]
            best.est_work = work[i] + a.prompt_tokens - hit + a.output_tokens
            best.est_t = t
            routed[best.index].append(a)
        return routed

    def _route_compiled(self, arrivals: Sequence[Arrival], cols: ArrivalColumns,
                        ready: list[Replica]) -> dict[int, Sequence[Arrival]]:
        """`_route`'s loop without cache affinity, compiled (sim/compiled_routing.py): the same routes and
        estimates, each replica eligible from its ready time on. `cols`: the arrivals' columns."""
        n, k = len(arrivals), len(ready)
        est = np.array([[r.est_work for r in ready], [r.est_t for r in ready], [r.rate_tps for r in ready],
                        [r.ready_s for r in ready]], dtype=np.float64)
        choice, order, group = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(k + 1, dtype=np.int64)
        at = arrivals.__getitem__
        if route_least_work(cols.arrival_s, cols.prompt_tokens, cols.output_tokens, est, choice, order, group):
            # no replica ready by these arrivals' times (only after a spot preemption): grouped after every
            # replica's rows, and left there
            for j in np.flatnonzero(choice < 0).tolist():
                self._eligible(ready, at(j))  # raises without disruptions, else keeps it to be rejected
        counts = group.tolist()
        est_work, est_t = est[0].tolist(), est[1].tolist()
        grouped = cols.take(order)  # one gather for all; each replica's rows are then a slice (views)
        routed: dict[int, Sequence[Arrival]] = {r.index: [] for r in ready}
        lo = 0
        for i, m in enumerate(counts[:k]):
            if m:  # a replica that took arrivals (as columns: no object built; with prefix ids, the objects)
                taken = grouped.slice(lo, lo + m)
                routed[ready[i].index] = ArrivalList(map(at, order[lo:lo + m].tolist()), taken) if taken.prefixed \
                    else ArrivalList(columns=taken)
                ready[i].est_work, ready[i].est_t = est_work[i], est_t[i]
                lo += m
        return routed

    def _eligible(self, ready: list[Replica], a: Arrival) -> list[Replica]:
        """The ready replicas that take `a` (ready by its time); none only after a spot preemption, when
        the arrival is kept to be rejected."""
        eligible = [r for r in ready if r.ready_s <= a.arrival_s]
        if not eligible:
            if self.disruptions is None:
                raise RuntimeError(f"no ready replica at t={a.arrival_s:.3f}")
            self._unrouted.append(a)
        return eligible

    def _choose(self, a: Arrival, eligible: list[Replica], work: list[float], affinity: float | None,
                sent: dict[int, RoutedPrefixes]) -> tuple[int, int]:
        """(index into `eligible`, prompt tokens counted as cached there): least outstanding work, or the
        cache-aware rule, which also remembers `a`'s units as sent to the replica chosen."""
        if affinity is None:
            return least_outstanding(work), 0
        hits = self._cached_tokens(a, eligible, sent)
        i = affinity_choice(work, [h / a.prompt_tokens for h in hits], affinity)
        if a.prefix_ids is not None:
            keys = a.prefix_ids
            sent[eligible[i].index].add(keys, min(len(keys), (a.prompt_tokens + a.output_tokens) // a.prefix_block_tokens))
        return i, hits[i]

    def _route_tracked(self, arrivals: Sequence[Arrival], affinity: float | None = None) -> None:
        """The tracked router (module docstring): each arrival, in time order, to the replica with the
        least true outstanding work at its arrival (or the cache-aware rule over it), handed to that
        engine at once. The engines' windows are begun; only the eligible ones are advanced (a draining
        replica takes no arrival: it runs to the window's end in one go, as under the estimated router)."""
        ready = [r for r in self.replicas if r.state == READY]
        sent: dict[int, RoutedPrefixes] = {r.index: RoutedPrefixes() for r in ready} if affinity is not None else {}
        for a in arrivals:
            eligible = self._eligible(ready, a)
            if not eligible:
                continue
            engines = []
            for r in eligible:
                eng = r.engine
                assert eng is not None  # a ready replica has its engine
                eng.advance(a.arrival_s)
                engines.append(eng)
            work = [eng.outstanding_tokens() for eng in engines]
            i, hit = self._choose(a, eligible, work, affinity, sent)
            engines[i].add_arrival(a, hit)

    @staticmethod
    def _cached_tokens(a: Arrival, eligible: list[Replica], sent: dict[int, RoutedPrefixes]) -> list[int]:
        """Prompt tokens of `a` each eligible replica holds: its engine's cached leading units, or the
        leading units routed there this window, whichever is longer (at least one token left to compute)."""
        keys = a.prefix_ids
        if keys is None:
            return [0] * len(eligible)
        unit = a.prefix_block_tokens
        cap = hit_cap_units(a.prompt_tokens, unit)
        n = min(cap, len(keys))
        hits = []
        for r in eligible:
            eng = r.engine
            cached = eng.cached_units(keys, cap) if eng is not None else 0
            hits.append(unit * min(cap, max(cached, sent[r.index].overlap(keys, n))))
        return hits

    def run_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float, dt: float) -> WindowReport:
        t1 = t0 + dt
        lost = self._reclaim(t0) if self.disruptions is not None else []
        if action.replicas is not None:
            lo, hi = self.range
            if not lo <= action.replicas <= hi:
                raise ValueError(f"replicas must be in {lo}..{hi}, got {action.replicas}")
            self._scale(action.replicas, t0)
        for r in self.replicas:
            if r.state == STARTING and r.ready_s < t1:
                self._make_ready(r)
        tracked = self.router == "tracked"
        if tracked:  # the engines run arrival by arrival while routing (_route_tracked), then to t1 below
            for r in self.replicas:
                if r.engine is not None and r.state in (READY, DRAINING):
                    r.engine.begin_window(action, t0, dt)
            self._route_tracked(arrivals, action.cache_affinity)
            routed: Mapping[int, Sequence[Arrival]] = {}
        else:
            routed = self._route(arrivals, action.cache_affinity)
        p = self.profile
        rep = WindowReport(t0=t0, dt=dt, quality=p.tiers[action.quantization_tier].quality,
                           applied=dict.fromkeys((*KNOBS, "replicas"), True))
        if action.cache_affinity is not None:
            rep.applied["cache_affinity"] = True
        # each serving replica's window: a compiled engine's ended in place (its outputs still in its buffers), a
        # Python engine's (or a compiled one's after a hand-over) as its report
        ended: list[tuple[Replica, WindowEnd | tuple[list[RequestRecord] | RequestBatch, int, float, WindowMeasurements]]] = []
        for r in self.replicas:
            if r.state not in (READY, DRAINING):
                continue
            eng = r.engine
            assert eng is not None  # a ready or draining replica has its engine
            if not tracked:  # (the tracked router began the engines' windows and ran them through the arrivals)
                eng.begin_window(action, t0, dt, routed.get(r.index, []))
            ended.append((r, eng.end_in_place() if isinstance(eng, ArrayEngine) and eng._py is None
                          else eng.end_window()))  # runs to t1
        ends = [e for _, e in ended if isinstance(e, WindowEnd)]
        if lost or self._unrouted or not ended or len(ends) < len(ended):
            # the replicas' requests as columns (the compiled engine's own shape; the Python engine's records
            # converted once), joined in replica order, with the requests lost to a preemption first
            reports = [e.engine.report(e) if isinstance(e, WindowEnd) else e for _, e in ended]
            finished = [RequestBatch.of(acc.finished) for _, _, _, acc in reports]
            if lost or self._unrouted:
                finished.insert(0, RequestBatch.from_records(lost + [RequestRecord(
                    a.request_id, a.tenant, a.priority, a.arrival_s, a.prompt_tokens, a.output_tokens, status="rejected",
                    finish_s=a.arrival_s, error="no ready replica (spot preemption)") for a in self._unrouted]))
                self._unrouted = []
            pendings = [RequestBatch.of(got) for got, _, _, _ in reports]
            rep.finished, rep.pending = RequestBatch.concat(finished), RequestBatch.concat(pendings)
            rep.first_tokens = FirstTokens.concat([acc.first_tokens for _, _, _, acc in reports])
            rep.itl_samples = ItlSamples.concat([acc.itl for _, _, _, acc in reports])
            served = [(used, mem, acc, pending, 0, len(pending), _outstanding_tokens(pending, (0, len(pending)))[0])
                      for (_, used, mem, acc), pending in zip(reports, pendings, strict=True)]
        else:  # every replica's rows copied once, into the joined columns (sim/window_join.py)
            joined = join_ends(ends)
            rep.finished, rep.pending, rep.first_tokens, rep.itl_samples = \
                joined.finished, joined.pending, joined.first_tokens, joined.itl
            work = _outstanding_tokens(joined.pending, [0, *(hi for _, hi in joined.pending_rows)])
            served = [(e.used, e.mem, e.acc, joined.pending, lo, hi, w)
                      for e, (lo, hi), w in zip(ends, joined.pending_rows, work, strict=True)]
        samples: list[list[ResourceSample] | SampleColumns] = []
        used_total = blocks_total = iterations = rejected = 0
        spec_accepted = 0.0
        for (r, _), (used, mem, acc, pending, lo, hi, outstanding) in zip(ended, served, strict=True):
            eng = r.engine
            assert eng is not None
            samples.append(acc.samples)
            rep.output_tokens += acc.output_tokens
            rep.prompt_tokens += acc.prompt_tokens
            rep.evictions += acc.evictions
            rep.prefix_query_tokens += acc.prefix_query
            rep.prefix_hit_tokens += acc.prefix_hit
            rep.prefix_cached_blocks += eng.cached_blocks
            rep.spec_proposed += acc.spec_proposed
            spec_accepted += acc.spec_accepted
            rep.busy_s += acc.busy
            rep.gpu_memory_used_gb += mem
            used_total += used
            blocks_total += eng.kv.total
            iterations += acc.iterations
            rejected += acc.rejected
            processed = acc.prompt_tokens + acc.output_tokens
            if processed > 0 and acc.busy > 0:
                r.rate_tps = processed / acc.busy
            r.est_work, r.est_t = outstanding, t1
            if self.disruptions is not None:
                r.pending = pending.slice(lo, hi)
            if r.state == DRAINING and hi == lo:
                r.state, r.gone_s, r.engine = GONE, t1, None
        rep.samples = SampleColumns.concat(samples)
        rep.spec_accepted = int(round(spec_accepted))
        rep.kv_occupancy = used_total / blocks_total if blocks_total else 0.0
        billed = sum(r.billed_s(t0, t1) for r in self.replicas)
        rep.cost_usd = billed * self.price_per_s
        counts = self.counts()
        rep.notes = {
            "profile": p.id, "iterations": iterations, "kv_blocks_total": blocks_total, "kv_blocks_used": used_total,
            "rejected": rejected,
            "cluster": {
                "target": self.target, "ready": counts[READY], "starting": counts[STARTING],
                "draining": counts[DRAINING], "replica_seconds": round(billed, 6),
                "cold_start_s": round(self.cold_start_s, 3),
                "starting_ready_in_s": sorted(round(r.ready_s - t1, 3) for r in self.replicas if r.state == STARTING),
            },
        }
        if self.disruptions is not None:
            cluster = rep.notes["cluster"]
            assert isinstance(cluster, dict)
            cluster["preempted"] = self.preempted
        return rep

    def fork(self) -> ClusterBackend:
        """An independent copy in the same state: every replica (life-cycle times, state, engine with
        its queues, KV cache, clocks and random stream), the router's estimates, the target and the
        billing clock (billing is derived from each replica's request and gone times). The profile
        and step-time models are shared (sim/fork.py)."""
        return fork_engine(self, shared=(self._models, *self._models.values()))

    def close(self) -> None:
        for r in self.replicas:
            r.engine = None
