"""The episode dashboard: the "Dashboard" tab beside OpenEnv's playground at /web.

A visitor picks a task, a seed and a policy (a registered agent, or the six knobs set by hand),
then steps or runs an episode in process and watches, window by window: TTFT against the SLOs,
ITL/TPOT, throughput, arrivals against goodput, the queue, KV occupancy and evictions, the reward,
the actions taken, per-tenant SLO attainment, and the final grade.

Each browser session owns its episode (a `gr.State`), played on its own `LLMServeEnvironment`
that shares the server's episode store and mode, so a dashboard episode can also be graded by id
through POST /grader. Plots are Gradio's own components (Vega, bundled with Gradio: no CDN).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd
from llmserve_env.agents.base import Policy, make_action
from llmserve_env.agents.registry import POLICIES, make_policy
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.shared.grader import GradeResult
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction, ServeObservation
from llmserve_env.shared.tasks import TASKS, TaskSpec, get_task

MANUAL = "manual"
POLICY_LABELS: dict[str, str] = {
    "heuristic": "Heuristic (adaptive queue/latency rules)",
    "ppo": "PPO (trained weights, numpy)",
    "tuned_static": "Tuned static (per-task search)",
    "static": "Static (vLLM defaults)",
    "vllm_default": "vLLM defaults",
    "starve": "Starve (batch cap 1: a bad floor)",
    "random": "Random",
    "llm": "LLM (OpenAI-compatible chat model)",
    MANUAL: "Manual knobs (set below)",
}
# How many windows "Run to end" plays between screen updates: the plots grow while it runs.
RUN_UPDATE_EVERY = 4
# An idle browser session's episode is dropped after this long.
SESSION_TTL_S = 3600
PLOT_HEIGHT = 260
FRAME_COLUMNS = ["step", "value", "series"]
# Vega's category10-like palette; measured series come first, SLO lines after them.
PALETTE = ("#4c78a8", "#f58518", "#e45756", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b")


def policy_choices() -> list[tuple[str, str]]:
    """The registered policies, the LLM one only where the server has an API key, then manual."""
    names = [n for n in POLICIES if n != "vllm_default" and (n != "llm" or os.environ.get("OPENAI_API_KEY"))]
    return [(POLICY_LABELS.get(n, n), n) for n in names] + [(POLICY_LABELS[MANUAL], MANUAL)]


@dataclass
class DashboardRun:
    """One browser session's episode: the environment, the policy playing it, and what it saw."""

    env: LLMServeEnvironment
    task: TaskSpec
    seed: int
    policy_name: str
    policy: Policy | None  # None: the manual knobs drive every step
    obs: ServeObservation
    rows: list[dict[str, Any]] = field(default_factory=list)
    grade: GradeResult | None = None

    @property
    def done(self) -> bool:
        return bool(self.obs.done)

    def plays(self, task_id: str, seed: int, policy_name: str) -> bool:
        """Whether this is the episode the page's task, seed and policy pick ask for."""
        return (self.task.task_id, self.seed, self.policy_name) == (task_id, seed, policy_name)

    def step(self, manual: ServeAction) -> None:
        action = manual if self.policy is None else self.policy.act(self.obs)
        self.obs = self.env.step(action)
        self.rows.append(step_row(self.obs, action, self.rows))
        if self.obs.done:
            self.grade = self.env.grade()


def step_row(obs: ServeObservation, action: ServeAction, previous: list[dict[str, Any]]) -> dict[str, Any]:
    """One window flattened for the plots and the action table."""
    meta = obs.metadata or {}
    cumulative = (previous[-1]["cumulative_reward"] if previous else 0.0) + float(obs.reward or 0.0)
    return {
        "step": obs.step_index,
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
        **action.knobs(),
        "weight_bits": weight_bits(action.quantization_tier),
    }


def new_run(env: LLMServeEnvironment, task_id: str, seed: int, policy_name: str) -> DashboardRun:
    task = get_task(task_id)
    policy = None if policy_name == MANUAL else make_policy(policy_name, task_id, seed=seed)
    if policy is not None:
        policy.reset()
    obs = env.reset(seed=seed, task_id=task_id)
    return DashboardRun(env=env, task=task, seed=seed, policy_name=policy_name, policy=policy, obs=obs)


# -- frames: long-format tables (step, value, series), one per plot ------------------------------
def series_frame(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    """`columns` maps a row key to the legend label of its line."""
    records = [(r["step"], float(r[key]), label) for r in rows for key, label in columns.items()]
    return pd.DataFrame.from_records(records, columns=FRAME_COLUMNS)


def with_slo_lines(frame: pd.DataFrame, rows: list[dict[str, Any]], slos: dict[str, float]) -> pd.DataFrame:
    """Add one flat line per SLO so a latency series can be read against its target."""
    if not rows:
        return frame
    steps = [r["step"] for r in rows]
    lines = [(s, value, label) for label, value in slos.items() for s in steps]
    return pd.concat([frame, pd.DataFrame.from_records(lines, columns=FRAME_COLUMNS)], ignore_index=True)


def tenant_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Each tenant's SLO attainment per window, where it had a settled request (the metric reads 1.0
    over an empty window, which would draw a met SLO that nothing earned)."""
    records = [
        (r["step"], float(t["attainment"]), name)
        for r in rows
        for name, t in r["per_tenant"].items()
        if t.get("met", 0) + t.get("missed", 0) > 0
    ]
    return pd.DataFrame.from_records(records, columns=FRAME_COLUMNS)


def tenant_totals(run: DashboardRun) -> pd.DataFrame:
    """Per-tenant totals over the episode so far, next to each tenant's SLOs."""
    out = []
    for t in run.task.tenants:
        met = sum(int(r["per_tenant"].get(t.name, {}).get("met", 0)) for r in run.rows)
        missed = sum(int(r["per_tenant"].get(t.name, {}).get("missed", 0)) for r in run.rows)
        settled = met + missed
        out.append(
            {
                "tenant": t.name,
                "priority": t.priority,
                "TTFT SLO (ms)": t.ttft_slo_ms,
                "TPOT SLO (ms)": t.tpot_slo_ms,
                "met": met,
                "missed": missed,
                "attainment": round(met / settled, 4) if settled else None,
            }
        )
    return pd.DataFrame(out)


def action_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    cols = [
        "step",
        "batch_cap",
        "kv_budget_fraction",
        "speculation_depth",
        "quantization_tier",
        "prefill_decode_split",
        "priority_routing",
        "reward",
    ]
    table = pd.DataFrame([{c: r[c] for c in cols} for r in rows], columns=cols)
    return table.round({"kv_budget_fraction": 3, "reward": 3})


def task_markdown(task_id: str) -> str:
    task = get_task(task_id)
    return f"**{task.task_id}** ({task.difficulty}): {task.description}"


def status_markdown(run: DashboardRun | None) -> str:
    if run is None:
        return "No episode yet: press **Run episode** (or **New episode**, then **Step**)."
    state = "finished" if run.done else "running"
    total = run.rows[-1]["cumulative_reward"] if run.rows else 0.0
    return (
        f"Episode `{run.obs.episode_id}`: task **{run.task.task_id}**, seed {run.seed}, "
        f"policy **{run.policy_name}**: {state}, window {run.obs.step_index}/{run.task.horizon}, "
        f"cumulative reward {total:.3f}."
    )


def grade_markdown(run: DashboardRun | None) -> str:
    if run is None or run.grade is None:
        return "The grade appears when the episode ends."
    return f"## Grade: {run.grade.score:.3f}  \nscore in [0, 1] from the episode log (`POST /grader`)."


def weight_bits(tier: str) -> int:
    """The weight width a quantization tier stands for (FP16 -> 16, INT8 -> 8, INT4 -> 4)."""
    return int("".join(ch for ch in tier if ch.isdigit()))


def plotted(frame: pd.DataFrame, from_zero: bool = True) -> dict[str, Any] | None:
    """A plot's new data with a fixed colour per series, or None until there is a point to draw.

    Gradio's plot builds its Vega spec (colour domain included) when it goes from no value to a
    value and afterwards only swaps the data, so each new episode starts from None (see
    `build_dashboard`); a plot first given an empty frame would also keep a broken layout.
    `from_zero` plots (non-negative quantities) start their axis at 0; when every value is 0 the
    axis runs to 1, since Vega would otherwise draw a zero-height domain labelled "0.000000".
    """
    if frame.empty:
        return None
    series = dict.fromkeys(frame["series"])
    update: dict[str, Any] = {
        "value": frame,
        "color_map": {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)},
    }
    if from_zero:
        update["y_lim"] = [0.0, 1.0] if float(frame["value"].max()) <= 0.0 else [0.0, None]
    return gr.update(**update)


def views(run: DashboardRun | None) -> tuple[Any, ...]:
    """Everything the page shows for `run`, in the order of `build_dashboard`'s outputs."""
    rows = run.rows if run is not None else []
    task = run.task if run is not None else None
    ttft_slos = {f"SLO {t.name}": t.ttft_slo_ms for t in task.tenants} if task else {}
    tpot_slos = {f"SLO {t.name}": t.tpot_slo_ms for t in task.tenants} if task else {}
    ttft = with_slo_lines(
        series_frame(rows, {"p50_ttft_ms": "p50 TTFT", "p99_ttft_ms": "p99 TTFT"}), rows, ttft_slos
    )
    itl = with_slo_lines(
        series_frame(rows, {"p50_itl_ms": "p50 ITL", "p50_tpot_ms": "p50 TPOT"}), rows, tpot_slos
    )
    return (
        status_markdown(run),
        grade_markdown(run),
        run.grade.model_dump(mode="json") if run is not None and run.grade is not None else None,
        tenant_totals(run) if run is not None else None,
        plotted(ttft),
        plotted(itl),
        plotted(series_frame(rows, {"throughput_tps": "output tokens/s"})),
        plotted(series_frame(rows, {"arrival_rps": "arrivals", "goodput_rps": "goodput (met every SLO)"})),
        plotted(series_frame(rows, {"queue_depth": "waiting", "active_requests": "running"})),
        plotted(
            series_frame(
                rows, {"kv_cache_occupancy": "KV occupancy", "slo_compliance_rate": "SLO compliance"}
            ),
            from_zero=False,
        ),
        plotted(series_frame(rows, {"eviction_events": "evictions"})),
        plotted(series_frame(rows, {"reward": "step reward"}), from_zero=False),
        plotted(series_frame(rows, {"batch_cap": "batch cap"})),
        plotted(series_frame(rows, {"speculation_depth": "speculation depth", "weight_bits": "weight bits"})),
        plotted(
            series_frame(
                rows,
                {
                    "kv_budget_fraction": "KV budget",
                    "prefill_decode_split": "prefill/decode split",  # plotted as 0/1
                    "priority_routing": "priority routing",
                },
            ),
            from_zero=False,
        ),
        plotted(tenant_frame(rows), from_zero=False),
        action_table(rows),
    )


def build_dashboard(
    web_manager: Any,
    action_fields: list[dict[str, Any]],
    metadata: Any,
    is_chat_env: bool,
    title: str,
    quick_start_md: str,
) -> gr.Blocks:
    """OpenEnv's `gradio_builder` hook: the Dashboard tab (the playground tab is OpenEnv's own)."""
    base = getattr(web_manager, "env", None)
    shared_env = base if isinstance(base, LLMServeEnvironment) else None

    def make_env() -> LLMServeEnvironment:
        if shared_env is None:
            return LLMServeEnvironment()
        return LLMServeEnvironment(store=shared_env.store, config=shared_env.config)

    def knobs(batch_cap: float, kv: float, spec: float, quant: str, split: bool, prio: bool) -> ServeAction:
        return make_action(int(batch_cap), float(kv), int(spec), quant, bool(split), bool(prio))

    def start(task_id: str, seed: float | None, policy_name: str) -> DashboardRun:
        seed_value = int(seed or 0)
        if seed_value < 0:
            raise gr.Error("the seed must be a non-negative integer")
        try:
            return new_run(make_env(), task_id, seed_value, policy_name)
        except Exception as exc:  # shown to the visitor rather than as a server error page
            raise gr.Error(f"{type(exc).__name__}: {exc}") from exc

    def advance(run: DashboardRun, manual: ServeAction) -> None:
        try:
            run.step(manual)
        except Exception as exc:
            raise gr.Error(f"step {run.obs.step_index} failed: {type(exc).__name__}: {exc}") from exc

    def on_new(task_id, seed, policy_name):
        run = start(task_id, seed, policy_name)
        return (run, *views(run))

    def current(
        run: DashboardRun | None, task_id: str, seed: float | None, policy_name: str
    ) -> tuple[DashboardRun, bool]:
        """The session's episode if it is unfinished and still what the page asks for, else a new one."""
        if run is None or run.done or not run.plays(task_id, int(seed or 0), policy_name):
            return start(task_id, seed, policy_name), True
        return run, False

    # A new episode first clears the plots: a plot rebuilt from empty takes the new episode's series
    # (another task's tenants and SLOs); one updated in place keeps the series it started with.
    def on_step(run, task_id, seed, policy_name, *knob_values) -> Iterator[tuple[Any, ...]]:
        run, fresh = current(run, task_id, seed, policy_name)
        if fresh:
            yield (run, *views(run))
        advance(run, knobs(*knob_values))
        yield (run, *views(run))

    def on_run(run, task_id, seed, policy_name, *knob_values) -> Iterator[tuple[Any, ...]]:
        run, fresh = current(run, task_id, seed, policy_name)
        if fresh:
            yield (run, *views(run))
        while not run.done:
            advance(run, knobs(*knob_values))
            if run.done or len(run.rows) % RUN_UPDATE_EVERY == 0:
                yield (run, *views(run))

    def plot(title_text: str, y_title: str, y_lim: list[float | None] | None = None) -> gr.LinePlot:
        return gr.LinePlot(
            x="step",
            y="value",
            color="series",
            title=title_text,
            x_title="window",
            y_title=y_title,
            y_lim=y_lim,  # type: ignore[arg-type]  # gradio's default is None though it annotates a list
            height=PLOT_HEIGHT,
            color_title="",
            elem_classes=["llmserve-plot"],
        )

    default_task = next(iter(TASKS))
    with gr.Blocks(title=title) as dashboard:
        gr.Markdown(
            "## Episode dashboard\nPlay one episode in process and watch the server, window by "
            "window. Pick a task, a seed and a policy, then press **Run episode**."
        )
        with gr.Row():
            task_in = gr.Dropdown(list(TASKS), value=default_task, label="Task", elem_id="dash-task")
            seed_in = gr.Number(value=0, precision=0, minimum=0, label="Seed", elem_id="dash-seed")
            policy_in = gr.Dropdown(
                policy_choices(),
                value="heuristic" if "heuristic" in POLICIES else MANUAL,
                label="Policy",
                elem_id="dash-policy",
            )
        task_md = gr.Markdown(task_markdown(default_task))
        with gr.Accordion("Manual knobs (used when the policy is 'Manual knobs')", open=False):
            with gr.Row():
                batch_in = gr.Slider(1, 512, value=64, step=1, label="batch_cap", elem_id="dash-batch")
                kv_in = gr.Slider(0.1, 1.0, value=0.9, step=0.05, label="kv_budget_fraction")
                spec_in = gr.Slider(0, 8, value=0, step=1, label="speculation_depth")
            with gr.Row():
                quant_in = gr.Radio(
                    list(QUANTIZATION_TIERS), value="FP16", label="quantization_tier", elem_id="dash-quant"
                )
                split_in = gr.Checkbox(False, label="prefill_decode_split")
                prio_in = gr.Checkbox(False, label="priority_routing")
        with gr.Row():
            new_btn = gr.Button("New episode", elem_id="dash-new")
            step_btn = gr.Button("Step", elem_id="dash-step")
            run_btn = gr.Button("Run episode", variant="primary", elem_id="dash-run")
        status_md = gr.Markdown(status_markdown(None), elem_id="dash-status")
        with gr.Row():
            with gr.Column(scale=1):
                grade_md = gr.Markdown(grade_markdown(None), elem_id="dash-grade")
                with gr.Accordion("Grade details: terms and reference points", open=False):
                    grade_json = gr.JSON(show_label=False)
            with gr.Column(scale=2):
                tenants_df = gr.Dataframe(
                    label="Per-tenant SLO attainment over the episode",
                    interactive=False,
                    elem_id="dash-tenants",
                )
        with gr.Row():
            ttft_plot = plot("Time to first token vs SLO", "ms")
            itl_plot = plot("Inter-token latency / TPOT vs SLO", "ms")
        with gr.Row():
            tps_plot = plot("Throughput", "output tokens/s")
            req_plot = plot("Arrivals vs goodput", "requests/s")
        with gr.Row():
            queue_plot = plot("Queue", "requests")
            kv_plot = plot("KV-cache occupancy and SLO compliance", "fraction", [0.0, 1.05])
        with gr.Row():
            evict_plot = plot("Evictions (preemptions)", "per window")
            reward_plot = plot("Reward", "per window")
        with gr.Row():
            batch_plot = plot("Action: batch cap", "running sequences (most)")
            spec_plot = plot("Actions: speculation depth and quantization", "tokens / bits")
        with gr.Row():
            switch_plot = plot("Actions: KV budget and switches (on = 1)", "fraction / on-off", [0.0, 1.05])
            tenant_plot = plot("Per-tenant SLO attainment", "fraction", [0.0, 1.05])
        actions_df = gr.Dataframe(label="Action timeline", interactive=False, elem_id="dash-actions")
        run_state = gr.State(None, time_to_live=SESSION_TTL_S)

        outputs = [
            run_state,
            status_md,
            grade_md,
            grade_json,
            tenants_df,
            ttft_plot,
            itl_plot,
            tps_plot,
            req_plot,
            queue_plot,
            kv_plot,
            evict_plot,
            reward_plot,
            batch_plot,
            spec_plot,
            switch_plot,
            tenant_plot,
            actions_df,
        ]
        knob_inputs = [batch_in, kv_in, spec_in, quant_in, split_in, prio_in]
        task_in.change(task_markdown, inputs=task_in, outputs=task_md)
        new_btn.click(on_new, inputs=[task_in, seed_in, policy_in], outputs=outputs)
        step_btn.click(
            on_step, inputs=[run_state, task_in, seed_in, policy_in, *knob_inputs], outputs=outputs
        )
        run_btn.click(on_run, inputs=[run_state, task_in, seed_in, policy_in, *knob_inputs], outputs=outputs)
    return dashboard
