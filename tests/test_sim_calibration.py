"""Profiles and calibration: provenance, fit errors, reproducible kernel fits, the records loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmserve_env.sim.calibration.extra_steps import (
    ExtraStep,
    check_extras,
    extras_allreduce,
    predict_extra,
    read_extra_steps,
    refitted,
    tier_models,
)
from llmserve_env.sim.calibration.kernel_data import DATA_DIR
from llmserve_env.sim.calibration.step_fit import fit_steps, read_steps
from llmserve_env.sim.profiles import PROFILE_DIR, UnknownProfileError, list_profiles, load_profile
from llmserve_env.sim.step_time import StepTimeModel
from llmserve_env.tools import calibrate

BUILT_IN = ["a100-llama3-8b", "h100-llama3.1-70b-tp4", "h100-llama3.1-8b"]


def test_built_in_profiles_load_with_provenance_and_fit_error():
    assert set(BUILT_IN) <= set(list_profiles())
    for pid in BUILT_IN:
        p = load_profile(pid)
        raw = p.raw
        for key in ("kernels", "fit", "t_fixed", "price", "memory", "model_shapes", "speculation"):
            assert raw["provenance"][key]
        assert raw["assumptions"]
        fe = raw["fit_error"]
        assert 0 < fe["kernels_heldout_median_abs_error_pct"] < 10
        assert fe["kernels_heldout_rows"] > 1000
        assert p.price_per_gpu_hour > 0 and p.memory_gib > 0
        assert set(p.tiers) == {"FP16", "INT8", "INT4"}
        assert p.kv_capacity_gib("FP16", False) > 0
    assert load_profile("h100-llama3.1-70b-tp4").tp == 4
    assert load_profile("h100-llama3.1-70b-tp4").allreduce is not None


def test_unknown_profile_is_refused():
    with pytest.raises(UnknownProfileError, match="available"):
        load_profile("tpu-v9-llama-9t")
    with pytest.raises(UnknownProfileError):
        load_profile("../profiles/h100-llama3.1-8b")


def test_weights_match_the_published_model_sizes():
    p = load_profile("h100-llama3.1-8b")
    assert p.model.params() == pytest.approx(8.03e9, rel=0.01)
    assert load_profile("h100-llama3.1-70b-tp4").model.params() == pytest.approx(70.6e9, rel=0.01)
    assert p.draft.params() == pytest.approx(1.24e9, rel=0.01)
    assert p.weights_gib("FP16", False) == pytest.approx(14.96, abs=0.05)  # vLLM logs ~14.99 GiB
    assert p.weights_gib("INT4", False) < p.weights_gib("INT8", False) < p.weights_gib("FP16", False)
    assert p.kv_capacity_gib("INT4", False) > p.kv_capacity_gib("FP16", False) > p.kv_capacity_gib("FP16", True)


def test_copied_kernel_data_is_small_and_documented():
    files = list(DATA_DIR.iterdir())
    assert sum(f.stat().st_size for f in files) < 5 * 2**20
    note = (DATA_DIR / "PROVENANCE.md").read_text()
    assert "Apache-2.0" in note and "AIConfigurator" in note


def test_kernel_calibration_reproduces_the_shipped_profiles_bit_for_bit(tmp_path):
    """README: `calibrate kernels --profile all --out-dir sim/profiles` writes the shipped files exactly."""
    assert calibrate.main(["kernels", "--profile", "all", "--out-dir", str(tmp_path)]) == 0
    shipped = PROFILE_DIR
    for name in [f"{pid}.json" for pid in BUILT_IN] + [calibrate.REPORT_NAME]:
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_step_time_shapes():
    p = load_profile("h100-llama3.1-8b")
    fp16, int8, int4 = (StepTimeModel(p, t) for t in ("FP16", "INT8", "INT4"))
    # memory-bound decode: fewer weight bytes, faster
    assert int4.iteration_s(1, 1000, 0, [], 0, 0) < int8.iteration_s(1, 1000, 0, [], 0, 0) \
        < fp16.iteration_s(1, 1000, 0, [], 0, 0)
    # compute-bound prefill: INT4 pays dequantization, INT8 runs FP8 tensor cores
    chunk = [(2048, 0)]
    assert int8.iteration_s(0, 0, 0, chunk, 2048, 1) < fp16.iteration_s(0, 0, 0, chunk, 2048, 1) \
        < int4.iteration_s(0, 0, 0, chunk, 2048, 1)
    # speculation: verifying 4 tokens at batch 1 costs little more than 1, at batch 256 a lot more
    assert fp16.iteration_s(1, 1000, 3, [], 0, 0) < 2 * fp16.iteration_s(1, 1000, 0, [], 0, 0)
    one, four = fp16.iteration_s(256, 256e3, 0, [], 0, 0), fp16.iteration_s(256, 256e3, 3, [], 0, 0)
    assert four > 2.35 * one  # slower than the 2.35 tokens a 0.65-acceptance step emits
    # all-reduce makes the TP4 70B profile pay per token
    p70 = StepTimeModel(load_profile("h100-llama3.1-70b-tp4"), "FP16")
    assert p70.dense[2048] > fp16.dense[2048]


def _synthetic_steps(path: Path, profile_id: str, t_fixed: float, scale: float) -> Path:
    """A measure_gpu_steps-style CSV whose latencies are a known (t_fixed, scale) of the profile."""
    p = load_profile(profile_id)
    model = StepTimeModel(p, "FP16")
    rows = ["phase,batch,context,prompt,tokens,latency_ms,p10_ms,p90_ms,repeats"]
    for b, c in [(1, 512), (8, 1024), (64, 2048), (256, 512)]:
        gpu = (model.iteration_s(b, float(b * c), 0, [], 0, 0) - p.t_fixed_s) / p.gpu_time_scale
        rows.append(f"decode,{b},{c},0,{b},{(t_fixed + scale * gpu) * 1e3},0,0,5")
    for b, n in [(1, 256), (1, 2048), (4, 512)]:
        gpu = (model.iteration_s(0, 0.0, 0, [(n, 0)] * b, b * n, b) - p.t_fixed_s) / p.gpu_time_scale
        rows.append(f"prefill,{b},0,{n},{b * n},{(t_fixed + scale * gpu) * 1e3},0,0,5")
    rows.append("prefill_eager,1,0,256,256,99.0,0,0,5")  # host-bound rows are not GPU measurements
    path.write_text("\n".join(rows) + "\n")
    return path


def test_steps_fit_recovers_a_known_scale_and_the_cli_writes_a_profile(tmp_path, monkeypatch):
    steps = _synthetic_steps(tmp_path / "steps.csv", "h100-llama3.1-8b", t_fixed=2.0e-3, scale=1.25)
    data = read_steps(steps)
    assert len(data.steps) == 7 and data.includes_allreduce
    fit = fit_steps(load_profile("h100-llama3.1-8b"), data)
    assert fit.t_fixed_s == pytest.approx(2.0e-3, rel=1e-3)
    assert fit.gpu_time_scale == pytest.approx(1.25, rel=1e-3)
    assert fit.after_median_abs_error_pct < 0.1 < fit.before_median_abs_error_pct
    assert fit.mean_ratio < 1.0  # the shipped profile is faster than this synthetic GPU
    # without --out-dir the profile goes to the user folder, never into the source tree
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert calibrate.main(["steps", "--profile", "h100-llama3.1-8b", "--steps", str(steps),
                           "--out", "h100-steps"]) == 0
    user = tmp_path / "xdg" / "llmserve_env" / "profiles"
    assert not (PROFILE_DIR / "h100-steps.json").exists()
    prof = json.loads((user / "h100-steps.json").read_text())
    assert prof["engine"]["gpu_time_scale"] == pytest.approx(1.25, rel=1e-3)
    assert "steps_fit" in prof["provenance"]
    assert (user / "h100-steps.steps_fit.md").read_text().startswith("# Measured-iteration fit")


def test_shipped_gpu_measurements_check_the_profiles():
    """The H100 iterations this project measured stay within 25 % of the shipped profiles (median),
    and the shard measurement is compared without all-reduces."""
    for pid, name, allreduce in (("h100-llama3.1-8b", "h100_llama3.1-8b_torch_steps.csv", True),
                                 ("h100-llama3.1-70b-tp4", "h100_llama3.1-70b-tp4-shard_torch_steps.csv", False)):
        data = read_steps(DATA_DIR / name)
        assert data.includes_allreduce is allreduce
        assert data.meta["device"].startswith("NVIDIA H100")
        fit = fit_steps(load_profile(pid), data)
        assert fit.n >= 50
        assert fit.before_median_abs_error_pct < 25
        assert fit.after_median_abs_error_pct < 5


def test_malformed_steps_name_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("phase,batch,context,prompt,latency_ms\ndecode,1,512,0,8.4\ndecode,x,512,0,8.4\n")
    with pytest.raises(ValueError, match=r"bad.csv:3"):
        read_steps(bad)
    nohead = tmp_path / "nohead.csv"
    nohead.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"nohead.csv:1: header lacks phase"):
        read_steps(nohead)


def test_gpu_extras_check_the_step_forms():
    """Iterations measured on an H100 that no fit saw (scripts/measure_gpu_steps.py --extras), predicted
    by the profile re-fitted to the same GPU's plain decode/prefill rows: the forms the engine relies on
    (decode per tier, the draft step, a prefill after a prefix-cache hit, a mixed chunked iteration, the
    verify pass) follow the measurement; FP8 weights are faster than bf16 at every batch, in the GPU and
    the model."""
    base = DATA_DIR / "h100_llama3.1-8b_torch_steps.csv"
    prof = refitted(load_profile("h100-llama3.1-8b"), base)
    masked = check_extras(prof, read_extra_steps(DATA_DIR / "h100_llama3.1-8b_torch_steps_extra.csv")).groups()
    flash = check_extras(prof, read_extra_steps(DATA_DIR / "h100_llama3.1-8b_torch_steps_extra_lower_right.csv")).groups()
    assert masked[("decode", "FP16")][1] < 5 and flash[("decode", "FP16")][1] < 5
    assert masked[("decode", "INT8")][1] < 10
    assert masked[("draft", "FP16")][1] < 10
    assert masked[("mixed", "FP16")][1] < 15
    assert flash[("cached_prefill", "FP16")][1] < 15
    # speculation's verify pass, priced as decode attention plus (depth + 1) rows through the GEMMs, holds
    # on a kernel that splits the KV cache for short queries (FlexAttention), depth 0-8
    flex = check_extras(prof, read_extra_steps(DATA_DIR / "h100_llama3.1-8b_torch_steps_extra_flex.csv")).groups()
    assert flex[("verify", "FP16")][0] == 20 and flex[("verify", "FP16")][1] < 10
    rows = read_extra_steps(DATA_DIR / "h100_llama3.1-8b_torch_steps_extra.csv")
    linear = {(s.tier, s.batch): s.latency_s for s in rows if s.phase == "linear"}
    models = tier_models(prof)
    for m in (1, 8, 32, 128, 512, 2048):
        assert linear[("INT8", m)] < linear[("FP16", m)]
        fp16 = predict_extra(models, ExtraStep("linear", "FP16", 0, m, 0, 0, 1.0))
        assert predict_extra(models, ExtraStep("linear", "INT8", 0, m, 0, 0, 1.0)) < fp16
    # INT4 at batch 1 (the memory-bound case tinygemm is built for): within 20 %
    b1 = next(s for s in rows if (s.phase, s.tier, s.batch) == ("decode", "INT4", 1))
    assert abs(predict_extra(models, b1) / b1.latency_s - 1) < 0.2


def test_gpu_extras_on_the_70b_shard():
    """The same forms on one tensor-parallel shard of the 70B profile (no all-reduce in the measurement,
    so none in the prediction): decode per tier, the mixed iteration, prefill after a cache hit through
    flash kernels, and the verify pass up to depth 4 through FlexAttention follow the shard's iterations.
    The shard's draft rows (the whole draft model on one GPU) are not compared with the profile's
    sharded draft."""
    base = DATA_DIR / "h100_llama3.1-70b-tp4-shard_torch_steps.csv"
    prof = refitted(load_profile("h100-llama3.1-70b-tp4"), base)
    mask = DATA_DIR / "h100_llama3.1-70b-tp4-shard_torch_steps_extra.csv"
    assert not extras_allreduce(mask) and extras_allreduce(DATA_DIR / "h100_llama3.1-8b_torch_steps_extra.csv")
    masked = check_extras(prof, read_extra_steps(mask), extras_allreduce(mask)).groups()
    assert ("draft", "FP16") not in masked
    assert masked[("decode", "FP16")][1] < 5 and masked[("decode", "INT8")][1] < 10
    assert masked[("mixed", "FP16")][1] < 15
    flash = DATA_DIR / "h100_llama3.1-70b-tp4-shard_torch_steps_extra_lower_right.csv"
    assert check_extras(prof, read_extra_steps(flash), False).groups()[("cached_prefill", "FP16")][1] < 15
    flex = [s for s in read_extra_steps(DATA_DIR / "h100_llama3.1-70b-tp4-shard_torch_steps_extra_flex.csv")
            if s.depth <= 4]
    assert len(flex) == 16 and check_extras(prof, flex, False).groups()[("verify", "FP16")][1] < 10
    # priced with the all-reduces the shard did not run, every decode row would be slower than measured
    with_ar = check_extras(prof, read_extra_steps(mask), True).groups()
    assert with_ar[("decode", "FP16")][2] > masked[("decode", "FP16")][2]


def test_malformed_extra_steps_name_the_line(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("phase,tier,depth,batch,context,prompt,latency_ms\nverify,FP16,1,8,1024,0,9.5\n"
                   "verify,FP32,1,8,1024,0,9.5\n")
    with pytest.raises(ValueError, match=r"x.csv:3: phase must be one of"):
        read_extra_steps(bad)
