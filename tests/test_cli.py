"""The command line as a newcomer meets it: bad arguments are refused at parse time (exit 2, one
line naming the option and what it allows, nothing written), `--help` shows defaults and starts
nothing, train.py keeps away from the shipped weights, and the set-up files keep their promises
(one -q, a CPU-only torch pin, no setuptools warnings at build)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from llmserve_env.__main__ import bench_names
from llmserve_env.__main__ import main as llmserve_main
from llmserve_env.agents.ppo_policy import WEIGHTS_DIR
from llmserve_env.tools import cli
from llmserve_env.tools.train_config import HELP, Args, build_parser, parse_args

ROOT = Path(__file__).resolve().parents[1]


def refused(main, argv: list[str], capsys) -> str:
    """Run a CLI's main expecting argparse's refusal; its one error line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return err[-1]


# -- train.py ---------------------------------------------------------------------------------------
def test_train_writes_into_its_run_folder_by_default():
    args = parse_args(["--task", "bursty_workload", "--seed", "3"])
    assert args.weights_dir == args.run_dir / "bursty_workload__s3" == args.run_path
    assert args.weights_dir.resolve() != WEIGHTS_DIR.resolve()


def test_train_replaces_the_shipped_weights_only_when_told(capsys):
    assert parse_args(["--replace-shipped-weights"]).weights_dir == WEIGHTS_DIR
    line = refused(parse_args, ["--out-dir", str(WEIGHTS_DIR)], capsys)
    assert "argument --out-dir" in line and "--replace-shipped-weights" in line


@pytest.mark.parametrize(("argv", "named", "allowed"), [
    (["--task", "nope"], "--task", "static_workload"),
    (["--total-steps", "-5"], "--total-steps", ">= 1"),
    (["--total-steps", "100"], "--total-steps", "1024"),  # below one rollout: used to train 1,024 steps silently
    (["--advice", "ture"], "--advice", "true or false"),  # used to read as False
    (["--init", "follow"], "--init", "--advice true"),
    (["--init", "nope"], "--init", "heuristic"),
    (["--num-workers", "0"], "--num-workers", ">= 1"),
    (["--num-workers", "17"], "--num-workers", "num_envs"),
    (["--gamma", "1.5"], "--gamma", "0..1"),
    (["--learning-rate", "0"], "--learning-rate", "> 0"),
    (["--num-minibatches", "3"], "--num-minibatches", "divide"),
])
def test_train_refuses_bad_arguments_before_any_work(argv, named, allowed, tmp_path, capsys):
    line = refused(parse_args, [*argv, "--run-dir", str(tmp_path / "runs")], capsys)
    assert line.startswith(f"python tools/train.py: error: argument {named}"), line
    assert allowed in line, line
    assert not (tmp_path / "runs").exists(), "nothing may be written for refused arguments"


def test_train_help_names_every_setting_with_its_default():
    text = build_parser().format_help()
    for name in HELP:
        if name != "quiet":
            assert "--" + name.replace("_", "-") in text, name
    assert "(default: 120000)" in text and "(default: adversarial_multitenant)" in text
    assert set(HELP) >= {f for f in Args.__dataclass_fields__ if f != "command"}


def test_python_m_llmserve_env_train_refuses_without_torch_or_workers(tmp_path, capsys):
    assert refused(llmserve_main, ["train", "--task", "nope"], capsys).startswith(
        "python -m llmserve_env train: error: argument --task")


# -- evaluate.py and the bench scripts ------------------------------------------------------------
@pytest.mark.parametrize(("argv", "named"), [
    (["--output", "/no/such/dir/x.json"], "--output"),  # used to crash after the whole evaluation
    (["--episodes", "0"], "--episodes"),  # used to raise ValueError: no samples
    (["--episodes", "-3"], "--episodes"),  # used to raise StatisticsError
    (["--agent", "nope"], "--agent"),
    (["--task", "static_workload,nope"], "--task"),
    (["--agent", "planner", "--task", "static_workload", "--planner-off-family", "operator"], "--planner-off-family"),
    (["--agent", "planner", "--task", "diurnal_family", "--planner-off-family", "heuristic"], "--planner-off-family"),
    (["--agent", "operator", "--task", "diurnal_family", "--planner-off-family", "operator"], "--planner-off-family"),
    (["--agent", "operator", "--task", "diurnal_family", "--planner-bases", "operator,ppo"], "--planner-bases"),
    (["--agent", "planner", "--task", "diurnal_family", "--planner-bases", "operator,llm"], "--planner-bases"),
    (["--agent", "planner", "--task", "diurnal_family", "--planner-bases", "planner"], "--planner-bases"),
    # a base that cannot play a task is refused before any episode, not at the planner's first reset
    (["--agent", "planner", "--task", "multitenant_family_shifted", "--planner-bases", "schedule,ppo"],
     "--planner-bases"),
    (["--agent", "planner", "--task", "mooncake_cluster", "--planner-bases", "hpa,tuned_static"], "--planner-bases"),
    (["--agent", "planner", "--task", "diurnal_family", "--planner-bases", "schedule",
      "--planner-off-family", "operator"], "--planner-off-family"),
])
def test_evaluate_refuses_bad_arguments(argv, named, capsys):
    from llmserve_env.tools.evaluate import main

    line = refused(main, argv, capsys)
    assert line.startswith(f"python tools/evaluate.py: error: argument {named}"), line


def test_evaluate_one_episode_prints_no_infinite_interval(tmp_path, capsys):
    import json

    from llmserve_env.tools.evaluate import main

    out = tmp_path / "scores.json"
    assert main(["--agent", "heuristic", "--task", "static_workload", "--episodes", "1", "--output", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "inf" not in printed and "n=1, no CI" in printed
    assert json.loads(out.read_text())["scores"]["heuristic"]["static_workload"]["ci95"] is None


def bench_module(script: str):
    """A bench script's module, loaded from its file as `python bench/NAME.py` would run it."""
    bench_dir = str(ROOT / "bench")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)  # for bench/local_server.py
    spec = importlib.util.spec_from_file_location(f"bench_{script}", ROOT / "bench" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def bench_main(script: str):
    """A bench script's main (`bench_module`)."""
    return bench_module(script).main


@pytest.mark.parametrize(("script", "argv", "named"), [
    ("sim_speed", ["--episodes", "0"], "--episodes"),  # used to raise ZeroDivisionError
    ("sim_speed", ["--repeats", "x"], "--repeats"),
    ("sim_speed", ["--planner-tasks", "static_workload"], "--planner-tasks"),  # a single-server task
    ("planner_floor", ["--tasks", "static_workload"], "--tasks"),  # the planner's floor: cluster tasks only
    ("planner_floor", ["--decisions", "0"], "--decisions"),
    ("score_table", ["--agents", "nope"], "--agents"),
    ("score_table", ["--tasks", "nope"], "--tasks"),
    ("load", ["--clients", "1,x"], "--clients"),
    ("load", ["--url", "localhost:7860"], "--url"),
    ("http_step", ["--task", "nope"], "--task"),
    ("adaptation_headroom", ["--task", "static_workload"], "--task"),
    ("fork", ["--tasks", "nope"], "--tasks"),
    ("gateway_accuracy", ["--levels", "0"], "--levels"),
    ("sim_fidelity", ["--trace-seconds", "0"], "--trace-seconds"),
    ("forecast_error", ["--tasks", "diurnal_autoscale"], "--tasks"),  # a fixed day has no posterior
    ("forecast_error", ["--wide", "0,2"], "--wide"),
    ("forecast_error", ["--split", "validation"], "--split"),
    ("compiled_loop", ["--requests", "0"], "--requests"),
    ("planner_value_bias", ["--task", "diurnal_autoscale"], "--task"),  # a fixed day has no posterior
    ("planner_value_bias", ["--follow", "hpa"], "--follow"),  # not among the default bases
    ("planner_value_bias", ["--surprises", "-1"], "--surprises"),
    ("headroom_sources", ["--task", "diurnal_autoscale"], "--task"),  # a fixed day: no drawn day to know
    ("headroom_sources", ["--seeds", "5:5"], "--seeds"),
    ("headroom_sources", ["--oracles", "weather"], "--oracles"),
    ("gate_confirm", ["--family", "diurnal_autoscale", "--inside", "operator", "--outside", "schedule"], "--family"),
    ("gate_confirm", ["--family", "diurnal_family", "--inside", "missing.npz", "--outside", "schedule"], "--inside"),
    ("gate_confirm", ["--family", "diurnal_family", "--inside", "operator", "--outside", "nope"], "--outside"),
    ("gate_confirm", ["--family", "diurnal_family", "--inside", "operator", "--outside", "schedule",
                      "--episodes", "1"], "--episodes"),
])
def test_bench_scripts_refuse_bad_arguments(script, argv, named, capsys):
    line = refused(bench_main(script), argv, capsys)
    assert line.startswith(f"python bench/{script}.py: error: argument {named}"), line


def test_compiled_loop_bench_serves_every_request_and_reports_per_event_cost(capsys):
    """bench/compiled_loop.py: the loop's Python run finishes every arrival; with numba installed, the
    compiled run must end at the same clock (its JSON says so)."""
    assert bench_main("compiled_loop")(["--requests", "300", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["events"] > 300 and out["python_ns_per_event"] > 0
    assert lines[1].split()[:3] == ["python", str(out["events"]), "300"]
    assert out.get("same_clock", True) is True


def test_planner_floor_bench_splits_a_decision_into_parts_that_sum_within_its_timed_run(capsys):
    """bench/planner_floor.py: the engines' kernels and the base policies both take time in a decision, and with the
    Python engine's (none on a compiled-engine task) they are within the timed run; the floor is the first two."""
    assert bench_main("planner_floor")(["--tasks", "multitenant_autoscale", "--decisions", "1", "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    key = "multitenant_autoscale_{}_s_per_decision".format
    assert out[key("kernels")] > 0 and out[key("policies")] > 0 and out[key("python_engine")] == 0
    parts = out[key("kernels")] + out[key("policies")] + out[key("python_engine")]
    assert parts <= out[key("timed_run")] + 1e-3
    assert out[key("floor")] == pytest.approx(out[key("kernels")] + out[key("policies")], abs=2e-4)
    assert out["multitenant_autoscale_windows_per_decision"] > 100 and out[key("cpu")] > 0


def test_gate_confirm_bench_plays_the_gate_its_halves_and_every_rival_on_the_same_seeds(capsys):
    """bench/gate_confirm.py on two shifted days: the gate hands them to the outside policy, so the gated
    scores are the outside policy's from the judge's first word on; every rival is paired."""
    out = bench_main("gate_confirm")(["--family", "diurnal_family", "--inside", "schedule", "--outside", "operator",
                                      "--splits", "shifted", "--episodes", "2", "--first-seed", "500000"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["shifted.gate_fired_episodes"] == 2
    for agent in ("gated", "inside", "outside", "operator", "schedule", "hpa", "dynamo_planner", "tuned_static"):
        assert 0.0 <= out[f"shifted.{agent}.mean"] <= 1.0
    from llmserve_env.agents.planner import RIVALS_TO_BEAT

    best = max(RIVALS_TO_BEAT, key=lambda a: out[f"shifted.{a}.mean"])
    assert out["shifted.best_rival"] == best
    # the outside policy is the operator: paired against the best rival, the difference of their means
    assert out["shifted.outside.mean"] == out["shifted.operator.mean"]
    assert out["shifted.outside_minus_best_rival"] == pytest.approx(
        out["shifted.operator.mean"] - out[f"shifted.{best}.mean"], abs=2e-4)
    assert out["shifted.gated.mean"] > out["shifted.inside.mean"]


def test_headroom_sources_oracles_know_the_surprises_only_as_asked():
    """bench/headroom_sources.py's oracles on test seed 1,000,000 (a flash crowd at windows 26-27, x1.76): before
    it begins only the `surprises` oracle's futures hold it; once it has begun both do, the same; deterministic."""
    from llmserve_env.shared.scenarios import draw_day
    from llmserve_env.shared.tasks import get_task
    from llmserve_env.shared.workloads import generate_arrivals, windows

    m = bench_module("headroom_sources")
    task, seed = get_task("multitenant_family"), 1_000_000
    (crowd,) = draw_day(task, seed).flash_crowds
    assert (crowd.start_window, crowd.windows) == (26, 2)
    wins = windows(generate_arrivals(task, seed), task)
    day, loud = m.DayOracle(task, seed, False), m.DayOracle(task, seed, True)

    def at_crowd(oracle, k: int) -> float:
        futures = oracle.futures(k, wins[:k], 4, 0)  # windows k.. each
        return sum(len(f[i - k]) for f in futures for i in range(max(k, 26), 28)) / 4

    assert at_crowd(loud, 20) > 1.4 * at_crowd(day, 20)
    assert at_crowd(loud, 27) == at_crowd(day, 27) > 0 and day.futures(20, wins[:20], 2, 0) == day.futures(20, wins[:20], 2, 0)


def test_bench_command_runs_the_script_with_its_own_arguments(capsys):
    """`python -m llmserve_env bench sim_speed --episodes 0`: the script's own refusal, exit 2."""
    assert llmserve_main(["bench", "sim_speed", "--episodes", "0"]) == 2
    assert "python bench/sim_speed.py: error: argument --episodes" in capsys.readouterr().err


def test_every_bench_script_is_reachable_from_the_entry_point():
    assert set(bench_names()) == {p.stem for p in (ROOT / "bench").glob("*.py")} - {"local_server"}


# -- the entry point and the console script --------------------------------------------------------
def test_entry_point_lists_its_commands_and_serve_help_starts_nothing(capsys):
    assert llmserve_main(["--help"]) == 0
    listed = capsys.readouterr().out
    for command in ("serve", "evaluate", "train", "calibrate", "bench"):
        assert f"  {command}" in listed
    # `serve --help` prints its options and exits at once (the old console script started a server).
    with pytest.raises(SystemExit) as exc:
        llmserve_main(["serve", "--help"])
    assert exc.value.code == 0
    shown = capsys.readouterr().out
    assert "--port" in shown and "(default: 127.0.0.1)" in shown


def test_console_script_has_a_specific_name():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "server" not in scripts, "a generic `server` collides with other OpenEnv environments' scripts"
    assert scripts["llmserve-env"] == "llmserve_env.__main__:main"


def test_unknown_command_is_refused(capsys):
    line = refused(llmserve_main, ["nope"], capsys)
    assert "argument COMMAND: invalid choice: 'nope'" in line


def test_a_refusal_is_one_line_named_as_the_command_was_typed(monkeypatch, capsys):
    """argparse printed its usage block first (6 lines above the one that says what is wrong), and
    named `llmserve-env evaluate` as `python tools/evaluate.py`."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/llmserve-env"])
    with pytest.raises(SystemExit) as exc:
        llmserve_main(["evaluate", "--episodes", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("llmserve-env evaluate: error: argument --episodes: expected an integer >= 1"), err
    assert err[0].endswith("(llmserve-env evaluate --help lists the options)"), err
    # outside the dispatcher the tool keeps its own name
    assert refused(parse_args, ["--task", "nope"], capsys).startswith("python tools/train.py: error:")


@pytest.mark.parametrize("port", ["99999", "0", "x"])
def test_serve_refuses_a_port_out_of_range_in_one_line(port, capsys):
    """`serve --port 99999` used to exit 1 with uvicorn's 72-line OverflowError."""
    line = refused(llmserve_main, ["serve", "--port", port], capsys)
    assert "serve: error: argument --port: expected" in line, line


def test_serve_with_an_unreachable_real_endpoint_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("LLMSERVE_MODE", "real")  # restored after the test (serve sets it)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # the discard port: nothing listens
    assert llmserve_main(["serve", "--mode", "real", "--port", "7999"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("python -m llmserve_env serve: cannot start: OPENAI_BASE_URL=http://127.0.0.1:9/v1 "
                              "is unreachable"), err


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_train_py_help_needs_no_torch():
    """`python tools/train.py --help` exited 1 ("needs torch") though the README says --help starts nothing."""
    shown = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), "--help"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
    assert shown.returncode == 0 and "--total-steps" in shown.stdout, shown.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), "--task", "nope"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "argument --task" in bad.stderr
    work = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py")], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert work.returncode == 1 and "make install-train" in work.stderr


def test_install_train_tries_the_local_wheel_before_any_index():
    """Offline, `make install-train` spent ~2 minutes retrying PyTorch's index before using the local
    wheel: the offline attempt (--no-index) comes first and the index only after it fails."""
    recipe = subprocess.run(["make", "-n", "-W", "pyproject.toml", "install-train", "VENV=/nonexistent"],
                            capture_output=True, text=True, cwd=ROOT, timeout=30).stdout
    offline = recipe.index("--no-index")
    assert offline < recipe.index("--extra-index-url https://download.pytorch.org/whl/cpu")
    assert "--extra-index-url" not in recipe.split("-e '.[train]'")[0].split("||")[0]
    no_index = subprocess.run(["make", "-n", "-W", "pyproject.toml", "install-train", "VENV=/nonexistent",
                               "TORCH_INDEX="], capture_output=True, text=True, cwd=ROOT, timeout=30).stdout
    assert "--extra-index-url" not in no_index


# -- argument types -----------------------------------------------------------------------------------
def test_writable_file_is_checked_before_work(tmp_path):
    assert cli.writable_file(str(tmp_path / "x.json")) == tmp_path / "x.json"
    for bad in (tmp_path, tmp_path / "missing" / "x.json"):
        with pytest.raises(Exception, match="folder"):
            cli.writable_file(str(bad))


def test_progress_bars_stay_off_the_output_when_not_on_a_terminal(capsys):
    # Under pytest stderr is not a terminal: the bar is disabled, and stdout never gets one.
    assert list(cli.progress(range(3), desc="x")) == [0, 1, 2]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


# -- set-up files ------------------------------------------------------------------------------------
def test_make_test_prints_pytest_summary_line():
    """`-q` in the Makefile plus `-q` in addopts made `-qq`, which drops the 'N passed' summary."""
    recipe = subprocess.run(["make", "-n", "test"], capture_output=True, text=True, cwd=ROOT, timeout=30).stdout
    pytest_line = next(line for line in recipe.splitlines() if "bin/pytest" in line)
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    quiet = pytest_line.split().count("-q") + addopts.split().count("-q")
    assert quiet == 1, f"{pytest_line!r} + addopts {addopts!r}"


def test_presubmit_has_a_make_target_that_installs_the_dev_extra():
    recipe = subprocess.run(["make", "-n", "-W", "pyproject.toml", "presubmit"], capture_output=True, text=True,
                            cwd=ROOT, timeout=30).stdout
    assert ".[dev]" in recipe and "scripts/pre_submission_check.py" in recipe


def test_torch_is_pinned_to_its_cpu_build_and_kept_out_of_the_core():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    for extra in ("train", "sb3"):
        torch = [d for d in project["optional-dependencies"][extra] if d.startswith("torch")]
        linux = [d for d in torch if "sys_platform == 'linux'" in d]
        assert linux == ["torch==2.13.0+cpu; sys_platform == 'linux'"], (extra, torch)
    assert "tqdm" in " ".join(project["dependencies"])


def test_license_is_an_spdx_string():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_every_folder_of_the_package_is_listed_for_setuptools():
    """setuptools warns 'Package would be ignored' for each importable folder (data folders too)
    that `packages` does not list; the install printed five such warnings."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    # not the package: development trees, run output, and candidates/ (weights measured, not shipped)
    skip = {"tests", "bench", "scripts", "docs", "runs", "artifacts", "outputs", "build", "dist", "__pycache__",
            "candidates"}
    for here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".") and not d.endswith(".egg-info")]
        rel = Path(here).relative_to(ROOT)
        if rel.parts and files:
            assert "llmserve_env." + ".".join(rel.parts) in listed, f"{rel} is not in [tool.setuptools] packages"


@pytest.mark.parametrize(("flags", "planner_options"), [
    (["--planner-off-family", "operator"], {"off_family": "operator"}),
    (["--planner-bases", "schedule,operator,ppo"], {"bases": ("schedule", "operator", "ppo")}),  # the actor too
])
def test_evaluate_gives_the_planner_its_options(flags, planner_options, monkeypatch, capsys):
    """`--planner-off-family` and `--planner-bases` reach the planner's constructor, and no other agent's."""
    from llmserve_env.tools import evaluate

    seen: dict[str, dict] = {}

    def fake(agent, task_id, episodes, runner=None, quiet=True, **options):
        seen[agent] = options
        return evaluate.AgentScores(agent, task_id, [1_000_000], [0.5], 0.0, {})

    monkeypatch.setattr(evaluate, "evaluate_agent", fake)
    assert evaluate.main(["--agent", "planner,operator", "--task", "multitenant_family", "--episodes", "1",
                          *flags, "--quiet"]) == 0
    assert seen == {"planner": planner_options, "operator": {}}
