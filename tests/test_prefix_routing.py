"""Cache-aware routing (shared/prefix_routing.py, sim/cluster.py): the knob's validation, its rule, and
that leaving it out keeps the router and every action's wire form as before."""

from __future__ import annotations

import dataclasses

import pytest
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import KNOBS, ServeAction
from llmserve_env.shared.prefix import chain_ids
from llmserve_env.shared.prefix_routing import affinity_choice, leading_overlap
from llmserve_env.sim.cluster import ClusterBackend
from pydantic import ValidationError

BASE = dict(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
            prefill_decode_split=False, priority_routing=False, replicas=2)


def test_knob_is_optional_validated_and_absent_when_unset():
    a = ServeAction(**BASE)
    assert a.cache_affinity is None and "cache_affinity" not in a.model_dump() and "cache_affinity" not in a.knobs()
    assert KNOBS == ("batch_cap", "kv_budget_fraction", "speculation_depth", "quantization_tier",
                     "prefill_decode_split", "priority_routing")
    assert ServeAction(**BASE, cache_affinity=0.5).knobs()["cache_affinity"] == 0.5
    for bad in (1.5, -0.1, float("nan"), "0.5"):
        with pytest.raises(ValidationError, match="cache_affinity"):
            ServeAction(**BASE, cache_affinity=bad)


def test_rule():
    assert leading_overlap(chain_ids((1, 2, 3)), set(chain_ids((1, 2)))) == 2
    assert leading_overlap(chain_ids((1, 2, 3)), set(chain_ids((9, 2, 3)))) == 0
    work, overlap = [100.0, 400.0], [0.0, 0.9]
    assert affinity_choice(work, overlap, 0.0) == 0  # least outstanding work
    assert affinity_choice(work, overlap, 1.0) == 1  # the cache alone
    assert affinity_choice(work, overlap, 0.5) == 1  # 0.5*0.25 + 0.5 = 0.625 against 0.5*1 + 0.05 = 0.55
    assert affinity_choice(work, overlap, 0.1) == 0  # 0.9 x 0.25 + 0.1 = 0.325 against 0.9 + 0.01 = 0.91
    assert affinity_choice([0.0, 0.0], [0.0, 0.0], 1.0) == 0  # ties: less loaded, then lower index


def serve(affinity: float | None, arrivals: list[list[Arrival]]):
    b = ClusterBackend("h100-llama3.1-8b", replicas=(2, 2), initial=2)
    b.reset(0)
    action = ServeAction(**BASE, cache_affinity=affinity)
    reps = [b.run_window(action, w, 5.0 * k, 5.0) for k, w in enumerate(arrivals)]
    return b, reps


def test_a_warm_prefix_draws_its_request_only_with_affinity():
    shared = chain_ids(tuple(range(250)))  # 4,000 tokens
    # window 0: the shared prefix goes to replica 0 (both idle), a long request to replica 1, a longer one
    # to replica 0 (less outstanding work then)
    w0 = [Arrival(0, 0.0, 4000, 50, prefix_ids=shared, prefix_block_tokens=16),
          Arrival(1, 0.1, 200, 4000, prefix_ids=chain_ids(tuple(range(1000, 1012))), prefix_block_tokens=16),
          Arrival(2, 0.2, 200, 8000, prefix_ids=chain_ids(tuple(range(2000, 2012))), prefix_block_tokens=16)]
    # window 1: the prefix again, while replica 0 holds more outstanding work
    w1 = [Arrival(3, 5.0, 4100, 20, prefix_ids=chain_ids(tuple(range(250)) + (7777,) * 6), prefix_block_tokens=16)]
    _, low = serve(None, [w0, w1])
    _, aff = serve(1.0, [w0, w1])
    assert low[1].prefix_hit_tokens == 0  # least outstanding work sent it where nothing is cached
    assert aff[1].prefix_hit_tokens == 250 * 16  # affinity 1 sent it to the warm replica
    assert aff[1].applied["cache_affinity"] is True and "cache_affinity" not in low[1].applied


def test_unset_knob_routes_as_before():
    """cache_affinity None is the seed's router: same reports whether or not arrivals carry ids."""
    arr = [Arrival(i, 0.05 * i, 300 + 37 * (i % 11), 40 + i % 13) for i in range(300)]
    with_ids = [dataclasses.replace(a, prefix_ids=chain_ids((a.request_id,)), prefix_block_tokens=16) for a in arr]
    wins = [[a for a in arr if 5.0 * k <= a.arrival_s < 5.0 * (k + 1)] for k in range(4)]
    wins_ids = [[a for a in with_ids if 5.0 * k <= a.arrival_s < 5.0 * (k + 1)] for k in range(4)]
    _, r1 = serve(None, wins)
    _, r2 = serve(None, wins_ids)
    for a, b in zip(r1, r2, strict=True):
        assert [x.request_id for x in a.finished] == [x.request_id for x in b.finished]
        assert [x.first_token_s for x in a.finished] == [x.first_token_s for x in b.finished]


def test_a_cluster_replay_of_mooncake_plays_with_the_knob_through_the_env():
    from llmserve_env.core.inprocess import InProcessEnv
    from llmserve_env.shared.prefix import MOONCAKE_PACKAGED, packaged_path

    env = InProcessEnv()
    env.reset(task_id=f"trace:{packaged_path(MOONCAKE_PACKAGED)}?prefix_block_tokens=512&replicas=4"
                      "&initial_replicas=4&window_s=10&horizon=4", seed=0)
    for aff in (None, 0.5, 0.5, None):
        obs = env.step(ServeAction(**{**BASE, "replicas": 4, "cache_affinity": aff}))
        assert obs.prefix_hit_rate is not None and obs.prefix_cached_blocks is not None
        assert obs.metadata["applied"].get("cache_affinity") is (None if aff is None else True)
    assert obs.done
    grade = env.grade()
    assert 0.0 <= grade["score"] <= 1.0


def test_cluster_with_affinity_is_deterministic_and_forkable():
    import random

    rng = random.Random(3)
    sys_ids = [tuple(range(k * 100, k * 100 + 40)) for k in range(3)]
    arr = []
    t = 0.0
    for i in range(240):
        t += rng.expovariate(12.0)
        ids = sys_ids[i % 3] + tuple(range(10_000 + 50 * i, 10_000 + 50 * i + 10))
        arr.append(Arrival(i, t, 50 * 16 + rng.randint(0, 15), rng.randint(5, 300), prefix_ids=chain_ids(ids),
                           prefix_block_tokens=16))
    wins = [[a for a in arr if 5.0 * k <= a.arrival_s < 5.0 * (k + 1)] for k in range(6)]
    _, r1 = serve(0.5, wins)
    _, r2 = serve(0.5, wins)
    assert [x.to_dict() for x in r1] == [x.to_dict() for x in r2]
    assert sum(x.prefix_hit_tokens for x in r1) > 0
    b, _ = serve(0.5, wins[:3])
    f = b.fork()
    action = ServeAction(**BASE, cache_affinity=0.5)
    ra = [b.run_window(action, w, 5.0 * k, 5.0) for k, w in enumerate(wins[3:], start=3)]
    rb = [f.run_window(action, w, 5.0 * k, 5.0) for k, w in enumerate(wins[3:], start=3)]
    assert [x.to_dict() for x in ra] == [x.to_dict() for x in rb]


def test_routed_runs_answer_as_the_set_of_every_unit_routed():
    """sim/routed_prefixes.py keeps the units the router sent a replica as runs of prefix-unique ids: on random
    chains that share prefixes and part at random depths (a multi-turn history resent longer each turn, system
    prompts shared, chains added in part), every overlap is the set's `leading_overlap`."""
    import random

    from llmserve_env.sim.routed_prefixes import RoutedPrefixes

    rng = random.Random(11)
    for trial in range(40):
        stems = [tuple(rng.randrange(50) for _ in range(rng.randint(1, 30))) for _ in range(4)]
        chains = []
        for _ in range(60):
            stem = rng.choice(stems)
            cut = rng.randint(0, len(stem))  # part from the stem at a random depth, then a tail of its own
            chains.append(chain_ids(stem[:cut] + tuple(rng.randrange(50) for _ in range(rng.randint(0, 25)))))
        chains = [c for c in chains if c]
        runs, units = RoutedPrefixes(), set()
        for c in chains:
            q = rng.choice(chains)
            n = rng.randint(1, len(q))
            assert runs.overlap(q, n) == leading_overlap(q[:n], units), trial
            m = rng.randint(1, len(c))
            runs.add(c, m)
            units.update(c[:m])
            assert runs.overlap(c, len(c)) == leading_overlap(c, units) >= m
