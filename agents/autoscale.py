"""Production autoscalers as rivals on the cluster tasks: Kubernetes' HPA and NVIDIA Dynamo's Planner.

Each rival is a replica controller (how many replicas to ask for, from the observation) paired with a
per-replica knob policy: the existing `heuristic` (default thresholds: none are tuned for the cluster
tasks) or vLLM's fixed defaults, whichever tuning on training seeds picks.

- `hpa`: the Kubernetes Horizontal Pod Autoscaler's rule (kubernetes.io, "Horizontal Pod Autoscaling":
  desired = ceil(current x currentMetric / targetMetric), no change while the ratio is within the 0.1
  tolerance; scale-down stabilisation: the highest recommendation over the last `stabilization`
  windows, 300 s by default; scale-up at once). The metric, a tuned choice: the mean number of requests
  in the system per ready replica (`in_system`: running + waiting, vLLM's num_requests_running +
  num_requests_waiting, the queue metric KEDA/llm-d scale vLLM on), or the KV cache's utilisation
  (`kv_cache`: the observation's `kv_cache_occupancy`, blocks in use over the serving replicas' blocks,
  the average across pods an HPA reads; vLLM exports it as gpu_cache_usage_perc), which counts a long
  prompt as the memory it holds rather than as one request. `current` is the replicas asked for
  (starting ones included).
- `dynamo_planner`: the Dynamo Planner's throughput-based scaling as its design document describes it
  (docs.nvidia.com/dynamo/latest/design-docs/component-design/planner-design, "Scaling Algorithm",
  steps 1-5): every `interval` windows it (1) collects the interval's average TTFT, ITL, request
  count, ISL and OSL; (2) updates correction factors, prefill = observed TTFT / expected TTFT and
  decode = observed ITL / expected ITL, the expectations from the profile's performance model at the
  observed load; (3) predicts the next interval's request count, ISL and OSL with a constant or a
  Holt-Winters predictor (statsmodels' ExponentialSmoothing, additive trend, as `holt_forecast`
  computes it; ARIMA is the docs' other choice); (4) computes the replicas that meet the TTFT and ITL targets at the predicted load: prefill
  work = predicted requests x ISL / interval x min(1, prefill correction) over one replica's prefill
  throughput; decode work = predicted requests x OSL / interval over one replica's decode throughput
  at the largest batch whose step time stays below ITL target / decode correction; (5) scales.
  Dynamo sizes separate prefill and decode pools; these tasks serve aggregated replicas (every replica
  does both phases), so the replica count is ceil(prefill work + decode work), each in replicas: a
  replica time-shares the two. Expected TTFT is the isolated prefill of the mean prompt; expected
  ITL the decode step at the observed concurrency, both from the profile's step-time model
  (`sim.step_time.StepTimeModel`), the planner's "performance interpolator". OSL is measured as
  output tokens per arriving request (throughput / arrival rate) since the observation carries no
  per-request output count.

On the prefix-caching tasks (mooncake_cluster, multiturn_cluster) each rival also routes: its
`cache_affinity` (the router's weight of a replica's cached prefix against its load,
shared/prefix_routing.py) is one more tuned setting, over the operator's grid of the field's routers'
weights (`agents.routing.AFFINITY_GRID`, the operator's too), so a scaling rule there is scaling plus the best
fixed routing.

Tuning (`python -m llmserve_env.tools.tune_autoscale --task all`): coordinate descent over each rival's grid on
training seeds only (agents/seeds.py); results and the command in agents/autoscale_tuned.json.
`tuned_static` on the cluster tasks is a fixed replica count plus fixed knobs, tuned by the same
command into agents/tuned_static.json (so `tuned_static(task_id)` serves it unchanged).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from llmserve_env.agents.base import Policy, make_action
from llmserve_env.agents.heuristic import HeuristicPolicy
from llmserve_env.agents.parallel import EpisodeJob, Runner
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.agents.routing import AFFINITY_GRID, AFFINITY_START
from llmserve_env.agents.search import coordinate_descent, tuned_entry
from llmserve_env.agents.static import VLLM_DEFAULT, StaticPolicy
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import PREFIX_TASKS, TaskSpec, get_task

TUNED_PATH = Path(__file__).resolve().parent / "autoscale_tuned.json"


def _ready(obs: ServeObservation, default: int) -> int:
    c = obs.metadata.get("cluster") or {}
    return int(c.get("ready", default)) or 1


def _knob_policy(task: TaskSpec, knobs: str) -> Policy:
    return HeuristicPolicy(task) if knobs == "heuristic" else StaticPolicy(VLLM_DEFAULT)


class AutoscalePolicy:
    """A replica controller plus a per-replica knob policy: the knobs' action with `replicas` set (and
    `cache_affinity`, where the rival routes by it)."""

    def __init__(self, name: str, task: TaskSpec, controller: Any):
        self.name = name
        self.task = task
        self.controller = controller
        self.knobs = _knob_policy(task, controller.p.knobs)
        self.cache_affinity = controller.p.cache_affinity

    def reset(self) -> None:
        self.knobs.reset()
        self.controller.reset()

    def act(self, obs: ServeObservation) -> ServeAction:
        n = self.controller.replicas(obs)
        lo, hi = self.task.replicas
        update: dict[str, Any] = {"replicas": int(min(hi, max(lo, n)))}
        if self.cache_affinity is not None:
            update["cache_affinity"] = self.cache_affinity
        return self.knobs.act(obs).model_copy(update=update)


# --------------------------------------------------------------------------------------------- HPA


HPA_METRICS = ("in_system", "kv_cache")


@dataclass(frozen=True)
class HPAParams:
    target_in_system: float = 16.0   # requests (running + waiting) per ready replica (metric "in_system")
    stabilization: int = 30          # scale-down stabilisation window, in windows (300 s at 10 s)
    tolerance: float = 0.1           # Kubernetes' default
    knobs: str = "static"
    metric: str = "in_system"        # or "kv_cache" (module docstring)
    target_kv: float = 0.5           # KV cache utilisation to hold (metric "kv_cache")
    cache_affinity: float | None = None  # prefix-caching tasks only (module docstring); None: least work

    def __post_init__(self) -> None:
        if self.metric not in HPA_METRICS:
            raise ValueError(f"metric must be one of {', '.join(HPA_METRICS)}, got {self.metric!r}")


class HPAController:
    def __init__(self, task: TaskSpec, p: HPAParams):
        self.task, self.p = task, p
        self.reset()

    def reset(self) -> None:
        self.current = self.task.initial_replicas
        self.history: deque[int] = deque(maxlen=max(1, self.p.stabilization))

    def replicas(self, obs: ServeObservation) -> int:
        if obs.step_index == 0:
            return self.current  # the reset observation carries no metric yet
        if self.p.metric == "kv_cache":
            ratio = obs.kv_cache_occupancy / self.p.target_kv
        else:
            ratio = (obs.queue_depth + obs.active_requests) / _ready(obs, self.current) / self.p.target_in_system
        desired = self.current if abs(ratio - 1.0) <= self.p.tolerance else math.ceil(self.current * ratio)
        lo, hi = self.task.replicas
        desired = min(hi, max(lo, desired))
        self.history.append(desired)
        stabilised = max(self.history)  # scale down only to the highest recent recommendation
        self.current = desired if desired > self.current else min(self.current, stabilised)
        return self.current


HPA_GRID: dict[str, tuple[Any, ...]] = {
    "target_in_system": (4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0),
    "stabilization": (1, 3, 6, 12, 30),
    "knobs": ("static", "heuristic"),
    "metric": HPA_METRICS,
    "target_kv": (0.2, 0.35, 0.5, 0.65, 0.8),
}


# ------------------------------------------------------------------------------------ Dynamo Planner


@dataclass(frozen=True)
class PlannerParams:
    interval: int = 1                # adjustment interval, in windows
    predictor: str = "holt_winters"  # or "constant"
    ttft_target_ms: float = 0.0      # 0: the tightest tenant SLO
    itl_target_ms: float = 0.0       # 0: the tightest tenant TPOT SLO
    headroom: float = 1.0            # multiplies the computed replicas (1 = as documented)
    alpha: float = 0.5               # Holt level smoothing
    beta: float = 0.3                # Holt trend smoothing
    knobs: str = "static"
    cache_affinity: float | None = None  # prefix-caching tasks only (module docstring); None: least work


class PerformanceModel:
    """One replica's prefill and decode throughput from the profile's step-time model (FP16)."""

    def __init__(self, task: TaskSpec):
        from llmserve_env.sim.step_time import step_model

        self.m = step_model(task.profile, "FP16")
        from llmserve_env.sim.profiles import load_profile

        self.budget = load_profile(task.profile).token_budget

    def __deepcopy__(self, memo: dict) -> PerformanceModel:
        return self  # immutable: a copied controller (the rollout planner's) shares it

    def prefill_tps(self) -> float:
        b = self.budget
        return b / self.m.iteration_s(0, 0.0, 0, [(b, 0)], b, 1)

    def prefill_s(self, isl: float) -> float:
        n = max(1, int(isl))
        c = min(n, self.budget)  # chunked prefill: one budget-sized chunk per iteration (Mooncake's ISLs exceed it)
        return self.m.iteration_s(0, 0.0, 0, [(c, 0)], c, 1) * max(1.0, n / self.budget)

    def itl_s(self, batch: int, context: float) -> float:
        return self.m.iteration_s(batch, batch * context, 0, [], 0, 0)

    def decode_tps_at(self, itl_s: float, context: float) -> float:
        """Tokens/s of the largest batch (<= 512) whose decode step stays within itl_s (>= batch 1)."""
        lo, hi = 1, 512
        if self.itl_s(1, context) > itl_s:
            return 1.0 / self.itl_s(1, context)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.itl_s(mid, context) <= itl_s:
                lo = mid
            else:
                hi = mid - 1
        return lo / self.itl_s(lo, context)


def _predict(series: Sequence[float], how: str, alpha: float, beta: float) -> float:
    """The next value: the last one ("constant"), or Holt's linear trend ("holt_winters": statsmodels'
    Holt-Winters without a seasonal term, which would need two whole days of history; smoothing
    parameters fixed from the tuning grid, since fitting them by optimisation costs ~0.3 s a window)."""
    if how == "constant" or len(series) < 3:
        return float(series[-1])
    return max(0.0, holt_forecast(series[-24:], alpha, beta))


def holt_forecast(series: Sequence[float], alpha: float, beta: float) -> float:
    """The one-step forecast of statsmodels' `Holt(x, initialization_method="known", initial_level=x[0],
    initial_trend=0.0).fit(smoothing_level=alpha, smoothing_trend=beta, optimized=False).forecast(1)[0]`,
    bit for bit: its recursion (statsmodels.tsa.holtwinters.model, `_predict`, additive trend, not damped:
    the damping factor is 1.0) with its operations in its order, without building the model (statsmodels
    took ~2 ms a call, most of dynamo_planner's own time and ~5 % of the rollout planner's;
    tests/test_autoscale.py checks the equality against statsmodels)."""
    x = [float(v) for v in series]
    alphac, betac = 1 - alpha, 1 - beta
    level, trend = x[0], 0.0
    for y in x:  # statsmodels multiplies the trend by the damping factor 1.0 here: exact, so left out
        last = level
        level = alpha * y + alphac * (last + trend)
        trend = beta * (level - last) + betac * trend
    return level + trend


class PlannerController:
    def __init__(self, task: TaskSpec, p: PlannerParams):
        self.task, self.p = task, p
        self.perf = PerformanceModel(task)
        self.ttft_s = (p.ttft_target_ms or min(t.ttft_slo_ms for t in task.tenants)) / 1e3
        self.itl_target_s = (p.itl_target_ms or min(t.tpot_slo_ms for t in task.tenants)) / 1e3
        self.reset()

    def reset(self) -> None:
        self.current = self.task.initial_replicas
        self.reqs: list[float] = []
        self.isl: list[float] = []
        self.osl: list[float] = []
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.active: list[float] = []
        self.p_corr = self.d_corr = 1.0
        self.since = 0

    def replicas(self, obs: ServeObservation) -> int:
        if obs.step_index == 0:
            return self.current  # the reset observation carries no metric yet
        w = self.task.window_s
        self.reqs.append(obs.request_arrival_rate * w)
        self.isl.append(obs.mean_prompt_length)
        # OSL: output tokens per arriving request, taken only from windows without a backlog (with
        # one, throughput is capped and the ratio underestimates it); else the last good estimate
        ready = _ready(obs, self.current)
        if obs.request_arrival_rate and obs.queue_depth <= ready and obs.throughput_tps > 0:
            self.osl.append(obs.throughput_tps / obs.request_arrival_rate)
        elif self.osl:
            self.osl.append(self.osl[-1])
        self.ttft.append(obs.p50_ttft_ms / 1e3)
        self.itl.append(obs.p50_itl_ms / 1e3)
        self.active.append(obs.active_requests / _ready(obs, self.current))
        self.since += 1
        if self.since < self.p.interval:
            return self.current
        self.since = 0
        k = self.p.interval
        isl = float(np.mean(self.isl[-k:])) or 1.0
        osl = float(np.mean(self.osl[-k:])) if self.osl else isl / 4  # no clean window yet
        # Step 2: correction factors against the performance model at the observed load
        exp_ttft = self.perf.prefill_s(isl)
        obs_ttft = float(np.mean(self.ttft[-k:]))
        if obs_ttft > 0:
            self.p_corr = obs_ttft / exp_ttft
        batch = max(1, int(round(float(np.mean(self.active[-k:])))))
        exp_itl = self.perf.itl_s(batch, isl + osl / 2)
        obs_itl = float(np.mean(self.itl[-k:]))
        if obs_itl > 0:
            self.d_corr = obs_itl / exp_itl
        # Step 3: load prediction, per interval
        per_interval = [sum(self.reqs[i:i + k]) for i in range(len(self.reqs) % k, len(self.reqs), k)]
        # Holt on the request count; ISL and OSL move little over a day, so their last interval is used
        next_reqs = _predict(per_interval, self.p.predictor, self.p.alpha, self.p.beta)
        next_isl, next_osl = isl, osl
        interval_s = k * w
        # Step 4: replicas to meet TTFT and ITL at the predicted load
        prefill_load = next_reqs * next_isl / interval_s * min(1.0, self.p_corr)
        prefill = prefill_load / self.perf.prefill_tps()
        corrected_itl = self.itl_target_s / max(self.d_corr, 1e-6)
        decode = next_reqs * next_osl / interval_s / self.perf.decode_tps_at(corrected_itl, next_isl + next_osl / 2)
        self.current = math.ceil((prefill + decode) * self.p.headroom - 1e-9)
        lo, hi = self.task.replicas
        self.current = min(hi, max(lo, self.current))
        return self.current


PLANNER_GRID: dict[str, tuple[Any, ...]] = {
    "interval": (1, 2, 3),
    "predictor": ("constant", "holt_winters"),
    "headroom": (1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
    "alpha": (0.5, 0.8),
    "beta": (0.1, 0.3),
    "knobs": ("static", "heuristic"),
}

STATIC_GRID: dict[str, tuple[Any, ...]] = {
    "replicas": (1, 2, 3, 4, 5, 6, 7, 8),
    "batch_cap": (64, 128, 256, 512),
    "kv_budget_fraction": (0.7, 0.9, 1.0),
    "quantization_tier": ("FP16", "INT8"),
    "speculation_depth": (0, 2),
}


# ------------------------------------------------------------------------------------------ factories


def _params(kind: str, task_id: str, path: Path = TUNED_PATH) -> dict[str, Any]:
    entry = (tuned_entry(path, task_id) or {}).get(kind)
    return dict(entry["params"]) if entry else {}


class NotClusterTaskError(KeyError):
    """An autoscaler asked to play a single-server task (nothing to scale)."""

    def __str__(self) -> str:
        return f"{self.args[0]!r} is a single-server task: autoscalers play the cluster tasks only"


def _cluster_task(task_id: str) -> TaskSpec:
    task = get_task(task_id)
    if not task.is_cluster:
        raise NotClusterTaskError(task_id)
    return task


def _autoscaler(kind: str, task: TaskSpec, values: dict[str, Any]) -> AutoscalePolicy:
    """The `kind` autoscaler ("hpa" or "dynamo_planner") with parameter `values` on `task`."""
    if kind == "hpa":
        return AutoscalePolicy(kind, task, HPAController(task, HPAParams(**values)))
    return AutoscalePolicy(kind, task, PlannerController(task, PlannerParams(**values)))


def hpa(task_id: str) -> AutoscalePolicy:
    return _autoscaler("hpa", _cluster_task(task_id), _params("hpa", task_id))


def dynamo_planner(task_id: str) -> AutoscalePolicy:
    return _autoscaler("dynamo_planner", _cluster_task(task_id), _params("dynamo_planner", task_id))


def _static_action(values: dict[str, Any]) -> ServeAction:
    a = make_action(values["batch_cap"], values["kv_budget_fraction"], values["speculation_depth"],
                    values["quantization_tier"])
    return a.model_copy(update={"replicas": int(values["replicas"])})


# --------------------------------------------------------------------------------------------- tuning

KINDS = ("tuned_static", "hpa", "dynamo_planner")


def rival(kind: str, task_id: str, values: dict[str, Any]) -> Policy:
    """A fresh `kind` rival with parameter `values`: module-level, so a `functools.partial` of it
    pickles and a tuning job can be played by another process or a Ray worker (agents/parallel.py)."""
    if kind in ("hpa", "dynamo_planner"):
        return _autoscaler(kind, get_task(task_id), values)
    if kind == "tuned_static":
        return StaticPolicy(_static_action(values), name="tuned_static")
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


def _mean(env: EpisodeEnv, kind: str, task_id: str, values: dict[str, Any], seeds: Sequence[int],
          runner: Runner | None = None) -> float:
    """Mean score of one configuration on `seeds`: on `env`, or as parallel jobs on `runner`."""
    make = functools.partial(rival, kind, task_id, values)
    if runner is not None:
        return float(np.mean([o.score for o in runner.map([EpisodeJob(make, task_id, s) for s in seeds])]))
    return float(np.mean([play_episode(env, make(), task_id, s).score for s in seeds]))


def tuning_grid(kind: str, task: TaskSpec) -> tuple[dict[str, tuple[Any, ...]], dict[str, Any]]:
    """(the grid `kind` is tuned over on `task`, the values it starts from): on a prefix-caching task the
    autoscalers' grid gains `cache_affinity` (module docstring)."""
    grid: dict[str, tuple[Any, ...]]
    if kind == "hpa":
        grid, base = HPA_GRID, asdict(HPAParams())
    elif kind == "dynamo_planner":
        grid, base = PLANNER_GRID, asdict(PlannerParams())
    elif kind == "tuned_static":
        grid = STATIC_GRID
        base = {**VLLM_DEFAULT.knobs(), "replicas": task.initial_replicas}
    else:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind != "tuned_static" and task.task_id in PREFIX_TASKS:
        grid = {**grid, "cache_affinity": AFFINITY_GRID}
        base["cache_affinity"] = AFFINITY_START
    return grid, base


def tune_kind(env: EpisodeEnv, kind: str, task_id: str, seeds: Sequence[int], log=print,
              runner: Runner | None = None) -> tuple[dict, float, int]:
    grid, base = tuning_grid(kind, get_task(task_id))
    names = list(grid)

    def values_at(point: tuple[int, ...]) -> dict[str, Any]:
        return {**base, **{n: grid[n][i] for n, i in zip(names, point, strict=True)}}

    start = tuple(grid[n].index(base[n]) if base.get(n) in grid[n] else 0 for n in names)
    starts = [start]
    if "metric" in grid:
        # HPA's target axes each act under one metric only: moving one from the other metric's start changes
        # nothing, so one descent would never try a target under a metric it did not start on. One start each.
        k = names.index("metric")
        starts = [start[:k] + (i,) + start[k + 1:] for i in range(len(grid["metric"]))]
    best, score, evaluated = coordinate_descent(lambda pt: _mean(env, kind, task_id, values_at(pt), seeds, runner),
                                                [len(grid[n]) for n in names], starts,
                                                log=lambda m: log(f"[{task_id} {kind}] {m}"))
    return values_at(best), score, evaluated
