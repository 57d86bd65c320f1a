"""The speed probe's arithmetic and the fitted profile carried to a probed speed (sim/calibration/speed_index.py)."""

from __future__ import annotations

import dataclasses

import pytest
from llmserve_env.sim.calibration.record_fit import load_runs, with_coefficients
from llmserve_env.sim.calibration.replay import pooled, replay
from llmserve_env.sim.calibration.speed_index import (
    Probe,
    episode_indices,
    read_probes,
    scale_factors,
    scaled_profile_dict,
    write_probes,
)
from llmserve_env.sim.calibration.table_fit import with_table
from llmserve_env.sim.measured_step import StepCoefficients, measured_models
from llmserve_env.sim.profiles import load_profile, profile_from_dict
from test_step_table import ACTION, BASE, SATURATING, records


def slower(table, factor):
    """The same engine with every time `factor` x longer (its core shared or clocked down)."""
    return dataclasses.replace(table, step_s=table.step_s * factor, ctx_s=table.ctx_s * factor,
                               decode_s=tuple(x * factor for x in table.decode_s),
                               prefill_s=tuple(x * factor for x in table.prefill_s))


def test_each_episode_is_indexed_by_the_probes_around_it_and_held_out_ones_by_the_fit_mean():
    probes = [Probe(0, None, 18.0), Probe(1, 1, 20.0), Probe(2, 2, 22.0), Probe(3, 3, 24.0)]
    idx = episode_indices(probes, [1, 2, 3])
    assert idx == {1: 19.0, 2: 21.0, 3: 23.0}
    assert scale_factors(idx, [1, 2], [3]) == {3: pytest.approx(23.0 / 20.0)}
    with pytest.raises(ValueError, match="3 episodes need 0..3"):
        episode_indices(probes[:3], [1, 2, 3])


def test_probes_round_trip_through_their_file_and_a_foreign_file_is_named(tmp_path):
    probes = [Probe(0, None, 18.25), Probe(1, 7, 19.5)]
    write_probes(tmp_path / "speed_probe.csv", probes)
    assert read_probes(tmp_path / "speed_probe.csv") == probes
    (tmp_path / "other.csv").write_text("slots,context,step_s\n1,8,0.02\n")
    with pytest.raises(ValueError, match="boundary, after_seed, step_ms"):
        read_probes(tmp_path / "other.csv")


@pytest.mark.parametrize("kind", ["table", "affine"])
def test_a_scaled_profile_times_every_iteration_that_many_times_longer(kind):
    base = load_profile(BASE)
    prof = (with_table(base, SATURATING, "t") if kind == "table"
            else with_coefficients(base, StepCoefficients(0.002, 0.01, 0.003, 2e-6), "a"))
    scaled = profile_from_dict(scaled_profile_dict(prof.raw, 1.3))
    assert scaled.id.endswith("@x1.3000") and prof.raw["engine"] != scaled.raw["engine"]  # the original untouched
    m, s = measured_models(prof)[("FP16", "unified")], measured_models(scaled)[("FP16", "unified")]
    for args in [(1, 100.0, 0, [], 0, 0), (6, 900.0, 0, [], 0, 0), (2, 300.0, 0, [(120, 0)], 120, 1)]:
        assert s.iteration_s(*args) == pytest.approx(1.3 * m.iteration_s(*args), rel=1e-12)
    with pytest.raises(ValueError, match="speed factor must be > 0"):
        scaled_profile_dict(prof.raw, 0.0)
    with pytest.raises(ValueError, match="no measured step model to scale"):
        scaled_profile_dict(base.raw, 1.3)  # a kernel-based profile: nothing a records fit wrote


def test_a_slower_engine_s_episode_is_replayed_right_at_the_probed_speed(tmp_path):
    """The fitted table is exact for the engine at its fit speed; an episode played 25 % slower misses on
    TPOT at the fit speed and matches once carried to it (the probe's reading of what moved)."""
    prof = with_table(load_profile(BASE), SATURATING, "fit")
    run = load_runs(records(slower(SATURATING, 1.25), tmp_path / "slow.jsonl", 5, n=20), [ACTION], windows=20)[0]
    at_fit = pooled([replay(run, prof)]).summary()
    at_speed = pooled([replay(run, profile_from_dict(scaled_profile_dict(prof.raw, 1.25)))]).summary()
    assert at_fit["tpot_err_pct"] > 15
    assert at_speed["tpot_err_pct"] < 1 and at_speed["ttft_err_pct"] < 1
