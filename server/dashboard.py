"""The episode dashboard: the "Dashboard" tab of /web, with a Playground tab beside it.

A visitor picks a task, a seed and a policy (a registered agent, or the six knobs set by hand),
then steps or runs an episode in process and watches, window by window: TTFT against the SLOs,
ITL/TPOT, throughput, arrivals against goodput, the queue, KV occupancy, the reward, each knob,
per-tenant SLO attainment, and on the cluster tasks load and replicas on one chart by time of day,
replicas by state and the cost. A finished episode of the same task and seed by another policy is
drawn beside the new one (server/dashboard_views.py), so two policies compare on one set of plots.
When the episode ends the grade is given in words and bars (server/dashboard_text.py), the episode
can be downloaded (its log, which POST /grader grades again, and its windows as CSV), and "Connect
from Python" replays the episode's own actions against the URL the page was served from.

Each browser session owns its episode (a `gr.State`), played on its own `LLMServeEnvironment`
that shares the server's episode store and mode, so a dashboard episode can also be graded by id
through POST /grader. Plots are Gradio's own components (Vega, bundled with Gradio: no CDN).
Modules: dashboard_data (the run, rows, frames, downloads), dashboard_views (the plots),
dashboard_text (words), dashboard_playground (OpenEnv's Playground with a valid starting action).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr
from llmserve_env.agents.base import make_action
from llmserve_env.agents.heuristic import heuristic
from llmserve_env.agents.registry import POLICIES
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.server.dashboard_data import MANUAL, DashboardRun, action_table, episode_csv, new_run
from llmserve_env.server.dashboard_playground import build_playground
from llmserve_env.server.dashboard_text import (
    EMPTY_STATE,
    ITL_TPOT_NOTE,
    LAST_WINDOW_NOTE,
    POLICY_NAMES,
    cluster_note,
    error_lines,
    grade_bars,
    grade_markdown,
    policy_about,
    python_markdown,
    server_url,
    status_markdown,
    task_markdown,
    tenant_table,
    ttft_note,
)
from llmserve_env.server.dashboard_views import (
    CLUSTER_PLOTS,
    MAX_TENANTS,
    PLOTS,
    PlotSpec,
    only_changed_props,
    plot_updates,
)
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction
from llmserve_env.shared.tasks import TASKS
from pydantic import ValidationError

# How many windows "Run to end" plays between screen updates: the plots grow while it runs.
RUN_UPDATE_EVERY = 4
FRESH_PAUSE_S = 0.3  # after a new episode clears the plots, before its first points (on_step / on_run say why)
# An idle browser session's episode is dropped after this long.
SESSION_TTL_S = 3600
PLOT_HEIGHT = 240
# Columns narrower than this wrap onto their own line: three plots side by side on a laptop, one
# per line on a phone (390 px).
PLOT_MIN_WIDTH = 300
# A table's columns are at least ~67 px wide in Gradio 6.31, so the 8-column action timeline made a
# 390 px phone's page 533 px wide, and every plot drawn after that kept the width (Vega draws at its
# container's width and a fixed-width SVG then holds the container). `contain: inline-size` keeps
# a table's content from widening the page; the table scrolls sideways inside its own box instead.
# The tenant table and the grade's bars are plain HTML that wraps to a phone's width.
DASHBOARD_CSS = """
<style>
#dash-actions, #dash-tenants { contain: inline-size; overflow-x: auto; }
.dash-tenant-table { width: 100%; border-collapse: collapse; font-size: 0.85em; }
.dash-tenant-table caption { text-align: left; font-weight: 600; padding-bottom: 4px; }
.dash-tenant-table th, .dash-tenant-table td { padding: 3px 5px !important; border-bottom: 1px solid #8884; text-align: right; }
.dash-tenant-table th:first-child, .dash-tenant-table td:first-child { text-align: left; }
.grade-bar { display: flex; align-items: center; gap: 8px; margin: 3px 0; font-size: 0.9em; }
.grade-bar-label { flex: 0 0 42%; overflow-wrap: anywhere; }
.grade-bar-track { flex: 1 1 auto; height: 12px; background: #8883; border-radius: 3px; overflow: hidden; }
.grade-bar-fill { display: block; height: 100%; }
.grade-bar-value { flex: 0 0 3em; text-align: right; font-variant-numeric: tabular-nums; }
</style>
"""


def policy_choices() -> list[tuple[str, str]]:
    """The registered policies, the LLM one only where the server has an API key, then manual."""
    names = [n for n in POLICIES if n != "vllm_default" and (n != "llm" or os.environ.get("OPENAI_API_KEY"))]
    return [(POLICY_NAMES.get(n, n), n) for n in names] + [(POLICY_NAMES[MANUAL], MANUAL)]


def first_heuristic_action(task_id: str, seed: int = 0) -> ServeAction:
    """The heuristic's action for the first window of (task, seed): where the manual knobs (and the
    Playground's form) start, a valid action that keeps up with the task's load."""
    # Always the simulator (in real mode too): the page is built without calling any endpoint.
    env = InProcessEnv("sim")
    policy = heuristic(task_id)
    policy.reset()
    try:
        return policy.act(env.reset(task_id, seed))
    finally:
        env.close()


def knob_values(action: ServeAction) -> tuple[Any, ...]:
    k = action.knobs()
    return (k["batch_cap"], k["kv_budget_fraction"], k["speculation_depth"], k["quantization_tier"],
            k["prefill_decode_split"], k["priority_routing"])


def downloads(run: DashboardRun | None) -> tuple[Any, Any]:
    """The finished episode's log (an EpisodeLog: what POST /grader takes as `episode_log`, and
    `python -m llmserve_env.tools.grade verify FILE` replays) and its windows
    (CSV), written once per episode to a folder of their own under the temporary folder."""
    if run is None or not run.done:
        return gr.update(value=None, visible=False), gr.update(value=None, visible=False)
    folder = Path(tempfile.mkdtemp(prefix="llmserve-episode-"))
    stem = f"{run.task.task_id}__s{run.seed}__{run.policy_name}"
    log_path = folder / f"{stem}.episode_log.json"
    log_path.write_text(run.episode_log().model_dump_json())
    csv_path = folder / f"{stem}.windows.csv"
    csv_path.write_text(episode_csv(run))
    return gr.update(value=str(log_path), visible=True), gr.update(value=str(csv_path), visible=True)


def views(run: DashboardRun | None, url: str) -> tuple[Any, ...]:
    """Everything the episode buttons update, in the order of `build_dashboard`'s outputs."""
    started = run is not None
    finished_downloads = downloads(run) if run is not None and run.done else downloads(None)
    plots = only_changed_props(plot_updates(run), run.plot_props if run is not None else {})
    return (
        run,
        status_markdown(run),
        gr.update(visible=not started),
        gr.update(visible=started),
        grade_markdown(run),
        grade_bars(run),
        *finished_downloads,
        tenant_table(run),
        ttft_note(run.task if run is not None else None),
        cluster_note(run),
        *plots,
        action_table(run.rows if run is not None else []),
        connect_markdown(run, url),
    )


def connect_markdown(run: DashboardRun | None, url: str, task_id: str | None = None, seed: int | None = None,
                     fixed: ServeAction | None = None) -> str:
    """The Python panel: the run's own actions once it has any (and is the page's task and seed),
    else one fixed action held every window."""
    if run is not None and run.actions and (task_id is None or (run.task.task_id, run.seed) == (task_id, seed)):
        return python_markdown(url, run.task.task_id, run.seed, run.actions, played_by=run.policy_name,
                               grade=run.grade.score if run.grade is not None else None)
    action = fixed or first_heuristic_action(task_id or next(iter(TASKS)))
    return python_markdown(url, task_id or next(iter(TASKS)), seed or 0, [action])


def request_url(request: gr.Request | None) -> str:
    headers = {k.lower(): v for k, v in dict(getattr(request, "headers", None) or {}).items()}
    return server_url(headers)


def build_dashboard(
    web_manager: Any,
    action_fields: list[dict[str, Any]],
    metadata: Any,
    is_chat_env: bool,
    title: str,
    quick_start_md: str,
) -> gr.Blocks:
    """OpenEnv's `gradio_builder` hook: the Dashboard tab, then OpenEnv's Playground built on a form
    that starts at a valid action (server/app.py turns OpenEnv's own default tab off)."""
    dashboard = build_episode_dashboard(web_manager, title)
    if web_manager is None:
        return dashboard
    start = first_heuristic_action(next(iter(TASKS)))
    playground = build_playground(web_manager, action_fields, metadata, is_chat_env, quick_start_md, start)
    tabbed = gr.TabbedInterface([dashboard, playground], tab_names=["Dashboard", "Playground"])
    tabbed.title = title
    return tabbed


def build_episode_dashboard(web_manager: Any, title: str) -> gr.Blocks:
    base = getattr(web_manager, "env", None)
    shared_env = base if isinstance(base, LLMServeEnvironment) else None

    def make_env() -> LLMServeEnvironment:
        if shared_env is None:
            return LLMServeEnvironment()
        return LLMServeEnvironment(store=shared_env.store, config=shared_env.config)

    def knobs(batch_cap: float, kv: float, spec: float, quant: str, split: bool, prio: bool) -> ServeAction:
        try:
            return make_action(int(batch_cap), float(kv), int(spec), quant, bool(split), bool(prio))
        except (ValidationError, ValueError, TypeError) as exc:
            raise gr.Error(error_lines(exc)) from exc

    def seed_of(seed: float | None) -> int:
        if seed is None or float(seed) != int(seed) or int(seed) < 0:
            raise gr.Error("seed: a whole number >= 0")
        return int(seed)

    def start(task_id: str, seed: float | None, policy_name: str, previous: DashboardRun | None) -> DashboardRun:
        seed_value = seed_of(seed)
        other = previous.comparable(task_id, seed_value, policy_name) if previous is not None else None
        try:
            return new_run(make_env(), task_id, seed_value, policy_name, other=other)
        except Exception as exc:  # shown to the visitor rather than as a server error page
            raise gr.Error(error_lines(exc)) from exc

    def advance(run: DashboardRun, manual: ServeAction) -> None:
        try:
            run.step(manual)
        except Exception as exc:
            raise gr.Error(f"step {run.obs.step_index + 1}: {error_lines(exc)}") from exc

    def on_new(run, task_id, seed, policy_name, request: gr.Request):
        return views(start(task_id, seed, policy_name, run), request_url(request))

    def current(
        run: DashboardRun | None, task_id: str, seed: float | None, policy_name: str
    ) -> tuple[DashboardRun, bool]:
        """The session's episode if it is unfinished and still what the page asks for, else a new one."""
        if run is None or run.done or not run.plays(task_id, seed_of(seed), policy_name):
            return start(task_id, seed, policy_name, run), True
        return run, False

    # A new episode first clears the plots: a plot rebuilt from empty takes the new episode's series
    # (another task's tenants and SLOs, a comparison); one updated in place keeps the series it had.
    # The page must draw the cleared plots before the first points arrive: two streamed updates a few
    # milliseconds apart can reach a plot in one render, which then never sees "no value", keeps its
    # old spec and shows the last episode's titles and colours (tests/test_dashboard_browser.py caught
    # the tenant plots still titled for static_workload after a run of adversarial_multitenant).
    def on_step(run, task_id, seed, policy_name, batch_cap, kv, spec, quant, split, prio,
                request: gr.Request) -> Iterator[tuple[Any, ...]]:
        manual = knobs(batch_cap, kv, spec, quant, split, prio)
        url = request_url(request)
        run, fresh = current(run, task_id, seed, policy_name)
        if fresh:
            yield views(run, url)
            time.sleep(FRESH_PAUSE_S)
        advance(run, manual)
        yield views(run, url)

    def on_run(run, task_id, seed, policy_name, batch_cap, kv, spec, quant, split, prio,
               request: gr.Request) -> Iterator[tuple[Any, ...]]:
        manual = knobs(batch_cap, kv, spec, quant, split, prio)
        url = request_url(request)
        run, fresh = current(run, task_id, seed, policy_name)
        if fresh:
            yield views(run, url)
            time.sleep(FRESH_PAUSE_S)
        while not run.done:
            advance(run, manual)
            if run.done or len(run.rows) % RUN_UPDATE_EVERY == 0:
                yield views(run, url)

    def on_task(task_id: str):
        """A new task: its description, and the manual knobs at its heuristic's first action."""
        return (task_markdown(task_id), *knob_values(first_heuristic_action(task_id)))

    def on_policy(policy_name: str) -> str:
        return policy_about(policy_name)

    def on_connect(run: DashboardRun | None, task_id: str, seed: float | None, batch_cap: float, kv: float,
                   spec: float, quant: str, split: bool, prio: bool, request: gr.Request):
        try:
            action = make_action(int(batch_cap), float(kv), int(spec), quant, bool(split), bool(prio))
            seed_value = int(seed or 0)
        except (ValidationError, ValueError, TypeError):
            return gr.update()
        return connect_markdown(run, request_url(request), task_id, seed_value, action)

    def plot(spec: PlotSpec | None = None, visible: bool = True, **kw: Any) -> gr.LinePlot:
        # A plot that may be hidden sits in its row directly: a hidden plot in a column of its own
        # would leave the empty column's width behind.
        title_text = spec.title if spec is not None else kw.pop("title")
        with gr.Column(min_width=PLOT_MIN_WIDTH) if visible else contextlib.nullcontext():
            return gr.LinePlot(
                x="x",
                y="value",
                color="series",
                title=title_text,
                x_title="window",
                y_title=spec.y_title if spec is not None else kw.pop("y_title"),
                y_lim=spec.y_lim if spec is not None else kw.pop("y_lim", None),  # type: ignore[arg-type]  # gradio defaults it to None, annotates a list
                color_title="",
                elem_classes=["llmserve-plot"],
                elem_id=f"dash-plot-{spec.key}" if spec is not None else None,
                visible=visible,
                **{"height": PLOT_HEIGHT, "min_width": PLOT_MIN_WIDTH, **kw},
            )

    default_task = next(iter(TASKS))
    start_action = first_heuristic_action(default_task)
    b0, kv0, spec0, quant0, split0, prio0 = knob_values(start_action)
    default_policy = "heuristic" if "heuristic" in POLICIES else MANUAL
    with gr.Blocks(title=title) as dashboard:
        gr.HTML(DASHBOARD_CSS, container=False, padding=False, js_on_load=None)
        gr.Markdown(
            "## Episode dashboard\nPlay one episode in process and watch the server, window by "
            "window. Pick a task, a seed and a policy, then press **Run episode**; run another policy "
            "on the same task and seed to see both on the same plots. (The **Playground** tab is "
            "OpenEnv's generic form for single `reset`/`step` calls.)"
        )
        with gr.Row():
            task_in = gr.Dropdown(list(TASKS), value=default_task, label="Task", elem_id="dash-task",
                                  min_width=220)
            seed_in = gr.Number(value=0, precision=0, minimum=0, label="Seed", elem_id="dash-seed", min_width=120)
            policy_in = gr.Dropdown(policy_choices(), value=default_policy, label="Policy", elem_id="dash-policy",
                                    min_width=220)
        policy_md = gr.Markdown(policy_about(default_policy), elem_id="dash-policy-about")
        task_md = gr.Markdown(task_markdown(default_task))
        with gr.Accordion("Manual knobs (used when the policy is 'Manual knobs'; they start at the "
                          "heuristic's first action for the task)", open=False):
            with gr.Row():
                batch_in = gr.Slider(1, 512, value=b0, step=1, label="batch_cap", elem_id="dash-batch",
                                     min_width=200)
                kv_in = gr.Slider(0.1, 1.0, value=kv0, step=0.05, label="kv_budget_fraction", elem_id="dash-kv",
                                  min_width=200)
                spec_in = gr.Slider(0, 8, value=spec0, step=1, label="speculation_depth", min_width=200)
            with gr.Row():
                quant_in = gr.Radio(
                    list(QUANTIZATION_TIERS), value=quant0, label="quantization_tier", elem_id="dash-quant",
                    min_width=200,
                )
                split_in = gr.Checkbox(split0, label="prefill_decode_split", min_width=160)
                prio_in = gr.Checkbox(prio0, label="priority_routing", min_width=160)
        with gr.Row():
            new_btn = gr.Button("New episode", elem_id="dash-new", min_width=100)
            step_btn = gr.Button("Step", elem_id="dash-step", min_width=100)
            run_btn = gr.Button("Run episode", variant="primary", elem_id="dash-run", min_width=100)
        status_md = gr.Markdown(status_markdown(None), elem_id="dash-status")
        empty_md = gr.Markdown(EMPTY_STATE, elem_id="dash-empty")
        with gr.Column(visible=False, elem_id="dash-results") as results:
            with gr.Row():
                with gr.Column(scale=1, min_width=PLOT_MIN_WIDTH):
                    grade_md = gr.Markdown(grade_markdown(None), elem_id="dash-grade")
                    bars_html = gr.HTML(elem_id="dash-grade-bars")
                    # stacked, small: two buttons side by side widened a phone's page past 390 px
                    log_btn = gr.DownloadButton("Download the episode log (JSON)", visible=False, size="sm",
                                                elem_id="dash-download-log")
                    csv_btn = gr.DownloadButton("Download the windows (CSV)", visible=False, size="sm",
                                                elem_id="dash-download-csv")
                with gr.Column(scale=1, min_width=PLOT_MIN_WIDTH):
                    tenants_html = gr.HTML(elem_id="dash-tenants")
            ttft_note_md = gr.Markdown(elem_id="dash-ttft-note")
            plots_out = []
            # three plots a row on a laptop; each wraps to its own line on a phone
            for i in range(0, len(PLOTS), 3):
                with gr.Row():
                    plots_out += [plot(spec) for spec in PLOTS[i:i + 3]]
            with gr.Row():
                tenant_plots_out = [plot(title="SLO attainment", y_title="fraction settled in SLO",
                                         y_lim=[0.0, 1.05], visible=False) for _ in range(MAX_TENANTS)]
            with gr.Row():
                cluster_plots_out = [plot(spec, visible=False) for spec in CLUSTER_PLOTS]
            cluster_note_md = gr.Markdown(elem_id="dash-cluster-note")
            gr.Markdown(ITL_TPOT_NOTE, elem_id="dash-itl-note")
            gr.Markdown(LAST_WINDOW_NOTE, elem_id="dash-last-window-note")
            actions_df = gr.Dataframe(label="Action timeline", interactive=False, elem_id="dash-actions")
        with gr.Accordion("Connect from Python", open=False, elem_id="dash-connect"):
            python_md = gr.Markdown(elem_id="dash-python")
        run_state = gr.State(None, time_to_live=SESSION_TTL_S)

        outputs = [
            run_state, status_md, empty_md, results, grade_md, bars_html, log_btn, csv_btn, tenants_html,
            ttft_note_md, cluster_note_md, *plots_out, *tenant_plots_out, *cluster_plots_out, actions_df, python_md,
        ]
        knob_inputs = [batch_in, kv_in, spec_in, quant_in, split_in, prio_in]
        connect_inputs = [run_state, task_in, seed_in, *knob_inputs]
        # The form's own updates (task text, knobs, the Python panel) bypass Gradio's queue: a queued
        # event that finished while Step was being submitted could close the page's event stream
        # under the step, whose result then never arrived (the page waited forever; seen in the
        # browser test, 3 runs in ~15). Only the episode's buttons use the queue.
        task_in.change(on_task, inputs=task_in, outputs=[task_md, *knob_inputs], queue=False).then(
            on_connect, inputs=connect_inputs, outputs=python_md, queue=False)
        policy_in.change(on_policy, inputs=policy_in, outputs=policy_md, queue=False)
        seed_in.change(on_connect, inputs=connect_inputs, outputs=python_md, queue=False)
        for knob in knob_inputs:
            knob.change(on_connect, inputs=connect_inputs, outputs=python_md, queue=False)  # type: ignore[attr-defined]  # every knob is an input component; the list is typed by their base class
        dashboard.load(on_connect, inputs=connect_inputs, outputs=python_md, queue=False)
        new_btn.click(on_new, inputs=[run_state, task_in, seed_in, policy_in], outputs=outputs)
        step_btn.click(on_step, inputs=[run_state, task_in, seed_in, policy_in, *knob_inputs], outputs=outputs)
        run_btn.click(on_run, inputs=[run_state, task_in, seed_in, policy_in, *knob_inputs], outputs=outputs)
    return dashboard
