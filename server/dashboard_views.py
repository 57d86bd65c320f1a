"""What each plot of the dashboard draws for an episode, as Gradio updates.

Each plot is a `PlotSpec` (its title, axis and how its frame is made from the run); `plot_updates`
turns a run into one update per plot, in PLOTS order, then the tenant and cluster plots. When a run
has a comparison (`DashboardRun.other`), the plots where two policies differ draw both, each series
labelled with its policy. On the cluster tasks the x-axis is the time of day.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd
from llmserve_env.server.dashboard_data import (
    DashboardRun,
    compared_frame,
    load_and_replicas_frame,
    series_frame,
    tenant_frame,
    with_lines,
)
from llmserve_env.server.dashboard_text import ttft_slo_lines
from llmserve_env.shared.tasks import TASKS, TaskSpec

# One attainment plot per tenant (lines at the same value hid each other on a shared plot); the
# page is built once, so it has as many tenant plots as the task with the most tenants, and hides
# the ones a task does not use.
MAX_TENANTS = max(len(t.tenants) for t in TASKS.values())
# Vega's category10-like palette; measured series come first, SLO lines after them.
PALETTE = ("#4c78a8", "#f58518", "#e45756", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b")
HOURS_AXIS = [0.0, 24.0]
FRACTION_AXIS = [0.0, 1.05]
ON_OFF_AXIS = [0.0, 1.05]


@dataclass(frozen=True)
class PlotSpec:
    """One plot: its title (short enough for a phone's 390 px), its y-axis, how its frame is made."""

    key: str
    title: str
    y_title: str
    frame: Callable[[DashboardRun], pd.DataFrame]
    y_lim: list[float] | None = None  # fixed axis; None: from 0 (non-negative series) or free
    from_zero: bool = True


def _ttft(run: DashboardRun) -> pd.DataFrame:
    drawn, _ = ttft_slo_lines(run.task)
    frame = compared_frame(run, {"p50_ttft_ms": "p50", "p99_ttft_ms": "p99"}, {"p99_ttft_ms": "p99"})
    return with_lines(frame, run.rows, drawn)


def _itl(run: DashboardRun) -> pd.DataFrame:
    frame = compared_frame(run, {"p50_itl_ms": "p50 ITL", "p50_tpot_ms": "p50 TPOT"}, {"p50_tpot_ms": "p50 TPOT"})
    return with_lines(frame, run.rows, {f"SLO {t.name}": t.tpot_slo_ms for t in run.task.tenants})


def _knob(key: str, label: str) -> Callable[[DashboardRun], pd.DataFrame]:
    return lambda run: compared_frame(run, {key: label})


def _replicas(run: DashboardRun) -> pd.DataFrame:
    """Asked for, ready and starting; a policy that leaves `replicas` unset keeps the count it has."""
    def filled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r if r.get("replicas") is not None else {**r, "replicas": r["replicas_ready"]} for r in rows]

    columns = {"replicas": "asked", "replicas_ready": "ready", "replicas_starting": "starting"}
    if run.other is None:
        return series_frame(filled(run.rows), columns)
    return pd.concat([series_frame(filled(run.rows), columns, f"{run.policy_name}: "),
                      series_frame(run.other.rows, {"replicas_ready": "ready"}, f"{run.other.policy_name}: ")],
                     ignore_index=True)


def _kv(run: DashboardRun) -> pd.DataFrame:
    """KV used and SLO met; on a prefix-caching task also the prefix hit rate (both policies')."""
    hits = {"prefix_hit_rate": "prefix hits"} if run.task.caches_prefixes else {}
    return compared_frame(run, {"kv_cache_occupancy": "KV used", "slo_compliance_rate": "SLO met", **hits},
                          {"slo_compliance_rate": "SLO met", **hits})


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("ttft", "Time to first token", "ms", _ttft),
    PlotSpec("itl", "ITL and TPOT", "ms", _itl),
    PlotSpec("tps", "Throughput", "output tokens/s", lambda run: compared_frame(run, {"throughput_tps": "tokens/s"})),
    PlotSpec("req", "Arrivals vs goodput", "requests/s", lambda run: compared_frame(
        run, {"arrival_rps": "arrivals", "goodput_rps": "goodput"}, {"goodput_rps": "goodput"})),
    PlotSpec("queue", "Queue and evictions", "requests", lambda run: compared_frame(
        run, {"queue_depth": "waiting", "active_requests": "running", "eviction_events": "evicted"},
        {"queue_depth": "waiting"})),
    PlotSpec("kv", "KV cache and SLO compliance", "fraction", _kv, FRACTION_AXIS, from_zero=False),
    PlotSpec("reward", "Reward so far", "sum of step rewards", lambda run: compared_frame(
        run, {"cumulative_reward": "reward"}), from_zero=False),
    PlotSpec("batch", "Action: batch cap", "sequences", _knob("batch_cap", "batch cap")),
    PlotSpec("kvb", "Action: KV budget", "fraction", _knob("kv_budget_fraction", "KV budget"), FRACTION_AXIS,
             from_zero=False),
    PlotSpec("spec", "Action: speculation", "draft tokens", _knob("speculation_depth", "draft tokens")),
    PlotSpec("bits", "Action: quantization", "weight bits", _knob("weight_bits", "weight bits"), [0.0, 17.0],
             from_zero=False),
    PlotSpec("split", "Action: P/D split", "on = 1", _knob("prefill_decode_split", "split"), ON_OFF_AXIS,
             from_zero=False),
    PlotSpec("prio", "Action: priority routing", "on = 1", _knob("priority_routing", "priority"), ON_OFF_AXIS,
             from_zero=False),
)
REPLICAS_AXIS = [0.0, max(t.replicas[1] for t in TASKS.values()) + 0.5]
CLUSTER_PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("load_replicas", "Load and replicas by time", "share of peak / of most", load_and_replicas_frame,
             [0.0, 1.05], from_zero=False),
    PlotSpec("replicas", "Replicas by state", "replicas", _replicas, REPLICAS_AXIS, from_zero=False),
    PlotSpec("cost", "Cost per window", "$", lambda run: compared_frame(run, {"cost_usd": "$"})),
)


def x_props(task: TaskSpec | None) -> dict[str, Any]:
    """The x-axis: the time of day on tasks with a daily cycle, else the window index."""
    if task is not None and task.cycle_windows:
        return {"x_title": "time of day (h)", "x_lim": HOURS_AXIS}
    return {"x_title": "window", "x_lim": None}


def plotted(frame: pd.DataFrame, from_zero: bool = True, **props: Any) -> dict[str, Any] | None:
    """A plot's new data with a fixed colour per series, or None until there is a point to draw.

    Gradio's plot builds its Vega spec (colour domain included) when it goes from no value to a
    value and afterwards only swaps the data, so each new episode starts from None (see
    `build_dashboard`); a plot first given an empty frame would also keep a broken layout.
    `from_zero` plots (non-negative quantities) start their axis at 0; when every value is 0 the
    axis runs to 1, since Vega would otherwise draw a zero-height domain labelled "0.000000".
    """
    if frame.empty:
        return gr.update(value=None, **props) if props else None
    series = dict.fromkeys(frame["series"])
    update: dict[str, Any] = {
        **props,
        "value": frame,
        "color_map": {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)},
    }
    if from_zero:
        update["y_lim"] = [0.0, 1.0] if float(frame["value"].max()) <= 0.0 else [0.0, None]
    return gr.update(**update)


def plot_updates(run: DashboardRun | None) -> list[Any]:
    """One update per plot: PLOTS, then MAX_TENANTS tenant plots, then CLUSTER_PLOTS."""
    if run is None or not run.rows:
        return [None] * len(PLOTS) + [gr.update(value=None, visible=False)] * (MAX_TENANTS + len(CLUSTER_PLOTS))
    xs = x_props(run.task)
    out = [plotted(spec.frame(run), spec.from_zero, **xs) for spec in PLOTS]
    names = [t.name for t in run.task.tenants]
    for i in range(MAX_TENANTS):
        if i < len(names):
            out.append(plotted(tenant_frame(run, names[i]), from_zero=False, visible=True,
                               title=f"SLO attainment: {names[i]}", **xs))
        else:
            out.append(gr.update(value=None, visible=False))
    if run.task.is_cluster:
        out += [plotted(spec.frame(run), spec.from_zero, visible=True, **xs) for spec in CLUSTER_PLOTS]
    else:
        out += [gr.update(value=None, visible=False) for _ in CLUSTER_PLOTS]
    return out


def only_changed_props(updates: list[Any], sent: dict[int, dict[str, Any]]) -> list[Any]:
    """The plot updates without the props each plot already has.

    Gradio's plot swaps the data in place when only its value changes, but draws the whole Vega
    view again when a prop it reads changes, and a list or dict sent again is a new object to it:
    colours and axis limits sent with every update re-drew every plot at every update. A plot that
    goes back to no value forgets what it was sent: its next value builds a new spec from the
    props sent with it.
    """
    out = []
    for i, update in enumerate(updates):
        if update is None or update.get("value") is None:
            sent.pop(i, None)
            out.append(update)
            continue
        known = sent.setdefault(i, {})
        changed = {k: v for k, v in update.items()
                   if k not in ("value", "__type__") and (k not in known or known[k] != v)}
        known.update(changed)
        # `visible` goes with every update: a boolean sent again redraws nothing, and a page that
        # missed the one update that showed a plot (a streamed update lost while Gradio's event
        # stream reconnects, seen under load) would otherwise keep it hidden for the whole episode.
        if "visible" in update:
            changed["visible"] = update["visible"]
        out.append(gr.update(value=update["value"], **changed))
    return out


__all__ = ["CLUSTER_PLOTS", "MAX_TENANTS", "PLOTS", "PlotSpec", "only_changed_props", "plot_updates", "plotted",
           "series_frame"]
