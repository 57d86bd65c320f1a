"""The dashboard's data, without a browser: two policies on one set of plots, the grade in words and
bars, the downloads (a downloaded log grades verified through POST /grader), the Python panel
replaying the episode's own actions (its grade is the dashboard's), load and replicas on one chart by
time of day on cluster tasks, far-apart SLO lines left off the TTFT axis, one attainment plot per
tenant, plot props sent once per episode, the Playground's form starting at a valid action, and only
the episode's buttons on Gradio's queue."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")

from llmserve_env.server.dashboard import build_dashboard, downloads, first_heuristic_action, views  # noqa: E402
from llmserve_env.server.dashboard_data import action_table, episode_csv, new_run  # noqa: E402
from llmserve_env.server.dashboard_text import grade_bars, grade_markdown, ttft_slo_lines  # noqa: E402
from llmserve_env.server.dashboard_views import (  # noqa: E402
    CLUSTER_PLOTS,
    MAX_TENANTS,
    PLOTS,
    only_changed_props,
    plot_updates,
)
from llmserve_env.server.environment import LLMServeEnvironment  # noqa: E402
from llmserve_env.shared.models import ServeAction  # noqa: E402
from llmserve_env.shared.tasks import get_task  # noqa: E402

URL = "http://127.0.0.1:7860"


def played(task_id: str, policy: str, windows: int | None = None, other=None, env=None):
    run = new_run(env or LLMServeEnvironment(), task_id, 0, policy, other=other)
    while not run.done and (windows is None or len(run.rows) < windows):
        run.step(None)
    return run


def by_key(updates):
    keys = [p.key for p in PLOTS] + [f"tenant{i}" for i in range(MAX_TENANTS)] + [p.key for p in CLUSTER_PLOTS]
    return dict(zip(keys, updates, strict=True))


def series(update) -> set[str]:
    return set(update["value"]["series"])


def test_a_second_policy_on_the_same_task_and_seed_is_drawn_beside_the_first():
    first = played("static_workload", "tuned_static")
    second = played("static_workload", "heuristic", 3, other=first.comparable("static_workload", 0, "heuristic"))
    assert second.other is first
    plots = by_key(plot_updates(second))
    assert {"heuristic: p99", "tuned_static: p99", "heuristic: p50"} <= series(plots["ttft"])
    assert series(plots["batch"]) == {"heuristic: batch cap", "tuned_static: batch cap"}
    # the other episode is drawn whole (48+ windows) while this one grows
    frame = plots["reward"]["value"]
    assert (frame["series"] == "tuned_static: reward").sum() == first.task.horizon
    assert (frame["series"] == "heuristic: reward").sum() == 3
    # no comparison with another seed, another task, or the same policy
    assert first.comparable("static_workload", 1, "heuristic") is None
    assert first.comparable("bursty_workload", 0, "heuristic") is None
    assert first.comparable("static_workload", 0, "tuned_static") is None


def test_the_grade_is_explained_in_words_and_bars():
    first = played("adversarial_multitenant", "static")
    run = played("adversarial_multitenant", "heuristic", other=first.comparable("adversarial_multitenant", 0, "heuristic"))
    t = run.grade.terms
    words = grade_markdown(run)
    assert f"Grade: {run.grade.score:.3f}" in words
    assert (f"√(goodput {t['goodput']:.2f} × worst tenant {t['worst_tenant']:.2f}) × quality {t['quality']:.2f} "
            f"× cost {t['cost']:.2f}") in words
    assert re.search(r"Worst tenant: \*\*(interactive|code|batch)\*\*", words), words
    assert f"**static {first.grade.score:.3f}**" in words and f"({run.grade.score - first.grade.score:+.3f})" in words
    # the formula's terms multiply to the score
    assert (t["goodput"] * t["worst_tenant"]) ** 0.5 * t["quality"] * t["cost"] == pytest.approx(run.grade.score)
    bars = dict(re.findall(r'data-term="(\w+)" data-policy="heuristic" data-value="([\d.]+)"', grade_bars(run)))
    assert float(bars["score"]) == pytest.approx(run.grade.score, abs=1e-4)
    assert set(bars) == {"score", *t}


def test_the_downloaded_log_grades_verified_through_the_grader(client, tmp_path):
    run = played("bursty_workload", "heuristic")
    log_update, csv_update = downloads(run)
    log = json.loads(Path(log_update["value"]).read_text())
    graded = client.post("/grader", json={"episode_log": log})
    assert graded.status_code == 200, graded.text
    assert graded.json()["verified"] is True
    assert graded.json()["score"] == pytest.approx(run.grade.score)
    rows = Path(csv_update["value"]).read_text().splitlines()
    assert len(rows) == 1 + run.task.horizon
    header = rows[0].split(",")
    assert {"step", "p99_ttft_ms", "batch_cap", "reward", "chat_met", "chat_missed"} <= set(header)
    assert downloads(played("bursty_workload", "heuristic", 2))[0]["visible"] is False  # only when finished


def test_connect_from_python_replays_the_episodes_own_actions(live_url):
    run = played("static_workload", "heuristic")
    code = views(run, live_url)[-1]
    assert f"the {run.task.horizon} actions **heuristic** took" in code
    source = code.split("```python\n", 1)[1].split("```", 1)[0]
    assert source.count("\n    (") == run.task.horizon  # one action per window, in order
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<dashboard>", "exec"), {})  # noqa: S102  # the code the page shows
    assert float(out.getvalue().strip()) == pytest.approx(run.grade.score)


@pytest.fixture(scope="module")
def live_url():
    from llmserve_env.server.app import build_app
    from llmserve_env.server.config import ServerSettings
    from llmserve_env.tools.launch import ThreadServer

    with ThreadServer(build_app(ServerSettings(mode="sim"))) as server:
        yield server.url


def test_cluster_tasks_plot_load_and_replicas_together_by_time_of_day():
    run = played("diurnal_autoscale", "hpa", 6)
    plots = by_key(plot_updates(run))
    combined = plots["load_replicas"]
    assert combined["visible"] is True and combined["x_title"] == "time of day (h)"
    assert series(combined) == {"arrivals / peak", "ready / 8", "asked / 8"}
    frame = combined["value"]
    hours = sorted(set(frame["x"]))
    assert hours == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]  # 48 windows a day: half an hour each from 00:00
    assert frame["value"].max() <= 1.0
    assert plots["ttft"]["x_title"] == "time of day (h)"
    row = run.rows[-1]
    cluster = run.obs.metadata["cluster"]
    assert (row["replicas_ready"], row["replicas_starting"], row["replicas_draining"]) == (
        cluster["ready"], cluster["starting"], cluster["draining"])
    assert series(plots["replicas"]) == {"asked", "ready", "starting"}
    assert row["cost_usd"] == pytest.approx(run.obs.metadata["cost_usd"]) and row["cost_usd"] > 0
    assert "replicas" in action_table(run.rows).columns


def test_single_server_task_hides_cluster_plots_and_plots_each_tenant_apart():
    run = played("adversarial_multitenant", "heuristic", 4)
    plots = by_key(plot_updates(run))
    names = [t.name for t in run.task.tenants]
    tenants = [plots[f"tenant{i}"] for i in range(MAX_TENANTS)]
    assert [u["title"] for u in tenants[:len(names)]] == [f"SLO attainment: {n}" for n in names]
    assert all(series(u) == {n} for u, n in zip(tenants, names, strict=False))
    assert all(plots[p.key]["visible"] is False for p in CLUSTER_PLOTS)
    assert plots["ttft"]["x_title"] == "window"
    assert "replicas" not in action_table(run.rows).columns


def test_far_apart_slo_lines_are_left_off_the_ttft_axis():
    """multitenant_autoscale's batch SLO (20,000 ms) ran the axis to 20 s and squashed the 1 s tenant."""
    drawn, left = ttft_slo_lines(get_task("multitenant_autoscale"))
    assert drawn == {"SLO interactive": 1000.0} and left == ["batch 20,000 ms"]
    run = played("multitenant_autoscale", "heuristic", 2)
    assert "SLO batch" not in series(by_key(plot_updates(run))["ttft"])
    assert "batch 20,000 ms" in views(run, URL)[9]
    drawn, left = ttft_slo_lines(get_task("adversarial_multitenant"))  # 300 / 800 / 4,000 ms: all drawn
    assert len(drawn) == 3 and left == []


def test_a_tenant_without_settled_requests_keeps_its_series_from_the_first_window():
    """A plot's colour domain is the series its first data holds: a tenant missing at first was never drawn."""
    run = played("multitenant_autoscale", "heuristic", 1)
    frame = by_key(plot_updates(run))["tenant1"]["value"]
    assert list(frame["series"]) == ["batch"]  # present, with no value where nothing settled


def test_plot_props_are_sent_once_per_episode():
    run = played("static_workload", "heuristic", 2)
    first = views(run, URL)[11]
    assert "color_map" in first and "y_lim" in first
    run.step(None)
    again = views(run, URL)[11]
    assert "color_map" not in again and "y_lim" not in again and len(again["value"]) > 0
    # a plot that went back to no value gets its props again with its next value
    sent = {0: {"color_map": {"a": "#000"}}}
    assert only_changed_props([None], sent) == [None] and sent == {}


def test_the_playgrounds_form_starts_at_a_valid_action():
    from llmserve_env.server.dashboard_playground import PlaygroundManager
    from llmserve_env.server.wire import WireAction

    class Manager:
        action_cls = WireAction

    start = first_heuristic_action("static_workload")
    schema = PlaygroundManager(Manager(), start).action_cls.model_json_schema()
    defaults = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    assert ServeAction.model_validate(defaults) == start
    assert "default" not in WireAction.model_json_schema()["properties"]["batch_cap"]  # the API's schema untouched


def test_only_the_episode_buttons_use_gradios_queue():
    """The form's updates (task text, knobs, Python panel) are not queued. When a queued knob update
    finished while Step was being submitted, Gradio's page closed its event stream under the step,
    whose result never arrived: the browser test waited out 180 s in 3 runs of ~15."""
    blocks = build_dashboard(None, [], None, False, "LLMServeEnv", "")
    queued = sorted(fn.name for fn in blocks.fns.values() if fn.queue)
    assert queued == ["on_new", "on_run", "on_step"]
    assert {fn.name for fn in blocks.fns.values() if not fn.queue} == {"on_connect", "on_task", "on_policy"}


def test_episode_csv_has_one_row_per_window():
    run = played("diurnal_autoscale", "tuned_static", 3)
    lines = episode_csv(run).splitlines()
    assert len(lines) == 4 and "hour_of_day" in lines[0].split(",")


def test_a_shown_plot_says_so_with_every_update():
    """A tenant plot's `visible` is repeated with each update: a page that missed the update that
    showed it (a streamed update lost while Gradio's event stream reconnects) shows it at the next."""
    run = played("adversarial_multitenant", "heuristic", 2)
    offsets = len(PLOTS)
    views(run, URL)
    run.step(None)
    again = views(run, URL)[11:]
    assert [again[offsets + i]["visible"] for i in range(3)] == [True, True, True]
    assert "color_map" not in again[offsets] and "title" not in again[offsets]


def test_prefix_caching_tasks_plot_the_hit_rate_and_others_do_not():
    """Issue 32: the KV plot adds the prefix hit rate on a prefix-caching task (its observations carry
    it), for both policies when compared, and the CSV has its column; a task without prefix ids keeps
    its two series."""
    run = played("multiturn_cluster", "llmd_scorer", 3)
    kv = by_key(plot_updates(run))["kv"]["value"]
    drawn = kv[kv["series"] == "prefix hits"]["value"].tolist()
    assert drawn == [r["prefix_hit_rate"] for r in run.rows] and len(drawn) == 3
    assert all(0.0 < h <= 1.0 for h in drawn) and "prefix_hit_rate" in episode_csv(run).splitlines()[0]
    other = played("multiturn_cluster", "least_work", 3)
    both = played("multiturn_cluster", "llmd_scorer", 3, other=other)
    assert {"llmd_scorer: prefix hits", "least_work: prefix hits"} <= series(by_key(plot_updates(both))["kv"])
    plain = played("diurnal_autoscale", "heuristic", 2)
    assert not any("prefix" in name for name in series(by_key(plot_updates(plain))["kv"]))
    assert all("prefix_hit_rate" not in r for r in plain.rows)
