"""bench/real_prefix.py's pieces that need no engine: the run put in the engine's tokens for the
simulator's prediction, and the slot model replayed on a run's own records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmserve_env.shared.backend import Arrival
from llmserve_env.sim.slot_cache import SlotCacheSpec


def bench():
    from test_cli import bench_module
    return bench_module("real_prefix")


def arrivals(tmp_path: Path, rp) -> list[Arrival]:
    trace = tmp_path / "t.jsonl"
    rp.write_trace(trace, 2, 2, 10.0, 256, 48, 16, 2.0, system_prompts=1)
    from llmserve_env.shared.workloads import generate_arrivals, resolve_task
    task = resolve_task(f"trace:{trace}?prefix_block_tokens=16&replicas=2&initial_replicas=2&window_s=5&horizon=4")
    return generate_arrivals(task, 0)


def shared_units(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_engine_tokens_scale_lengths_and_shared_prefixes_alike(tmp_path):
    rp = bench()
    arr = arrivals(tmp_path, rp)
    first = [a for a in arr if a.prompt_tokens == 304]  # the two conversations' first turns: 16 shared units
    assert len(first) == 2 and shared_units(first[0].prefix_ids, first[1].prefix_ids) == 16
    scaled = rp.in_engine_tokens(first, 1.25)
    assert [a.prompt_tokens for a in scaled] == [380, 380]
    assert shared_units(scaled[0].prefix_ids, scaled[1].prefix_ids) == 20  # 16 x 1.25
    assert len(scaled[0].prefix_ids) == 380 // 16
    same = rp.in_engine_tokens(first, 1.0)
    assert [a.prompt_tokens for a in same] == [304, 304]
    assert shared_units(same[0].prefix_ids, same[1].prefix_ids) == 16


def test_slot_replay_matches_an_engine_that_behaves_as_the_model(tmp_path):
    rp = bench()
    arr = arrivals(tmp_path, rp)
    rows = []
    # one endpoint, one request at a time: each conversation's second turn finds its first in a slot
    for a in sorted(arr, key=lambda x: x.arrival_s):
        rows.append({"request_id": a.request_id, "status": "ok", "endpoint": "e0", "dispatch_s": a.arrival_s,
                     "finish_s": a.arrival_s + 1.0, "arrival_s": a.arrival_s, "prompt_tokens": a.prompt_tokens,
                     "usage_prompt_tokens": a.prompt_tokens, "engine_prompt_tokens": a.prompt_tokens,
                     "cached_tokens": None, "first_token_s": a.arrival_s + 0.5, "prefix_units_sent": 1})
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = rp.replay_slots(path, arr, SlotCacheSpec(slots=4))
    for r in rows:  # the engine reports what the model predicts...
        share = next(x["model_hit"] for x in model if x["request_id"] == r["request_id"])
        r["cached_tokens"] = round(share * r["engine_prompt_tokens"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = rp.replay_slots(path, arr, SlotCacheSpec(slots=4))
    assert all(abs(x["engine_hit"] - x["model_hit"]) < 0.01 for x in again)  # ...and the replay agrees
    assert max(x["model_hit"] for x in again) > 0.5  # a second turn hit its own history
    from llmserve_env.sim.calibration.replay import prompt_ratio
    assert prompt_ratio(rows) == 1.0  # what the bench scales the run by: the engine counted as o200k here
    summary = rp.summary_records(path)
    assert summary["requests_ok"] == len(arr) and summary["ttft_mean_ms"] == 500.0


def test_the_prediction_on_recorded_routes_sends_each_request_where_the_records_say(tmp_path):
    """`--replay`'s third prediction plays a run on the gateway's own routes: a conversation whose second
    turn went to the other server finds no history there, and the records' endpoints name the replicas."""
    rp = bench()
    from llmserve_env.shared.workloads import resolve_task
    from llmserve_env.sim.profiles import load_profile
    arr = sorted(arrivals(tmp_path, rp), key=lambda a: a.arrival_s)
    task = resolve_task(f"trace:{tmp_path / 't.jsonl'}?prefix_block_tokens=16&replicas=2&initial_replicas=2"
                        "&window_s=5&horizon=4")
    first = [a for a in arr if a.prompt_tokens == 304]
    convo = {a.request_id: i for i, a in enumerate(first)}
    for a in arr:  # a second turn resends its first turn's units: the conversation it belongs to
        if a.request_id not in convo:
            convo[a.request_id] = next(convo[f.request_id] for f in first
                                       if a.prefix_ids[:len(f.prefix_ids)] == f.prefix_ids)

    def records(split: bool) -> Path:
        """Conversation c on server c; with `split`, each second turn on the other server."""
        path = tmp_path / f"records_{split}.jsonl"
        rows = [{"request_id": a.request_id, "status": "ok",
                 "endpoint": f"http://e{(convo[a.request_id] + (split and a.prompt_tokens > 304)) % 2}"}
                for a in arr]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    kept, split = rp.recorded_routes(records(False)), rp.recorded_routes(records(True))
    assert kept == {a.request_id: convo[a.request_id] for a in arr}
    assert sum(kept[i] != split[i] for i in kept) == 2  # the two second turns moved
    profile = load_profile("h100-llama3.1-8b")
    hit_kept = rp.summary(rp.play_sim(profile, arr, task, None, kept))["hit_rate"]
    hit_split = rp.summary(rp.play_sim(profile, arr, task, None, split))["hit_rate"]
    assert hit_split < hit_kept
    extra = tmp_path / "three.jsonl"
    extra.write_text("".join(json.dumps({"request_id": i, "endpoint": f"http://e{i}"}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match="3 endpoints"):
        rp.recorded_routes(extra)


def test_conversations_and_their_splits_by_a_routing(tmp_path):
    """The bench counts, per routing, the conversations with turns on both servers and the turn-to-turn
    server changes; a conversation is told by its first turn's units leading each later turn (two
    conversations on one system prompt share only that)."""
    rp = bench()
    from llmserve_env.shared.workloads import resolve_task
    from llmserve_env.sim.profiles import load_profile
    arr = sorted(arrivals(tmp_path, rp), key=lambda a: a.arrival_s)
    convo = rp.conversations(arr)
    first = sorted(a.request_id for a in arr if a.prompt_tokens == 304)
    assert sorted(set(convo.values())) == first and all(list(convo.values()).count(f) == 2 for f in first)
    together = {a.request_id: first.index(convo[a.request_id]) for a in arr}
    assert rp.splits(together, convo) == {"split": 0, "changes": 0}
    moved = dict(together)
    later = max(a.request_id for a in arr if convo[a.request_id] == first[0])
    moved[later] = 1 - moved[later]
    assert rp.splits(moved, convo) == {"split": 1, "changes": 1}
    task = resolve_task(f"trace:{tmp_path / 't.jsonl'}?prefix_block_tokens=16&replicas=2&initial_replicas=2"
                        "&window_s=5&horizon=4")
    for router in ("estimated", "tracked"):  # the simulator's own routes, noted for every request
        routes: dict[int, int] = {}
        reports = rp.play_sim(load_profile("h100-llama3.1-8b"), arr, task, 0.0, router=router, routes_out=routes)
        assert sorted(routes) == sorted(a.request_id for a in arr) and set(routes.values()) <= {0, 1}
        assert rp.summary(reports)["requests_ok"] == len(arr)
