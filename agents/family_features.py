"""The learned policy's view of a scenario family (issue 28): richer inputs and a replica COUNT head.

The fixed-day encoding (agents/encoding.py, `FeatureView`) gives the actor one window of arrivals and
a replica head that moves the target by ±1 a window. On a family the day moves from seed to seed, so a
policy must read the day off the observations as they come, and a cold start is 9 windows: ±1 a
window cannot catch a ramp it sees late. This view (encoding `FAMILY_ENCODING`, named in the weights'
JSON under "encoding") adds, every input read from the observation alone (its numeric fields and
`metadata["cluster"]`, which the Gym fast path's `ObservedWindow` carries too; nothing of the drawn day):

- time of day: the fixed-day encoder's sine and cosine of the next window's phase, plus the second
  harmonic (a day with a peak and a trough is not one sinusoid in the features an MLP gets);
- arrival-rate history per tenant (`metadata.cluster.arrival_rate_by_tenant`): the last `LAGS`
  windows, an exponential average (`EMA_ALPHA`) and the most of the last `MAX_WINDOWS`, kept in this
  object and reset per episode (the actor is numpy-only and has no recurrent core); the total rate
  per ready replica and its change over 3 windows;
- announced jobs (`metadata.cluster.announced_jobs`) per tenant: the rate announced for the next
  window, for a cold start ahead and the most over the next cold start, windows until the next
  announced start and until the running one ends;
- replicas by state: the fixed-day encoder's target, ready, starting, draining and next-ready share,
  plus the three soonest starts' remaining cold start, replicas ready within 3 windows, and the queue
  per ready replica.

Action: the six knob heads of agents/encoding.py and a COUNT head, one choice per replica count of the
task's range (lo .. hi): the replicas asked for this window, an absolute target. A sampled count
would start and drain replicas at random under PPO's exploration (encoding.py's reason for ±1); these
weights start from DAgger (tools/dagger.py), whose heads are already confident, so the count is
sampled near the cloned target and PPO explores around it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from llmserve_env.agents.encoding import (
    ACTION_NVEC,
    OBS_HIGH,
    SINGLE,
    ObservationEncoder,
    Replicas,
    decode_action,
    encode_action,
    feature_names,
)
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TaskSpec
from llmserve_env.shared.workloads import resolve_task

FAMILY_ENCODING = "family-v1"
LAGS = 4            # windows of arrival-rate history per tenant
EMA_ALPHA = 0.25    # the exponential average's weight on the newest window
MAX_WINDOWS = 8     # the most over this many windows (a flash crowd's height after it starts)
COLD_WINDOWS = 9    # a cold start in windows (87.4 s / 10 s): how far ahead the announced-jobs features look
RATE_TOP = 100.0    # req/s at which a rate feature reaches 1 (log scale); the families stay under ~60
STARTS = 3          # soonest starting replicas whose remaining cold start is an input


def _log(x: float, top: float) -> float:
    return math.log1p(max(x, 0.0)) / math.log1p(top)


def family_feature_names(tenants: Sequence[str], replicas: Replicas) -> tuple[str, ...]:
    """Every input's name, in order: the fixed-day encoder's, then this view's."""
    names = list(feature_names(replicas))
    names += ["time_of_day_sin2", "time_of_day_cos2"]
    for t in tenants:
        names += [f"rate_{t}_lag{i}" for i in range(1, LAGS + 1)]
        names += [f"rate_{t}_ema", f"rate_{t}_max{MAX_WINDOWS}"]
    names += ["rate_per_ready_replica", "rate_change_3"]
    for t in tenants:
        names += [f"jobs_{t}_next", f"jobs_{t}_cold_ahead", f"jobs_{t}_max_cold", f"jobs_{t}_to_start",
                  f"jobs_{t}_to_end"]
    names += [f"start_{i}_ready_in" for i in range(STARTS)]
    names += ["ready_within_3", "queue_per_ready", "preempted"]
    return tuple(names)


def family_shape(tenants: Sequence[str], replicas: Replicas) -> tuple[tuple[int, ...], int]:
    """(action grid, feature count): the six knobs plus the count head (hi - lo + 1 choices)."""
    return ACTION_NVEC + (replicas[1] - replicas[0] + 1,), len(family_feature_names(tenants, replicas))


def is_family_encoding(meta: Mapping[str, Any]) -> bool:
    """Weights trained on this view (their JSON says so); every other weight file is the fixed-day view."""
    return meta.get("encoding") == FAMILY_ENCODING


class FamilyView:
    """Features and action decoding of the family encoding (the interface of advice.FeatureView:
    `nvec`, `dim`, `reset`, `features`, `decode`, `encoder.current_replicas`), plus `encode`: a
    teacher's action as this grid's indices (DAgger's labels)."""

    def __init__(self, task: TaskSpec | str):
        self.task = resolve_task(task) if isinstance(task, str) else task
        if not self.task.is_cluster:
            raise ValueError(f"{self.task.task_id!r} is a single-server task: the family view has a replica count head")
        self.replicas: Replicas = self.task.replicas
        self.tenants = [t.name for t in self.task.tenants]
        self.nvec, self.dim = family_shape(self.tenants, self.replicas)
        self.names = family_feature_names(self.tenants, self.replicas)
        self.encoder = ObservationEncoder(self.task.horizon, self.replicas)
        self.reset()

    def reset(self) -> None:
        self.encoder.reset()
        self._rates: dict[str, deque[float]] = {t: deque(maxlen=max(LAGS, MAX_WINDOWS)) for t in self.tenants}
        self._ema: dict[str, float | None] = dict.fromkeys(self.tenants)
        self._totals: deque[float] = deque(maxlen=4)

    # ------------------------------------------------------------------------------------ inputs

    def _observe_rates(self, cluster: Mapping[str, Any]) -> None:
        by = cluster.get("arrival_rate_by_tenant")
        if by is None:  # the reset observation: no window served yet
            return
        for t in self.tenants:
            r = float(by.get(t, 0.0))
            self._rates[t].appendleft(r)
            prev = self._ema[t]
            self._ema[t] = r if prev is None else prev + EMA_ALPHA * (r - prev)
        self._totals.appendleft(sum(float(by.get(t, 0.0)) for t in self.tenants))

    def _job_features(self, cluster: Mapping[str, Any], k: int) -> list[float]:
        jobs = cluster.get("announced_jobs") or []
        out: list[float] = []
        for t in self.tenants:
            rate = np.zeros(COLD_WINDOWS + 1)  # announced req/s in windows k .. k + COLD_WINDOWS
            to_start, to_end = 2 * COLD_WINDOWS, 0
            for j in jobs:
                if j.get("tenant") != t:
                    continue
                s, n, r = int(j["start_window"]), int(j["windows"]), float(j["rate_rps"])
                lo, hi = max(s - k, 0), min(s + n - k, COLD_WINDOWS + 1)
                if hi > lo:
                    rate[lo:hi] += r
                if s > k:
                    to_start = min(to_start, s - k)
                elif s + n > k:
                    to_end = max(to_end, s + n - k)
            out += [_log(rate[0], RATE_TOP), _log(rate[-1], RATE_TOP), _log(float(rate.max()), RATE_TOP),
                    to_start / (2 * COLD_WINDOWS), min(to_end / (2 * COLD_WINDOWS), 1.0)]
        return out

    def features(self, obs: ServeObservation) -> np.ndarray:
        base = self.encoder.encode(obs)
        c = (obs.metadata or {}).get("cluster") or {}
        self._observe_rates(c)
        cycle = int(c.get("cycle_windows") or 0)
        phase = 2.0 * math.pi * int(c.get("window_in_cycle", 0)) / cycle if cycle else 0.0
        feats: list[float] = [0.5 * (math.sin(2 * phase) + 1.0), 0.5 * (math.cos(2 * phase) + 1.0)]
        for t in self.tenants:
            hist = list(self._rates[t])
            lags = hist[:LAGS] + [hist[-1] if hist else 0.0] * (LAGS - len(hist[:LAGS]))
            feats += [_log(x, RATE_TOP) for x in lags]
            feats += [_log(self._ema[t] or 0.0, RATE_TOP), _log(max(hist[:MAX_WINDOWS], default=0.0), RATE_TOP)]
        ready = max(int(c.get("ready", 0)), 1)
        total = self._totals[0] if self._totals else 0.0
        older = self._totals[-1] if self._totals else 0.0
        # log-ratio of the newest total rate to the one 3 windows before, clipped to ±1 and shifted into [0, 1]
        change = math.log((total + 1.0) / (older + 1.0)) if len(self._totals) > 1 else 0.0
        feats += [_log(total / ready, RATE_TOP), 0.5 * (max(-1.0, min(1.0, change)) + 1.0)]
        feats += self._job_features(c, int(obs.step_index))
        cold = float(c.get("cold_start_s") or 0.0)
        ready_in = sorted(float(x) for x in (c.get("starting_ready_in_s") or []))
        shares = [x / cold if cold > 0 else 0.0 for x in ready_in[:STARTS]]
        feats += shares + [0.0] * (STARTS - len(shares))
        window_s = self.task.window_s
        soon = sum(1 for x in ready_in if x <= 3 * window_s)
        top = float(self.replicas[1])
        feats += [(int(c.get("ready", 0)) + soon) / top, _log(obs.queue_depth / ready, 1000.0),
                  min(float(c.get("preempted", 0)) / 4.0, 1.0)]
        x = np.concatenate([base, np.asarray(feats, dtype=np.float32)])
        return np.clip(x, 0.0, OBS_HIGH)

    # ----------------------------------------------------------------------------------- actions

    def decode(self, idx: Sequence[int] | np.ndarray) -> ServeAction:
        """The knobs of idx[:6] and the replica count lo + idx[6]."""
        if len(idx) != len(self.nvec):
            raise ValueError(f"expected {len(self.nvec)} action indices, got {len(idx)}")
        count = self.replicas[0] + int(idx[6])
        action = decode_action(idx[:6], SINGLE).model_copy(update={"replicas": count})
        self.encoder.record_action(action)
        return action

    def encode(self, action: ServeAction) -> np.ndarray:
        """`action` as this grid's indices: its knobs' nearest grid points and its replica count (the
        count asked for so far when it names none), kept in the task's range."""
        current = self.encoder.current_replicas if self.encoder.current_replicas is not None else \
            self.task.initial_replicas
        n = action.replicas if action.replicas is not None else current
        lo, hi = self.replicas
        return np.concatenate([encode_action(action, SINGLE), [min(max(int(n), lo), hi) - lo]]).astype(np.int64)

    def meta(self) -> dict[str, Any]:
        """What the weights' JSON records of this view (ActorWeights and PPOPolicy read it back)."""
        return {"encoding": FAMILY_ENCODING, "tenants": list(self.tenants), "feature_names": list(self.names)}
