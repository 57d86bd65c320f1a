"""Run independent episodes: in this process, on a local process pool, or as Ray tasks.

An episode is a pure function of (policy, task, seed): the simulator is deterministic and every
job builds a fresh policy, so the same jobs give the same results bit for bit whichever runner
plays them (tests/test_parallel.py compares the pool with a local Ray cluster).

    jobs = [registry_job("heuristic", "bursty_workload", s) for s in eval_seeds(50)]   # agents.registry
    runner = make_runner("auto", workers=2)            # Ray if installed, else the process pool
    results = runner.map(jobs)                          # in the order of `jobs`

| runner  | where the episodes run                                                          |
|---------|---------------------------------------------------------------------------------|
| serial  | this process, one after another (what a single-worker evaluation always did)    |
| pool    | `workers` local processes (concurrent.futures, spawn)                           |
| ray     | Ray tasks: a local Ray with `workers` CPUs, or an existing cluster at           |
|         | `ray_address` (`auto`, `ray://host:10001`): one task per episode                |
| auto    | ray when the `ray` extra is installed (`pip install -e '.[ray]'`), else pool;    |
|         | serial for one worker and no address                                            |

A Ray worker that dies mid-episode is retried (`max_retries`, Ray's retry of system failures);
an episode that still fails raises `EpisodeLostError` naming the job: a table never has a row
silently missing. Ray is imported only by the `ray` runner: it is never needed to serve.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from importlib.util import find_spec
from multiprocessing import get_context
from typing import Any, Protocol

from llmserve_env.agents.base import Policy
from llmserve_env.agents.rollout import play_episode

RUNNERS = ("auto", "serial", "pool", "ray")
RAY_MAX_RETRIES = 3


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play. `policy` builds a fresh policy and must pickle (a `functools.partial`
    of a module-level callable, as agents.registry.registry_job makes), so it can travel to another process."""

    policy: Callable[[], Policy]
    task_id: str
    seed: int


@dataclass(frozen=True)
class EpisodeOutcome:
    task_id: str
    seed: int
    policy: str
    score: float
    total_reward: float
    steps: int
    wall_s: float
    cpu_s: float  # process CPU time of the episode (the planner's cost per decision is read from it)


class EpisodeLostError(RuntimeError):
    """An episode could not be played (its worker died past the retries, or it raised)."""


_ENV: Any = None  # one in-process environment per worker process, reused across its jobs


def play_job(job: EpisodeJob) -> EpisodeOutcome:
    """Play one job in this process (what every runner calls, wherever it runs)."""
    global _ENV
    if _ENV is None:
        from llmserve_env.core.inprocess import InProcessEnv

        _ENV = InProcessEnv()
    t0, c0 = time.perf_counter(), time.process_time()
    policy = job.policy()
    r = play_episode(_ENV, policy, job.task_id, job.seed)
    return EpisodeOutcome(job.task_id, job.seed, r.policy, r.score, r.total_reward, r.steps,
                          time.perf_counter() - t0, time.process_time() - c0)


class Runner(Protocol):
    name: str

    def map(self, jobs: Sequence[EpisodeJob]) -> list[EpisodeOutcome]: ...

    def close(self) -> None: ...


class SerialRunner:
    name = "serial"

    def map(self, jobs: Sequence[EpisodeJob]) -> list[EpisodeOutcome]:
        return [_play_or_lost(job) for job in jobs]

    def close(self) -> None:
        pass


def _play_or_lost(job: EpisodeJob) -> EpisodeOutcome:
    try:
        return play_job(job)
    except Exception as exc:
        raise EpisodeLostError(f"episode {job.task_id} seed {job.seed} failed: {type(exc).__name__}: {exc}") from exc


class PoolRunner:
    """The project's own process pool: `workers` spawned processes, kept for the runner's life."""

    name = "pool"

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))

    def map(self, jobs: Sequence[EpisodeJob]) -> list[EpisodeOutcome]:
        # A few jobs per hand-off: an episode takes ~0.1 s, a pickle round trip ~1 ms.
        chunk = max(1, min(8, len(jobs) // (4 * self.workers)))
        try:
            return list(self._pool.map(_play_or_lost, jobs, chunksize=chunk))
        except BrokenProcessPool as exc:  # a worker died: no retry here (Ray's runner has them)
            raise EpisodeLostError(f"a pool worker died while playing these {len(jobs)} episodes: {exc}") from exc

    def close(self) -> None:
        self._pool.shutdown()


class RayRunner:
    """One Ray task per episode, on a local Ray (`workers` CPUs) or the cluster at `address`."""

    name = "ray"

    def __init__(self, workers: int, address: str | None = None):
        import ray

        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            init_ray(address, workers)
        self._play = ray.remote(num_cpus=1, max_retries=RAY_MAX_RETRIES)(play_job)

    def map(self, jobs: Sequence[EpisodeJob]) -> list[EpisodeOutcome]:
        refs = [self._play.remote(job) for job in jobs]
        out = []
        for job, ref in zip(jobs, refs, strict=True):
            try:
                out.append(self._ray.get(ref))
            except Exception as exc:  # RayTaskError (it raised) or a worker lost past its retries
                for pending in refs:
                    self._ray.cancel(pending)
                raise EpisodeLostError(f"episode {job.task_id} seed {job.seed} was lost: "
                                       f"{type(exc).__name__}: {exc}") from exc
        return out

    def close(self) -> None:
        if self._owns:
            self._ray.shutdown()


def init_ray(address: str | None, local_cpus: int) -> None:
    """Join the Ray cluster at `address` (`auto`, `ray://host:10001`), or start a local Ray with
    `local_cpus` CPUs: how the runner, train_rllib.py and tune_ppo.py all start Ray."""
    import ray

    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=local_cpus, include_dashboard=False, log_to_driver=False)


def ray_available() -> bool:
    spec = find_spec("ray")
    # a bare folder named ray on sys.path (Ray's own /tmp/ray session folder, say) is no install
    return spec is not None and spec.origin is not None


def make_runner(kind: str = "auto", workers: int = 1, ray_address: str | None = None) -> Runner:
    """The runner for `kind` (one of RUNNERS); see the module docstring for what `auto` picks."""
    if kind not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {kind!r}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if kind == "auto":
        if ray_address:
            kind = "ray"
        elif workers == 1:
            kind = "serial"
        else:
            kind = "ray" if ray_available() else "pool"
    if kind == "ray":
        if not ray_available():
            raise ValueError("the ray runner needs the ray extra: pip install -e '.[ray]'")
        return RayRunner(workers, ray_address)
    if ray_address:
        raise ValueError(f"--ray-address needs the ray runner, not {kind!r}")
    return PoolRunner(workers) if kind == "pool" else SerialRunner()


def add_runner_arguments(ap: Any, default_workers: int = 1) -> None:
    """The command-line options every episode-heavy command shares (evaluate, benches, searches)."""
    # A parser built with ArgumentDefaultsHelpFormatter prints each default itself: say it once.
    formatter = getattr(ap, "formatter_class", None)
    prints_defaults = isinstance(formatter, type) and issubclass(formatter, argparse.ArgumentDefaultsHelpFormatter)

    def helped(text: str, default: str) -> str:
        return text if prints_defaults else f"{text} (default {default})"

    ap.add_argument("--workers", type=_positive_int, default=default_workers,
                    help=helped("episodes played at once", str(default_workers)))
    ap.add_argument("--runner", choices=RUNNERS, default="auto",
                    help=helped("where episodes run: auto = Ray if installed else a process pool (serial for "
                                "one worker), or serial / pool / ray", "auto"))
    ap.add_argument("--ray-address", default=None,
                    help=helped("an existing Ray cluster: 'auto' or 'ray://host:10001'",
                                "none: a local Ray when the ray runner is used"))


def runner_from_args(ap: Any, args: Any) -> Runner:
    try:
        return make_runner(args.runner, args.workers, args.ray_address)
    except ValueError as exc:
        ap.error(str(exc))
        raise  # ap.error exits; this keeps type checkers content


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value
