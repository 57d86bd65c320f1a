"""`SimBackend`: the simulator behind the `Backend` protocol (the default `sim` mode).

    backend = SimBackend("h100-llama3.1-8b")
    backend.reset(seed)
    report = backend.run_window(action, arrivals, t0, dt)   # one window, requests carried over

Deterministic: the same seed, arrivals and actions give bit-identical reports. The engine's own
randomness (per-request speculative acceptance rates) comes from `reset(seed)` on a stream separate
from the workload's: every arrival's rate is drawn from it in arrival order whatever the action (the
compiled engine draws them once it speculates, sim/array_engine.py: the same numbers).

`fork()` returns an independent copy in the same state (sim/fork.py): what model-based planning
and `Episode.fork` build on.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmserve_env.shared.backend import Arrival, WindowReport
from llmserve_env.shared.models import KNOBS, ServeAction
from llmserve_env.sim.array_engine import ArrayEngine, make_engine
from llmserve_env.sim.engine import Engine
from llmserve_env.sim.fork import fork_engine
from llmserve_env.sim.measured_step import measured_models
from llmserve_env.sim.profiles import Profile, load_profile
from llmserve_env.sim.step_time import IterationModel

# Step-time models are pure functions of (profile, tier, lane) and take ~2 ms each to tabulate; the
# server builds one backend per episode, so they are kept per profile object across backends.
_MODELS: dict[str, tuple[Profile, dict[tuple[str, str], IterationModel]]] = {}


def _models_for(profile: Profile) -> dict[tuple[str, str], IterationModel]:
    cached = _MODELS.get(profile.id)
    if cached is None or cached[0] is not profile:  # a re-loaded or hand-made profile gets fresh models
        # a profile fitted to another engine's records brings its own iteration times (sim/measured_step.py)
        cached = _MODELS[profile.id] = (profile, dict(measured_models(profile)))
    return cached[1]


class SimBackend:
    """A calibrated, event-driven simulation of one vLLM-style serving replica."""

    name = "sim"

    def __init__(self, profile_id: str | Profile = "h100-llama3.1-8b"):
        self.profile = profile_id if isinstance(profile_id, Profile) else load_profile(profile_id)
        self._models = _models_for(self.profile)
        self._engine: Engine | ArrayEngine = make_engine(self.profile, 0, self._models)

    def reset(self, seed: int) -> None:
        self._engine = make_engine(self.profile, seed, self._models)

    def run_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float, dt: float) -> WindowReport:
        eng = self._engine
        pending, used, mem, acc = eng.serve_window(action, arrivals, t0, dt)
        p = self.profile
        applied = dict.fromkeys(KNOBS, True)  # the simulator honours every knob
        if action.cache_affinity is not None:
            applied["cache_affinity"] = False  # one replica: there is nothing to route
        return WindowReport(
            t0=t0, dt=dt, finished=acc.finished, pending=pending, first_tokens=acc.first_tokens,
            itl_samples=acc.itl, samples=acc.samples, output_tokens=acc.output_tokens,
            prompt_tokens=acc.prompt_tokens, evictions=acc.evictions, spec_proposed=acc.spec_proposed,
            spec_accepted=int(round(acc.spec_accepted)), busy_s=acc.busy, gpu_memory_used_gb=mem,
            kv_occupancy=used / eng.kv.total if eng.kv.total else 0.0,
            cost_usd=dt * p.tp * p.price_per_gpu_hour / 3600.0, quality=p.tiers[action.quantization_tier].quality,
            applied=applied,
            notes={"profile": p.id, "iterations": acc.iterations, "kv_blocks_total": eng.kv.total,
                   "kv_blocks_used": used, "rejected": acc.rejected},
            prefix_query_tokens=acc.prefix_query, prefix_hit_tokens=acc.prefix_hit,
            prefix_cached_blocks=eng.cached_blocks,
        )

    def fork(self) -> SimBackend:
        """An independent copy in the same state (queues, KV cache, clocks, random stream): the same
        window run on both gives bit-identical reports. The profile and step-time models are shared."""
        return fork_engine(self, shared=(self._models, *self._models.values()))

    def close(self) -> None:
        self._engine = make_engine(self.profile, 0, self._models)
