"""Prefix caching in the simulator (sim/prefix_cache.py, sim/engine.py): hits, the chain rule, LRU
eviction before preemption, shared blocks counted once, caching without sharing = caching off,
determinism and forks."""

from __future__ import annotations

import pytest
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.prefix import chain_ids
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.prefix_cache import PrefixCache


@pytest.fixture(autouse=True)
def python_engine(monkeypatch):
    """These tests read the Python engine's prefix cache and counters, which serves every prefix-caching episode
    (the compiled engine hands such episodes over to it: tests/test_array_engine.py)."""
    monkeypatch.setenv("LLMSERVE_SIM_CORE", "python")


BASE = dict(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
            prefill_decode_split=False, priority_routing=False)


def act(**kw) -> ServeAction:
    return ServeAction(**{**BASE, **kw})


def arrival(rid: int, t: float, prompt: int, ids: tuple[int, ...] | None, out: int = 8, unit: int = 16) -> Arrival:
    """A request whose units have content `ids` (made prefix-unique here, as Arrival.prefix_ids must be)."""
    return Arrival(rid, t, prompt, out, prefix_ids=None if ids is None else chain_ids(ids),
                   prefix_block_tokens=unit if ids is not None else 0)


def serve(arrivals: list[Arrival], action: ServeAction | None = None, windows: int = 4, dt: float = 5.0,
          backend: SimBackend | None = None):
    b = backend or SimBackend()
    if backend is None:
        b.reset(0)
    reps = []
    for k in range(windows):
        t0 = k * dt
        reps.append(b.run_window(action or act(), [a for a in arrivals if t0 <= a.arrival_s < t0 + dt], t0, dt))
    return b, reps


def records(reps) -> dict[int, object]:
    return {r.request_id: r for rep in reps for r in rep.finished}


def ttft(rec) -> float:
    return rec.first_token_s - rec.arrival_s


# ----------------------------------------------------------------------------------- the cache alone

def test_chain_ids_depend_on_the_whole_prefix():
    a = chain_ids((1, 2, 3))
    b = chain_ids((9, 2, 3))
    assert len(a) == 3 and not set(a) & set(b)  # same later content after a different first unit: no shared id
    assert chain_ids((1, 2)) == a[:2] and chain_ids((1, 2, 3)) == a  # deterministic


def test_cache_evicts_least_recently_released_tail_first():
    pc = PrefixCache()
    pc.bind(16)
    a, b = chain_ids((1, 2)), chain_ids((3, 4))
    assert pc.acquire(a, 0, 2) == 2 and pc.acquire(b, 0, 2) == 2
    assert pc.release(a, 2) == 2 and pc.release(b, 2) == 2
    assert pc.free_units == 4
    pc.evict(1)  # a was released first, and its tail unit before its head
    assert pc.match(a, 2) == (1, 1)  # a's tail unit is gone, its head still cached
    assert pc.match(a, 2) == (1, 1)  # the head still hits (and is evictable: revived on acquire)
    assert pc.acquire(a, 0, 1) == 1 and pc.free_units == 2
    pc.evict(2)  # b's units go; a's head is referenced again, so it stays
    assert pc.match(b, 2) == (0, 0) and pc.match(a, 2) == (1, 0)


def test_runs_split_where_chains_part_and_where_references_end():
    pc = PrefixCache()
    pc.bind(16)
    a = chain_ids(tuple(range(10)))
    b = chain_ids(tuple(range(6)) + (60, 70, 80, 90))  # a's first 6 units, then its own
    assert pc.acquire(a, 0, 10) == 10 and len(pc.starts) == 1
    assert pc.match(b, 10) == (6, 0)
    assert pc.acquire(b, 0, 6) == 0  # shared: a's run is cut at depth 6
    assert pc.acquire(b, 6, 10) == 4  # b's own units: a new run
    assert len(pc.starts) == 3
    assert pc.release(a, 10) == 4  # a's tail goes evictable; the shared head is still b's
    assert pc.free_units == 4
    assert pc.release(b, 10) == 10 and pc.free_units == 14
    pc.evict(3)  # b released last, deepest first: a's tail (released first) goes first
    assert pc.match(a, 10) == (7, 7) and pc.match(b, 10) == (10, 10)
    c = chain_ids(tuple(range(3)))  # a partial hit of the shared head, capped
    assert pc.match(c, 2) == (2, 2) and pc.acquire(c, 0, 2) == 2 and pc.free_units == 14 - 3 - 2


def test_bad_unit_size_is_refused():
    with pytest.raises(ValueError, match="multiple of 16"):
        PrefixCache().bind(100)
    pc = PrefixCache()
    pc.bind(16)
    with pytest.raises(ValueError, match="one unit size"):
        pc.bind(512)


# ----------------------------------------------------------------------------------- the engine

def test_repeated_prompt_hits_and_its_ttft_is_lower():
    ids = tuple(range(125))  # 2,000 tokens = 125 units of 16
    arr = [arrival(0, 0.0, 2000, ids), arrival(1, 5.0, 2000, ids)]
    _, reps = serve(arr)
    recs = records(reps)
    assert ttft(recs[1]) < 0.5 * ttft(recs[0])
    # the second request hits 124 units: 1,984 tokens (the last full unit is recomputed, as V1 leaves
    # at least one prompt token to compute)
    assert reps[0].prefix_query_tokens == 2000 and reps[0].prefix_hit_tokens == 0
    assert reps[1].prefix_query_tokens == 2000 and reps[1].prefix_hit_tokens == 1984
    assert reps[1].prompt_tokens == 2000 - 1984
    assert reps[1].prefix_cached_blocks == 125


def test_a_later_unit_alone_does_not_hit():
    ids = tuple(range(125))
    other = (999,) + ids[1:]  # every unit but the first equal: its chain differs from the start
    _, reps = serve([arrival(0, 0.0, 2000, ids), arrival(1, 5.0, 2000, other)])
    assert reps[1].prefix_hit_tokens == 0 and reps[1].prompt_tokens == 2000
    # a shared first half hits exactly that half
    half = ids[:60] + tuple(range(500, 565))
    _, reps = serve([arrival(0, 0.0, 2000, ids), arrival(1, 5.0, 2000, half)])
    assert reps[1].prefix_hit_tokens == 60 * 16


def test_concurrent_requests_share_blocks_counted_once():
    ids = tuple(range(250))  # 4,000 tokens
    # the second arrives after the first's prefill has covered its units, while it still decodes
    shared = [arrival(0, 0.0, 4000, ids, out=2000), arrival(1, 1.0, 4000, ids, out=2000)]
    apart = [arrival(0, 0.0, 4000, ids, out=2000), arrival(1, 1.0, 4000, tuple(range(1000, 1250)), out=2000)]
    r1, r2 = serve(shared, windows=1)[1], serve(apart, windows=1)[1]
    used_shared, used_apart = r1[0].notes["kv_blocks_used"], r2[0].notes["kv_blocks_used"]
    assert r1[0].prefix_hit_tokens == 249 * 16
    # both decode at the window's end; the shared 249 units (of 16 tokens) are held once
    assert len(r1[0].pending) == len(r2[0].pending) == 2
    def blocks(reps) -> int:  # what each running request's context needs, had it its own copy of everything
        return sum(-(-(r.prompt_tokens + r.output_tokens) // 16) for r in reps[0].pending)

    assert used_apart == blocks(r2)
    # all 250 units are held once: the second request hit 249 and recomputed the last one, whose copy
    # joins the cached unit (sim/prefix_cache.py: a unit computed twice is kept once)
    assert used_shared == blocks(r1) - 250


def test_eviction_is_lru_and_comes_before_any_preemption():
    b = SimBackend()
    b.reset(0)
    # a small pool; each prompt takes ~40 % of it
    action = act(kv_budget_fraction=0.1)
    b.run_window(action, [], 0.0, 1.0)
    total = b._engine.kv.total
    prompt = (total * 16 * 2 // 5) // 16 * 16
    n_units = prompt // 16
    pa, pb, pc_ = (tuple(range(k * 100_000, k * 100_000 + n_units)) for k in range(3))
    arr = [arrival(0, 1.0, prompt, pa), arrival(1, 6.0, prompt, pb),  # A then B, one at a time: both cached
           arrival(2, 11.0, prompt, pc_),  # C needs room: A's units (released first) are evicted, not B's
           arrival(3, 16.0, prompt, pb),   # B still hits
           arrival(4, 21.0, prompt, pa)]   # A only partly
    reps = [b.run_window(action, [a for a in arr if t0 <= a.arrival_s < t0 + 5.0], t0, 5.0)
            for t0 in (1.0, 6.0, 11.0, 16.0, 21.0)]
    assert sum(r.evictions for r in reps) == 0  # evictable cached blocks went before any preemption
    assert b._engine.pcache.evicted > 0
    hits = {r.t0: r.prefix_hit_tokens for r in reps}
    assert hits[11.0] == 0 and hits[16.0] == (n_units - 1) * 16
    # C took the room of A's units only (A was released before B), tail first: A's head still hits
    assert 0 < hits[21.0] < hits[16.0]
    assert hits[21.0] % 16 == 0
    assert all(r.status == "ok" for r in records(reps).values())


def test_preemption_releases_shared_units_and_recompute_hits_them():
    # a tight pool and long outputs: requests are preempted; their cached prompt units stay and the
    # recompute hits them, and every request still finishes
    ids = tuple(range(64))
    arr = [arrival(i, 0.1 * i, 1024, ids, out=4000) for i in range(20)]
    b, reps = serve(arr, act(kv_budget_fraction=0.1), windows=30, dt=5.0)
    recs = records(reps)
    assert sum(r.evictions for r in reps) > 0
    # every admission but the first hits the shared 63 units, re-admissions after preemption included
    assert reps[0].prefix_hit_tokens == 19 * 63 * 16
    assert len(recs) == 20 and all(r.status == "ok" for r in recs.values())
    eng = b._engine
    assert eng.kv.used_fixed == 0 and eng.decode_shared == 0  # nothing is left referenced
    assert all(run.refs == 0 for run in eng.pcache.starts.values())


def _plain_and_unique(n: int = 300, rate: float = 8.0) -> tuple[list[Arrival], list[Arrival]]:
    import random

    rng = random.Random(7)
    plain, unique = [], []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        p, o = rng.randint(50, 3000), rng.randint(1, 400)
        plain.append(Arrival(i, t, p, o))
        unique.append(Arrival(i, t, p, o, prefix_ids=tuple(range(i * 1000, i * 1000 + p // 16)),
                              prefix_block_tokens=16))
    return plain, unique


def _without_prefix_fields(rep) -> dict:
    d = rep.to_dict()
    for k in ("prefix_query_tokens", "prefix_hit_tokens", "prefix_cached_blocks"):
        d.pop(k)
    return d


@pytest.mark.parametrize("split", [False, True])
def test_caching_without_sharing_is_caching_off(split):
    """Unique ids everywhere and no preemption: the cache fills with evictable units nobody hits, and
    every timing is what the seed's path (no ids) gives."""
    plain, unique = _plain_and_unique()
    action = act(kv_budget_fraction=0.9, prefill_decode_split=split, batch_cap=128)
    _, r_plain = serve(plain, action, windows=10, dt=5.0)
    b, r_unique = serve(unique, action, windows=10, dt=5.0)
    assert sum(r.evictions for r in r_plain) == 0
    assert b._engine.pcache.cached_blocks > 0
    for a, u in zip(r_plain, r_unique, strict=True):
        assert u.prefix_hit_tokens == 0
        assert _without_prefix_fields(a) == _without_prefix_fields(u)


def test_a_preempted_request_hits_its_own_cached_prompt():
    """Under memory pressure a preempted request's prompt units stay cached (evictable), so its
    recompute hits them, as V1's does: fewer prompt tokens are recomputed than without ids."""
    plain, unique = _plain_and_unique()
    action = act(kv_budget_fraction=0.1, batch_cap=128)
    _, r_plain = serve(plain, action, windows=10, dt=5.0)
    _, r_unique = serve(unique, action, windows=10, dt=5.0)
    assert sum(r.evictions for r in r_plain) > 0
    assert sum(r.prefix_hit_tokens for r in r_unique) == 0  # first admissions never hit (unique ids)
    assert sum(r.prompt_tokens for r in r_unique) < sum(r.prompt_tokens for r in r_plain)


def test_deterministic_and_forkable():
    ids = [tuple(range(k * 50, k * 50 + 40)) for k in range(3)]
    arr = [arrival(i, 0.05 * i, 700 + 10 * (i % 7), ids[i % 3], out=50 + i % 40) for i in range(400)]
    action = act(kv_budget_fraction=0.1)
    _, r1 = serve(arr, action, windows=6, dt=4.0)
    _, r2 = serve(arr, action, windows=6, dt=4.0)
    assert [x.to_dict() for x in r1] == [x.to_dict() for x in r2]
    assert sum(x.prefix_hit_tokens for x in r1) > 0
    b = SimBackend()
    b.reset(0)
    for k in range(3):
        b.run_window(action, [a for a in arr if 4.0 * k <= a.arrival_s < 4.0 * (k + 1)], 4.0 * k, 4.0)
    f = b.fork()
    rest = [(k, [a for a in arr if 4.0 * k <= a.arrival_s < 4.0 * (k + 1)]) for k in range(3, 6)]
    ra = [b.run_window(action, w, 4.0 * k, 4.0) for k, w in rest]
    rb = [f.run_window(action, w, 4.0 * k, 4.0) for k, w in rest]
    assert [x.to_dict() for x in ra] == [x.to_dict() for x in rb]
