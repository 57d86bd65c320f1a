"""Prefix ids from data and workloads (shared/prefix.py): the packaged Mooncake trace, bad files, the
synthetic multi-turn chat, and the engine hitting a conversation's previous turn (answer included)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.prefix import (
    MOONCAKE_PACKAGED,
    MultiTurnSpec,
    as_sampled_day,
    continued_arrivals,
    conversation_starts,
    ideal_hit_rate,
    load_prefix_trace,
    mooncake_task,
    multiturn_arrivals,
    multiturn_task,
    packaged_path,
    running_conversations,
)
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.traces import TraceError
from llmserve_env.shared.workloads import generate_arrivals
from llmserve_env.sim.backend import SimBackend


def test_packaged_mooncake_trace_and_its_ideal_hit_rate():
    pt = load_prefix_trace(packaged_path(MOONCAKE_PACKAGED))
    assert len(pt.ids) == len(pt.trace) == 12031
    assert pt.ids[0] == tuple(range(14)) and int(pt.trace.prompt_tokens[0]) == 6758
    assert abs(float(pt.trace.prompt_tokens.mean()) - 12035.06) < 0.01  # the paper's Table 2: 12035
    every = [Arrival(i, float(t), int(p), int(o), prefix_ids=ids, prefix_block_tokens=512)
             for i, (t, p, o, ids) in enumerate(zip(pt.trace.arrival_s, pt.trace.prompt_tokens,
                                                    pt.trace.output_tokens, pt.ids, strict=True))]
    # an infinite cache over the whole trace: 37.3 % of prompt tokens (the paper reports 40 %)
    assert ideal_hit_rate(every) == pytest.approx(0.3734, abs=5e-4)


def test_mooncake_task_arrivals_carry_the_rows_ids():
    task = mooncake_task(speedup=2.0, horizon=30, start_s=100.0)
    arr = generate_arrivals(task, 0)
    pt = load_prefix_trace(packaged_path(MOONCAKE_PACKAGED))
    lo = int((pt.trace.arrival_s < 100.0).sum())
    assert arr and all(a.prefix_block_tokens == 512 for a in arr)
    for k, a in enumerate(arr[:50]):
        assert a.prefix_ids == pt.ids[lo + k] and a.prompt_tokens == int(pt.trace.prompt_tokens[lo + k])
    assert arr == generate_arrivals(task, 1)  # a fixed replay: the seed changes nothing


@pytest.mark.parametrize("row, why", [
    ({"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1, "x"]}, "hash_ids must be"),
    ({"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1, 2]}, "at most one per 512"),
    ({"timestamp": -1, "input_length": 100, "output_length": 5, "hash_ids": [1]}, "timestamp"),
    ({"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}, "input_length"),
    ({"timestamp": 0, "input_length": 10, "output_length": 5}, "hash_ids must be"),
    ({"timestamp": 0, "input_length": 900, "output_length": 5, "hash_ids": [7, 2]}, "follows another prefix"),
])
def test_bad_prefix_trace_rows_name_the_line(tmp_path, row, why):
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(TraceError, match=f"line 2: .*{why}"):
        load_prefix_trace(path)


def test_multiturn_is_deterministic_and_shares_what_it_says():
    spec = MultiTurnSpec(conversations_per_s=1.0, think_s=5.0)
    a, b = multiturn_arrivals(spec, 120.0, 3), multiturn_arrivals(spec, 120.0, 3)
    assert a == b and a != multiturn_arrivals(spec, 120.0, 4)
    assert [x.request_id for x in a] == list(range(len(a)))
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:], strict=False))
    convs: dict[int, list[Arrival]] = {}
    for x in a:
        assert x.prefix_ids is not None and len(x.prefix_ids) == (x.prompt_tokens + x.output_tokens) // 16
        convs.setdefault(x.prefix_ids[-1] >> 32, []).append(x)
    multi = [turns for turns in convs.values() if len(turns) > 1]
    assert multi
    for turns in multi:  # each turn resends the previous turn's prompt and answer
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert nxt.prefix_ids[:len(prev.prefix_ids)] == prev.prefix_ids
    rate = ideal_hit_rate(a)
    assert 0.5 < rate < 1.0


def test_a_sampled_day_shares_the_system_prompts_and_none_of_the_episode_s_conversations():
    """What the planner's sampled futures play beside an episode: the same tenants' system prompts (equal
    ids), other conversations (no id in common with the episode's own, whose numbers they share)."""
    task = multiturn_task()
    spec = MultiTurnSpec(**task.workload["spec"])
    own, other = generate_arrivals(task, 1), generate_arrivals(task, 2)
    sampled = as_sampled_day(other, task.workload, 0, 0)
    assert [(a.request_id, a.arrival_s, a.prompt_tokens, a.output_tokens) for a in sampled] == \
        [(a.request_id, a.arrival_s, a.prompt_tokens, a.output_tokens) for a in other]
    n_sys = len(spec.system_tokens)
    own_ids = {i for a in own for i in a.prefix_ids or ()}
    other_ids = {i for a in other for i in a.prefix_ids or ()}
    sampled_ids = {i for a in sampled for i in a.prefix_ids or ()}
    assert {i for i in own_ids & other_ids if i >> 32 >= n_sys}  # unrelated conversations, same numbers
    common = own_ids & sampled_ids
    assert common and all(i >> 32 < n_sys for i in common)  # only system prompts in common
    assert as_sampled_day(sampled, task.workload, 1, 0) != as_sampled_day(sampled, task.workload, 0, 0)
    # a trace's ids are content hashes: kept; and days are numbered from 0
    mc = generate_arrivals(mooncake_task(horizon=4), 0)
    assert as_sampled_day(mc, mooncake_task().workload, 3, 0) == mc
    assert [a.request_id for a in as_sampled_day(mc, mooncake_task().workload, 3, 1 << 40)] == \
        [(1 << 40) + a.request_id for a in mc]
    with pytest.raises(ValueError, match="day must be >= 0"):
        as_sampled_day(mc, mooncake_task().workload, -1, 0)


def test_the_running_conversations_next_turns_drawn_as_many_as_the_day_brings_and_resending_their_history():
    """What the planner's multi-turn futures add: a draw of the turns still to come of the conversations seen
    so far. Counted against the true day's (turns after `now` of conversations that began before it), on
    multiturn_cluster's test seeds; each drawn turn resends the conversation's last seen prompt and answer."""
    task = get_task("multiturn_cluster")
    spec = MultiTurnSpec(**task.workload["spec"])
    end = task.horizon * task.window_s
    real_n = drawn_n = 0
    for seed in (1_000_000, 1_000_001, 1_000_002):
        arrivals = generate_arrivals(task, seed)
        starts = conversation_starts(arrivals, spec)
        for k in (10, 25, 40):
            now = k * task.window_s
            seen = [a for a in arrivals if a.arrival_s < now]
            running = running_conversations(seen, spec)
            last = {}
            for a in seen:
                last[a.prefix_ids[-1] >> 32] = a
            assert len(running) == len(last)
            real_n += sum(1 for a, s in zip(arrivals, starts, strict=True) if a.arrival_s >= now and s < now)
            drawn = continued_arrivals(running, spec, now, end, np.random.default_rng([seed, k]), 1 << 41)
            assert drawn == continued_arrivals(running, spec, now, end, np.random.default_rng([seed, k]), 1 << 41)
            drawn_n += len(drawn)
            assert [a.request_id for a in drawn] == list(range(1 << 41, (1 << 41) + len(drawn)))
            assert all(now <= a.arrival_s < end for a in drawn)
            assert [a.arrival_s for a in drawn] == sorted(a.arrival_s for a in drawn)
            for a in drawn:
                prev = last[a.prefix_ids[-1] >> 32]  # a conversation seen, its history resent
                assert a.prompt_tokens > prev.prompt_tokens + prev.output_tokens
                assert a.prefix_ids[:len(prev.prefix_ids)] == prev.prefix_ids
    assert abs(drawn_n / real_n - 1.0) < 0.05, (drawn_n, real_n)
    # no conversation seen, or none that can go on: nothing to draw
    assert continued_arrivals([], spec, 100.0, end, np.random.default_rng(0), 0) == []
    one_turn = MultiTurnSpec(**{**task.workload["spec"], "turns_mean": 1.0})
    assert continued_arrivals(running, one_turn, now, end, np.random.default_rng(0), 0) == []


def test_engine_hits_the_previous_turn_answer_included():
    sys_ids = tuple(range(64))  # a 1,024-token system prompt
    t1 = Arrival(0, 0.0, 1024 + 100, 300, prefix_ids=sys_ids + tuple(range(1000, 1025)), prefix_block_tokens=16)
    # turn 2: turn 1's prompt and answer (1,424 tokens), then a new user message of 200 tokens
    ids2 = sys_ids + tuple(range(1000, 1000 + (1624 - 1024) // 16))
    t2 = Arrival(1, 10.0, 1624, 50, prefix_ids=ids2, prefix_block_tokens=16)
    b = SimBackend()
    b.reset(0)
    act = ServeAction(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    r1 = b.run_window(act, [t1], 0.0, 10.0)
    r2 = b.run_window(act, [t2], 10.0, 10.0)
    assert r1.prefix_hit_tokens == 0 and r1.finished
    # the KV of turn 1's prompt + answer but its last sampled token: 1,423 tokens = 88 full units
    assert r2.prefix_hit_tokens == (1024 + 100 + 300 - 1) // 16 * 16


def test_multiturn_task_runs_and_hits():
    task = multiturn_task(horizon=20)
    arr = generate_arrivals(task, 0)
    assert arr and arr == generate_arrivals(task, 0)
    b = SimBackend()
    b.reset(0)
    act = ServeAction(batch_cap=128, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    hit = query = 0
    for k in range(task.horizon):
        rep = b.run_window(act, [a for a in arr if k <= a.arrival_s < k + 1], float(k), 1.0)
        hit += rep.prefix_hit_tokens
        query += rep.prefix_query_tokens
    assert query > 0 and 0.3 < hit / query <= ideal_hit_rate(arr) + 1e-9


def _act() -> ServeAction:
    return ServeAction(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                       prefill_decode_split=False, priority_routing=False)


def test_observation_shows_the_cache_only_where_it_is_on():
    from llmserve_env.core.inprocess import InProcessEnv

    env = InProcessEnv()
    env.reset(task_id=f"trace:{packaged_path(MOONCAKE_PACKAGED)}?prefix_block_tokens=512&horizon=4&window_s=5",
              seed=0)
    seen = []
    for _ in range(4):
        obs = env.step(_act())
        dumped = obs.model_dump()
        assert "prefix_hit_rate" in dumped and "prefix_cached_blocks" in dumped
        seen.append((obs.prefix_hit_rate, obs.prefix_cached_blocks))
    assert all(0.0 <= h <= 1.0 for h, _ in seen) and any(h > 0 for h, _ in seen)
    assert all(c > 0 for _, c in seen)
    plain = InProcessEnv()
    obs = plain.reset(task_id="static_workload", seed=0)
    obs = plain.step(_act())
    # absent, not null: the seed's observation key for key (the golden digests hash model_dump)
    assert "prefix_hit_rate" not in obs.model_dump() and "prefix_hit_rate" not in obs.model_dump_json()
    assert obs.prefix_hit_rate is None


@pytest.mark.parametrize("value", ["100", "0", "abc", "17"])
def test_bad_prefix_block_tokens_option_is_refused(value):
    from llmserve_env.shared.workloads import resolve_task

    with pytest.raises(TraceError, match="prefix_block_tokens"):
        resolve_task(f"trace:{packaged_path(MOONCAKE_PACKAGED)}?prefix_block_tokens={value}")


def test_http_step_carries_the_cache_fields_only_where_caching_is_on(client):
    act = _act().model_dump()
    task = f"trace:{packaged_path(MOONCAKE_PACKAGED)}?prefix_block_tokens=512&horizon=3&window_s=5"
    r = client.post("/reset", json={"task_id": task, "seed": 0})
    assert r.status_code == 200, r.text
    eid = r.json()["observation"]["episode_id"]
    r = client.post("/step", json={"action": act, "episode_id": eid})
    assert r.status_code == 200, r.text
    obs = r.json()["observation"]
    assert 0.0 <= obs["prefix_hit_rate"] <= 1.0 and obs["prefix_cached_blocks"] > 0
    r = client.post("/reset", json={"task_id": "static_workload", "seed": 0})
    eid = r.json()["observation"]["episode_id"]
    obs = client.post("/step", json={"action": act, "episode_id": eid}).json()["observation"]
    assert "prefix_hit_rate" not in obs and "prefix_cached_blocks" not in obs
    bad = client.post("/step", json={"action": {**act, "cache_affinity": 2.0}, "episode_id": eid})
    assert bad.status_code == 422 and "cache_affinity" in bad.text
