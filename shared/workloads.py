"""Arrival streams: every request of an episode, from (task, seed) alone.

`generate_arrivals(task, seed)` returns the whole episode's requests (horizon x window_s
seconds), sorted by arrival time, with request ids 0..n-1. Nothing here sees an action, so every
policy played on the same (task, seed) serves the same requests. Randomness comes from a numpy
Generator seeded with (seed, WORKLOAD_STREAM), split into independent sub-streams for arrival
times, tenants and lengths: the engine's stream (seeded from `seed` alone) never overlaps it,
and changing a length distribution does not move any arrival time.

Arrival processes (`task.workload["kind"]`):

- "poisson": homogeneous Poisson at `rate_rps`; each arrival's tenant drawn by share.
- "mmpp": Markov-modulated Poisson. The phase is a continuous-time Markov chain over
  `rates_rps` (one rate per phase) whose dwell in phase k is exponential with mean
  `mean_dwell_windows[k]` windows; it moves to another phase chosen uniformly (two phases
  alternate) and starts in its stationary distribution. Within a phase, Poisson at its rate.
- "spiky": every tenant sends Poisson traffic at `rate_rps` x share; at each window not already
  in a spike, a spike starts with probability `spike_prob` and lasts a whole number of windows
  drawn uniformly from `spike_len_windows` [lo, hi]; during it `spike_tenant`'s rate is
  multiplied by `spike_factor`.
- "cycle": a daily cycle (cluster tasks). Each tenant under `tenants` sends Poisson traffic whose
  rate follows a raised cosine over `cycle_windows` windows, from `trough_rps` half a cycle away
  from `peak_window` up to `peak_rps` at it (evaluated at each window's centre), times a log-normal
  factor with sigma `noise_sigma` drawn per window and tenant. Each entry of `jobs` adds a tenant's
  scheduled job: Poisson at `rate_rps` for `windows` windows from `start_window` (every cycle).
  A scenario family (`workload["family"]`, shared/scenarios.py) draws the day from the seed instead:
  each tenant's rate per window and the jobs come from `draw_day(task, seed)` (its own random
  stream), and the arrivals are Poisson at those rates, drawn as above.
- "trace": a file replayed (`shared.traces`): `packaged` names a trace shipped in shared/data,
  `path` a file. With `speedup` and `start_s` the slice is fixed and the seed changes nothing.
  With `tokens_per_s` the seed picks the slice: the consecutive requests, from a start drawn
  uniformly over the trace, that hold tokens_per_s x episode seconds of prompt + output tokens,
  time-scaled to fill the episode (each seed replays a different part of the trace at the same
  mean load, with the trace's own burstiness and lengths). With `prefix_block_tokens` the file is a
  Mooncake-format JSONL (gzip allowed) whose `hash_ids` become each arrival's prefix ids
  (shared/prefix.py), for prefix caching.
- "multiturn": synthetic multi-turn chat with prefix ids (shared/prefix.py `multiturn_arrivals`,
  parameters `spec`, a `MultiTurnSpec` as a dict), for the first tenant.

Lengths (non-trace kinds): log-normal with the tenant's (median, sigma), rounded, clipped to the
tenant's [min, max].

`resolve_task("trace:PATH")` builds a one-tenant task that replays PATH; an optional query
string sets `speedup`, `start_s`, `horizon`, `window_s`, `ttft_ms`, `tpot_ms`
(`trace:/data/t.csv?speedup=4&horizon=32`), and `replicas` (the most replicas an action may ask
for: above 1 the replay is a cluster task, starting with `initial_replicas`, default 1):
`trace:/data/week.csv?window_s=10&horizon=1008&replicas=8`; `prefix_block_tokens=512` reads a
Mooncake-format JSONL (gzip allowed) with its `hash_ids` as prefix ids, for prefix caching
(`trace:/data/mooncake_conversation.jsonl.gz?prefix_block_tokens=512`). The horizon is cut to the replayed slice's length when
the trace is shorter (at least one window).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np
from llmserve_env.shared import portable_math as pm
from llmserve_env.shared.arrival_list import ArrivalColumns, ArrivalList
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import MAX_REPLICAS
from llmserve_env.shared.prefix import (
    MultiTurnSpec,
    load_prefix_trace,
    multiturn_arrivals,
    slice_ids,
    with_prefix,
    workload_day_scale,
)
from llmserve_env.shared.scenarios import draw_day, is_family
from llmserve_env.shared.tasks import MAX_HORIZON, TaskSpec, TenantSpec, UnknownTaskError, get_task
from llmserve_env.shared.traces import TraceError, TraceSlice, load_trace, packaged_trace_path, replay_slice

# Mixed into every workload seed so the workload's random stream is not the engine's.
WORKLOAD_STREAM = 0x574F524B  # "WORK"
TRACE_PREFIX = "trace:"
# SLOs of a `trace:PATH` replay unless its query string sets them (a conversational service).
TRACE_DEFAULT_TTFT_MS = 1000.0
TRACE_DEFAULT_TPOT_MS = 60.0
TRACE_DEFAULT_HORIZON = 64


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    ss = np.random.SeedSequence([int(seed), WORKLOAD_STREAM])
    times, tenants, lengths = (np.random.default_rng(s) for s in ss.spawn(3))
    return times, tenants, lengths


def _lognormal_tokens(rng: np.random.Generator, n: int, params: tuple[float, float],
                      clip: tuple[int, int]) -> np.ndarray:
    median, sigma = params
    x = pm.exp(math.log(median) + sigma * rng.standard_normal(n))  # (NumPy's exp is the CPU's own: portable_math)
    return np.clip(np.rint(x), clip[0], clip[1]).astype(np.int64)


def _poisson_times(rng: np.random.Generator, rate: float, t0: float, t1: float) -> np.ndarray:
    """Arrival times of a Poisson process of `rate` on [t0, t1): a Poisson count, uniform times."""
    n = int(rng.poisson(rate * (t1 - t0))) if rate > 0 and t1 > t0 else 0
    return rng.uniform(t0, t1, n)


def _mmpp_times(rng: np.random.Generator, task: TaskSpec, total_s: float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """(arrival times, the [start, end) spans spent in the highest-rate phase) of the MMPP."""
    rates = [float(r) for r in task.workload["rates_rps"]]
    dwell_s = [float(d) * task.window_s for d in task.workload["mean_dwell_windows"]]
    k = len(rates)
    if k < 1 or len(dwell_s) != k:
        raise ValueError(f"task {task.task_id!r}: rates_rps and mean_dwell_windows must have the same length")
    top = rates.index(max(rates))
    high: list[tuple[float, float]] = []
    # With uniform jumps to another phase, time in phase j is proportional to its mean dwell.
    phase = int(rng.choice(k, p=np.asarray(dwell_s) / sum(dwell_s)))
    chunks, t = [], 0.0
    while t < total_s:
        end = min(total_s, t + float(rng.exponential(dwell_s[phase])))
        chunks.append(_poisson_times(rng, rates[phase], t, end))
        if phase == top:
            high.append((t, end))
        t = end
        if k > 1:
            phase = (phase + 1 + int(rng.integers(0, k - 1))) % k
    return (np.concatenate(chunks) if chunks else np.empty(0)), high


def _add_overlap(per_window: np.ndarray, t0: float, t1: float, window_s: float) -> None:
    """Add to each window the seconds of [t0, t1) that fall in it."""
    for w in range(int(t0 // window_s), min(per_window.shape[0], int(math.ceil(t1 / window_s)))):
        per_window[w] += max(0.0, min(t1, (w + 1) * window_s) - max(t0, w * window_s))


def _spiky(rng: np.random.Generator, task: TaskSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, tenant index, 1.0 for each window in a spike) of the spiky process, window by window."""
    w = task.workload
    base = float(w["rate_rps"])
    spike_tenant = [t.name for t in task.tenants].index(w["spike_tenant"])
    factor = float(w["spike_factor"])
    prob = float(w["spike_prob"])
    lo, hi = (int(x) for x in w["spike_len_windows"])
    times, who = [], []
    spikes = np.zeros(task.horizon)
    left = 0  # windows of the current spike still to come
    for k in range(task.horizon):
        if left == 0 and rng.random() < prob:
            left = int(rng.integers(lo, hi + 1))
        spiking = left > 0
        t0, t1 = k * task.window_s, (k + 1) * task.window_s
        for i, tenant in enumerate(task.tenants):
            rate = base * tenant.share * (factor if spiking and i == spike_tenant else 1.0)
            ts = _poisson_times(rng, rate, t0, t1)
            times.append(ts)
            who.append(np.full(ts.shape[0], i, dtype=np.int64))
        if spiking:
            spikes[k] = 1.0
            left -= 1
    return np.concatenate(times), np.concatenate(who), spikes


def cycle_rate(task: TaskSpec, spec: dict, k: int) -> float:
    """The mean arrival rate (req/s) of one `cycle` tenant in window k, before the noise factor."""
    w = task.workload
    n = int(w["cycle_windows"])
    phase = ((k + 0.5 - float(w["peak_window"])) / n) % 1.0  # 0 at the peak, 0.5 at the trough
    shape = 0.5 * (1.0 + math.cos(2.0 * math.pi * phase))
    lo, hi = float(spec["trough_rps"]), float(spec["peak_rps"])
    return lo + (hi - lo) * shape


def _cycle(rng: np.random.Generator, task: TaskSpec) -> tuple[np.ndarray, np.ndarray]:
    """(times, tenant index) of the `cycle` process, window by window."""
    w = task.workload
    names = [t.name for t in task.tenants]
    cycled = [(names.index(name), spec) for name, spec in w.get("tenants", {}).items()]
    jobs = [(names.index(j["tenant"]), int(j["start_window"]), int(j["windows"]), float(j["rate_rps"]))
            for j in w.get("jobs", [])]
    sigma = float(w.get("noise_sigma", 0.0))
    n = int(w["cycle_windows"])
    times, who = [], []
    for k in range(task.horizon):
        t0, t1 = k * task.window_s, (k + 1) * task.window_s
        for i, spec in cycled:
            # the noise is drawn whatever the rate, so the stream never depends on the shape
            rate = cycle_rate(task, spec, k) * math.exp(sigma * float(rng.standard_normal()) - 0.5 * sigma * sigma)
            ts = _poisson_times(rng, rate, t0, t1)
            times.append(ts)
            who.append(np.full(ts.shape[0], i, dtype=np.int64))
        for i, start, length, rate in jobs:
            if start <= k % n < start + length:
                ts = _poisson_times(rng, rate, t0, t1)
                times.append(ts)
                who.append(np.full(ts.shape[0], i, dtype=np.int64))
    if not times:
        return np.empty(0), np.empty(0, dtype=np.int64)
    return np.concatenate(times), np.concatenate(who)


def _family_day(rng: np.random.Generator, task: TaskSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(times, tenant index) of a scenario family's day (shared.scenarios.draw_day), window by window:
    Poisson at each cycled tenant's drawn rate, and at each drawn job's rate while it runs."""
    day = draw_day(task, seed)
    names = [t.name for t in task.tenants]
    cycled = [(names.index(name), rates) for name, rates in day.rates.items()]
    jobs = [(names.index(j.tenant), j.start_window, j.windows, j.rate_rps) for j in day.jobs]
    times, who = [], []
    for k in range(task.horizon):
        t0, t1 = k * task.window_s, (k + 1) * task.window_s
        for i, rates in cycled:
            ts = _poisson_times(rng, float(rates[k]), t0, t1)
            times.append(ts)
            who.append(np.full(ts.shape[0], i, dtype=np.int64))
        for i, start, length, rate in jobs:
            if start <= k < start + length:
                ts = _poisson_times(rng, rate, t0, t1)
                times.append(ts)
                who.append(np.full(ts.shape[0], i, dtype=np.int64))
    if not times:
        return np.empty(0), np.empty(0, dtype=np.int64)
    return np.concatenate(times), np.concatenate(who)


def _trace_slice(task: TaskSpec, rng: np.random.Generator) -> TraceSlice:
    w = task.workload
    path = packaged_trace_path(w["packaged"]) if "packaged" in w else Path(w["path"])
    trace = load_prefix_trace(path, int(w["prefix_block_tokens"])).trace if "prefix_block_tokens" in w else load_trace(path)
    total_s = task.horizon * task.window_s
    if w.get("seeded_start"):
        # At the trace's own pace from a start the seed draws (the Mooncake task): each seed replays
        # another stretch with its own arrival times and lengths, unscaled
        speedup = float(w.get("speedup", 1.0))
        t_first, t_last = float(trace.arrival_s[0]), float(trace.arrival_s[-1])
        latest = t_last - total_s * speedup
        if latest < t_first:
            raise TraceError(f"trace {trace.path!r}: shorter than the {total_s * speedup:g} s an episode replays")
        return replay_slice(trace, total_s, speedup=speedup, start_s=float(rng.uniform(t_first, latest)))
    if "tokens_per_s" not in w:
        return replay_slice(trace, total_s, speedup=float(w.get("speedup", 1.0)), start_s=w.get("start_s"))
    # Seeded slice: consecutive requests from a start drawn by the seed, as many as hold
    # tokens_per_s x episode seconds of work (prompt + output tokens), played at the speed that
    # fits them into the episode. Normalising by tokens rather than requests keeps the load, and so
    # the difficulty, alike across seeds; the trace's own burstiness and lengths are kept.
    work = np.cumsum(trace.prompt_tokens + trace.output_tokens)
    target = float(w["tokens_per_s"]) * total_s
    if work[-1] <= target:
        raise TraceError(f"trace {trace.path!r}: holds {int(work[-1])} tokens, fewer than the {target:g} to replay")
    last_first = int(np.searchsorted(work, work[-1] - target, side="right"))
    first = int(rng.integers(0, last_first + 1))
    base = float(work[first - 1]) if first else 0.0
    end = int(np.searchsorted(work, base + target))
    t0, t_end = float(trace.arrival_s[first]), float(trace.arrival_s[end])
    if t_end <= t0:
        raise TraceError(f"trace {trace.path!r}: requests {first}..{end} all arrive at the same time")
    return replay_slice(trace, total_s, speedup=(t_end - t0) / total_s, start_s=t0)


def generate_arrivals(task: TaskSpec, seed: int) -> Sequence[Arrival]:
    """Every request of one episode of `task` under `seed` (see the module docstring)."""
    total_s = task.horizon * task.window_s
    kind = task.workload.get("kind")
    t_rng, who_rng, len_rng = _streams(seed)
    if kind == "trace":
        sl = _trace_slice(task, t_rng)
        tenant = task.tenants[0]
        n = len(sl)
        columns = ArrivalColumns(np.arange(n, dtype=np.int64), sl.arrival_s.astype(np.float64),
                                 sl.prompt_tokens.astype(np.int64), sl.output_tokens.astype(np.int64),
                                 np.full(n, tenant.name, dtype=object), np.full(n, tenant.priority, dtype=np.int64),
                                 known_index=tenant_indices(task.tenants, np.zeros(n, dtype=np.int64)))
        out: Sequence[Arrival] = ArrivalList(columns=columns)
        if "prefix_block_tokens" in task.workload:
            w = task.workload
            block = int(w["prefix_block_tokens"])
            pt = load_prefix_trace(packaged_trace_path(w["packaged"]) if "packaged" in w else Path(w["path"]), block)
            out = with_prefix(out, slice_ids(pt, sl.start_s, len(sl)), block)
        return out
    if kind == "multiturn":
        tenant = task.tenants[0]
        scale = workload_day_scale(task.workload, task.window_s)  # thinned starts; None: a constant rate
        return multiturn_arrivals(MultiTurnSpec(**task.workload.get("spec", {})), total_s, seed, tenant.name,
                                  tenant.priority, scale)
    if kind == "poisson":
        times = _poisson_times(t_rng, float(task.workload["rate_rps"]), 0.0, total_s)
        who = None
    elif kind == "mmpp":
        times, _ = _mmpp_times(t_rng, task, total_s)
        who = None
    elif kind == "spiky":
        times, who, _ = _spiky(t_rng, task)
    elif kind == "cycle" and is_family(task):
        times, who = _family_day(t_rng, task, seed)
    elif kind == "cycle":
        times, who = _cycle(t_rng, task)
    else:
        raise ValueError(f"task {task.task_id!r}: unknown workload kind {kind!r}")
    order = np.argsort(times, kind="stable")
    times = times[order]
    n = times.shape[0]
    if who is None:
        shares = np.array([t.share for t in task.tenants], dtype=np.float64)
        who = np.asarray(who_rng.choice(len(task.tenants), size=n, p=shares / shares.sum()))
    else:
        who = who[order]
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    for i, tenant in enumerate(task.tenants):
        mask = who == i
        m = int(mask.sum())
        prompt[mask] = _lognormal_tokens(len_rng, m, tenant.prompt_tokens, tenant.prompt_clip)
        output[mask] = _lognormal_tokens(len_rng, m, tenant.output_tokens, tenant.output_clip)
    tenants = task.tenants
    names = np.array([t.name for t in tenants], dtype=object)
    priorities = np.array([t.priority for t in tenants], dtype=np.int64)
    columns = ArrivalColumns(np.arange(n, dtype=np.int64), times, prompt, output, names[who], priorities[who],
                             known_index=tenant_indices(tenants, who))
    return ArrivalList(columns=columns)


def tenant_indices(tenants: tuple[TenantSpec, ...], who: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """`ArrivalColumns.known_index` of rows drawn as indices `who` into a task's `tenants`."""
    return tuple(t.name for t in tenants), np.asarray(who, dtype=np.int64)


def arrivals_at_rates(task: TaskSpec, rates: dict[str, np.ndarray], first_window: int, rng: np.random.Generator,
                      first_id: int = 0) -> list[Sequence[Arrival]]:
    """Windows `first_window`..horizon-1 of Poisson arrivals at `rates` (tenant name -> requests/s of each
    of those windows), each tenant's lengths drawn as `generate_arrivals` draws them: a forecast's day
    turned into requests (agents/forecast.py). Ids count up from `first_id`."""
    names = [t.name for t in task.tenants]
    unknown = sorted(set(rates) - set(names))
    if unknown:
        raise ValueError(f"task {task.task_id!r} has no tenant {unknown[0]!r} (tenants: {', '.join(names)})")
    out: list[Sequence[Arrival]] = []
    next_id = first_id
    tenant_names = np.array(names, dtype=object)
    priorities = np.array([t.priority for t in task.tenants], dtype=np.int64)
    for j, k in enumerate(range(first_window, task.horizon)):
        t0, t1 = k * task.window_s, (k + 1) * task.window_s
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for i, tenant in enumerate(task.tenants):
            r = rates.get(tenant.name)
            if r is None:
                continue
            ts = _poisson_times(rng, float(r[j]), t0, t1)
            m = ts.shape[0]
            if m:
                p = _lognormal_tokens(rng, m, tenant.prompt_tokens, tenant.prompt_clip)
                o = _lognormal_tokens(rng, m, tenant.output_tokens, tenant.output_clip)
                parts.append((ts, np.full(m, i, dtype=np.int64), p, o))
        if parts:
            ts, who, p, o = (np.concatenate(c) for c in zip(*parts, strict=True))
        else:
            ts, who, p, o = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        order = np.lexsort((o, p, who, ts))  # by time, then tenant, prompt, output: (t, i, p, o) tuples sorted
        ts, who, p, o = ts[order], who[order], p[order], o[order]
        n = ts.shape[0]
        out.append(ArrivalList(columns=ArrivalColumns(np.arange(next_id, next_id + n, dtype=np.int64), ts, p, o,
                                                      tenant_names[who], priorities[who],
                                                      known_index=tenant_indices(task.tenants, who))))
        next_id += n
    return out


def high_load_regime(task: TaskSpec, seed: int) -> np.ndarray:
    """The hidden state of the arrival process, per window: the fraction of the window spent in the
    highest-rate MMPP phase, or 1.0 for a window inside a spike; zeros for Poisson and traces.

    Drawn from the same random stream as `generate_arrivals(task, seed)`, so it is the regime
    those arrivals came from. No policy observes it: it is for measuring what knowing it is
    worth (bench/adaptation_headroom.py).
    """
    kind = task.workload.get("kind")
    t_rng, _, _ = _streams(seed)
    if kind == "mmpp":
        high = np.zeros(task.horizon)
        for t0, t1 in _mmpp_times(t_rng, task, task.horizon * task.window_s)[1]:
            _add_overlap(high, t0, t1, task.window_s)
        return high
    if kind == "spiky":
        return _spiky(t_rng, task)[2]
    return np.zeros(task.horizon)


def windows(arrivals: Sequence[Arrival], task: TaskSpec) -> list[Sequence[Arrival]]:
    """Split sorted arrivals into `task.horizon` windows: k*window_s <= t < (k+1)*window_s. An ArrivalList's
    windows are ArrivalLists (their columns sliced; no object built)."""
    edges = [(k + 1) * task.window_s for k in range(task.horizon)]
    out: list[Sequence[Arrival]] = []
    lo = 0
    if isinstance(arrivals, ArrivalList):
        for hi in np.searchsorted(arrivals.columns.arrival_s, edges, side="left").tolist():
            out.append(arrivals[lo:hi])
            lo = hi
    else:
        times = [a.arrival_s for a in arrivals]
        for edge in edges:
            hi = bisect.bisect_left(times, edge, lo)
            out.append(arrivals[lo:hi])
            lo = hi
    if lo != len(arrivals):
        raise ValueError(f"{len(arrivals) - lo} arrival(s) after the horizon of task {task.task_id!r}")
    return out


def resolve_task(task_id: str) -> TaskSpec:
    """A built-in task by id, or a `trace:PATH[?options]` replay (see the module docstring)."""
    if task_id.startswith(TRACE_PREFIX):
        return trace_task(task_id)
    return get_task(task_id)


_TRACE_OPTIONS = {"speedup", "start_s", "horizon", "window_s", "ttft_ms", "tpot_ms", "replicas",
                  "initial_replicas", "prefix_block_tokens"}
# Each option's allowed range: what a replay can mean (a 1e-310 speedup or a 1e-320 s window
# overflowed the horizon arithmetic). start_s is seconds into the trace (0 allowed).
_OPTION_RANGES = {"speedup": (1e-3, 1e6), "start_s": (0.0, 1e12), "horizon": (1, MAX_HORIZON),
                  "window_s": (1e-3, 3600.0), "ttft_ms": (1e-3, 1e7), "tpot_ms": (1e-3, 1e7),
                  "replicas": (1, MAX_REPLICAS), "initial_replicas": (1, MAX_REPLICAS),
                  "prefix_block_tokens": (16, 1 << 16)}
# Most requests one window of a replay may hold: the simulator serves a window's requests on the
# calling thread, and a 2 M-request window took 22 s. The built-in tasks peak below 70 per window
# (5 seeds each); this leaves room for a 50x denser trace and bounds one step to tens of ms.
MAX_REQUESTS_PER_WINDOW = 4096


def _option(options: dict[str, str], name: str, default: float, spec: str) -> float:
    if name not in options:
        return default
    lo, hi = _OPTION_RANGES[name]
    try:
        x = float(options[name])
    except (ValueError, OverflowError):
        raise TraceError(f"{spec!r}: option {name} must be a number in [{lo:g}, {hi:g}]") from None
    if not (math.isfinite(x) and lo <= x <= hi):
        raise TraceError(f"{spec!r}: option {name} must be a number in [{lo:g}, {hi:g}]")
    return x


def check_window_load(sl: TraceSlice, window_s: float, spec: str) -> None:
    """TraceError when one window of the replay holds more than MAX_REQUESTS_PER_WINDOW requests."""
    if len(sl) == 0:
        return
    per_window = np.bincount((sl.arrival_s // window_s).astype(np.int64))
    k = int(per_window.argmax())
    if per_window[k] > MAX_REQUESTS_PER_WINDOW:
        raise TraceError(f"{spec!r}: window {k} of the replay holds {int(per_window[k])} requests, more than "
                         f"the {MAX_REQUESTS_PER_WINDOW} allowed per window (lower speedup or window_s)")


def trace_task(task_id: str) -> TaskSpec:
    """The one-tenant task replaying `trace:PATH[?options]`; TraceError for a bad file or option."""
    spec = task_id[len(TRACE_PREFIX):]
    path, _, query = spec.partition("?")
    if not path:
        raise UnknownTaskError(task_id)
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key not in _TRACE_OPTIONS:
            raise TraceError(f"{task_id!r}: unknown option {key!r}; allowed: {', '.join(sorted(_TRACE_OPTIONS))}")
        options[key] = value
    speedup = _option(options, "speedup", 1.0, task_id)
    window_s = _option(options, "window_s", 1.0, task_id)
    horizon_opt = _option(options, "horizon", TRACE_DEFAULT_HORIZON, task_id)
    if horizon_opt != int(horizon_opt) or not 1 <= horizon_opt <= MAX_HORIZON:
        raise TraceError(f"{task_id!r}: option horizon must be an integer in 1..{MAX_HORIZON}")
    max_replicas = _option(options, "replicas", 1, task_id)
    initial = _option(options, "initial_replicas", 1, task_id)
    if max_replicas != int(max_replicas) or not 1 <= max_replicas <= MAX_REPLICAS:
        raise TraceError(f"{task_id!r}: option replicas must be an integer in 1..{MAX_REPLICAS}")
    if initial != int(initial) or not 1 <= initial <= max_replicas:
        raise TraceError(f"{task_id!r}: option initial_replicas must be an integer in 1..{int(max_replicas)}")
    block = _option(options, "prefix_block_tokens", 0, task_id) if "prefix_block_tokens" in options else 0
    if block and (block != int(block) or int(block) % 16):
        raise TraceError(f"{task_id!r}: option prefix_block_tokens must be a multiple of 16 in 16..65536")
    trace = load_prefix_trace(path, int(block)).trace if block else load_trace(path)
    start = options.get("start_s")
    start_s = _option(options, "start_s", 0.0, task_id) if start is not None else None
    t_first = float(trace.arrival_s[0]) if start_s is None else start_s
    # Cut the horizon to the replayed part of the trace, so an episode never runs on empty air.
    span_s = (float(trace.arrival_s[-1]) - t_first) / speedup
    if span_s < 0:
        raise TraceError(f"{task_id!r}: start_s is after the trace's last request")
    horizon = int(min(horizon_opt, max(1, math.floor(min(span_s / window_s, MAX_HORIZON)) + 1)))
    sl = replay_slice(trace, horizon * window_s, speedup=speedup, start_s=start_s)
    if len(sl) == 0:
        raise TraceError(f"{task_id!r}: no request of the trace falls in the replayed {horizon * window_s:g} s")
    check_window_load(sl, window_s, task_id)
    tenant = TenantSpec(
        "trace", 1, 1.0,
        ttft_slo_ms=_option(options, "ttft_ms", TRACE_DEFAULT_TTFT_MS, task_id),
        tpot_slo_ms=_option(options, "tpot_ms", TRACE_DEFAULT_TPOT_MS, task_id),
        prompt_tokens=_median_sigma(sl.prompt_tokens),
        output_tokens=_median_sigma(sl.output_tokens),
        prompt_clip=(1, 1 << 20), output_clip=(1, 1 << 20),
    )
    workload = {"kind": "trace", "path": path, "format": trace.fmt, "speedup": speedup, "start_s": sl.start_s,
                "requests": len(sl)}
    if block:
        workload["prefix_block_tokens"] = int(block)
    return TaskSpec(
        task_id=task_id,
        difficulty="custom",
        description=(
            f"Replay of {path} ({trace.fmt}): {len(sl)} requests from t={sl.start_s:g} s, {speedup:g}x "
            f"speed, {horizon} windows of {window_s:g} s; one tenant with TTFT {tenant.ttft_slo_ms:g} ms "
            f"and TPOT {tenant.tpot_slo_ms:g} ms."
        ),
        tenants=(tenant,),
        workload=workload,
        horizon=horizon,
        window_s=window_s,
        replicas=(1, int(max_replicas)),
        initial_replicas=int(initial),
    )


def _median_sigma(x: np.ndarray) -> tuple[float, float]:
    """(median, standard deviation of log) of a length sample: how TenantSpec describes lengths."""
    logs = pm.log(x.astype(np.float64))
    return float(np.median(x)), round(float(logs.std()), 3)

