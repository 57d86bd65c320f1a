"""Task definitions: who sends what, how fast, under which SLOs, for how long.

A task fixes the workload (arrival process and request lengths per tenant), the SLOs each
tenant is judged by, the hardware profile the simulator prices steps with, the cost budget, and
the horizon. The arrival streams themselves are generated in `shared.workloads` from
(task, seed) alone, so every policy faces the same requests.

The grader's reference points need what an ideal server and a naive one can do on the task's
profile: `ProfileCapacity` holds those figures per profile id (see `PROFILE_CAPACITY`).

| task                    | arrivals                                         | tenants: prompt/output median, SLO TTFT/TPOT              | horizon |
|-------------------------|--------------------------------------------------|-----------------------------------------------------------|---------|
| static_workload         | Poisson 50 req/s                                 | chat 256/128 tok, 500/50 ms                               | 64 x 1 s |
| bursty_workload         | MMPP 20 <-> 42 req/s, dwell 8 s / 5 s            | chat 70 % 384/160, 600/60 ms; rag 30 % 1536/96, 1500/80 ms | 64 x 1 s |
| adversarial_multitenant | 18 req/s + batch spikes x2.5 (2-4 s, p 0.08/s)   | interactive (priority 0) 45 % 192/96, 300/40 ms; code 30 % 768/192, 800/60 ms; batch 25 % 3072/256, 4000/120 ms | 64 x 1 s |
| azure_conv_trace        | Azure 2023 conversation trace, seeded stretch, 28k tokens/s (~20 req/s) | trace 1020/129 (measured), 1000/60 ms | 64 x 1 s |
| diurnal_autoscale       | daily cycle 10 -> 30 req/s (peak 14:00), 1-8 replicas | chat 2048/384, 1000/60 ms                             | 48 x 10 s |
| multitenant_autoscale   | interactive cycle 4 -> 16 req/s + batch jobs at 03:00 and 15:00, 1-8 replicas | interactive (priority 0) 2048/384, 1000/60 ms; batch 4096/512, 20 s/150 ms | 48 x 10 s |

| diurnal_family          | diurnal_autoscale's day drawn per seed: peak 12:30-15:30, load x0.85-1.15, peak/trough 2.5-3.5, AR(1) noise, flash crowds, spot preemption, cold-start jitter | as diurnal_autoscale | 48 x 10 s |
| multitenant_family      | multitenant_autoscale's day drawn per seed, its two jobs at random start/length/rate, half announced 1-3 h ahead, ad-hoc jobs | as multitenant_autoscale | 48 x 10 s |
| *_family_shifted        | the shifted tests: peaks 08:00-11:00, load x1.2-1.4 (jobs at 06:00-08:00 and 19:00-21:00) | as their family | 48 x 10 s |
| mooncake_cluster        | Mooncake conversation trace at its own pace (3.4 req/s), seeded 20-minute stretch, 512-token prefix ids, 1-8 replicas | trace 6909/350 (measured), 2000/60 ms | 60 x 20 s |
| multiturn_cluster       | multi-turn chat, conversation starts on the daily cycle (peak 12 conv/s at 14:00, a third at 02:00), 16-token prefix ids, 1-8 replicas | chat 200/250 per turn (prompts carry the history), 1000/60 ms | 48 x 10 s |

The last eight are cluster tasks (the last two, `PREFIX_TASKS`, cache prefixes: issue 32) (`TaskSpec.replicas` allows more than one replica; `sim/cluster.py`);
`SINGLE_SERVER_TASKS` and `CLUSTER_TASKS` split `TASKS` into the two kinds, and `FAMILY_TASKS` names
the scenario families (shared/scenarios.py) among the cluster tasks.

The loads sit near what a well-set engine sustains on the default profile (the vLLM-like default
keeps up with static_workload up to about 60 req/s), so a careless setting builds a queue that
costs SLOs; see tests/test_policy_floors.py for the properties this tuning pins.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from llmserve_env.shared.scenarios import AWS_SPOT_TOP_BUCKET_PER_HOUR, FAMILY_SOURCES

# The longest episode any task (built-in or trace replay) may have; bounds episode logs too.
MAX_HORIZON = 1024


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
                   (trace replays: the measured median and log-sigma of the replayed slice,
                   for description only; the lengths come from the trace)
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
class ProfileCapacity:
    """What an ideal server and a naive server can do on one hardware x model profile.

    The grader's upper reference is an ideal server that spends 1 / peak_tokens_per_s GPU-seconds
    on every token (prompt or output) under any knob setting, and emits a request's output
    tokens at best min_itl_ms apart. Its floor is a naive server that runs one request at a time
    (FP16, no speculation): a prefill pass of serial_itl_ms + prompt / serial_prefill_tps, then one
    serial_itl_ms step per further output token.

    peak_tokens_per_s   most tokens (prompt or output) the GPU can process per second, any tier
    min_itl_ms          shortest possible gap between two output tokens of one request
    serial_prefill_tps  prompt tokens/s of one request alone (FP16)
    serial_itl_ms       decode step of one request alone (FP16, no speculation)
    source              where the figures come from, and the command that recomputes them
    """

    profile: str
    peak_tokens_per_s: float
    min_itl_ms: float
    serial_prefill_tps: float
    serial_itl_ms: float
    source: str

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "peak_tokens_per_s": self.peak_tokens_per_s,
            "min_itl_ms": self.min_itl_ms,
            "serial_prefill_tps": self.serial_prefill_tps,
            "serial_itl_ms": self.serial_itl_ms,
            "source": self.source,
        }


def _h100_llama31_8b_published() -> ProfileCapacity:
    """H100 SXM x Llama-3.1-8B from published figures (/work/shared/data/README.md).

    Why these numbers: a token costs 2 x 8.03e9 FLOPs in the linear layers; H100 SXM peaks at
    989 TFLOP/s dense BF16 with 72-76 % reachable (76 % taken), and FP8 GEMMs are at most 1.55x
    faster, so no tier processes more than 989e12 x 0.76 x 1.55 / 1.606e10 = 72.5k tokens/s
    (attention FLOPs only lower real rates, so this stays an upper bound). The fastest token
    gap reads INT4 weights (4.0 GB) once at the full 3.35 TB/s and emits at most 9 tokens per
    verification step (speculation depth 8). The naive server is FP16 at 76 % of peak compute
    for prefill (46.8k tokens/s) and a 6.5 ms batch-1 decode step (measured vLLM TPOT,
    InferenceBench as cited by issue 15; the kernel tables' worked example, 7-8 ms, was a kernel
    sum that left the host overhead double-counted in the simulator's anchor).
    """
    flops_per_token = 2 * 8.03e9
    bf16_eff = 989e12 * 0.76
    return ProfileCapacity(
        profile="h100-llama3.1-8b",
        peak_tokens_per_s=round(bf16_eff * 1.55 / flops_per_token, 1),
        min_itl_ms=round(4.0e9 / 3.35e12 / 9 * 1e3, 4),
        serial_prefill_tps=round(bf16_eff / flops_per_token, 1),
        serial_itl_ms=6.5,
        source=(
            "published figures (shared/data/README.md: H100 989 TFLOP/s at 76 %, FP8 GEMM 1.55x, "
            "3.35 TB/s; measured batch-1 vLLM TPOT 6.5 ms); derivation in shared.tasks._h100_llama31_8b_published"
        ),
    )


PROFILE_CAPACITY: dict[str, ProfileCapacity] = {
    c.profile: c for c in (_h100_llama31_8b_published(),)
}


def is_cluster_range(replicas: tuple[int, int]) -> bool:
    """Whether a (min, max) replica range is a cluster's: more than one replica allowed. TaskSpec.is_cluster,
    and trained weights, which know only the range they were trained for (agents/encoding.py)."""
    return replicas[1] > 1


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task: id, difficulty, description, tenants, arrival process, profile, budget, horizon.

    horizon         windows per episode (the episode ends `done` after the last one)
    window_s        seconds of traffic each step serves
    workload        arrival-process kind and parameters, read by `shared.workloads`
    profile         hardware x model profile id the simulator uses (see sim/profiles)
    cost_budget_per_1k  USD per 1,000 output tokens above which the reward charges a cost penalty
    replicas        (min, max) serving replicas an action may ask for; (1, 1) for a single server, and
                    any other value of `ServeAction.replicas` is refused (HTTP 422) naming the range
    initial_replicas  replicas ready when the episode starts (cluster tasks)
    floor_replicas  the grader's floor: this many naive one-request-at-a-time servers
    cycle_windows   windows per daily cycle (0: no cycle); the observation's metadata shows the
                    window's place in it on cluster tasks
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
    replicas: tuple[int, int] = (1, 1)
    initial_replicas: int = 1
    floor_replicas: int = 1
    cycle_windows: int = 0
    # Derived once here, not per read: every step's observation asks both (a property was three calls of
    # a /step's own path, issue 25).
    # A task whose actions may scale the replica count (served by sim/cluster.py).
    is_cluster: bool = field(init=False, repr=False, compare=False)
    # Whether the task's arrivals carry prefix ids (issue 32, shared/prefix.py): its engines cache prefixes
    # and its observations carry prefix_hit_rate and prefix_cached_blocks.
    caches_prefixes: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_cluster", is_cluster_range(self.replicas))
        object.__setattr__(self, "caches_prefixes",
                           self.workload.get("kind") == "multiturn" or "prefix_block_tokens" in self.workload)

    def tenant(self, name: str) -> TenantSpec:
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    def capacity(self) -> ProfileCapacity:
        """The reference capacity figures of this task's profile (KeyError if none are known)."""
        return PROFILE_CAPACITY[self.profile]

    def describe(self) -> dict[str, Any]:
        """The JSON-able description served by `GET /tasks` (a prefix-caching task adds `prefix_caching`)."""
        trace = self.workload.get("kind") == "trace"
        prefix = {"prefix_caching": {
            "observation": ["prefix_hit_rate", "prefix_cached_blocks"],
            "action": "cache_affinity 0..1: a replica's cached share of a request against its load when "
                      "routing (cluster tasks; absent = least outstanding work)",
        }} if self.caches_prefixes else {}
        return {
            "task_id": self.task_id,
            "difficulty": self.difficulty,
            "description": self.description,
            "horizon": self.horizon,
            "window_s": self.window_s,
            "profile": self.profile,
            "cost_budget_per_1k": self.cost_budget_per_1k,
            "replicas": {"min": self.replicas[0], "max": self.replicas[1], "initial": self.initial_replicas},
            "cycle_windows": self.cycle_windows,
            "workload": dict(self.workload),
            "grader_capacity": PROFILE_CAPACITY[self.profile].describe() if self.profile in PROFILE_CAPACITY else None,
            "tenants": [
                {
                    "name": t.name,
                    "priority": t.priority,
                    "share": t.share,
                    "slo": {"ttft_ms": t.ttft_slo_ms, "tpot_ms": t.tpot_slo_ms},
                    "lengths": "replayed from the trace (median, sigma describe the replayed slice)"
                    if trace else "log-normal, clipped",
                    "prompt_tokens_lognormal": {"median": t.prompt_tokens[0], "sigma": t.prompt_tokens[1],
                                                "clip": list(t.prompt_clip)},
                    "output_tokens_lognormal": {"median": t.output_tokens[0], "sigma": t.output_tokens[1],
                                                "clip": list(t.output_clip)},
                }
                for t in self.tenants
            ],
            **prefix,
        }


STATIC = TaskSpec(
    task_id="static_workload",
    difficulty="easy",
    description=(
        "Steady Poisson arrivals at 50 req/s of short chat prompts (median 256 tokens in, 128 out) "
        "from one tenant; SLOs TTFT 500 ms, TPOT 50 ms; 64 windows of 1 s. Near the engine's capacity, "
        "so batching, KV budget, speculation and disaggregation must be set with care."
    ),
    tenants=(
        TenantSpec("chat", 1, 1.0, ttft_slo_ms=500.0, tpot_slo_ms=50.0,
                   prompt_tokens=(256, 0.6), output_tokens=(128, 0.6)),
    ),
    workload={"kind": "poisson", "rate_rps": 50.0},
)

BURSTY = TaskSpec(
    task_id="bursty_workload",
    difficulty="medium",
    description=(
        "Markov-modulated Poisson arrivals switching between a lull (20 req/s) and bursts (42 req/s), "
        "mean dwell 8 s in a lull and 5 s in a burst; 70 % chat (median 384 in / 160 out, TTFT 600 ms, "
        "TPOT 60 ms) and 30 % RAG (median 1536 in / 96 out, TTFT 1500 ms, TPOT 80 ms); 64 windows "
        "of 1 s. The queue swings, so a policy that adapts to the phase beats any fixed setting."
    ),
    tenants=(
        TenantSpec("chat", 1, 0.7, ttft_slo_ms=600.0, tpot_slo_ms=60.0,
                   prompt_tokens=(384, 0.7), output_tokens=(160, 0.7)),
        TenantSpec("rag", 1, 0.3, ttft_slo_ms=1500.0, tpot_slo_ms=80.0,
                   prompt_tokens=(1536, 0.5), output_tokens=(96, 0.6)),
    ),
    workload={"kind": "mmpp", "rates_rps": [20.0, 42.0], "mean_dwell_windows": [8.0, 5.0]},
)

ADVERSARIAL = TaskSpec(
    task_id="adversarial_multitenant",
    difficulty="hard",
    description=(
        "Three tenants: a priority interactive tenant (45 %, median 192 in / 96 out, TTFT 300 ms, "
        "TPOT 40 ms), a code tenant (30 %, 768 in / 192 out, TTFT 800 ms, TPOT 60 ms) and a batch "
        "summarisation tenant (25 %, median 3k-token prompts / 256 out, TTFT 4 s, TPOT 120 ms); an "
        "18 req/s base load with sharp spikes from the batch tenant (x2.5 for 2-4 windows, started "
        "with probability 0.08 per window); 64 windows of 1 s. The worst tenant's SLO attainment counts."
    ),
    tenants=(
        TenantSpec("interactive", 0, 0.45, ttft_slo_ms=300.0, tpot_slo_ms=40.0,
                   prompt_tokens=(192, 0.5), output_tokens=(96, 0.5)),
        TenantSpec("code", 1, 0.30, ttft_slo_ms=800.0, tpot_slo_ms=60.0,
                   prompt_tokens=(768, 0.6), output_tokens=(192, 0.6)),
        TenantSpec("batch", 2, 0.25, ttft_slo_ms=4000.0, tpot_slo_ms=120.0,
                   prompt_tokens=(3072, 0.5), output_tokens=(256, 0.5), prompt_clip=(256, 16384)),
    ),
    workload={"kind": "spiky", "rate_rps": 18.0, "spike_tenant": "batch", "spike_factor": 2.5,
              "spike_prob": 0.08, "spike_len_windows": [2, 4]},
)

# The shipped Azure 2023 conversation trace (shared/data/azure_conv_2023.csv, 19,366 requests over
# about an hour): each seed replays the consecutive requests, from a seeded start, that hold
# 28,000 prompt + output tokens per episode second (1.8M tokens: about 1,150-1,700 requests),
# time-scaled to fit the 64 s. The tenant's length parameters are the whole trace's measured
# median and log-sigma (tests/test_traces.py recomputes them).
AZURE_CONV_TRACE = TaskSpec(
    task_id="azure_conv_trace",
    difficulty="medium",
    description=(
        "Replay of the Azure LLM inference trace 2023 (conversation; Microsoft Azure Public Dataset, "
        "CC-BY 4.0): each seed picks a stretch of consecutive real requests holding 28,000 tokens "
        "(prompt + output) per second of episode, about 20 req/s, keeping the trace's own bursts and "
        "lengths (median 1020 tokens in, 129 out, long tails); one tenant with TTFT 1000 ms and TPOT "
        "60 ms; 64 windows of 1 s."
    ),
    tenants=(
        TenantSpec("trace", 1, 1.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0,
                   prompt_tokens=(1020.0, 0.985), output_tokens=(129.0, 0.859),
                   prompt_clip=(1, 1 << 20), output_clip=(1, 1 << 20)),
    ),
    workload={"kind": "trace", "packaged": "azure_conv_2023.csv", "tokens_per_s": 28000.0},
)

# ---------------------------------------------------------------------------------------- cluster tasks
# A compressed day: 48 windows of 10 s (one window = 30 minutes of the day). The replica physics is not
# compressed: a replica of the profile takes its cold start (87 s on h100-llama3.1-8b: 8.7 windows) from
# request to serving, billed throughout, so scaling for a ramp must start well before it.
#
# Daily shape: a raised cosine between trough and peak, peak at 14:00 (window 28), trough at 02:00, with
# a log-normal factor (sigma 0.15) per window and tenant on top of Poisson arrivals. Peak/trough = 3 is an
# ASSUMPTION in the range production LLM services show (daytime peaks a few times the night-time trough:
# BurstGPT, Wang et al. 2024, arXiv:2401.17644, Azure OpenAI conversation logs over 213 days; SageServe,
# Jaiswal et al. 2025, arXiv:2502.14617, Microsoft O365 traffic); the figure itself was not read off a
# trace. A user replays their own traffic with `trace:PATH?replicas=8` instead.
# One replica of h100-llama3.1-8b under vLLM's defaults meets ~95 % of the SLOs below at 6 req/s of the
# diurnal chat mix and ~52 % at 7 req/s (measured: 12 windows of 10 s, Poisson), so the 30 req/s peak
# needs about 5 replicas and the 10 req/s trough 2. (Heavier requests at lower rates than the
# single-server tasks keep a whole simulated day of up to 8 engines near a second of CPU.)
CLUSTER_DAY = {"cycle_windows": 48, "peak_window": 28, "noise_sigma": 0.15}

DIURNAL_AUTOSCALE = TaskSpec(
    task_id="diurnal_autoscale",
    difficulty="hard",
    description=(
        "A cluster of 1-8 replicas (Llama-3.1-8B on H100 each) serving a chat tenant (median 2048 in / "
        "384 out, TTFT 1000 ms, TPOT 60 ms) through a day compressed into 48 windows of 10 s: Poisson "
        "arrivals on a raised-cosine daily cycle from 10 req/s at 02:00 to 30 req/s at 14:00, with "
        "log-normal per-window noise. A replica is billed from the moment it is requested and serves "
        "only after its 87 s cold start (weights plus engine start-up), so scaling must lead the ramp; "
        "idle replicas cost money. Starts with 2 replicas ready."
    ),
    tenants=(
        TenantSpec("chat", 1, 1.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0,
                   prompt_tokens=(2048, 0.7), output_tokens=(384, 0.6)),
    ),
    workload={"kind": "cycle", **CLUSTER_DAY, "tenants": {"chat": {"trough_rps": 10.0, "peak_rps": 30.0}}},
    horizon=48,
    window_s=10.0,
    cost_budget_per_1k=0.0003,
    replicas=(1, 8),
    initial_replicas=2,
    floor_replicas=2,
    cycle_windows=48,
)

MULTITENANT_AUTOSCALE = TaskSpec(
    task_id="multitenant_autoscale",
    difficulty="hard",
    description=(
        "A cluster of 1-8 replicas serving two tenants through a day compressed into 48 windows of 10 s: "
        "an interactive tenant (priority 0, median 2048 in / 384 out, TTFT 1000 ms, TPOT 60 ms) on a daily "
        "cycle from 4 req/s at 02:00 to 16 req/s at 14:00, and a batch tenant (priority 2, median 4096 in "
        "/ 512 out, TTFT 20 s, TPOT 150 ms) whose jobs start at scheduled times every day: 03:00 for 3 hours "
        "at 4 req/s and 15:00 for 2 hours at 4 req/s. Replicas take 87 s to start and are billed "
        "throughout; the worst tenant's SLO attainment counts. Starts with 2 replicas ready."
    ),
    tenants=(
        TenantSpec("interactive", 0, 0.75, ttft_slo_ms=1000.0, tpot_slo_ms=60.0,
                   prompt_tokens=(2048, 0.7), output_tokens=(384, 0.6)),
        TenantSpec("batch", 2, 0.25, ttft_slo_ms=20000.0, tpot_slo_ms=150.0,
                   prompt_tokens=(4096, 0.5), output_tokens=(512, 0.5), prompt_clip=(256, 16384)),
    ),
    workload={"kind": "cycle", **CLUSTER_DAY,
              "tenants": {"interactive": {"trough_rps": 4.0, "peak_rps": 16.0}},
              "jobs": [{"tenant": "batch", "start_window": 6, "windows": 6, "rate_rps": 4.0},
                       {"tenant": "batch", "start_window": 30, "windows": 4, "rate_rps": 4.0}]},
    horizon=48,
    window_s=10.0,
    cost_budget_per_1k=0.0003,
    replicas=(1, 8),
    initial_replicas=2,
    floor_replicas=2,
    cycle_windows=48,
)

# ---------------------------------------------------------------------------------------- scenario families
# The two cluster tasks above play the same published day on every seed, so an open-loop schedule read
# off the task is near optimal (issue 26). A family task draws each seed's day from the distribution in
# `workload["family"]` (shared/scenarios.py: the keys, the draw, and the source or ASSUMPTION of every
# range in FAMILY_SOURCES); the rest of `workload` is the NOMINAL day it publishes, in the keys the
# fixed-day tasks use. The training families' nominal day is exactly the fixed-day task's (every range
# is centred on it). A shifted family (shared/splits.py: the `shifted` split) draws from ranges outside
# the training family's and publishes the training family's nominal day: what an operator knew before
# the world moved. Tenants, SLOs, replicas, budget and horizon are the fixed-day task's.
_FAMILY_COMMON = {
    "level": [0.85, 1.15],
    "peak_to_trough": [2.5, 3.5],
    "noise": {"phi": 0.7, "sigma": 0.15},
    "preemption_per_replica_hour": round(AWS_SPOT_TOP_BUCKET_PER_HOUR, 7),
    "cold_start_sigma": 0.15,
}
_SHIFT = {"peak_window": [16.0, 22.0], "level": [1.2, 1.4]}  # peaks 08:00-11:00, 20-40 % more load


def _family(base: TaskSpec, task_id: str, ranges: dict[str, Any], description: str,
            shifted_from: str | None = None) -> TaskSpec:
    family = {**ranges, "sources": FAMILY_SOURCES}
    if shifted_from is not None:
        family["published_day"] = f"the nominal day of {shifted_from} (the training family), not this one's"
    return replace(base, task_id=task_id, description=description,
                   workload={**base.workload, "family": family})


_DIURNAL_RANGES = {
    **_FAMILY_COMMON,
    "peak_window": [25.0, 31.0],  # 12:30-15:30
    "flash_crowds": {"per_day": 0.5, "tenant": "chat", "factor": [1.5, 2.5], "windows": [1, 4]},
}
_FAMILY_TAIL = (
    "A replica is billed from its request and serves after its cold start (87 s, log-normal jitter "
    "sigma 0.15); spot replicas are reclaimed at AWS's top interruption rate (2.8e-4 per replica-hour of "
    "the day) and replaced by a new request. 48 windows of 10 s; starts with 2 replicas ready. Ranges and "
    "their sources: workload.family."
)
DIURNAL_FAMILY = _family(
    DIURNAL_AUTOSCALE, "diurnal_family", _DIURNAL_RANGES,
    "diurnal_autoscale's cluster (1-8 replicas) and chat tenant (median 2048 in / 384 out, TTFT 1000 ms, "
    "TPOT 60 ms), but every seed draws its own day: peak between 12:30 and 15:30, mean load x0.85-1.15 of "
    "the published 20 req/s, peak/trough 2.5-3.5, autocorrelated noise (AR(1) log-rate, sigma 0.15) and "
    "0.5 flash crowds a day (x1.5-2.5 for 0.5-2 h). The published day is diurnal_autoscale's. " + _FAMILY_TAIL,
)
DIURNAL_FAMILY_SHIFTED = _family(
    DIURNAL_AUTOSCALE, "diurnal_family_shifted", {**_DIURNAL_RANGES, **_SHIFT},
    "diurnal_family's shifted test: peaks between 08:00 and 11:00 (never in the training range "
    "12:30-15:30) and 20-40 % more load (x1.2-1.4); otherwise as diurnal_family (chat tenant, TTFT 1000 ms, "
    "TPOT 60 ms), and it still publishes diurnal_autoscale's day. " + _FAMILY_TAIL,
    shifted_from="diurnal_family",
)
_MULTITENANT_RANGES = {
    **_FAMILY_COMMON,
    "peak_window": [25.0, 31.0],
    "flash_crowds": {"per_day": 0.5, "tenant": "interactive", "factor": [1.5, 2.5], "windows": [1, 4]},
    "jobs": [{"tenant": "batch", "start_window": [4, 8], "windows": [5, 7], "rate_rps": [3.0, 5.0]},
             {"tenant": "batch", "start_window": [28, 32], "windows": [3, 5], "rate_rps": [3.0, 5.0]}],
    "announced_share": 0.5,
    "lead_windows": [2, 6],
    "extra_jobs": {"per_day": 0.5, "tenant": "batch", "windows": [2, 6], "rate_rps": [2.0, 5.0]},
}
MULTITENANT_FAMILY = _family(
    MULTITENANT_AUTOSCALE, "multitenant_family", _MULTITENANT_RANGES,
    "multitenant_autoscale's cluster and tenants (interactive, priority 0, TTFT 1000 ms, TPOT 60 ms; batch, "
    "priority 2, TTFT 20 s, TPOT 150 ms), but every seed draws its own day: the interactive cycle's peak "
    "between 12:30 and 15:30, load x0.85-1.15, peak/trough 2.5-3.5, AR(1) noise, flash crowds; the two "
    "batch jobs start within an hour of 03:00 and 15:00 with random length and rate (3-5 req/s), each "
    "announced in the observation 1-3 h ahead with probability 0.5, plus 0.5 unannounced ad-hoc jobs a "
    "day. The published day is multitenant_autoscale's. " + _FAMILY_TAIL,
)
MULTITENANT_FAMILY_SHIFTED = _family(
    MULTITENANT_AUTOSCALE, "multitenant_family_shifted",
    {**_MULTITENANT_RANGES, **_SHIFT,
     "jobs": [{"tenant": "batch", "start_window": [12, 16], "windows": [5, 7], "rate_rps": [4.0, 6.0]},
              {"tenant": "batch", "start_window": [38, 42], "windows": [3, 5], "rate_rps": [4.0, 6.0]}]},
    "multitenant_family's shifted test: interactive peaks between 08:00 and 11:00, 20-40 % more load, and "
    "the batch jobs at new times (06:00-08:00 and 19:00-21:00) at 4-6 req/s; tenants and SLOs as "
    "multitenant_family (TTFT 1000 ms / 20 s, TPOT 60 / 150 ms), and it still publishes "
    "multitenant_autoscale's day. " + _FAMILY_TAIL,
    shifted_from="multitenant_family",
)
FAMILY_TASKS: dict[str, TaskSpec] = {t.task_id: t for t in (DIURNAL_FAMILY, DIURNAL_FAMILY_SHIFTED, MULTITENANT_FAMILY,
                                                           MULTITENANT_FAMILY_SHIFTED)}

# ---------------------------------------------------------------------------------------- prefix-caching tasks
# Issue 32: cluster tasks whose requests carry prefix ids (shared/prefix.py), so the engines cache prefixes
# and `ServeAction.cache_affinity` decides whether a request follows its warm cache or the shortest queue.
# Their observations carry prefix_hit_rate and prefix_cached_blocks (runtime/episode.py). The workload
# dicts are read by shared.workloads; the trace's figures below are recomputed by tests/test_prefix_tasks.py.
MOONCAKE_CLUSTER = TaskSpec(
    task_id="mooncake_cluster",
    difficulty="hard",
    description=(
        "A cluster of 1-8 replicas (Llama-3.1-8B on H100 each) replaying Mooncake's conversation trace "
        "(Kimi, FAST'25, Apache-2.0; 12,031 requests over 59 minutes) at its own pace with its own lengths "
        "(median 6,909 tokens in / 350 out, about 3.4 req/s) and its 512-token prefix blocks: each seed "
        "replays the 20 minutes from a start it draws. Engines cache prefixes (vLLM-style APC) and the "
        "router weighs each replica's cached share of a request against its load (cache_affinity). SLOs "
        "TTFT 2000 ms, TPOT 60 ms; 60 windows of 20 s; replicas start in 87 s and are billed throughout. "
        "Starts with 2 replicas ready."
    ),
    tenants=(
        TenantSpec("trace", 1, 1.0, ttft_slo_ms=2000.0, tpot_slo_ms=60.0,
                   prompt_tokens=(6909.0, 0.0), output_tokens=(350.0, 0.0),
                   prompt_clip=(1, 1 << 20), output_clip=(1, 1 << 20)),
    ),
    workload={"kind": "trace", "packaged": "mooncake_conversation.jsonl.gz", "prefix_block_tokens": 512,
              "seeded_start": True, "speedup": 1.0},
    horizon=60,
    window_s=20.0,  # under real mode's default 30 s step timeout, which every task's window must stay below
    cost_budget_per_1k=0.002,  # about what 3 replicas cost at the trace's pace: its prompts are 20x its outputs
    replicas=(1, 8),
    initial_replicas=2,
    floor_replicas=2,
)

MULTITURN_CLUSTER = TaskSpec(
    task_id="multiturn_cluster",
    difficulty="hard",
    description=(
        "A cluster of 1-8 replicas serving a synthetic multi-turn chat through a day compressed into 48 "
        "windows of 10 s: conversations start on a raised-cosine daily cycle (peak at 14:00, trough a third "
        "of it at 02:00), each 1 + geometric turns (mean 4) 20 s apart, every turn resending its app's system "
        "prompt (one of four, 512-2,048 tokens) and the whole history plus a new message (median 200 tokens), "
        "answers of median 250. Engines cache prefixes (vLLM-style APC, 16-token blocks) and the router "
        "weighs each replica's cached share of a request against its load (cache_affinity): a conversation "
        "whose turns go back to its replica skips re-prefilling its history. TTFT 1000 ms, TPOT 60 ms; "
        "replicas start in 87 s and are billed throughout. Starts with 2 replicas ready."
    ),
    tenants=(
        TenantSpec("chat", 1, 1.0, ttft_slo_ms=1000.0, tpot_slo_ms=60.0,
                   prompt_tokens=(200.0, 0.8), output_tokens=(250.0, 0.6),
                   prompt_clip=(1, 16384), output_clip=(1, 16384)),
    ),
    workload={"kind": "multiturn",
              "spec": {"conversations_per_s": 12.0, "turns_mean": 4.0, "system_tokens": (1024, 2048, 512, 1536),
                       "user_tokens": (200.0, 0.8), "answer_tokens": (250.0, 0.6), "think_s": 20.0,
                       "max_context": 16384},
              "day": {"cycle_windows": 48, "peak_window": 28, "trough_ratio": round(1 / 3, 6)}},
    horizon=48,
    window_s=10.0,
    cost_budget_per_1k=0.0003,
    replicas=(1, 8),
    initial_replicas=2,
    floor_replicas=2,
    cycle_windows=48,
)
PREFIX_TASKS: dict[str, TaskSpec] = {t.task_id: t for t in (MOONCAKE_CLUSTER, MULTITURN_CLUSTER)}

# The seed's single-server tasks (exactly one replica) and the cluster tasks (fixed days, then families).
SINGLE_SERVER_TASKS: dict[str, TaskSpec] = {t.task_id: t for t in (STATIC, BURSTY, ADVERSARIAL, AZURE_CONV_TRACE)}
CLUSTER_TASKS: dict[str, TaskSpec] = {**{t.task_id: t for t in (DIURNAL_AUTOSCALE, MULTITENANT_AUTOSCALE)},
                                      **FAMILY_TASKS, **PREFIX_TASKS}
TASKS: dict[str, TaskSpec] = {**SINGLE_SERVER_TASKS, **CLUSTER_TASKS}


def parse_task_ids(spec: str) -> list[str]:
    """Built-in task ids from a command-line value: comma-separated ids, or 'all' (every task).
    UnknownTaskError names the first id that is not one."""
    if spec == "all":
        return list(TASKS)
    ids = [t.strip() for t in spec.split(",") if t.strip()]
    for t in ids:
        if t not in TASKS:
            raise UnknownTaskError(t)
    return ids


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
