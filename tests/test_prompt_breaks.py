"""llama-server's context-checkpoint breaks (sim/prompt_breaks.py): where a prompt's prefill stops, and
what that costs in the engine: more iterations for the prompt, each stalling every decoding request."""

from __future__ import annotations

import copy

import pytest
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.profiles import load_profile, profile_from_dict
from llmserve_env.sim.prompt_breaks import PromptBreaks, parse_prompt_breaks
from llmserve_env.tools import calibrate


def test_breaks_follow_the_checkpoint_offsets():
    b = PromptBreaks()
    # a 70-token one-turn prompt: [0, 1), [1, 66), [66, 70), as gemma-3-270m's -lv 4 log shows
    assert [b.room(0, 70), b.room(1, 70), b.room(66, 70)] == [1, 65, 4]
    # a prompt longer than 4 + n_ubatch also stops 516 tokens before its end
    assert [b.room(0, 1000), b.room(1, 1000), b.room(484, 1000), b.room(996, 1000)] == [1, 483, 512, 4]
    # a cached prefix moves the start: a hit of 63 of 68 tokens computes [63, 64), then [64, 68)
    assert [b.room(63, 68), b.room(64, 68)] == [1, 4]
    assert [b.room(0, 3), b.room(1, 3)] == [1, 2]  # breaks at or before the start are not breaks


def test_spec_round_trips_and_bad_values_name_the_field():
    spec = PromptBreaks(ubatch=256)
    assert PromptBreaks.from_engine({"prompt_breaks": spec.to_engine()}) == spec
    assert PromptBreaks.from_engine({}) is None
    with pytest.raises(ValueError, match="engine.prompt_breaks.kind"):
        PromptBreaks.from_engine({"prompt_breaks": {"kind": "vllm"}})
    with pytest.raises(ValueError, match="tail and ubatch >= 1"):
        PromptBreaks(ubatch=0)
    assert parse_prompt_breaks("none") is None
    assert parse_prompt_breaks("llama") == PromptBreaks().to_engine()
    assert parse_prompt_breaks("llama:1024")["ubatch"] == 1024
    for bad in ("llama:0", "llama:x", "gemma"):
        with pytest.raises(ValueError, match="--prompt-breaks must be none, llama or llama:UBATCH"):
            parse_prompt_breaks(bad)


def broken(spec: PromptBreaks | None):
    raw = copy.deepcopy(load_profile("h100-llama3.1-8b").raw)
    if spec is not None:
        raw["engine"]["prompt_breaks"] = spec.to_engine()
    return profile_from_dict(raw)


ACT = ServeAction(batch_cap=16, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                  prefill_decode_split=False, priority_routing=False)


def play(spec: PromptBreaks | None, arrivals: list[Arrival]):
    backend = SimBackend(broken(spec))
    backend.reset(0)
    return backend.run_window(ACT, arrivals, 0.0, 30.0)


def test_a_lone_prompt_takes_three_iterations():
    lone = [Arrival(0, 0.0, 700, 1)]
    plain, split = play(None, lone), play(PromptBreaks(), lone)
    # 700 tokens: [0, 1), [1, 184), [184, 696), [696, 700) with the checkpoints; one iteration without
    assert split.notes["iterations"] - plain.notes["iterations"] == 3
    assert split.prompt_tokens == plain.prompt_tokens == 700
    (p,), (s,) = plain.finished, split.finished
    assert s.first_token_s > p.first_token_s


def test_each_break_stalls_the_decoding_requests():
    """Four requests decoding when a fifth prompt arrives: with the breaks its prefill spreads over three
    iterations, each with the four decodes, so its first token comes later and the four streams' tokens
    take longer (llama-server's stalls for a sliding-window model)."""
    day = [Arrival(i, 0.0, 64, 400) for i in range(4)] + [Arrival(4, 0.5, 300, 8)]
    plain, split = play(None, day), play(PromptBreaks(), day)
    ttft = {r.request_id: r.first_token_s - r.arrival_s for r in plain.finished}
    ttft_split = {r.request_id: r.first_token_s - r.arrival_s for r in split.finished}
    assert ttft_split[4] > ttft[4]
    span = {r.request_id: r.finish_s for r in plain.finished}
    span_split = {r.request_id: r.finish_s for r in split.finished}
    assert all(span_split[i] > span[i] for i in range(4))


def test_calibrate_records_plays_and_writes_the_breaks(tmp_path, capsys):
    """`calibrate records --prompt-breaks llama` fits with the breaks played and keeps them in the profile;
    a bad value is exit 2 naming the flag and its forms."""
    import json

    from llmserve_env.sim.measured_step import StepCoefficients
    from test_step_table import ACTION_JSON, BASE, records

    line = tmp_path / "line.jsonl"
    records(StepCoefficients(step_s=0.012, seq_s=0.004, token_s=0.006, ctx_s=2e-6), line, 1, n=12, rate=0.6)
    argv = ["records", "--profile", BASE, "--records", str(line), "--action", ACTION_JSON, "--windows", "20",
            "--step-model", "affine"]
    fitted = {}
    for flag in ("none", "llama"):
        out = tmp_path / f"{flag}.json"
        assert calibrate.main([*argv, "--out", str(out), "--prompt-breaks", flag]) == 0
        fitted[flag] = json.loads(out.read_text())
    assert "prompt_breaks" not in fitted["none"]["engine"]
    assert fitted["llama"]["engine"]["prompt_breaks"] == PromptBreaks().to_engine()
    # the breaks were played while fitting: the same records give other coefficients
    assert fitted["llama"]["engine"]["measured_step"] != fitted["none"]["engine"]["measured_step"]
    capsys.readouterr()
    assert calibrate.main([*argv, "--out", str(tmp_path / "bad.json"), "--prompt-breaks", "llama:0"]) == 2
    assert "--prompt-breaks must be none, llama or llama:UBATCH" in capsys.readouterr().err
