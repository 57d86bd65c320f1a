"""The sim-to-real loop: fit another engine from its records, refuse a worse fit, load profiles from a
path, replay a recording, and real mode's caps in the simulator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import STEADY_ACTION
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gateway.backend import GatewayBackend
from llmserve_env.gateway.config import GatewayConfig, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import TaskSpec, TenantSpec
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.calibration.record_fit import (
    fit_records,
    load_runs,
    solve_fixed_and_scale,
    with_coefficients,
)
from llmserve_env.sim.calibration.replay import replay
from llmserve_env.sim.caps import CappedBackend, CapsError, RequestCaps
from llmserve_env.sim.measured_step import StepCoefficients
from llmserve_env.sim.profiles import InvalidProfileError, UnknownProfileError, load_profile
from llmserve_env.sim.standin.app import DEFAULT_PROFILE, StandinConfig
from llmserve_env.tools import calibrate
from llmserve_env.tools.standin_harness import BackgroundStandin

BASE = "h100-llama3.1-8b"
ACTION = ServeAction(batch_cap=8, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
                     prefill_decode_split=False, priority_routing=False)
ACTION_JSON = ACTION.model_dump_json(exclude={"metadata"})
# A CPU engine, roughly llama.cpp with a 135M model on one thread: a prompt token costs half a decode step.
CPU = StepCoefficients(step_s=0.012, seq_s=0.004, token_s=0.006, ctx_s=2e-6)


@pytest.fixture(autouse=True)
def user_folder(tmp_path, monkeypatch):
    """Profiles written 'to the user folder' land in the test's folder, never in ~ or the source tree."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("LLMSERVE_PROFILE_PATH", raising=False)


def engine_records(coef: StepCoefficients, path: Path, seed: int, windows_n: int = 30, rate: float = 0.6) -> Path:
    """What real mode would record from an engine whose iterations take `coef` (the simulator plays it)."""
    task = TaskSpec("rec", "x", "x", (TenantSpec("chat", 1, 1.0, 1000.0, 100.0, (150, 0.5), (48, 0.5)),),
                    workload={"kind": "poisson", "rate_rps": rate}, horizon=windows_n)
    backend = SimBackend(with_coefficients(load_profile(BASE), coef, "truth"))
    backend.reset(seed)
    rows = []
    for k, w in enumerate(windows(generate_arrivals(task, seed), task)):
        report = backend.run_window(ACTION, w, float(k), 1.0)
        done = report.finished
        if k == windows_n - 1:  # the episode ends: what is still in flight is cancelled, as real mode records it
            done += [dataclasses.replace(r, status="cancelled", finish_s=windows_n - 1e-6) for r in report.pending]
        for r in done:
            rows.append(json.dumps({**dataclasses.asdict(r), "episode": 1, "seed": seed, "max_tokens": r.target_output_tokens,
                                    # the server's count, 20 % above the project tokenizer's (as llama.cpp)
                                    "usage_prompt_tokens": r.prompt_tokens,
                                    "prompt_tokens": int(r.prompt_tokens / 1.2)}))
    with path.open("a") as f:
        f.write("\n".join(rows) + "\n")
    return path


def test_fit_recovers_another_engine_from_its_records(tmp_path):
    recs = engine_records(CPU, tmp_path / "cpu.jsonl", seed=3)
    runs = load_runs(recs, [ACTION], windows=30)
    fit = fit_records(load_profile(BASE), runs)
    assert fit.coefficients.step_s == pytest.approx(CPU.step_s, rel=0.1)
    assert fit.coefficients.token_s == pytest.approx(CPU.token_s, rel=0.1)
    before, after = fit.before_summary, fit.after_summary
    assert before["ttft_err_pct"] > 50 and before["tpot_err_pct"] > 50  # the H100 profile is nothing like it
    assert after["ttft_err_pct"] < 5 and after["tpot_err_pct"] < 5
    assert fit.improved
    # and it predicts a run it was not fitted on
    held = load_runs(engine_records(CPU, tmp_path / "held.jsonl", seed=4), [ACTION], windows=30)[0]
    cmp = replay(held, with_coefficients(load_profile(BASE), fit.coefficients))
    assert cmp.ttft_err_pct < 10 and cmp.tpot_err_pct < 10 and cmp.throughput_err_pct < 5


def test_a_fit_that_does_not_beat_its_start_is_refused(tmp_path, capsys):
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(with_coefficients(load_profile(BASE), CPU, "truth").raw))
    recs = engine_records(CPU, tmp_path / "cpu.jsonl", seed=3, windows_n=12)
    out = tmp_path / "fitted.json"
    rc = calibrate.main(["records", "--profile", str(truth), "--records", str(recs), "--action", ACTION_JSON,
                         "--windows", "12", "--out", str(out)])
    assert rc == 1
    assert "does not beat truth" in capsys.readouterr().err
    assert not out.exists()


def test_records_cli_writes_to_the_user_folder_and_the_profile_loads_by_id(tmp_path, capsys):
    recs = engine_records(CPU, tmp_path / "cpu.jsonl", seed=3, windows_n=12)
    assert calibrate.main(["records", "--profile", BASE, "--records", str(recs), "--action", ACTION_JSON,
                           "--windows", "12", "--out", "cpu-fit"]) == 0
    path = tmp_path / "xdg" / "llmserve_env" / "profiles" / "cpu-fit.json"
    prof = load_profile("cpu-fit")
    assert prof.raw["engine"]["measured_step"]["token_s"] == pytest.approx(CPU.token_s, rel=0.15)
    assert "records_fit" in prof.raw["provenance"]
    assert path.with_name("cpu-fit.records_fit.md").read_text().startswith("# Records fit")
    assert str(path) in capsys.readouterr().out


def test_bad_records_and_arguments_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": 0, "arrival_s": 0, "status": "ok", "prompt_tokens": 5, "target_output_tokens": 3,'
                   ' "dispatch_s": 0, "first_token_s": 1, "finish_s": 2, "output_tokens": 3}\nnot json\n')
    assert calibrate.main(["replay", "--profile", BASE, "--records", str(bad), "--action", ACTION_JSON]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"request_id": 0, "arrival_s": 0, "status": "ok", "prompt_tokens": 5, '
                       '"target_output_tokens": 3, "dispatch_s": 0}\n')
    assert calibrate.main(["replay", "--profile", BASE, "--records", str(missing), "--action", ACTION_JSON]) == 2
    assert "missing.jsonl:1: missing first_token_s" in capsys.readouterr().err
    assert calibrate.main(["replay", "--profile", "no-such-profile", "--records", str(bad),
                           "--action", ACTION_JSON]) == 2
    assert "--profile" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        calibrate.main(["replay", "--profile", BASE, "--records", str(bad), "--action", '{"batch_cap": 0}'])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        calibrate.main(["replay", "--profile", BASE, "--records", str(bad), "--action", ACTION_JSON,
                        "--max-prompt-tokens", "0"])
    assert e.value.code == 2
    assert "max_prompt_tokens" in capsys.readouterr().err


def test_profiles_load_from_a_path_and_the_profile_path(tmp_path, monkeypatch):
    prof = with_coefficients(load_profile(BASE), CPU, "cpu-engine")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "cpu-engine.json").write_text(json.dumps(prof.raw))
    assert load_profile(str(folder / "cpu-engine.json")).id == "cpu-engine"
    with pytest.raises(UnknownProfileError):
        load_profile("cpu-engine")
    monkeypatch.setenv("LLMSERVE_PROFILE_PATH", str(folder))
    assert load_profile("cpu-engine").raw["engine"]["measured_step"] == CPU.to_dict()
    with pytest.raises(UnknownProfileError):
        load_profile(str(tmp_path / "nowhere.json"))
    (folder / "broken.json").write_text('{"id": "broken"}')
    with pytest.raises(InvalidProfileError, match="broken.json"):
        load_profile("broken")
    # a built-in id cannot be shadowed by a file of the same name further down the path
    (folder / f"{BASE}.json").write_text(json.dumps(prof.raw))
    assert load_profile(BASE).id == BASE


def test_a_measured_profile_times_the_simulator(tmp_path):
    """The fitted coefficients are what the engine runs on: one request alone, prompt P, output N."""
    prof = with_coefficients(load_profile(BASE), StepCoefficients(0.01, 0.002, 0.005, 0.0), "cpu")
    b = SimBackend(prof)
    b.reset(0)
    rep = b.run_window(ACTION, [Arrival(0, 0.0, 100, 11)], 0.0, 5.0)
    [rec] = rep.finished
    assert rec.first_token_s == pytest.approx(0.01 + 0.005 * 100)
    assert (rec.finish_s - rec.first_token_s) / 10 == pytest.approx(0.01 + 0.002 + 0.005)


def test_caps_reject_over_the_step_cap_and_cut_prompts_and_completions():
    caps = RequestCaps(max_requests_per_step=2, max_prompt_tokens=50, max_completion_tokens=4)
    b = CappedBackend(SimBackend(BASE), caps)
    b.reset(0)
    arrivals = [Arrival(i, 0.01 * i, 500, 100) for i in range(4)]
    rep = b.run_window(ACTION, arrivals, 0.0, 1.0)
    by_id = {r.request_id: r for r in rep.finished}
    assert [by_id[i].status for i in range(4)] == ["ok", "ok", "rejected", "rejected"]
    assert by_id[0].prompt_tokens == 50 and by_id[0].output_tokens == 4
    assert by_id[3].finish_s == pytest.approx(0.03) and rep.notes["rejected"] == 2
    with pytest.raises(CapsError, match="max_completion_tokens"):
        RequestCaps(max_completion_tokens=0)
    with pytest.raises(CapsError, match="unknown cap 'max_tokens'"):
        RequestCaps.from_dict({"max_tokens": 5})


def test_solve_fixed_and_scale_refits_the_other_term_when_one_is_clamped():
    gpu = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.array([1.0, 2.2, 3.3, 4.5])  # steeper than proportional: unconstrained t_fixed < 0
    t_fixed, scale = solve_fixed_and_scale(np.ones(4), gpu, y)
    assert t_fixed == 0.0
    rel = gpu / y
    assert scale == pytest.approx(rel.sum() / (rel @ rel))  # the best scale alone, not the one fitted with t<0
    t_fixed, scale = solve_fixed_and_scale(np.ones(4), gpu, np.array([2.0, 1.9, 1.8, 1.7]))
    assert scale == 1e-6 and t_fixed > 0


def test_replay_of_a_recording_made_through_the_gateway(tmp_path, capsys):
    record = tmp_path / "real.jsonl"
    tiers = TierTable({t: TierPrice(DEFAULT_PROFILE, 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "test")
    with BackgroundStandin(StandinConfig(fixed_ttft_s=0.05, fixed_itl_s=0.01)) as s:
        config = GatewayConfig(api_key=Secret("EMPTY"), base_url=s.base_url, record_path=str(record),
                               max_requests_per_step=3, max_completion_tokens=8)
        b = GatewayBackend(config, tiers=tiers, lag_monitor=False)
        b.reset(7)
        arrivals = [Arrival(i, 0.05 * i, 40, 20) for i in range(5)]
        try:
            for k in range(4):
                b.run_window(ACTION, [a for a in arrivals if 0.25 * k <= a.arrival_s < 0.25 * (k + 1)], 0.25 * k, 0.25)
        finally:
            b.close()
    actions = tmp_path / "actions.jsonl"
    actions.write_text("\n".join([ACTION_JSON] * 4) + "\n")
    assert calibrate.main(["replay", "--profile", BASE, "--records", str(record), "--actions", str(actions),
                           "--window-s", "0.25", "--max-requests-per-step", "3",
                           "--max-completion-tokens", "8"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert set(summary) == {"ttft_err_pct", "tpot_err_pct", "throughput_err_pct"}
    assert all(np.isfinite(v) for v in summary.values())
    assert any(line.split()[:1] == ["3"] for line in out)  # one row per window
    # the fifth arrival was over the per-step cap in real mode, and is rejected in the replay too
    [run] = load_runs(record, [ACTION], window_s=0.25, windows=4, caps=RequestCaps(3, None, 8))
    assert sum(r["status"] == "rejected" for r in run.rows) == 2
    cmp = replay(run, load_profile(BASE))
    assert cmp.n_ttft == 3 and cmp.unmatched == 0


def _fitted_profile_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "fitted"
    folder.mkdir()
    (folder / "cpu-engine.json").write_text(json.dumps(with_coefficients(load_profile(BASE), CPU, "cpu-engine").raw))
    return folder


def test_a_task_plays_in_process_on_a_fitted_profile_under_real_caps(tmp_path):
    path = _fitted_profile_folder(tmp_path) / "cpu-engine.json"
    env = InProcessEnv()
    obs = env.reset("static_workload", 0, profile=str(path), caps=RequestCaps(max_requests_per_step=5))
    assert obs.metadata["profile"] == "cpu-engine"
    obs = env.step(ACTION)
    notes = obs.metadata["backend_notes"]
    assert notes["profile"] == "cpu-engine" and notes["caps"]["max_requests_per_step"] == 5
    assert notes["rejected"] > 0  # static_workload sends ~50 a window; 5 are served
    assert env.episode.episode_log().profile == "cpu-engine"
    env.close()
    with pytest.raises(UnknownProfileError):
        env.reset("static_workload", 0, profile="no-such-profile")


def test_reset_over_http_chooses_a_fitted_profile_and_caps(client, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSERVE_PROFILE_PATH", str(_fitted_profile_folder(tmp_path)))
    r = client.post("/reset", json={"task_id": "static_workload", "profile": "cpu-engine",
                                    "caps": {"max_requests_per_step": 5, "max_completion_tokens": 16}})
    assert r.status_code == 200, r.text
    obs = r.json()["observation"]
    assert obs["metadata"]["profile"] == "cpu-engine"
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": obs["episode_id"]})
    assert r.status_code == 200 and r.json()["observation"]["metadata"]["backend_notes"]["profile"] == "cpu-engine"
    r = client.post("/reset", json={"task_id": "static_workload", "profile": "no-such-profile"})
    assert r.status_code == 404 and "unknown profile 'no-such-profile'" in r.text
    # a client names ids, never files; caps are strict
    for body, loc in (({"profile": str(tmp_path / "fitted" / "cpu-engine.json")}, ["body", "profile"]),
                      ({"caps": {"max_tokens": 5}}, ["body", "caps", "max_tokens"]),
                      ({"caps": {"max_prompt_tokens": 0}}, ["body", "caps", "max_prompt_tokens"])):
        r = client.post("/reset", json={"task_id": "static_workload", **body})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, (body, r.text)


def test_the_stand_in_serves_a_fitted_profile_at_its_speed(tmp_path):
    """A fitted (measured) profile given to the loopback stand-in is timed by its own coefficients,
    not by the kernel model of the profile it started from (that would answer in milliseconds)."""
    path = _fitted_profile_folder(tmp_path) / "cpu-engine.json"
    tiers = TierTable({t: TierPrice("cpu-engine", 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "test")
    with BackgroundStandin(StandinConfig(profile=str(path))) as s:
        b = GatewayBackend(GatewayConfig(api_key=Secret("EMPTY"), base_url=s.base_url), tiers=tiers,
                           lag_monitor=False)
        b.reset(0)
        try:
            reports = [b.run_window(ACTION, [Arrival(0, 0.0, 40, 3)] if k == 0 else [], 0.5 * k, 0.5)
                       for k in range(3)]
        finally:
            b.close()
    [rec] = [r for rep in reports for r in rep.finished]
    # a 40-token prompt costs >= 12 ms + 40 x 6 ms = 252 ms on this engine; the server waits it (a busy
    # machine can only add to it)
    assert rec.status == "ok" and rec.first_token_s - rec.dispatch_s >= 0.25


def test_pooled_errors_are_medians_over_every_request_not_a_mean_of_run_medians():
    from llmserve_env.sim.calibration.replay import Comparison, pooled
    a = Comparison(3, 3, 2.0, 2.0, 10.0, 0, [], (1.0, 2.0, 3.0), (1.0, 2.0, 3.0), 100.0, 110.0)
    b = Comparison(1, 1, 50.0, 50.0, 0.0, 1, [], (50.0,), (50.0,), 300.0, 300.0)
    p = pooled([a, b])
    assert (p.n_ttft, p.ttft_err_pct, p.tpot_err_pct, p.unmatched) == (4, 2.5, 2.5, 1)  # a mean of medians: 26
    assert p.throughput_err_pct == pytest.approx(10.0 / 400.0 * 100.0)


def test_errors_by_concurrency_find_where_a_profile_is_wrong(tmp_path):
    """Replayed on the engine that made them, records agree at every concurrency; on a profile whose decode
    steps grow too slowly with the batch, the TPOT bias is negative and grows with concurrency."""
    from llmserve_env.sim.calibration.replay import by_concurrency
    runs = load_runs(engine_records(CPU, tmp_path / "c.jsonl", seed=5, rate=0.3, windows_n=60), [ACTION], windows=60)
    truth = by_concurrency(runs, with_coefficients(load_profile(BASE), CPU))
    assert [r.lo for r in truth] == [1.0, 1.5, 2.5, 4.0]  # this seed's requests fill every bucket
    assert sum(r.n for r in truth) == sum(1 for row in runs[0].rows if row["status"] == "ok")
    assert all(r.ttft_err_pct < 1 and r.tpot_err_pct < 1 for r in truth)
    flat = by_concurrency(runs, with_coefficients(load_profile(BASE), dataclasses.replace(CPU, seq_s=0.0)))
    bias = [r.tpot_bias_pct for r in flat]
    assert all(b < -10 for b in bias) and bias[-1] < bias[0] - 10


def test_the_replayed_prefill_is_what_the_engine_computed_less_its_prompt_cache():
    """llama-server serves the opening of a prompt from the slot's last one (25-40 of ~100 tokens in the
    bench's episodes, `cached_tokens`): the replay prefills the rest, the engine's own count less its hit."""
    from llmserve_env.sim.calibration.replay import engine_prompt

    assert engine_prompt({"prompt_tokens": 64, "usage_prompt_tokens": 100, "cached_tokens": 40}) == 60
    assert engine_prompt({"prompt_tokens": 64, "usage_prompt_tokens": 100, "cached_tokens": None}) == 100
    assert engine_prompt({"prompt_tokens": 64, "usage_prompt_tokens": 100, "cached_tokens": 100}) == 1  # never 0
    assert engine_prompt({"prompt_tokens": 64, "usage_prompt_tokens": None}, ratio=1.5) == 96


def test_requests_alone_on_the_engine_show_its_single_sequence_step_and_a_slower_profile_too_slow(tmp_path):
    """The engine's requests that nothing overlapped time its one-slot step directly: replayed on the
    engine that made them they agree; on a profile 10 % slower per step they are slower (by more than
    10 %: in the slower replay they can queue behind others)."""
    from llmserve_env.sim.calibration.replay import alone_by_run
    runs = load_runs(engine_records(CPU, tmp_path / "c.jsonl", seed=5, rate=0.3, windows_n=60), [ACTION], windows=60)
    [truth] = alone_by_run(runs, with_coefficients(load_profile(BASE), CPU))
    assert truth.seed == runs[0].seed and truth.n >= 3
    assert truth.sim_tpot_ms == pytest.approx(truth.real_tpot_ms, rel=0.01)
    slow = dataclasses.replace(CPU, step_s=CPU.step_s * 1.1, seq_s=CPU.seq_s * 1.1, token_s=CPU.token_s * 1.1,
                               ctx_s=CPU.ctx_s * 1.1)
    [off] = alone_by_run(runs, with_coefficients(load_profile(BASE), slow))
    assert off.n == truth.n and off.real_tpot_ms == truth.real_tpot_ms and off.sim_tpot_ms > 1.09 * off.real_tpot_ms


def test_replay_prefills_the_engine_s_prompt_counts_under_a_prompt_cap(tmp_path):
    """Real mode's prompt cap cut each prompt in the gateway's tokenizer before the engine counted it, so a
    recorded count above the cap is what the engine computed: the replay prefills it, not the cap (the
    truth's own records replay to the same TTFTs with and without a cap under them)."""
    record = engine_records(CPU, tmp_path / "r.jsonl", 3)
    truth = with_coefficients(load_profile(BASE), CPU, "truth")
    errs = []
    for caps in (RequestCaps(), RequestCaps(max_prompt_tokens=64)):
        [run] = load_runs(record, [ACTION], window_s=1.0, windows=30, caps=caps)
        assert max(r["usage_prompt_tokens"] for r in run.rows) > 64
        errs.append(replay(run, truth).summary()["ttft_err_pct"])
    assert errs[0] == errs[1] and errs[0] < 1.0


def test_the_engine_against_itself_is_nothing_when_nothing_changed_and_finds_a_slower_second_run(tmp_path, capsys):
    """Two recordings of one seed on one engine (the simulator plays a deterministic one) are apart by
    nothing; a second recording on an engine 10 % slower a step is 10 % slower on TPOT at every concurrency,
    and its TTFT slower too. bench/engine_repeat.py prints the same, and names a seed the folders lack."""
    from llmserve_env.sim.calibration.replay import engine_repeat
    from test_cli import bench_main

    slow = StepCoefficients(*(v * 1.1 for v in (CPU.step_s, CPU.seq_s, CPU.token_s, CPU.ctx_s)))
    for name, coef in (("a", CPU), ("b", CPU), ("slow", slow)):
        (tmp_path / name).mkdir()
        engine_records(coef, tmp_path / name / "records_seed5.jsonl", seed=5, rate=0.3, windows_n=60)
    a, b, s = (load_runs(tmp_path / n / "records_seed5.jsonl", [ACTION], windows=60) for n in ("a", "b", "slow"))
    total, rows = engine_repeat(a, b)
    assert total.n_ttft > 10 and total.ttft_err_pct == 0 and total.tpot_err_pct == 0
    assert [r.lo for r in rows] == [1.0, 1.5, 2.5, 4.0] and all(r.ttft_err_pct == r.tpot_err_pct == 0 for r in rows)
    total, rows = engine_repeat(a, s)
    assert all(r.tpot_bias_pct > 9 for r in rows) and total.tpot_err_pct > 9
    assert all(r.sim_ttft_ms > r.real_ttft_ms for r in rows)
    other = load_runs(engine_records(CPU, tmp_path / "seed6.jsonl", seed=6, rate=0.3, windows_n=60), [ACTION], windows=60)
    with pytest.raises(ValueError, match="no seed recorded in both"):
        engine_repeat(a, other)

    main = bench_main("engine_repeat")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["engine_repeat.py", str(tmp_path / "a"), str(tmp_path / "slow")])
        main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["seeds"] == "5" and out["tpot_err_pct"] == pytest.approx(total.tpot_err_pct, abs=0.01)
    assert out["c4_inf_n"] == rows[-1].n and out["c1_1p5_tpot_err_pct"] > 9
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit):
        mp.setattr("sys.argv", ["engine_repeat.py", str(tmp_path / "a"), str(tmp_path / "slow"), "--seeds", "7"])
        main()
    assert "seed 7 is not recorded in both folders" in capsys.readouterr().err
