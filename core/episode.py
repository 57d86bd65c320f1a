"""One episode: its arrivals (fixed at reset), its backend, metrics tracker, reward and step log.

    ep = Episode.start(task, seed, mode)      # ep.last_observation is the reset observation
    obs = ep.step(action)                     # one window served; obs.reward, obs.done
    ep.episode_log()                          # what the grader reads
    copy = ep.fork()                          # an independent copy in the same state (sim mode)
    out = ep.advance(action)                  # the fast path: one window served, no observation built

`advance` is for learners and planners in process (the Gym wrapper): it returns the window's
metrics, reward and done (`StepOutcome`) without building the pydantic observation, and logs the
step without validating it again (its values are this process's own). `last_observation` is then
built only when read. `step` (every transport) builds and validates both, as before.

The server keeps HTTP episodes in its store (server/episodes.py); WebSocket sessions and
in-process users (core/inprocess.py) hold theirs directly.
"""

from __future__ import annotations

import copy
import logging
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llmserve_env.core.episode_log import EpisodeLog, StepRecord
from llmserve_env.core.errors import (
    BackendFailure,
    EndpointUnavailableError,
    EnvError,
    EpisodeDoneError,
    EpisodeIdError,
    ForkUnsupportedError,
    ReplicasOutOfRangeError,
)
from llmserve_env.core.grader import References, compute_references
from llmserve_env.core.metrics import DRAIN_MAX_WINDOWS, MetricsTracker, WindowMetrics, with_drain
from llmserve_env.core.reward import GradeReward
from llmserve_env.shared.arrival_list import arrival_columns
from llmserve_env.shared.backend import Arrival, Backend, BackendUnavailableError, WindowReport
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.scenarios import announced_jobs, replica_disruptions
from llmserve_env.shared.tasks import PROFILE_CAPACITY, TaskSpec
from llmserve_env.shared.workloads import generate_arrivals, windows

log = logging.getLogger("llmserve_env.core")

# Episode ids, on every transport (HTTP body and query, WebSocket, web UI): short, and only
# characters that need no escaping in a URL, a log line or a file name. Minted ids are 128 random
# bits from `secrets`, so an id is a capability: nobody can guess another client's.
EPISODE_ID_MAX_LEN = 128
EPISODE_ID_PATTERN = r"^[A-Za-z0-9._:-]+$"
_EPISODE_ID_RE = re.compile(r"[A-Za-z0-9._:-]+")


def mint_episode_id() -> str:
    return secrets.token_hex(16)


def check_episode_id(episode_id: object) -> str:
    """`episode_id` if it is a well-formed id, else EpisodeIdError (a 422) saying what is allowed."""
    if (not isinstance(episode_id, str) or not 1 <= len(episode_id) <= EPISODE_ID_MAX_LEN
            or _EPISODE_ID_RE.fullmatch(episode_id) is None):
        raise EpisodeIdError(episode_id, EPISODE_ID_MAX_LEN)
    return episode_id


def make_backend(mode: str, task: TaskSpec, profile: Any = None, caps: Any = None) -> Backend:
    """The backend for one episode. Imported here so sim mode never loads the gateway and back.
    Sim mode: `profile` (an id, a path to a profile file, or a sim.profiles.Profile) replaces the task's,
    and `caps` (a sim.caps.RequestCaps) applies real mode's request caps, so a recorded episode can be
    played again in the simulator."""
    if mode == "real":
        if profile is not None or caps is not None:
            raise EnvError("profile and caps choose how sim mode serves; real mode serves what the endpoint "
                           "is, under LLMSERVE_REAL_MAX_* caps")
        from llmserve_env.gateway.backend import GatewayBackend

        return GatewayBackend.from_env()
    if task.is_cluster:
        from llmserve_env.sim.cluster import ClusterBackend

        return ClusterBackend(task.profile, task.replicas, task.initial_replicas, replica_disruptions(task))
    from llmserve_env.sim.backend import SimBackend
    from llmserve_env.sim.caps import CappedBackend

    backend: Backend = SimBackend(task.profile if profile is None else profile)
    return CappedBackend(backend, caps) if caps is not None and caps.any else backend


def _served_profile(backend: Backend, task: TaskSpec) -> str:
    """The id of the profile a sim backend (capped or not) serves; the task's for other backends."""
    profile = getattr(getattr(backend, "inner", backend), "profile", None)
    return profile.id if profile is not None else task.profile


def check_replicas(action: ServeAction, task: TaskSpec, backend_max: int | None = None) -> None:
    """ReplicasOutOfRangeError (HTTP 422) when `action.replicas` is set outside the task's range, or
    above `backend_max` (real mode: the endpoints in LLMSERVE_REAL_ENDPOINTS)."""
    n = action.replicas
    if n is None:
        return
    lo, hi = task.replicas
    if backend_max is not None and backend_max < hi:
        if not lo <= n <= max(lo, backend_max):
            raise ReplicasOutOfRangeError(task.task_id, n, lo, max(lo, backend_max),
                                          why=f"real mode serves on {backend_max} endpoint(s) "
                                              "(LLMSERVE_REAL_ENDPOINTS)")
    elif not lo <= n <= hi:
        raise ReplicasOutOfRangeError(task.task_id, n, lo, hi)


def cluster_metadata(task: TaskSpec, next_window: int, notes: dict[str, Any] | None, seed: int | None = None,
                     served: Sequence[Arrival] | None = None) -> dict[str, Any]:
    """What an operator of a cluster task sees: the replicas by state (asked for, ready, starting with the
    seconds until each is ready, draining), the next window's place in the daily cycle, each tenant's
    arrival rate in the window just `served` (absent before the first window), and the batch jobs
    announced by the next window and not yet finished (`seed` picks a scenario family's day; a
    fixed-day task's published jobs are always announced). Nothing about the episode's future beyond
    what is announced (tests/test_scenarios.py)."""
    out: dict[str, Any] = dict((notes or {}).get("cluster") or {})
    if not out:  # the reset observation, or a backend that does not scale (real mode)
        out = {"target": task.initial_replicas, "ready": task.initial_replicas, "starting": 0, "draining": 0}
    out["replicas_range"] = list(task.replicas)
    if task.cycle_windows:
        k = next_window % task.cycle_windows
        out["window_in_cycle"] = k
        out["cycle_windows"] = task.cycle_windows
        out["time_of_day_h"] = round(24.0 * k / task.cycle_windows, 4)
    if served is not None:
        names = [t.name for t in task.tenants]
        counts = arrival_columns(served).tenant_counts(names)
        out["arrival_rate_by_tenant"] = {name: round(n / task.window_s, 4) for name, n in zip(names, counts, strict=True)}
    if seed is not None and task.workload.get("kind") == "cycle":
        out["announced_jobs"] = announced_jobs(task, seed, next_window)
    return out


def observed_fields(m: WindowMetrics) -> dict[str, Any]:
    """One window's metrics as the observation's numeric fields (one place: the observation and
    the fast path's `ObservedWindow` both take them from here)."""
    return {
        "queue_depth": m.queue_depth,
        "active_requests": m.active_requests,
        "kv_cache_occupancy": min(1.0, max(0.0, m.kv_occupancy)),
        "mean_prompt_length": m.mean_prompt_tokens,
        "p50_ttft_ms": m.p50_ttft_ms,
        "p99_ttft_ms": m.p99_ttft_ms,
        "p50_itl_ms": m.p50_itl_ms,
        "throughput_tps": m.throughput_tps,
        "slo_compliance_rate": m.slo_attainment,
        "gpu_memory_used_gb": m.gpu_memory_used_gb,
        "estimated_cost_per_1k": m.cost_per_1k_tokens,
        "request_arrival_rate": m.arrival_rate_rps,
        "spec_acceptance_rate": min(1.0, max(0.0, m.spec_acceptance_rate)),
        "eviction_events": m.evictions,
    }


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """One window served, before it is dressed as a `ServeObservation` (`Episode.advance`)."""

    metrics: WindowMetrics
    reward: float
    terms: dict[str, float]
    applied: dict[str, bool]
    notes: dict[str, Any]
    step_index: int  # windows served so far, this one included (the observation's step_index)
    done: bool
    seed: int  # the episode's seed: a scenario family's day, for the announced jobs
    served: Sequence[Arrival]  # the window's arrivals (each tenant's arrival rate, cluster tasks)
    # prefix caching (sim): (prompt tokens first admitted, of them served from the cache, cached blocks)
    prefix: tuple[int, int, int] = (0, 0, 0)


class ObservedWindow:
    """The observation's numeric fields, reward, done, step index and (cluster tasks) cluster
    metadata, without the pydantic model: what a feature encoder reads (the Gym fast path)."""

    __slots__ = ("queue_depth", "active_requests", "kv_cache_occupancy", "mean_prompt_length", "p50_ttft_ms",
                 "p99_ttft_ms", "p50_itl_ms", "throughput_tps", "slo_compliance_rate", "gpu_memory_used_gb",
                 "estimated_cost_per_1k", "request_arrival_rate", "spec_acceptance_rate", "eviction_events",
                 "reward", "done", "step_index", "metadata", "prefix_hit_rate")

    def __init__(self, out: StepOutcome, task: TaskSpec):
        for name, value in observed_fields(out.metrics).items():
            setattr(self, name, value)
        # None off the prefix workloads, as the observation leaves the field out there
        self.prefix_hit_rate = prefix_fields(out)["prefix_hit_rate"] if task.caches_prefixes else None
        self.reward = out.reward
        self.done = out.done
        self.step_index = out.step_index
        self.metadata = ({"cluster": cluster_metadata(task, out.step_index, out.notes, out.seed, out.served)}
                         if task.is_cluster else {})


def observation_from(m: WindowMetrics, ep: Episode, reward: float, terms: dict[str, float],
                     applied: dict[str, bool], notes: dict[str, Any]) -> ServeObservation:
    """Map one window's metrics onto the observation fields (one place, both modes)."""
    out = StepOutcome(m, reward, terms, applied, notes, ep.step_count, ep.done, ep.seed,
                      ep.windows[ep.step_count - 1])
    return _observation(out, ep.task, ep.episode_id)


def _fold_prefix(report: WindowReport, drained: list[WindowReport]) -> None:
    """Real mode measures a request's prefix hit when it ends (the engine's usage comes last): the drain
    windows' hits belong to the last step's observation, as their latencies do."""
    for r in drained:
        report.prefix_query_tokens += r.prefix_query_tokens
        report.prefix_hit_tokens += r.prefix_hit_tokens
        for key in ("prefix_hit_measured", "prefix_hit_unmeasured"):
            if key in r.notes:
                report.notes[key] = int(report.notes.get(key) or 0) + int(r.notes[key])  # type: ignore[call-overload]


def prefix_fields(out: StepOutcome) -> dict[str, Any]:
    """The prefix cache's observation fields, given only on prefix workloads (`TaskSpec.caches_prefixes`):
    every other task's observation keeps the seed's keys."""
    query, hit, cached = out.prefix
    if out.notes.get("backend") == "real":
        # the engines' own counts (gateway/dispatcher.py): None where no engine said (no measured request
        # in the window); the gateway does not see the engines' cached blocks
        return {"prefix_hit_rate": hit / query if query else None, "prefix_cached_blocks": None}
    return {"prefix_hit_rate": hit / query if query else 0.0, "prefix_cached_blocks": cached}


def _observation(out: StepOutcome, task: TaskSpec, episode_id: str) -> ServeObservation:
    m = out.metrics
    metadata = {
        "per_tenant": {name: t.to_dict() for name, t in m.per_tenant.items()},
        "goodput_rps": m.goodput_rps,
        "p50_tpot_ms": m.p50_tpot_ms,
        "quality": m.quality,
        "cost_usd": m.cost_usd,
        "reward_terms": out.terms,
        "applied": out.applied,
        "backend_notes": out.notes,
        "terminated": out.done,
        "drain_windows": m.drain_windows,
    }
    if out.notes.get("backend") == "real":
        # Requests that failed in the window, beside the latencies they leave out: a window whose
        # requests all failed must not read as a quiet one (0 ms, 0 tokens/s) to a client that
        # does not read the backend's notes.
        metadata["failed_requests"] = int(out.notes.get("errors") or 0) + int(out.notes.get("timeouts") or 0)
        metadata["failure"] = out.notes.get("failure")
    if task.is_cluster:
        metadata["cluster"] = cluster_metadata(task, out.step_index, out.notes, out.seed, out.served)
    return ServeObservation(
        **observed_fields(m),
        **(prefix_fields(out) if task.caches_prefixes else {}),
        step_index=out.step_index,
        task_id=task.task_id,
        episode_id=episode_id,
        reward=out.reward,
        done=out.done,
        metadata=metadata,
    )


@dataclass(eq=False)
class Episode:
    """A running episode: the arrivals are fixed at reset, the backend serves them window by window."""

    episode_id: str
    task: TaskSpec
    seed: int
    mode: Literal["sim", "real"]
    backend: Backend
    windows: list[Sequence[Arrival]]
    tracker: MetricsTracker
    reward: GradeReward
    step_count: int = 0
    done: bool = False
    failed: str | None = None
    cumulative_reward: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    # the last observation, or (after `advance`) the outcome it is built from when first read
    observation: ServeObservation | None = None
    outcome: StepOutcome | None = field(default=None, repr=False)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    profile: str = ""  # the simulator profile served (sim mode), else the task's
    # windows the engine may drain after the horizon (0: none, the backlog at the horizon is missed,
    # as before issue 13; kept for measuring what the drain changes)
    drain_max_windows: int = DRAIN_MAX_WINDOWS
    # real mode: the drain windows' reports of the last step (their prefix hits join its observation)
    _drained: list[WindowReport] = field(default_factory=list, repr=False)
    # the arrivals as generated from (task, seed) and the grader's references of them, computed once at
    # the start: what grading this episode would compute again (`grade_own`); read-only, forks share it
    played: tuple[Sequence[Arrival], References] | None = field(default=None, repr=False)

    @classmethod
    def start(cls, task: TaskSpec, seed: int, mode: Literal["sim", "real"], episode_id: str | None = None, *,
              profile: Any = None,
              caps: Any = None) -> Episode:
        """`profile`, `caps`: sim mode only, see make_backend (UnknownProfileError / CapsError when bad)."""
        episode_id = mint_episode_id() if episode_id is None else check_episode_id(episode_id)
        arrivals = generate_arrivals(task, seed)
        backend = make_backend(mode, task, profile, caps)
        # the grader's references: of the arrivals as generated (the grader regenerates them), on the
        # capacity of the profile served (as the grader reads it from the log)
        served = _served_profile(backend, task)
        references = compute_references(task, seed, PROFILE_CAPACITY.get(served) or task.capacity(), arrivals)
        played = (arrivals, references)
        if mode == "real":  # the gateway tags its records with the id; arrivals as sent (capped) are judged
            try:
                arrivals = backend.begin(seed, episode_id, task.window_s, arrivals,  # type: ignore[attr-defined]
                                         initial_replicas=task.initial_replicas)
            except ValueError as exc:  # a window the step timeout cannot hold (a trace task's window_s)
                backend.close()
                raise EnvError(str(exc)) from None
        else:
            backend.reset(seed)
        ep = cls(
            episode_id=episode_id,
            task=task,
            seed=seed,
            mode=mode,
            backend=backend,
            windows=windows(arrivals, task),
            tracker=MetricsTracker(task),
            reward=GradeReward(task, references),
            profile=served,
            played=played,
        )
        ep.last_observation = ServeObservation(
            task_id=task.task_id,
            episode_id=ep.episode_id,
            reward=0.0,
            done=False,
            metadata={"horizon": task.horizon, "window_s": task.window_s, "profile": ep.profile,
                      "mode": mode, "seed": seed},
        )
        if task.is_cluster:
            ep.last_observation.metadata["cluster"] = cluster_metadata(task, 0, None, seed)
        return ep

    @property
    def last_observation(self) -> ServeObservation | None:
        if self.observation is None and self.outcome is not None:
            self.observation = _observation(self.outcome, self.task, self.episode_id)
        return self.observation

    @last_observation.setter
    def last_observation(self, obs: ServeObservation | None) -> None:
        self.observation, self.outcome = obs, None

    def step(self, action: ServeAction) -> ServeObservation:
        with self.lock:
            out = self._serve(action, validate=True)
            obs = _observation(out, self.task, self.episode_id)
            self.observation, self.outcome = obs, None  # the last_observation setter's work, one call fewer
            return obs

    def advance(self, action: ServeAction) -> StepOutcome:
        """`step` without the observation (built only if `last_observation` is read) and with the
        step logged unvalidated: the fast path for learners and planners in process."""
        with self.lock:
            out = self._serve(action, validate=False)
            self.observation, self.outcome = None, out
            return out

    def _serve(self, action: ServeAction, validate: bool) -> StepOutcome:
        """One window served, metered, rewarded and logged (the caller holds the lock)."""
        self.last_used = time.monotonic()
        if self.done:
            raise EpisodeDoneError(self.episode_id, self.task.horizon)
        if action.replicas is not None:  # a single-server action has none: nothing to check
            check_replicas(action, self.task, getattr(self.backend, "max_replicas", None))
        k = self.step_count
        arrivals = self.windows[k]
        dt = self.task.window_s
        last = k + 1 >= self.task.horizon
        try:
            report = self.backend.run_window(action, arrivals, k * dt, dt)
            m = self.tracker.observe(report, arrivals, final=last and self.drain_max_windows <= 0)
            if last and not self.tracker.closed:
                self._drained = []
                m = with_drain(m, self._drain(action))
                if self._drained:
                    _fold_prefix(report, self._drained)
        except BackendUnavailableError as exc:  # nothing was served: the same step can be sent again
            log.warning("episode %s: step %d not served: %s", self.episode_id, k, exc)
            raise EndpointUnavailableError(self.episode_id, k, exc.endpoint, exc.reason) from exc
        except Exception as exc:  # one episode's backend failing must not take the server down
            self.failed = f"{type(exc).__name__}: {exc}"
            self.done = True
            log.warning("episode %s: backend failed at step %d: %s", self.episode_id, k, self.failed)
            self.close()
            raise BackendFailure(f"the {self.mode} backend failed at step {k}: {self.failed}; "
                                 f"this episode has ended, call POST /reset for a new one") from exc
        self.step_count = k + 1
        self.done = last
        reward, terms = self.reward.step(m)
        self.cumulative_reward += reward
        knobs, metrics = action.knobs(), m.to_dict()
        if validate:
            # The action's knobs come from a ServeAction validated on its way in: added unvalidated
            # (model_copy's update does not validate), the metrics and reward are checked here.
            record = StepRecord(step_index=k, metrics=metrics, reward=reward,
                                reward_terms=terms).model_copy(update={"action": knobs})
        else:  # the fast path: the values are this process's own, checked when they were made
            record = StepRecord.model_construct(step_index=k, action=knobs, metrics=metrics, reward=reward,
                                                reward_terms=terms)
        self.steps.append(record)
        if self.done:
            self.close()
        return StepOutcome(m, reward, terms, report.applied, report.notes, self.step_count, self.done, self.seed,
                           arrivals, (report.prefix_query_tokens, report.prefix_hit_tokens, report.prefix_cached_blocks))

    def _drain(self, action: ServeAction) -> list[WindowMetrics]:
        """After the last window: no more arrivals, the engine keeps serving under the last action
        until every request is settled (at most DRAIN_MAX_WINDOWS windows; what is left then is
        missed). Each drained window costs what a served one does (core/metrics.py says why)."""
        dt = self.task.window_s
        t = self.task.horizon * dt
        out: list[WindowMetrics] = []
        limit = self.drain_max_windows
        while self.tracker.outstanding and len(out) < limit:
            report = self.backend.run_window(action, [], t, dt)
            out.append(self.tracker.observe(report, [], final=len(out) + 1 == limit))
            if self.mode == "real":
                self._drained.append(report)
            t += dt
        if not self.tracker.closed:
            self.tracker.close()
        return out

    def fork(self, episode_id: str | None = None) -> Episode:
        """An independent copy of this episode in its current state: the backend (engine, queues,
        KV cache, clocks, random stream), the metrics tracker, the step log and the reward so far.
        Stepping the copy with an action gives bit-for-bit the observation and reward the original
        gives with that action, and never changes the original. The task, the arrival windows and
        the logged steps (immutable) are shared. ForkUnsupportedError for a backend without `fork`
        (real mode: a live engine's state cannot be copied)."""
        with self.lock:
            fork_backend = getattr(self.backend, "fork", None)
            if fork_backend is None or self.failed is not None:
                raise ForkUnsupportedError(self.episode_id, self.mode, self.failed)
            clone = copy.copy(self)
            clone.episode_id = mint_episode_id() if episode_id is None else check_episode_id(episode_id)
            clone.backend = fork_backend()
            clone.tracker = self.tracker.fork()
            clone.reward = self.reward.fork()
            clone.steps = list(self.steps)
            clone.lock = threading.Lock()
            clone.last_used = time.monotonic()
            if self.last_observation is not None:
                clone.last_observation = self.last_observation.model_copy(update={"episode_id": clone.episode_id})
            return clone

    def episode_log(self) -> EpisodeLog:
        return EpisodeLog(
            episode_id=self.episode_id,
            task_id=self.task.task_id,
            seed=self.seed,
            mode=self.mode,
            profile=self.profile,
            horizon=self.task.horizon,
            done=self.done and self.failed is None,
            steps=list(self.steps),
        )

    def close(self) -> None:
        try:
            self.backend.close()
        except Exception as exc:  # closing is best effort; the episode's data is already recorded
            log.warning("episode %s: backend close failed: %s", self.episode_id, exc)
