"""engine.cached_context_s (sim/cached_context.py): a measured engine's attention over what comes before a
computed prompt token, on the affine model and the step table, in the engine, at load, in the records fit,
and bench/cached_prefill.py's probe against a mocked llama-server."""

from __future__ import annotations

import json

import httpx
import pytest
import respx
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.prefix import chain_ids
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.calibration.record_fit import with_coefficients
from llmserve_env.sim.calibration.table_fit import with_table
from llmserve_env.sim.measured_step import MeasuredStepModel, StepCoefficients
from llmserve_env.sim.profiles import InvalidProfileError, load_profile, with_engine
from llmserve_env.sim.step_table import TableStepModel
from test_step_table import SATURATING

BASE = "h100-llama3.1-8b"
CPU = StepCoefficients(step_s=0.012, seq_s=0.004, token_s=0.006, ctx_s=2e-6)
K = 2.13e-6  # SmolLM2-135M on one CPU thread, the first of three probes (sim/data/llama_cpu_cached_prefill.csv)


def affine(k: float | None):
    prof = with_coefficients(load_profile(BASE), CPU, "cpu")
    return with_engine(prof, {"cached_context_s": k}) if k is not None else prof


def test_the_affine_model_prices_every_causal_pair_and_the_table_only_the_cached_ones():
    chunks = [(77, 512), (40, 0)]
    off = MeasuredStepModel(affine(None), "FP16", CPU).iteration_s(2, 900.0, 0, chunks, 117, 2)
    on = MeasuredStepModel(affine(K), "FP16", CPU).iteration_s(2, 900.0, 0, chunks, 117, 2)
    assert on - off == pytest.approx(K * (77 * (512 + 39) + 40 * 20.5))
    # nothing to prefill: the decode iteration is the same
    assert MeasuredStepModel(affine(K), "FP16", CPU).iteration_s(3, 900.0, 0, [], 0, 0) == \
        MeasuredStepModel(affine(None), "FP16", CPU).iteration_s(3, 900.0, 0, [], 0, 0)
    table = with_table(load_profile(BASE), SATURATING, "t")
    t_off = TableStepModel(table, "FP16", SATURATING).iteration_s(2, 900.0, 0, chunks, 117, 2)
    t_on = TableStepModel(with_engine(table, {"cached_context_s": K}), "FP16", SATURATING).iteration_s(
        2, 900.0, 0, chunks, 117, 2)
    assert t_on - t_off == pytest.approx(K * 77 * 512)  # the knots hold a prompt's own pairs already


def second_turn_ttft(profile, history_units: int, new_units: int = 5, unit: int = 16) -> float:
    """TTFT of a conversation's second turn: `history_units` cached, `new_units` computed."""
    hist = chain_ids(tuple(range(history_units)))
    turn2 = chain_ids(tuple(range(history_units + new_units)))
    arr = [Arrival(0, 0.0, unit * history_units, 1, prefix_ids=hist, prefix_block_tokens=unit),
           Arrival(1, 30.0, unit * (history_units + new_units), 1, prefix_ids=turn2, prefix_block_tokens=unit)]
    backend = SimBackend(profile)
    backend.reset(0)
    act = ServeAction(batch_cap=4, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                      prefill_decode_split=False, priority_routing=False)
    ttft = {}
    for k in range(4):
        rep = backend.run_window(act, [a for a in arr if 20.0 * k <= a.arrival_s < 20.0 * (k + 1)], 20.0 * k, 20.0)
        ttft.update({i: t for i, _, t in rep.first_tokens})
    return ttft[1]


def test_a_cached_prefix_makes_the_next_turn_slower_by_its_length_only_when_priced():
    short, long = second_turn_ttft(affine(None), 8), second_turn_ttft(affine(None), 48)
    assert long == pytest.approx(short, rel=1e-9)  # not priced: the cache hides the history entirely
    short_k, long_k = second_turn_ttft(affine(K), 8), second_turn_ttft(affine(K), 48)
    # 80 tokens computed after 640 more cached tokens: K x 80 x 640 = 110 ms more
    assert long_k - short_k == pytest.approx(K * 80 * 640, rel=0.01)
    assert short_k > short


def test_the_field_is_refused_where_nothing_would_price_it(tmp_path):
    raw = json.loads(json.dumps(load_profile(BASE).raw))
    raw["engine"]["cached_context_s"] = K
    path = tmp_path / "kernel.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InvalidProfileError, match="engine.cached_context_s is a measured step model's term"):
        load_profile(str(path))
    bad = json.loads(json.dumps(affine(None).raw))
    bad["engine"]["cached_context_s"] = -1.0
    path = tmp_path / "negative.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InvalidProfileError, match="engine.cached_context_s must be a number >= 0"):
        load_profile(str(path))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(affine(K).raw))
    assert load_profile(str(good)).raw["engine"]["cached_context_s"] == K


def test_calibrate_records_holds_the_cost_fixed_and_fits_the_rest(tmp_path, monkeypatch, capsys):
    """Records of an engine whose attention costs 20 us a pair (prompts of 30-90 tokens): told that cost,
    the fit finds its per-token cost; not told, it folds the attention into a dearer token."""
    from llmserve_env.tools import calibrate
    from test_step_table import ACTION_JSON, records

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    truth_k = 2e-5
    line = tmp_path / "line.jsonl"
    import test_step_table

    monkeypatch.setattr(test_step_table, "with_coefficients",
                        lambda base, coef, out_id=None: with_engine(with_coefficients(base, coef, out_id),
                                                                    {"cached_context_s": truth_k}))
    records(CPU, line, 1, n=12, rate=0.6)
    argv = ["records", "--profile", BASE, "--records", str(line), "--action", ACTION_JSON, "--windows", "12",
            "--step-model", "affine"]
    told, blind = tmp_path / "told.json", tmp_path / "blind.json"
    assert calibrate.main([*argv, "--out", str(told), "--cached-context-s", str(truth_k)]) == 0
    assert calibrate.main([*argv, "--out", str(blind)]) == 0
    t, b = (json.loads(p.read_text())["engine"] for p in (told, blind))
    assert t["cached_context_s"] == truth_k and "cached_context_s" not in b
    assert t["measured_step"]["token_s"] == pytest.approx(CPU.token_s, rel=0.05)
    assert b["measured_step"]["token_s"] > t["measured_step"]["token_s"] * 1.05
    capsys.readouterr()
    assert calibrate.main([*argv, "--out", str(tmp_path / "x.json"), "--cached-context-s", "-1"]) == 2
    assert "cached_context_s must be >= 0" in capsys.readouterr().err


def probe_module():
    from test_cli import bench_module
    return bench_module("cached_prefill")


class SlotServer:
    """llama-server's /completion on one slot with cache_prompt: what the slot held is not computed again,
    and each computed token costs 5 ms plus 2 us per token before it."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["cache_prompt"] is True and body["id_slot"] == 0 and body["n_predict"] == 1
        ids = body["prompt"]
        keep = 0
        while keep < min(len(ids), len(self.held)) and ids[keep] == self.held[keep]:
            keep += 1
        computed = len(ids) - keep
        ms = sum(5.0 + 2e-3 * (keep + j) for j in range(computed))
        self.held = list(ids)
        return httpx.Response(200, json={"timings": {"prompt_n": computed, "prompt_ms": ms}})


def test_the_probe_reads_the_cost_of_a_cached_prefix_off_a_slot():
    cp = probe_module()
    with respx.mock(assert_all_called=True) as mock:
        mock.post("http://engine/completion").mock(side_effect=SlotServer())
        rows = cp.measure("http://engine", [0, 256, 512], 77, [100, 300], repeats=2, seed=1)
    assert [r.prompt_n for r in rows if r.kind == "cached"] == [77] * 6
    res = cp.fit(rows)
    assert res["cached_context_s"] == pytest.approx(2e-6, rel=1e-6)  # per computed token per cached token
    assert res["intercept_ms"] == pytest.approx(77 * 5.0 + 2e-3 * 77 * 76 / 2, rel=1e-6)
    assert res["scratch_pair_s"] == pytest.approx(2e-6, rel=1e-6)


def test_the_probe_stops_when_the_slot_did_not_keep_the_prefix():
    cp = probe_module()

    def forgetful(request: httpx.Request) -> httpx.Response:
        n = len(json.loads(request.content)["prompt"])
        return httpx.Response(200, json={"timings": {"prompt_n": n, "prompt_ms": 5.0 * n}})

    with respx.mock:
        respx.post("http://engine/completion").mock(side_effect=forgetful)
        with pytest.raises(RuntimeError, match="after 128 cached tokens the engine computed 205, not 77"):
            cp.measure("http://engine", [0, 128], 77, [], repeats=1, seed=0)


def test_the_probe_names_what_the_engine_refused():
    cp = probe_module()
    with respx.mock:
        respx.post("http://engine/completion").mock(return_value=httpx.Response(
            400, json={"error": {"message": "request (1024 tokens) exceeds the available context size (1024 tokens)"}}))
        with pytest.raises(RuntimeError, match=r"a prompt of 1024 tokens: HTTP 400 .*exceeds the available context"):
            cp.measure("http://engine", [1024, 0], 77, [], repeats=1, seed=0)
