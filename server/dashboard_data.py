"""The dashboard's data: one browser session's episode, its windows flattened to rows, and the
long-format frames (x, value, series) the plots draw, the tables and the downloads made from them.

No layout here (server/dashboard.py) and no Gradio: what the page shows is computed from these.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from llmserve_env.agents.base import Policy
from llmserve_env.agents.registry import make_policy
from llmserve_env.core.episode_log import EpisodeLog
from llmserve_env.core.grader import GradeResult
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TaskSpec, get_task

MANUAL = "manual"
FRAME_COLUMNS = ["x", "value", "series"]
HOURS_PER_DAY = 24.0


@dataclass
class DashboardRun:
    """One browser session's episode: the environment, the policy playing it, and what it saw.

    `other` is the last finished episode of the same task and seed by another policy: its series are
    drawn beside this one's, so two policies can be compared on one set of plots."""

    env: LLMServeEnvironment
    task: TaskSpec
    seed: int
    policy_name: str
    policy: Policy | None  # None: the manual knobs drive every step
    obs: ServeObservation
    rows: list[dict[str, Any]] = field(default_factory=list)
    actions: list[ServeAction] = field(default_factory=list)
    grade: GradeResult | None = None
    other: DashboardRun | None = None
    # The props (colours, axis limits, title) each plot was last sent, by its place in the outputs:
    # see dashboard_views.only_changed_props.
    plot_props: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return bool(self.obs.done)

    def plays(self, task_id: str, seed: int, policy_name: str) -> bool:
        """Whether this is the episode the page's task, seed and policy pick ask for."""
        return (self.task.task_id, self.seed, self.policy_name) == (task_id, seed, policy_name)

    def step(self, manual: ServeAction | None) -> None:
        action = manual if self.policy is None else self.policy.act(self.obs)
        if action is None:
            raise ValueError("the manual policy needs an action")
        self.obs = self.env.step(action)
        self.actions.append(action)
        self.rows.append(step_row(self.obs, action, self.rows, self.task))
        if self.obs.done:
            self.grade = self.env.grade()

    def episode_log(self) -> EpisodeLog:
        """What POST /grader takes as `episode_log` (a sim-mode log is replayed and graded verified)."""
        return self.env.store.get(self.obs.episode_id).episode_log()

    def comparable(self, task_id: str, seed: int, policy_name: str) -> DashboardRun | None:
        """The finished episode a new (task, seed, policy) run is drawn beside: this one or the one it
        was itself compared with, if it played the same task and seed with another policy."""
        for run in (self, self.other):
            if (run is not None and run.done and run.grade is not None and run.task.task_id == task_id
                    and run.seed == seed and run.policy_name != policy_name):
                return run.without_other()
        return None

    def without_other(self) -> DashboardRun:
        """This run as a comparison: its own comparison dropped (one level, never a chain)."""
        if self.other is None:
            return self
        return DashboardRun(env=self.env, task=self.task, seed=self.seed, policy_name=self.policy_name,
                            policy=self.policy, obs=self.obs, rows=self.rows, actions=self.actions,
                            grade=self.grade)


def hour_of_day(task: TaskSpec, step: int) -> float | None:
    """Where window `step` (1-based) starts in the task's compressed day, in hours; None on tasks
    without a daily cycle. Window 0 starts at 00:00 (shared/tasks.py: peak window 28 = 14:00)."""
    if not task.cycle_windows:
        return None
    return (step - 1) * HOURS_PER_DAY / task.cycle_windows


def step_row(obs: ServeObservation, action: ServeAction, previous: list[dict[str, Any]],
             task: TaskSpec) -> dict[str, Any]:
    """One window flattened for the plots, the action table and the CSV."""
    meta = obs.metadata or {}
    cumulative = (previous[-1]["cumulative_reward"] if previous else 0.0) + float(obs.reward or 0.0)
    hour = hour_of_day(task, obs.step_index)
    return {
        "step": obs.step_index,
        "x": hour if hour is not None else float(obs.step_index),
        "p50_ttft_ms": obs.p50_ttft_ms,
        "p99_ttft_ms": obs.p99_ttft_ms,
        "p50_itl_ms": obs.p50_itl_ms,
        "p50_tpot_ms": float(meta.get("p50_tpot_ms", 0.0)),
        "throughput_tps": obs.throughput_tps,
        "arrival_rps": obs.request_arrival_rate,
        "goodput_rps": float(meta.get("goodput_rps", 0.0)),
        "queue_depth": obs.queue_depth,
        "active_requests": obs.active_requests,
        "kv_cache_occupancy": obs.kv_cache_occupancy,
        "eviction_events": obs.eviction_events,
        "slo_compliance_rate": obs.slo_compliance_rate,
        "reward": float(obs.reward or 0.0),
        "cumulative_reward": cumulative,
        "per_tenant": dict(meta.get("per_tenant", {})),
        "cost_usd": float(meta.get("cost_usd", 0.0)),
        **cluster_row(meta.get("cluster")),
        # prefix-caching tasks only (issue 32): the observation carries the field there and nowhere else
        **({"prefix_hit_rate": obs.prefix_hit_rate} if obs.prefix_hit_rate is not None else {}),
        **action.knobs(),
        "weight_bits": weight_bits(action.quantization_tier),
    }


def cluster_row(cluster: dict[str, Any] | None) -> dict[str, int]:
    """The replica counts at the window's end (cluster tasks; zeros elsewhere, never plotted there)."""
    c = cluster or {}
    return {f"replicas_{state}": int(c.get(state, 0)) for state in ("ready", "starting", "draining")}


def weight_bits(tier: str) -> int:
    """The weight width a quantization tier stands for (FP16 -> 16, INT8 -> 8, INT4 -> 4)."""
    return int("".join(ch for ch in tier if ch.isdigit()))


def new_run(env: LLMServeEnvironment, task_id: str, seed: int, policy_name: str,
            other: DashboardRun | None = None) -> DashboardRun:
    task = get_task(task_id)
    policy = None if policy_name == MANUAL else make_policy(policy_name, task_id, seed=seed)
    if policy is not None:
        policy.reset()
    obs = env.reset(seed=seed, task_id=task_id)
    return DashboardRun(env=env, task=task, seed=seed, policy_name=policy_name, policy=policy, obs=obs,
                        other=other)


# -- frames: long-format tables (x, value, series), one per plot ---------------------------------
def series_frame(rows: list[dict[str, Any]], columns: dict[str, str], prefix: str = "") -> pd.DataFrame:
    """`columns` maps a row key to the legend label of its line; `prefix` names the policy when two
    episodes share the plot."""
    records = [(r["x"], float(r[key]), prefix + label) for r in rows for key, label in columns.items()]
    return pd.DataFrame.from_records(records, columns=FRAME_COLUMNS)


def compared_frame(run: DashboardRun, columns: dict[str, str],
                   other_columns: dict[str, str] | None = None) -> pd.DataFrame:
    """This run's series, and beside them (when there is a comparison) the other policy's
    `other_columns` (default: the same ones), each label prefixed with its policy."""
    if run.other is None:
        return series_frame(run.rows, columns)
    return pd.concat([series_frame(run.rows, columns, f"{run.policy_name}: "),
                      series_frame(run.other.rows, other_columns or columns, f"{run.other.policy_name}: ")],
                     ignore_index=True)


def with_lines(frame: pd.DataFrame, rows: list[dict[str, Any]], lines: dict[str, float]) -> pd.DataFrame:
    """Add one flat line per entry (an SLO) so a series can be read against its target."""
    if not rows or not lines:
        return frame
    xs = [r["x"] for r in rows]
    flat = [(x, value, label) for label, value in lines.items() for x in xs]
    return pd.concat([frame, pd.DataFrame.from_records(flat, columns=FRAME_COLUMNS)], ignore_index=True)


def tenant_frame(run: DashboardRun, name: str) -> pd.DataFrame:
    """One tenant's SLO attainment per window; the other policy's too. A window where the tenant had
    no settled request has no value (NaN: no point drawn; the metric reads 1.0 there, a met SLO that
    nothing earned), but keeps the series in the frame from the first window: the plot's colour
    domain is taken from the series its data holds, and one missing at first was never drawn."""
    records = []
    runs = [(run, "")] if run.other is None else [(run, f"{run.policy_name}: "), (run.other, f"{run.other.policy_name}: ")]
    for r_run, prefix in runs:
        for r in r_run.rows:
            t = r["per_tenant"].get(name)
            settled = t is not None and t.get("met", 0) + t.get("missed", 0) > 0
            records.append((r["x"], float(t["attainment"]) if settled else math.nan, prefix + name))
    return pd.DataFrame.from_records(records, columns=FRAME_COLUMNS)


def load_and_replicas_frame(run: DashboardRun) -> pd.DataFrame:
    """Cluster tasks: arrivals and replicas on one axis, each as a share of its peak (arrivals: the
    highest window of the episode so far; replicas: the task's most), so a reader sees whether the
    replicas led the load or followed it."""
    top = float(run.task.replicas[1])

    def shares(r_run: DashboardRun, prefix: str, with_load: bool) -> list[tuple[float, float, str]]:
        peak = max((r["arrival_rps"] for r in r_run.rows), default=0.0) or 1.0
        out = []
        for r in r_run.rows:
            if with_load:
                out.append((r["x"], r["arrival_rps"] / peak, "arrivals / peak"))
            out.append((r["x"], r["replicas_ready"] / top, f"{prefix}ready / {top:g}"))
            asked = r.get("replicas")  # None: the policy kept the count it had
            out.append((r["x"], float(r["replicas_ready"] if asked is None else asked) / top, f"{prefix}asked / {top:g}"))
        return out

    records = shares(run, "" if run.other is None else f"{run.policy_name} ", True)
    if run.other is not None:
        records += shares(run.other, f"{run.other.policy_name} ", False)
    return pd.DataFrame.from_records(records, columns=FRAME_COLUMNS)


# -- tables ------------------------------------------------------------------------------------------
def tenant_totals(run: DashboardRun) -> list[dict[str, Any]]:
    """Per-tenant totals over the episode so far, next to each tenant's SLOs."""
    out = []
    for t in run.task.tenants:
        met = sum(int(r["per_tenant"].get(t.name, {}).get("met", 0)) for r in run.rows)
        missed = sum(int(r["per_tenant"].get(t.name, {}).get("missed", 0)) for r in run.rows)
        settled = met + missed
        out.append({"tenant": t.name, "priority": t.priority, "ttft_slo_ms": t.ttft_slo_ms,
                    "tpot_slo_ms": t.tpot_slo_ms, "met": met, "missed": missed,
                    "attainment": met / settled if settled else None})
    return out


ACTION_COLUMNS = ["step", "batch_cap", "kv_budget_fraction", "speculation_depth", "quantization_tier",
                  "prefill_decode_split", "priority_routing", "reward"]


def action_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    cols = list(ACTION_COLUMNS)
    if any(r.get("replicas") is not None for r in rows):
        cols.insert(1, "replicas")
    table = pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)
    return table.round({"kv_budget_fraction": 3, "reward": 3})


# The CSV's columns: every flat field of a row (the per-tenant dict is spread into columns).
CSV_SKIP = ("per_tenant", "x")


def episode_csv(run: DashboardRun) -> str:
    """The episode's windows as CSV: one row per window, the observation's series, the action, the
    per-tenant met/missed counts; the hour of day on cluster tasks."""
    names = [t.name for t in run.task.tenants]
    buf = io.StringIO()
    writer: csv.DictWriter[str] | None = None
    for r in run.rows:
        flat = {k: v for k, v in r.items() if k not in CSV_SKIP}
        hour = hour_of_day(run.task, r["step"])
        if hour is not None:
            flat["hour_of_day"] = hour
        for n in names:
            t = r["per_tenant"].get(n, {})
            flat[f"{n}_met"] = int(t.get("met", 0))
            flat[f"{n}_missed"] = int(t.get("missed", 0))
        if writer is None:
            writer = csv.DictWriter(buf, fieldnames=list(flat), restval="", extrasaction="ignore",
                                    lineterminator="\n")
            writer.writeheader()
        writer.writerow(flat)
    return buf.getvalue()
