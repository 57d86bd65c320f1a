"""The slot-based prompt cache of llama-server (sim/slot_cache.py) and an engine that uses it: slot choice
by prefix similarity or LRU, a history lost when a similar prompt takes its slot, kept in the RAM cache
when idle slots are saved, and the engine's hits following the slot model rather than the block cache."""

from __future__ import annotations

import copy

import pytest
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.prefix import chain_ids
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.profiles import load_profile, profile_from_dict
from llmserve_env.sim.slot_cache import SlotCache, SlotCacheSpec

UNIT = 16
SYSTEM = tuple(range(100, 116))  # a 256-token system prompt, 16 units


def convo(c: int, turns: int) -> tuple[int, ...]:
    """Content ids of conversation c's prompt at turn `turns` (1-based): the system prompt, then 3 units
    per user message and 1 per answer, each unique to the conversation."""
    ids = list(SYSTEM)
    for t in range(turns):
        ids += [1000 * c + 10 * t + k for k in range(3)]
        if t < turns - 1:
            ids.append(1000 * c + 10 * t + 9)
    return chain_ids(tuple(ids))


def take(cache: SlotCache, keys: tuple[int, ...]) -> tuple[int, int]:
    plan = cache.plan(keys, UNIT * len(keys))
    return cache.take(plan), plan[2]


def done(cache: SlotCache, slot: int, keys: tuple[int, ...], t: float) -> None:
    cache.release(slot, keys, UNIT * len(keys) + 15, t)


def fresh(**kw) -> SlotCache:
    c = SlotCache(SlotCacheSpec(slots=kw.pop("slots", 4), **kw))
    c.unit = UNIT
    return c


def test_first_requests_take_the_least_recently_used_slot_last_first():
    c = fresh()
    assert take(c, convo(1, 1)) == (3, 0)  # never-used slots tie: llama-server's `<=` picks the last
    assert take(c, convo(2, 1))[0] == 2


def test_a_conversation_hits_its_history_in_its_slot():
    c = fresh()
    s, _ = take(c, convo(1, 1))
    done(c, s, convo(1, 1), 1.0)
    slot, hit = take(c, convo(1, 2))
    assert slot == s and hit == len(convo(1, 1))  # the whole first prompt


def test_a_similar_new_prompt_takes_the_slot_and_its_history_is_lost_but_for_a_ram_copy():
    for save_idle, in_ram in ((False, len(SYSTEM)), (True, len(convo(1, 2)))):
        c = fresh(slots=3, save_idle=save_idle)
        s, _ = take(c, convo(1, 2))
        done(c, s, convo(1, 2), 1.0)
        x, _ = take(c, chain_ids((7, 7, 7)))  # an unrelated request starts: idle slots are copied to RAM
        assert x != s
        # conversation 2 shares the system prompt (16 of its 19 units, over 0.10) and keeping 16 of the
        # slot's 24 units is over half: it is given conversation 1's slot, which is not saved
        s2, hit2 = take(c, convo(2, 1))
        assert s2 == s and hit2 == len(SYSTEM)
        done(c, s2, convo(2, 1), 2.0)
        # conversation 1's third turn is given that slot again (the system prompt, keeping over half of
        # it: no RAM lookup), so it hits the system prompt only, with or without a RAM copy
        assert take(copy.deepcopy(c), convo(1, 3))[1] == len(SYSTEM)
        # the copy is there for a router that reads the engine's cache
        assert c.match(convo(1, 3), 999) == in_ram


def test_the_ram_cache_restores_a_history_when_the_slot_is_taken_by_lru():
    c = fresh(slots=1)
    s, _ = take(c, convo(1, 2))
    done(c, s, convo(1, 2), 1.0)
    s, _ = take(c, chain_ids((7, 7, 7)))  # shares nothing: LRU, the slot's tokens are saved first
    done(c, s, chain_ids((7, 7, 7)), 2.0)
    slot, hit = take(c, convo(1, 3))  # LRU again (nothing similar in the slot): the saved history is loaded
    assert hit == len(convo(1, 2))
    off = fresh(slots=1, ram=False)
    s, _ = take(off, convo(1, 2))
    done(off, s, convo(1, 2), 1.0)
    s, _ = take(off, chain_ids((7, 7, 7)))
    done(off, s, chain_ids((7, 7, 7)), 2.0)
    assert take(off, convo(1, 3))[1] == 0  # no RAM cache: gone


def test_the_hit_leaves_the_last_prompt_token_to_compute():
    c = fresh()
    s, _ = take(c, convo(1, 1))
    done(c, s, convo(1, 1), 1.0)
    keys = convo(1, 1)
    plan = c.plan(keys, UNIT * len(keys))  # the same prompt again: one token is computed
    assert plan[2] == len(keys) - 1


def test_busy_slots_are_never_taken():
    c = fresh(slots=2)
    take(c, convo(1, 1))
    take(c, convo(2, 1))
    assert not c.idle()


@pytest.mark.parametrize("bad", [{"kind": "pages"}, {"kind": "slots", "slots": 0},
                                 {"kind": "slots", "slots": 2, "similarity": 1.5}])
def test_profile_prefix_cache_is_checked(bad):
    with pytest.raises(ValueError, match="prefix_cache"):
        SlotCacheSpec.from_engine({"prefix_cache": bad})


def test_no_prefix_cache_section_is_the_block_cache():
    assert SlotCacheSpec.from_engine({}) is None
    assert SlotCacheSpec.from_engine({"prefix_cache": {"kind": "blocks"}}) is None


# ----------------------------------------------------------------------------------- in the engine

def slot_profile(slots: int):
    raw = copy.deepcopy(load_profile("h100-llama3.1-8b").raw)
    raw["engine"]["prefix_cache"] = SlotCacheSpec(slots=slots).to_engine()
    return profile_from_dict(raw)


def play(backend: SimBackend, arrivals: list[Arrival], windows: int = 6, dt: float = 5.0):
    backend.reset(0)
    act = ServeAction(batch_cap=2, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    reps = [backend.run_window(act, [a for a in arrivals if k * dt <= a.arrival_s < (k + 1) * dt], k * dt, dt)
            for k in range(windows)]
    return reps


def takeover_day() -> list[Arrival]:
    """Conversation 1's two turns, with conversation 2 (same system prompt) arriving between them."""
    a = [(0.0, convo(1, 1)), (5.0, convo(2, 1)), (10.0, convo(1, 2)), (15.0, convo(2, 2))]
    return [Arrival(i, t, UNIT * len(k), 16, prefix_ids=k, prefix_block_tokens=UNIT) for i, (t, k) in enumerate(a)]


def test_engine_hits_follow_the_slot_model_not_the_block_cache():
    day = takeover_day()
    blocks = play(SimBackend(), day)
    slots = play(SimBackend(slot_profile(1)), day)
    hit = lambda reps: sum(r.prefix_hit_tokens for r in reps)  # noqa: E731
    query = sum(a.prompt_tokens for a in day)
    assert sum(r.prefix_query_tokens for r in slots) == query
    # the block cache keeps both conversations' histories; one slot holds one at a time (the RAM cache
    # brings the other back when the slot is taken by LRU): fewer hits, never more
    assert hit(slots) <= hit(blocks)
    assert hit(slots) > 0
    again = play(SimBackend(slot_profile(1)), day)
    assert [r.prefix_hit_tokens for r in again] == [r.prefix_hit_tokens for r in slots]  # deterministic


def test_a_slot_engine_runs_no_more_requests_than_it_has_slots():
    day = [Arrival(i, 0.0, 512, 64, prefix_ids=chain_ids((i,) * 32), prefix_block_tokens=UNIT) for i in range(6)]
    backend = SimBackend(slot_profile(2))
    backend.reset(0)
    act = ServeAction(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    rep = backend.run_window(act, day, 0.0, 0.05)
    eng = backend._engine
    assert len(eng.decoding) + len(eng.prefilling) <= 2
    assert sum(eng.slots.busy) == len(eng.decoding) + len(eng.prefilling)
    assert rep is not None


def test_a_fork_of_a_slot_engine_plays_on_identically():
    day = takeover_day()
    a = SimBackend(slot_profile(1))
    a.reset(0)
    act = ServeAction(batch_cap=2, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    a.run_window(act, [x for x in day if x.arrival_s < 5.0], 0.0, 5.0)
    b = a.fork()
    rest = [x for x in day if 5.0 <= x.arrival_s < 10.0]
    ra, rb = a.run_window(act, rest, 5.0, 5.0), b.run_window(act, rest, 5.0, 5.0)
    assert (ra.prefix_hit_tokens, ra.prefix_cached_blocks, len(ra.finished)) == \
        (rb.prefix_hit_tokens, rb.prefix_cached_blocks, len(rb.finished))
    assert b._engine.slots is not a._engine.slots and ra.prefix_cached_blocks > 0


def test_calibrate_records_writes_the_engine_s_cache_kind(tmp_path, capsys):
    import json

    from llmserve_env.sim.measured_step import StepCoefficients
    from llmserve_env.tools import calibrate
    from test_step_table import ACTION_JSON, BASE, records

    line = tmp_path / "line.jsonl"
    records(StepCoefficients(step_s=0.012, seq_s=0.004, token_s=0.006, ctx_s=2e-6), line, 1, n=12, rate=0.6)
    out = tmp_path / "slots.json"
    argv = ["records", "--profile", BASE, "--records", str(line), "--action", ACTION_JSON, "--windows", "20",
            "--step-model", "affine", "--out", str(out)]
    assert calibrate.main([*argv, "--prefix-cache", "slots:8"]) == 0
    prof = json.loads(out.read_text())
    assert prof["engine"]["prefix_cache"] == SlotCacheSpec(slots=8).to_engine()
    assert load_profile(str(out)).raw["engine"]["prefix_cache"]["kind"] == "slots"
    capsys.readouterr()
    assert calibrate.main([*argv, "--prefix-cache", "slots:0"]) == 2
    assert "--prefix-cache must be 'blocks' or 'slots:N'" in capsys.readouterr().err
