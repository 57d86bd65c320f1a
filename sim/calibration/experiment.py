"""Play a policy on a task in the simulator and summarise the episode (tests, benches, notebooks).

Arrivals come from `shared.workloads`, SLO accounting from `core.metrics`, so a summary measures
exactly what the environment scores; this module only adds episode-level aggregates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmserve_env.core.metrics import MetricsTracker, TenantStats
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import TaskSpec
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.profiles import Profile

Policy = ServeAction | Callable[[int], ServeAction]


@dataclass(slots=True)
class EpisodeSummary:
    arrivals: int = 0
    finished_ok: int = 0
    met: int = 0
    missed: int = 0
    tenants: dict[str, TenantStats] = field(default_factory=dict)  # summed over the episode
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    itl_weighted_sum: float = 0.0
    itl_count: int = 0
    output_tokens: int = 0
    evictions: int = 0
    max_memory_gb: float = 0.0
    quality_sum: float = 0.0
    spec_proposed: int = 0
    spec_accepted: int = 0
    busy_s: float = 0.0
    seconds: float = 0.0
    windows: int = 0

    @property
    def attainment(self) -> float:
        settled = self.met + self.missed
        return self.met / settled if settled else 1.0

    def tenant_attainment(self, tenant: str) -> float:
        return self.tenants[tenant].attainment if tenant in self.tenants else 1.0

    @property
    def worst_tenant_attainment(self) -> float:
        return min(t.attainment for t in self.tenants.values())

    @property
    def goodput_rps(self) -> float:
        return self.met / self.seconds if self.seconds else 0.0

    @property
    def throughput_tps(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_ttft_s(self) -> float:
        return sum(self.ttft_s) / len(self.ttft_s) if self.ttft_s else 0.0

    @property
    def mean_tpot_s(self) -> float:
        return sum(self.tpot_s) / len(self.tpot_s) if self.tpot_s else 0.0

    @property
    def mean_itl_s(self) -> float:
        return self.itl_weighted_sum / self.itl_count if self.itl_count else 0.0

    @property
    def quality(self) -> float:
        return self.quality_sum / self.windows if self.windows else 1.0


def play(task: TaskSpec, policy: Policy, seed: int = 0, profile: str | Profile | None = None) -> EpisodeSummary:
    """Serve one episode of `task` (arrivals from `seed`) with `policy`; summarise it."""
    arrivals = generate_arrivals(task, seed)
    backend = SimBackend(profile if profile is not None else task.profile)
    backend.reset(seed)
    tracker = MetricsTracker(task)
    out = EpisodeSummary(arrivals=len(arrivals))
    wins = windows(arrivals, task)
    for k, win in enumerate(wins):
        action = policy if isinstance(policy, ServeAction) else policy(k)
        report = backend.run_window(action, win, k * task.window_s, task.window_s)
        m = tracker.observe(report, win, final=k == len(wins) - 1)
        out.met += m.slo_met
        out.missed += m.slo_missed
        for name, ts in m.per_tenant.items():
            total = out.tenants.setdefault(name, TenantStats())
            total.arrived += ts.arrived
            total.met += ts.met
            total.missed += ts.missed
        out.ttft_s.extend(x[2] for x in report.first_tokens)
        for r in report.finished:
            if r.status == "ok":
                out.finished_ok += 1
                if r.output_tokens > 1 and r.finish_s is not None and r.first_token_s is not None:
                    out.tpot_s.append((r.finish_s - r.first_token_s) / (r.output_tokens - 1))
        for gap, count in report.itl_samples:
            out.itl_weighted_sum += gap * count
            out.itl_count += count
        out.output_tokens += report.output_tokens
        out.evictions += report.evictions
        out.max_memory_gb = max(out.max_memory_gb, report.gpu_memory_used_gb)
        out.quality_sum += report.quality
        out.spec_proposed += report.spec_proposed
        out.spec_accepted += report.spec_accepted
        out.busy_s += report.busy_s
        out.seconds += task.window_s
        out.windows += 1
    return out
