"""Task definitions: who sends what, how fast, under which SLOs, for how long.

A task fixes the workload (arrival process and request lengths per tenant), the SLOs each
tenant is judged by, the hardware profile the simulator prices steps with, the cost budget, and
the horizon. The arrival streams themselves are generated in `shared.workloads` from
(task, seed) alone, so every policy faces the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """One traffic source and its service-level objectives.

    name           tenant id carried by each Arrival
    priority       0 is the highest (protected by `priority_routing`)
    share          fraction of the task's arrivals from this tenant (shares sum to 1)
    ttft_slo_ms    time to first token, from arrival, that a request must not exceed
    tpot_slo_ms    mean time per output token after the first that it must not exceed
    prompt_tokens  (median, sigma) of a log-normal prompt length, clipped to [min, max]
    output_tokens  (median, sigma) of a log-normal output length, clipped to [min, max]
    """

    name: str
    priority: int
    share: float
    ttft_slo_ms: float
    tpot_slo_ms: float
    prompt_tokens: tuple[float, float]
    output_tokens: tuple[float, float]
    prompt_clip: tuple[int, int] = (8, 8192)
    output_clip: tuple[int, int] = (4, 2048)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task: id, difficulty, description, tenants, arrival process, profile, budget, horizon.

    horizon         windows per episode (the episode ends `done` after the last one)
    window_s        seconds of traffic each step serves
    workload        arrival-process kind and parameters, read by `shared.workloads`
    profile         hardware x model profile id the simulator uses (see sim/profiles)
    cost_budget_per_1k  USD per 1,000 output tokens above which the reward charges a cost penalty
    """

    task_id: str
    difficulty: str
    description: str
    tenants: tuple[TenantSpec, ...]
    workload: dict[str, Any] = field(default_factory=dict)
    horizon: int = 64
    window_s: float = 1.0
    profile: str = "h100-llama3.1-8b"
    cost_budget_per_1k: float = 0.0006

    def tenant(self, name: str) -> TenantSpec:
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    def describe(self) -> dict[str, Any]:
        """The JSON-able description served by `GET /tasks`."""
        return {
            "task_id": self.task_id,
            "difficulty": self.difficulty,
            "description": self.description,
            "horizon": self.horizon,
            "window_s": self.window_s,
            "profile": self.profile,
            "cost_budget_per_1k": self.cost_budget_per_1k,
            "workload": dict(self.workload),
            "tenants": [
                {
                    "name": t.name,
                    "priority": t.priority,
                    "share": t.share,
                    "slo": {"ttft_ms": t.ttft_slo_ms, "tpot_ms": t.tpot_slo_ms},
                    "prompt_tokens_lognormal": {"median": t.prompt_tokens[0], "sigma": t.prompt_tokens[1],
                                                "clip": list(t.prompt_clip)},
                    "output_tokens_lognormal": {"median": t.output_tokens[0], "sigma": t.output_tokens[1],
                                                "clip": list(t.output_clip)},
                }
                for t in self.tenants
            ],
        }


STATIC = TaskSpec(
    task_id="static_workload",
    difficulty="easy",
    description=(
        "Steady Poisson arrivals at 20 req/s of short chat prompts (median 256 tokens in, 128 out) "
        "from one tenant. Teaches the basic batching / KV-budget / latency trade-off."
    ),
    tenants=(
        TenantSpec("chat", 1, 1.0, ttft_slo_ms=500.0, tpot_slo_ms=50.0,
                   prompt_tokens=(256, 0.6), output_tokens=(128, 0.6)),
    ),
    workload={"kind": "poisson", "rate_rps": 20.0},
)

BURSTY = TaskSpec(
    task_id="bursty_workload",
    difficulty="medium",
    description=(
        "Markov-modulated Poisson arrivals switching between a lull (6 req/s) and bursts (55 req/s), "
        "mean dwell 8 windows in a lull and 5 in a burst; chat and longer RAG prompts. The queue swings, "
        "so a policy that adapts to the phase beats any fixed setting."
    ),
    tenants=(
        TenantSpec("chat", 1, 0.7, ttft_slo_ms=600.0, tpot_slo_ms=60.0,
                   prompt_tokens=(384, 0.7), output_tokens=(160, 0.7)),
        TenantSpec("rag", 1, 0.3, ttft_slo_ms=1500.0, tpot_slo_ms=80.0,
                   prompt_tokens=(1536, 0.5), output_tokens=(96, 0.6)),
    ),
    workload={"kind": "mmpp", "rates_rps": [6.0, 55.0], "mean_dwell_windows": [8.0, 5.0]},
)

ADVERSARIAL = TaskSpec(
    task_id="adversarial_multitenant",
    difficulty="hard",
    description=(
        "Three tenants: a priority interactive tenant with tight SLOs, a code tenant, and a batch "
        "summarisation tenant with long prompts (median 3k tokens); a 14 req/s base load with sharp "
        "spikes (x4 for 2-4 windows) from the batch tenant. The worst tenant's SLO attainment counts."
    ),
    tenants=(
        TenantSpec("interactive", 0, 0.45, ttft_slo_ms=300.0, tpot_slo_ms=40.0,
                   prompt_tokens=(192, 0.5), output_tokens=(96, 0.5)),
        TenantSpec("code", 1, 0.30, ttft_slo_ms=800.0, tpot_slo_ms=60.0,
                   prompt_tokens=(768, 0.6), output_tokens=(192, 0.6)),
        TenantSpec("batch", 2, 0.25, ttft_slo_ms=4000.0, tpot_slo_ms=120.0,
                   prompt_tokens=(3072, 0.5), output_tokens=(256, 0.5), prompt_clip=(256, 16384)),
    ),
    workload={"kind": "spiky", "rate_rps": 14.0, "spike_tenant": "batch", "spike_factor": 4.0,
              "spike_prob": 0.08, "spike_len_windows": [2, 4]},
)

TASKS: dict[str, TaskSpec] = {t.task_id: t for t in (STATIC, BURSTY, ADVERSARIAL)}


class UnknownTaskError(KeyError):
    """Raised for a task id that is neither built in nor a `trace:PATH` replay."""

    def __init__(self, task_id: str):
        super().__init__(task_id)
        self.task_id = task_id
        self.valid = sorted(TASKS)

    def __str__(self) -> str:
        return f"unknown task_id {self.task_id!r}; valid task ids: {', '.join(self.valid)} (or 'trace:PATH')"


def get_task(task_id: str) -> TaskSpec:
    """The built-in task named `task_id` (trace replays are resolved by `shared.workloads`)."""
    try:
        return TASKS[task_id]
    except KeyError:
        raise UnknownTaskError(task_id) from None
