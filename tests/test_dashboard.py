"""The dashboard's data, without a browser: one attainment plot per tenant, cluster plots only on
cluster tasks (replicas by state and cost from the observation), and plot props sent once per
episode (resending them made Gradio re-draw every plot at every update); only the episode's buttons
use Gradio's queue."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from llmserve_env.server.dashboard import (  # noqa: E402
    CLUSTER_SERIES,
    MAX_TENANTS,
    action_table,
    build_dashboard,
    new_run,
    only_changed_props,
    views,
)
from llmserve_env.server.environment import LLMServeEnvironment  # noqa: E402

# views(): status, empty state, results, grade, grade json, tenant totals, 14 plots, tenants, cluster, table
FIRST_PLOT = 6
N_PLOTS = 14 + MAX_TENANTS + len(CLUSTER_SERIES)


def plots_of(run):
    return list(views(run)[FIRST_PLOT:FIRST_PLOT + N_PLOTS])


def played(task_id: str, policy: str, windows: int):
    run = new_run(LLMServeEnvironment(), task_id, 0, policy)
    for _ in range(windows):
        run.step(None)
    return run


def test_cluster_task_plots_replicas_by_state_and_cost():
    run = played("diurnal_autoscale", "hpa", 3)
    row = run.rows[-1]
    cluster = run.obs.metadata["cluster"]
    assert (row["replicas_ready"], row["replicas_starting"], row["replicas_draining"]) == (
        cluster["ready"], cluster["starting"], cluster["draining"])
    assert row["cost_usd"] == pytest.approx(run.obs.metadata["cost_usd"]) and row["cost_usd"] > 0
    cluster_updates = plots_of(run)[-len(CLUSTER_SERIES):]
    assert all(u["visible"] is True and len(u["value"]) == 3 for u in cluster_updates)
    labels = [set(u["value"]["series"]) for u in cluster_updates]
    assert labels == [{label} for _, label in CLUSTER_SERIES]
    assert "replicas" in action_table(run.rows).columns


def test_single_server_task_hides_cluster_plots_and_plots_each_tenant_apart():
    run = played("adversarial_multitenant", "heuristic", 4)
    updates = plots_of(run)
    tenants = updates[14:14 + MAX_TENANTS]
    names = [t.name for t in run.task.tenants]
    assert [u["title"] for u in tenants[:len(names)]] == [f"SLO attainment: tenant {n}" for n in names]
    assert all(set(u["value"]["series"]) <= {n} for u, n in zip(tenants, names, strict=False))
    assert all(u["visible"] is False for u in updates[-len(CLUSTER_SERIES):])
    assert "replicas" not in action_table(run.rows).columns


def test_plot_props_are_sent_once_per_episode():
    run = played("static_workload", "heuristic", 2)
    first = plots_of(run)
    assert "color_map" in first[0] and "y_lim" in first[0]
    run.step(None)
    again = plots_of(run)
    assert "color_map" not in again[0] and "y_lim" not in again[0] and len(again[0]["value"]) > 0
    # a plot that went back to no value gets its props again with its next value
    sent = {0: {"color_map": {"a": "#000"}}}
    assert only_changed_props([None], sent) == [None] and sent == {}


def test_only_the_episode_buttons_use_gradios_queue():
    """The form's updates (task text, knobs, Python panel) are not queued. When a queued knob update
    finished while Step was being submitted, Gradio's page closed its event stream under the step,
    whose result never arrived: the browser test waited out 180 s in 3 runs of ~15."""
    blocks = build_dashboard(None, [], None, False, "LLMServeEnv", "")
    queued = sorted(fn.name for fn in blocks.fns.values() if fn.queue)
    assert queued == ["on_new", "on_run", "on_step"]
    assert {fn.name for fn in blocks.fns.values() if not fn.queue} == {"on_connect", "on_task"}
