"""Episodes as jobs: every runner gives the same results; a lost episode is an error, never a gap."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest
from llmserve_env.agents.parallel import (
    EpisodeJob,
    EpisodeLostError,
    PoolRunner,
    SerialRunner,
    make_runner,
    ray_available,
)
from llmserve_env.agents.registry import registry_job
from llmserve_env.agents.static import StaticPolicy, vllm_default

JOBS = [registry_job(agent, task, seed) for agent in ("random", "heuristic")
        for task in ("static_workload", "adversarial_multitenant") for seed in (1_000_000, 1_000_001)]


def _table(outcomes) -> list[tuple]:
    return [(o.policy, o.task_id, o.seed, o.score, o.total_reward, o.steps) for o in outcomes]


@pytest.fixture(scope="module")
def serial_table() -> list[tuple]:
    return _table(SerialRunner().map(JOBS))


def test_pool_matches_serial_bit_for_bit(serial_table) -> None:
    pool = PoolRunner(2)
    try:
        assert _table(pool.map(JOBS)) == serial_table
    finally:
        pool.close()


def test_random_agent_is_a_pure_function_of_the_episode_seed(serial_table) -> None:
    again = _table(SerialRunner().map(list(reversed(JOBS))))
    assert list(reversed(again)) == serial_table
    # two seeds of the random agent draw different actions (its stream is seeded per episode)
    assert serial_table[0][3:] != serial_table[1][3:]


class _Boom:
    name = "boom"

    def reset(self) -> None:
        raise RuntimeError("policy broke")


def test_a_failing_episode_is_an_error_naming_it() -> None:
    with pytest.raises(EpisodeLostError, match="static_workload seed 7"):
        SerialRunner().map([EpisodeJob(_Boom, "static_workload", 7)])


def test_runner_choice_is_checked() -> None:
    with pytest.raises(ValueError, match="runner must be one of"):
        make_runner("dask")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        make_runner("pool", workers=0)
    with pytest.raises(ValueError, match="ray runner"):
        make_runner("pool", workers=2, ray_address="auto")
    assert make_runner("auto", workers=1).name == "serial"


def _require_ray() -> None:
    if not ray_available():
        if os.environ.get("LLMSERVE_REQUIRE_RAY") == "1":
            pytest.fail("ray is required here (LLMSERVE_REQUIRE_RAY=1) but not installed")
        pytest.skip("ray is in the ray extra (pip install -e '.[ray]')")


class _DieOnce:
    """A static policy whose first attempt kills its worker process (a crashed Ray worker)."""

    name = "die_once"

    def __init__(self, marker: str):
        if not Path(marker).exists():
            Path(marker).write_text("died")
            os._exit(1)
        self._inner = vllm_default()

    def reset(self) -> None:
        self._inner.reset()

    def act(self, obs):
        return self._inner.act(obs)


@pytest.fixture(scope="module")
def ray_runner():
    _require_ray()
    from ray import cloudpickle

    # this module's helper classes travel by value: Ray's workers cannot import a test module
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    runner = make_runner("ray", workers=2)
    yield runner
    runner.close()


def test_local_ray_matches_the_pool_bit_for_bit(serial_table, ray_runner) -> None:
    assert _table(ray_runner.map(JOBS)) == serial_table


def test_ray_retries_an_episode_whose_worker_died(ray_runner, tmp_path) -> None:
    job = EpisodeJob(functools.partial(_DieOnce, str(tmp_path / "died")), "static_workload", 1_000_000)
    [outcome] = ray_runner.map([job])
    expect = SerialRunner().map([EpisodeJob(functools.partial(StaticPolicy, vllm_default().action),
                                            "static_workload", 1_000_000)])[0]
    assert (tmp_path / "died").exists()
    assert outcome.score == expect.score


# -- every episode-heavy command takes the runner options (issue 19) ---------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _bench_main(script: str):
    """A bench script's main, loaded from its file as `python bench/NAME.py` runs it."""
    import importlib.util

    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{script}", ROOT / "bench" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.main


def _main(name: str):
    if name.startswith("bench/"):
        return _bench_main(name.removeprefix("bench/"))
    import importlib

    return importlib.import_module(f"llmserve_env.{name}").main


@pytest.mark.parametrize("command", ["tools.evaluate", "bench/score_table", "bench/headroom", "tools.tune_static",
                                     "tools.tune_heuristic", "tools.tune_autoscale"])
def test_every_episode_heavy_command_takes_the_runner_options(command, capsys) -> None:
    main = _main(command)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert all(option in text for option in ("--workers", "--runner", "--ray-address")), text
    # the options reach make_runner: an address without the ray runner is refused before any work
    with pytest.raises(SystemExit) as exc:
        main(["--runner", "pool", "--workers", "2", "--ray-address", "auto"])
    assert exc.value.code == 2
    assert "--ray-address needs the ray runner" in capsys.readouterr().err


def test_autoscale_tuning_jobs_give_the_same_scores_on_a_pool() -> None:
    """The rivals' tuning configurations travel as picklable jobs: a pool scores them as in process."""
    from dataclasses import asdict

    from llmserve_env.agents.autoscale import HPAParams, _mean
    from llmserve_env.core.inprocess import InProcessEnv

    values = asdict(HPAParams(target_in_system=32.0, stabilization=3))
    seeds = [1_000_000, 1_000_001]
    env = InProcessEnv()
    in_process = _mean(env, "hpa", "diurnal_autoscale", values, seeds)
    pool = PoolRunner(2)
    try:
        assert _mean(env, "hpa", "diurnal_autoscale", values, seeds, runner=pool) == in_process
    finally:
        pool.close()
        env.close()


def test_autoscale_refuses_a_single_server_task(capsys) -> None:
    from llmserve_env.tools.tune_autoscale import main

    with pytest.raises(SystemExit) as exc:
        main(["--task", "static_workload"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --task" in err and "diurnal_autoscale" in err
