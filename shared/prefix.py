"""Prefix block ids for prefix caching (sim/prefix_cache.py): from a trace that has them, or drawn.

An `Arrival` may carry `prefix_ids`, one id per unit of `prefix_block_tokens` tokens of its prompt
(and, for conversations, of its answer, which the next turn resends). Ids are prefix-unique: an id
names its unit together with everything before it (vLLM's block hash is a hash of the parent's hash
and the block's tokens; Mooncake's `hash_ids` are remapped so, which `load_prefix_trace` checks), so
two requests whose first k ids are equal share their first k units' text. `chain_ids` turns ids that
only name a unit's own content into prefix-unique ones. None (every built-in task) means no caching.

Two sources:

- **Mooncake's conversation trace** (`shared/data/mooncake_conversation.jsonl.gz`, Apache-2.0, see
  shared/data/PROVENANCE.md): `hash_ids` are 512-token prefix blocks, remapped by Moonshot AI so that
  equal ids mean equal blocks after an equal prefix. The cache works at the trace's granularity (a
  unit = 512 tokens = 32 of the engine's 16-token blocks): the trace says nothing finer, and splitting
  an id into 32 made-up sub-ids would only slow the simulator down. `load_prefix_trace` reads it (or
  any JSONL of that format, gzip or not); `prefix_trace_arrivals` replays it.
- **Synthetic multi-turn chat** (`multiturn_arrivals`): tenants with a system prompt each, and
  conversations whose every turn resends the system prompt and the whole history (every earlier user
  message and answer) followed by a new user message. Ids are per 16-token unit, the engine's own
  block, so hits are exact to vLLM's granularity. The parameters are stated in
  `MultiTurnSpec` (not fitted to a dataset); the sharing they give is measured, not assumed
  (`ideal_hit_rate`, bench/prefix_cache.py).

`ideal_hit_rate` is the hit rate an infinite cache would give (every unit seen before hits, chain
rule and "at least one token computed" included): the ceiling any finite cache is measured against.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
from llmserve_env.shared.arrival_list import ArrivalList
from llmserve_env.shared.backend import Arrival, new_arrival
from llmserve_env.shared.tasks import TaskSpec, TenantSpec
from llmserve_env.shared.traces import (
    MAX_REQUEST_TOKENS,
    MAX_TRACE_BYTES,
    Trace,
    TraceError,
    _json_object,
    _lines,
    _Rows,
    _time,
    _tokens,
    packaged_trace_path,
)

MOONCAKE_PACKAGED = "mooncake_conversation.jsonl.gz"
MOONCAKE_BLOCK_TOKENS = 512  # the trace's hash_ids unit (Mooncake FAST'25 traces README / Dynamo's datagen docs)
MAX_PREFIX_ROWS = 100_000  # Mooncake's largest released trace has 23,608
MAX_IDS_PER_ROW = MAX_REQUEST_TOKENS // 16


@dataclass(frozen=True, slots=True)
class PrefixTrace:
    """A trace whose rows carry prefix ids: the `Trace` arrays (sorted by time) and each row's ids."""

    trace: Trace
    ids: tuple[tuple[int, ...], ...]
    block_tokens: int


packaged_path = packaged_trace_path  # a file in shared/data (the traces' one definition)


def load_prefix_trace(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> PrefixTrace:
    """Read a Mooncake-format JSONL (optionally gzip): timestamp (ms), input_length, output_length,
    hash_ids. TraceError names the file and the 1-based line of a bad row."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise TraceError(f"trace file {str(p)!r}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceError(f"trace file {str(p)!r}: {st.st_size} bytes, more than the {MAX_TRACE_BYTES} allowed")
    return _load(str(p.resolve()), st.st_mtime_ns, block_tokens, str(p))


@lru_cache(maxsize=4)
def _load(resolved: str, mtime_ns: int, block_tokens: int, shown: str) -> PrefixTrace:
    """Rows read as shared/traces.py reads a JSONL trace (its bounded lines, row cap, time limit and
    field checks), plus each row's hash_ids, checked to be prefix-unique."""
    del mtime_ns  # part of the cache key: a rewritten file is read again
    opener = gzip.open if resolved.endswith(".gz") else open
    rows = _Rows(shown)
    ids: list[tuple[int, ...]] = []
    parents: dict[int, int] = {}
    try:
        with opener(resolved, "rb") as f:
            for line_no, line in enumerate(_lines(cast(BinaryIO, f), shown, rows.deadline), start=1):
                if not line.strip():
                    continue
                if len(ids) >= MAX_PREFIX_ROWS:
                    raise TraceError(f"trace file {shown!r}: more than {MAX_PREFIX_ROWS} rows")
                obj = _json_object(line, shown, line_no)
                ts = _time(obj.get("timestamp"), shown, line_no, "timestamp", 1e-3)
                if obj.get("input_length") == 0:  # traces.py counts it as 1 token; a row with ids needs a prompt
                    raise TraceError(f"trace file {shown!r}, line {line_no}: input_length must be >= 1")
                n_in = _tokens(obj.get("input_length"), shown, line_no, "input_length")
                n_out = _tokens(obj.get("output_length"), shown, line_no, "output_length")
                h = obj.get("hash_ids")
                if (not isinstance(h, list) or len(h) > MAX_IDS_PER_ROW
                        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in h)):
                    raise TraceError(f"trace file {shown!r}, line {line_no}: hash_ids must be a list of integers >= 0")
                if len(h) > -(-n_in // block_tokens):
                    raise TraceError(f"trace file {shown!r}, line {line_no}: {len(h)} hash_ids for {n_in} input "
                                     f"tokens (at most one per {block_tokens} tokens)")
                prev = -1
                for x in h:  # prefix-unique: an id always follows the same id (-1: first)
                    if parents.setdefault(x, prev) != prev:
                        raise TraceError(f"trace file {shown!r}, line {line_no}: hash id {x} follows another prefix "
                                         "than it did before (ids must name a block with everything before it)")
                    prev = x
                rows.add(ts, n_in, n_out)
                ids.append(tuple(h))
    except (OSError, EOFError) as exc:  # EOFError: a truncated gzip stream
        raise TraceError(f"trace file {shown!r}: cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})") from None
    if not ids:
        raise TraceError(f"trace file {shown!r}: no requests in it")
    t = np.frombuffer(rows.t, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    trace = Trace(path=shown, fmt="jsonl", arrival_s=t[order],
                  prompt_tokens=np.frombuffer(rows.prompt, dtype=np.int64)[order],
                  output_tokens=np.frombuffer(rows.output, dtype=np.int64)[order])
    return PrefixTrace(trace, tuple(ids[i] for i in order.tolist()), block_tokens)


def chain_ids(ids: tuple[int, ...]) -> tuple[int, ...]:
    """Prefix-unique ids from per-position content ids: id j = hash((id j-1, content j)), as vLLM
    chains its block hashes (Python's hash of int tuples is the same in every process)."""
    out = []
    parent = -1
    for x in ids:
        parent = hash((parent, x))
        out.append(parent)
    return tuple(out)


def slice_ids(pt: PrefixTrace, start_s: float, n: int) -> tuple[tuple[int, ...], ...]:
    """The ids of the `n` rows a `replay_slice(pt.trace, ..., start_s=start_s)` returned (it takes the
    rows from the first at or after start_s, in order)."""
    lo = int(np.searchsorted(pt.trace.arrival_s, start_s, side="left"))
    return pt.ids[lo:lo + n]


def with_prefix(arrivals: Sequence[Arrival], ids: tuple[tuple[int, ...], ...], block_tokens: int) -> list[Arrival]:
    """The arrivals with their prefix ids attached (same order)."""
    return [Arrival(a.request_id, a.arrival_s, a.prompt_tokens, a.output_tokens, a.tenant, a.priority, i, block_tokens)
            for a, i in zip(arrivals, ids, strict=True)]


def ideal_hit_rate(arrivals: Sequence[Arrival]) -> float:
    """Prompt tokens an infinite cache would serve / prompt tokens, over `arrivals` in order: the
    longest run of a request's leading units seen before (in an earlier request's prompt, or its
    answer when the ids cover it), capped to leave one prompt token to compute."""
    seen: set[int] = set()
    hit = total = 0
    for a in arrivals:
        total += a.prompt_tokens
        if a.prefix_ids is None:
            continue
        u = a.prefix_block_tokens
        keys = a.prefix_ids[:(a.prompt_tokens + a.output_tokens) // u]
        cap = (a.prompt_tokens - 1) // u
        n = 0
        while n < min(cap, len(keys)) and keys[n] in seen:
            n += 1
        hit += n * u
        seen.update(keys[:(a.prompt_tokens + a.output_tokens - 1) // u])
    return hit / total if total else 0.0


# ----------------------------------------------------------------------------------- multi-turn chat

@dataclass(frozen=True, slots=True)
class MultiTurnSpec:
    """A synthetic multi-turn chat workload's parameters (stated, not fitted).

    conversations_per_s   new conversations per second (Poisson)
    turns_mean            turns per conversation: 1 + geometric with this mean
    system_tokens         each tenant's system prompt, tokens (one per tenant, equal for its users)
    user_tokens           (median, sigma) log-normal new user message per turn
    answer_tokens         (median, sigma) log-normal answer (output) per turn
    think_s               mean seconds from one turn's arrival to the next's (exponential; arrivals
                          never depend on the policy, so this includes the answer's own time)
    max_context           a conversation ends once a turn's prompt + answer would pass this
    """

    conversations_per_s: float = 2.0
    turns_mean: float = 4.0
    system_tokens: tuple[int, ...] = (1024, 2048, 512, 1536)
    user_tokens: tuple[float, float] = (200.0, 0.8)
    answer_tokens: tuple[float, float] = (250.0, 0.6)
    think_s: float = 20.0
    max_context: int = 16384

    @property
    def continue_p(self) -> float:
        """The chance that another turn follows any turn (turns are 1 + geometric, memoryless)."""
        return 1.0 - 1.0 / self.turns_mean if self.turns_mean > 1.0 else 0.0


UNIT = 16  # the engine's KV block: synthetic ids are exact at vLLM's granularity


def multiturn_arrivals(spec: MultiTurnSpec, duration_s: float, seed: int,
                       tenant: str = "chat", priority: int = 1,
                       rate_scale: Callable[[float], float] | None = None) -> list[Arrival]:
    """Every request of `duration_s` seconds of the multi-turn workload, sorted by arrival, ids 0..n-1.

    A conversation's token stream is [system prompt][user 1][answer 1][user 2][answer 2]...; turn k's
    prompt is the stream up to user k, its output answer k. Unit j of the stream (tokens 16j..16j+15)
    gets id (owner << 32) | j, the owner being the tenant for units wholly inside its system prompt and
    the conversation otherwise: equal ids exactly where the text is equal.

    `rate_scale(t)` in [0, 1] (a daily cycle, `day_scale`) thins the conversation starts: a start at t
    is kept with that probability, so `conversations_per_s` is the peak rate (Lewis-Shedler thinning).
    None keeps every start, and the draws are exactly those of the constant-rate workload."""
    rng = np.random.default_rng([int(seed), 0x4D54])  # "MT": this workload's own stream
    n_conv = int(rng.poisson(spec.conversations_per_s * duration_s))
    starts = np.sort(rng.uniform(0.0, duration_s, n_conv))
    if rate_scale is not None:
        keep = rng.random(n_conv) < np.array([rate_scale(t) for t in starts.tolist()])
        starts = starts[keep]
    n_sys = len(spec.system_tokens)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    for c, t in enumerate(starts.tolist()):
        which = int(rng.integers(0, n_sys))
        sys_len = spec.system_tokens[which]
        turns = int(rng.geometric(1.0 / spec.turns_mean))  # >= 1, mean turns_mean
        sys_units = sys_len // UNIT
        system_ids = tuple(range(which << 32, (which << 32) + sys_units))  # j < 2**32: `| j` is `+ j`
        _turns(rng, spec, t, turns, sys_len, system_ids, (n_sys + c) << 32, duration_s, rows)
    rows.sort(key=lambda r: r[0])
    return [Arrival(i, t, p, o, tenant, priority, ids, UNIT) for i, (t, p, o, ids) in enumerate(rows)]


def _turns(rng: np.random.Generator, spec: MultiTurnSpec, t: float, turns: int, context: int,
           system_ids: tuple[int, ...], owner: int, duration_s: float,
           rows: list[tuple[float, int, int, tuple[int, ...]]]) -> None:
    """Up to `turns` turns of one conversation from second `t`, its stream `context` tokens long so far,
    appended to `rows` as (arrival, prompt, answer, ids): the turn model's one definition."""
    sys_units = len(system_ids)
    for _ in range(turns):
        u = max(1, int(round(rng.lognormal(math.log(spec.user_tokens[0]), spec.user_tokens[1]))))
        a = max(1, int(round(rng.lognormal(math.log(spec.answer_tokens[0]), spec.answer_tokens[1]))))
        prompt = context + u
        if prompt + a > spec.max_context or t >= duration_s:
            break
        n_units = (prompt + a) // UNIT
        # the tenant's units, then the conversation's (ranges: one C loop, not a generator per unit)
        ids = (system_ids + tuple(range(owner + sys_units, owner + n_units)) if n_units > sys_units
               else system_ids[:n_units])
        rows.append((t, prompt, a, ids))
        context = prompt + a
        t += float(rng.exponential(spec.think_s))


def expected_turn_rates(spec: MultiTurnSpec, duration_s: float, window_s: float,
                        rate_scale: Callable[[float], float] | None = None, step_s: float = 0.25) -> np.ndarray:
    """The multi-turn workload's expected requests/s in each window of `window_s` over `duration_s`: what an
    operator can compute from the published spec and day, never a day's draw.

    Conversations start at lam(s) = conversations_per_s x rate_scale(s) on [0, duration_s); turn n + 1 of
    one exists with probability q^n (q = 1 - 1/turns_mean) and comes n exponential think times after its
    start. Summed over n, the turn rate is r(t) = lam(t) + (q / think_s) x the integral over u >= 0 of
    lam(t - u) exp(-(1 - q) u / think_s) (a geometric sum of Erlang densities is an exponential), which
    is lam x turns_mean at a constant rate. Integrated on a `step_s` grid; it leaves out conversations cut
    by `max_context` (their later turns are not sent)."""
    q = spec.continue_p
    n = int(round(duration_s / step_s))
    t = (np.arange(n) + 0.5) * step_s
    lam = spec.conversations_per_s * (np.array([rate_scale(float(x)) for x in t]) if rate_scale else np.ones(n))
    r = lam.copy()
    if q > 0.0 and spec.think_s > 0.0:
        decay = math.exp(-(1.0 - q) * step_s / spec.think_s)
        acc = 0.0  # the integral up to the grid point before, by the exponential filter's recursion
        for i in range(n):
            r[i] += q / spec.think_s * acc
            acc = acc * decay + lam[i] * step_s
    per = int(round(window_s / step_s))
    return r[: n - n % per].reshape(-1, per).mean(axis=1)


def conversation_owner(ids: tuple[int, ...] | None, n_sys: int) -> int | None:
    """The conversation a multi-turn request belongs to (its owner, the ids' high bits), or None when its
    ids are its tenant's system prompt alone (a turn under one 16-token unit past it: not told apart)."""
    if not ids or ids[-1] >> 32 < n_sys:
        return None
    return ids[-1] >> 32 << 32


@dataclass(frozen=True, slots=True)
class RunningConversation:
    """What the requests seen so far say about one conversation: enough to draw its next turns."""

    owner: int
    last_s: float          # its last turn's arrival
    context: int           # its stream after that turn's answer (the next prompt resends it), tokens
    system_ids: tuple[int, ...]
    tenant: str
    priority: int


def running_conversations(seen: Sequence[Arrival], spec: MultiTurnSpec) -> list[RunningConversation]:
    """Every conversation among the multi-turn requests `seen` (in arrival order), as of its last turn
    seen, in the order each first appeared."""
    n_sys = len(spec.system_tokens)
    last: dict[int, Arrival] = {}
    for a in seen:
        owner = conversation_owner(a.prefix_ids, n_sys)
        if owner is not None:
            last[owner] = a
    out = []
    for owner, a in last.items():
        ids = a.prefix_ids
        assert ids is not None
        sys_units = next(j for j, i in enumerate(ids) if i >> 32 >= n_sys)
        out.append(RunningConversation(owner, a.arrival_s, a.prompt_tokens + a.output_tokens, ids[:sys_units],
                                       a.tenant, a.priority))
    return out


def continued_arrivals(running: list[RunningConversation], spec: MultiTurnSpec, now_s: float, duration_s: float,
                       rng: np.random.Generator, id_base: int) -> list[Arrival]:
    """A draw of the turns still to come, from second `now_s` on, of the conversations `running` (the
    turn model of `multiturn_arrivals`, conditioned on what was seen), sorted by arrival, request ids
    from `id_base` on. A conversation's turns are 1 + geometric (memoryless: after any turn, another
    follows with probability q = 1 - 1/turns_mean) and a turn follows the last one after an exponential
    think time (memoryless too), so one whose last turn came at `last_s` and none since still has one to
    come with probability q s / (1 - q + q s), s = exp(-(now_s - last_s) / think_s), arriving at
    now_s + an exponential think time, then as the model goes on. (It leaves out that an unseen next turn
    may have ended the conversation by passing `max_context`: a few conversations near it.) The ids are
    the conversation's own, so a continued turn hits the cache its history left."""
    q = spec.continue_p
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    who: list[RunningConversation] = []
    for c in running:
        s = math.exp(-(now_s - c.last_s) / spec.think_s) if spec.think_s > 0 else 0.0
        p = q * s / (1.0 - q + q * s) if q * s > 0 else 0.0
        if float(rng.random()) >= p:  # one draw a conversation, continued or not
            continue
        n = len(rows)
        _turns(rng, spec, now_s + float(rng.exponential(spec.think_s)), int(rng.geometric(1.0 / spec.turns_mean)),
               c.context, c.system_ids, c.owner, duration_s, rows)
        who.extend([c] * (len(rows) - n))
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    return [Arrival(id_base + n, rows[i][0], rows[i][1], rows[i][2], who[i].tenant, who[i].priority, rows[i][3],
                    UNIT) for n, i in enumerate(order)]


def conversation_starts(arrivals: Sequence[Arrival], spec: MultiTurnSpec) -> list[float]:
    """Each request's conversation's first arrival among `arrivals` (sorted by arrival): its own where it
    is not told apart (`conversation_owner`)."""
    n_sys = len(spec.system_tokens)
    first: dict[int, float] = {}
    out = []
    for a in arrivals:
        owner = conversation_owner(a.prefix_ids, n_sys)
        out.append(a.arrival_s if owner is None else first.setdefault(owner, a.arrival_s))
    return out


# A sampled day's own conversations are moved this far up (their owner by (day + 1) << 24): above any
# owner of a real day, which has its tenants plus one per conversation (under 2**24 even for a whole day
# at 12 conversations a second).
SAMPLED_DAY_SHIFT = 56


def as_sampled_day(arrivals: Sequence[Arrival], workload: dict[str, Any], day: int, id_base: int) -> Sequence[Arrival]:
    """Another day's arrivals played beside an episode's own (a planner's sampled future): request ids moved
    up by `id_base` (above every id of the episode), prefix ids kept where their text is that of every day
    and moved where it is that day's own. A multi-turn tenant's system prompt is the same text every day
    (its units keep their ids, and may hit what the episode cached); a conversation is that day's (its
    units get ids no real day has, so a sampled future never hits the cache of an unrelated conversation
    that happens to share its number). A trace's ids are content hashes over the whole trace, the same
    text wherever a stretch is cut: kept."""
    if day < 0:
        raise ValueError(f"day must be >= 0, got {day}")
    if isinstance(arrivals, ArrivalList) and not arrivals.columns.prefixed:  # no prefix ids: the columns moved
        cols = arrivals.columns
        return ArrivalList(columns=dataclasses.replace(cols, request_id=cols.request_id + id_base))
    own = None  # (tenants' units below this owner, the day's shift) on a multi-turn workload
    if workload.get("kind") == "multiturn":
        own = (len(MultiTurnSpec(**workload.get("spec", {})).system_tokens), (day + 1) << SAMPLED_DAY_SHIFT)
    out = []
    last: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # a conversation's last turn: (ids, moved)
    for a in arrivals:
        ids = a.prefix_ids
        if ids is not None and own is not None:
            ids = _moved_ids(ids, *own, last)
        out.append(new_arrival(id_base + a.request_id, a.arrival_s, a.prompt_tokens, a.output_tokens, a.tenant,
                               a.priority, ids, a.prefix_block_tokens))
    return out


def _moved_ids(ids: tuple[int, ...], n_sys: int, shift: int,
               last: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> tuple[int, ...]:
    """`ids` with the conversation's own units (owners from n_sys on) moved up by `shift`. A turn resends its
    conversation's history, so where it begins with the ids of the conversation's last turn (`last`, by owner;
    kept up to date here), their moved ids are reused and only the rest is moved: ~200 units a turn against ~50
    new (multiturn_cluster), the same ids either way."""
    owner = conversation_owner(ids, n_sys)
    prev = last.get(owner) if owner is not None else None
    k, head = 0, ()  # type: tuple[int, tuple[int, ...]]
    if prev is not None and len(prev[0]) <= len(ids) and ids[:len(prev[0])] == prev[0]:
        k, head = len(prev[0]), prev[1]
    moved = head + tuple(i + shift if i >> 32 >= n_sys else i for i in ids[k:])
    if owner is not None:
        last[owner] = (ids, moved)
    return moved


def workload_day_scale(workload: dict[str, Any], window_s: float) -> Callable[[float], float] | None:
    """The multi-turn workload's daily cycle (`day_scale` of its `day` entry), or None where it has none."""
    day = workload.get("day")
    if not day:
        return None
    return day_scale(window_s, int(day["cycle_windows"]), float(day["peak_window"]), float(day["trough_ratio"]))


def day_scale(window_s: float, cycle_windows: int, peak_window: float, trough_ratio: float) -> Callable[[float], float]:
    """The raised-cosine day of the cluster tasks (shared.workloads.cycle_rate's shape) as a multiplier
    of the peak rate at second t: 1 at the middle of `peak_window`, `trough_ratio` half a cycle away."""
    def scale(t: float) -> float:
        phase = ((t / window_s - float(peak_window)) / cycle_windows) % 1.0  # 0 at the peak
        return trough_ratio + (1.0 - trough_ratio) * 0.5 * (1.0 + math.cos(2.0 * math.pi * phase))
    return scale


# ----------------------------------------------------------------------------------- tasks

def mooncake_task(speedup: float = 1.0, horizon: int = 64, window_s: float = 1.0, start_s: float = 0.0,
                  replicas: tuple[int, int] = (1, 1), initial_replicas: int = 1) -> TaskSpec:
    """A replay of the packaged Mooncake conversation trace with its prefix ids (not a built-in task:
    the bench and tests build it). `speedup` > 1 plays it faster; the horizon is `horizon` windows."""
    pt = load_prefix_trace(packaged_path(MOONCAKE_PACKAGED))
    tenant = TenantSpec("trace", 1, 1.0, ttft_slo_ms=30_000.0, tpot_slo_ms=100.0,
                        prompt_tokens=(float(np.median(pt.trace.prompt_tokens)), 0.0),
                        output_tokens=(float(np.median(pt.trace.output_tokens)), 0.0),
                        prompt_clip=(1, MAX_REQUEST_TOKENS), output_clip=(1, MAX_REQUEST_TOKENS))
    return TaskSpec(
        task_id="mooncake_conversation",
        difficulty="custom",
        description=("Replay of Mooncake's conversation trace (FAST'25, Apache-2.0) with its 512-token prefix "
                     "blocks; SLOs are the paper's (TTFT 30 s, TBT 100 ms)."),
        tenants=(tenant,),
        workload={"kind": "trace", "packaged": MOONCAKE_PACKAGED, "prefix_block_tokens": MOONCAKE_BLOCK_TOKENS,
                  "speedup": speedup, "start_s": start_s},
        horizon=horizon, window_s=window_s, replicas=replicas, initial_replicas=initial_replicas,
    )


def multiturn_task(spec: MultiTurnSpec | None = None, horizon: int = 64, window_s: float = 1.0,
                   replicas: tuple[int, int] = (1, 1), initial_replicas: int = 1) -> TaskSpec:
    """The synthetic multi-turn chat workload as a task (not a built-in task: the bench and tests build it)."""
    s = spec or MultiTurnSpec()
    tenant = TenantSpec("chat", 1, 1.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0,
                        prompt_tokens=(float(s.user_tokens[0]), s.user_tokens[1]),
                        output_tokens=(float(s.answer_tokens[0]), s.answer_tokens[1]),
                        prompt_clip=(1, s.max_context), output_clip=(1, s.max_context))
    return TaskSpec(
        task_id="multiturn_chat",
        difficulty="custom",
        description="Synthetic multi-turn chat: per-app system prompts, turns resending their history.",
        tenants=(tenant,),
        workload={"kind": "multiturn", "spec": {f: getattr(s, f) for f in s.__dataclass_fields__}},
        horizon=horizon, window_s=window_s, replicas=replicas, initial_replicas=initial_replicas,
    )
