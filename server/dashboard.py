"""The episode dashboard: the "Dashboard" tab beside OpenEnv's playground at /web.

A visitor picks a task, a seed and a policy (a registered agent, or the six knobs set by hand),
then steps or runs an episode in process and watches, window by window: TTFT against the SLOs,
ITL/TPOT, throughput, arrivals against goodput, the queue, KV occupancy and evictions, the reward,
the actions taken, per-tenant SLO attainment, and the final grade.

Each browser session owns its episode (a `gr.State`), played on its own `LLMServeEnvironment`
that shares the server's episode store and mode, so a dashboard episode can also be graded by id
through POST /grader. Plots are Gradio's own components (Vega, bundled with Gradio: no CDN).

It is the landing tab of /web (OpenEnv's generic Playground is the second): before the first
episode it shows what to do instead of empty plots; the manual knobs start at the heuristic's
first action for the chosen task (a valid action that serves the load); each knob has a plot of
its own (constant lines hid each other), and so has each tenant's SLO attainment; on the cluster
tasks the replicas asked for, the ready / starting / draining replicas and the cost per window are
plotted too (from the observation's `metadata["cluster"]` and `metadata["cost_usd"]`); the page
reflows to one column on a phone (the tables scroll inside their own box: DASHBOARD_CSS); and a
"Connect from Python" panel gives the same episode as code against the URL the page was served from.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd
from llmserve_env.agents.base import Policy, make_action
from llmserve_env.agents.heuristic import heuristic
from llmserve_env.agents.registry import POLICIES, make_policy
from llmserve_env.runtime.inprocess import InProcessEnv
from llmserve_env.server.environment import LLMServeEnvironment
from llmserve_env.shared.grader import GradeResult
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction, ServeObservation
from llmserve_env.shared.tasks import TASKS, TaskSpec, get_task
from pydantic import ValidationError

# One attainment plot per tenant (lines at the same value hid each other on a shared plot); the
# page is built once, so it has as many tenant plots as the task with the most tenants, and hides
# the ones a task does not use.
MAX_TENANTS = max(len(t.tenants) for t in TASKS.values())
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
    "planner": "Planner (lookahead on forks of the episode)",
    "clairvoyant": "Clairvoyant planner (sees future arrivals: a bound)",
    "hpa": "HPA (Kubernetes autoscaler; cluster tasks)",
    "dynamo_planner": "Dynamo Planner (predictive autoscaler; cluster tasks)",
    MANUAL: "Manual knobs (set below)",
}
# How many windows "Run to end" plays between screen updates: the plots grow while it runs.
RUN_UPDATE_EVERY = 4
# An idle browser session's episode is dropped after this long.
SESSION_TTL_S = 3600
PLOT_HEIGHT = 260
# Columns narrower than this wrap onto their own line: two plots side by side on a laptop, one
# per line on a phone (390 px).
PLOT_MIN_WIDTH = 320
EMPTY_STATE = (
    "**No episode yet.** Pick a task, a seed and a policy above, then press **Run episode** to play "
    "all 64 windows (a few seconds) or **Step** to play one window at a time. The plots, the grade "
    "and the per-tenant table appear here as the episode runs."
)
ITL_TPOT_NOTE = (
    "**ITL vs TPOT.** ITL is the gap between consecutive output chunks of the requests running in the "
    "window (with speculation one chunk carries several tokens, so its gap is longer). TPOT is a "
    "request's (finish − first token) / (output tokens − 1), over the requests that finished in the "
    "window: the SLO is on TPOT, so p50 ITL can sit above the TPOT SLO line while requests meet it."
)
LAST_WINDOW_NOTE = (
    "**The last window.** When the episode ends, every request still queued or running is charged as an "
    "SLO miss (the end-of-episode backlog), so the reward usually drops in the final window: a policy "
    "cannot defer its backlog past the horizon."
)
# A table's columns are at least ~67 px wide in Gradio 6.31, so the 8-column action timeline made a
# 390 px phone's page 533 px wide, and every plot drawn after that kept the width (Vega draws at its
# container's width and a fixed-width SVG then holds the container). `contain: inline-size` keeps
# a table's content from widening the page; the table, its columns sized by their content, scrolls
# sideways inside its own box instead (columns given as shares of a phone's width wrapped their
# text a letter or two a line).
DASHBOARD_CSS = """
<style>
#dash-actions, #dash-tenants { contain: inline-size; overflow-x: auto; }
</style>
"""
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
    # The props (colours, axis limits, title) each plot was last sent, by its place in the outputs:
    # see `only_changed_props`.
    plot_props: dict[int, dict[str, Any]] = field(default_factory=dict)

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
        "cost_usd": float(meta.get("cost_usd", 0.0)),
        **cluster_row(meta.get("cluster")),
        **action.knobs(),
        "weight_bits": weight_bits(action.quantization_tier),
    }


def cluster_row(cluster: dict[str, Any] | None) -> dict[str, int]:
    """The replica counts at the window's end (cluster tasks; zeros elsewhere, never plotted there)."""
    c = cluster or {}
    return {f"replicas_{state}": int(c.get(state, 0)) for state in ("ready", "starting", "draining")}


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


def tenant_frame(rows: list[dict[str, Any]], name: str) -> pd.DataFrame:
    """One tenant's SLO attainment per window, where it had a settled request (the metric reads 1.0
    over an empty window, which would draw a met SLO that nothing earned)."""
    records = []
    for r in rows:
        t = r["per_tenant"].get(name)
        if t is not None and t.get("met", 0) + t.get("missed", 0) > 0:
            records.append((r["step"], float(t["attainment"]), name))
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
    if any(r.get("replicas") is not None for r in rows):
        cols.insert(1, "replicas")
    table = pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)
    return table.round({"kv_budget_fraction": 3, "reward": 3})


def task_markdown(task_id: str) -> str:
    task = get_task(task_id)
    return f"**{task.task_id}** ({task.difficulty}): {task.description}"


def status_markdown(run: DashboardRun | None) -> str:
    if run is None:
        return "No episode yet."
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


def views(run: DashboardRun | None) -> tuple[Any, ...]:
    """Everything the page shows for `run`, in the order of `build_dashboard`'s outputs."""
    rows = run.rows if run is not None else []
    task = run.task if run is not None else None
    ttft_slos = {f"SLO {t.name}": t.ttft_slo_ms for t in task.tenants} if task else {}
    tpot_slos = {f"TPOT SLO {t.name}": t.tpot_slo_ms for t in task.tenants} if task else {}
    ttft = with_slo_lines(
        series_frame(rows, {"p50_ttft_ms": "p50 TTFT", "p99_ttft_ms": "p99 TTFT"}), rows, ttft_slos
    )
    itl = with_slo_lines(
        series_frame(rows, {"p50_itl_ms": "p50 ITL", "p50_tpot_ms": "p50 TPOT"}), rows, tpot_slos
    )
    started = run is not None
    plots = [
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
        plotted(series_frame(rows, {"kv_budget_fraction": "KV budget"}), from_zero=False),
        plotted(series_frame(rows, {"speculation_depth": "draft tokens"})),
        plotted(series_frame(rows, {"weight_bits": "weight bits"})),
        plotted(series_frame(rows, {"prefill_decode_split": "prefill/decode split"}), from_zero=False),
        plotted(series_frame(rows, {"priority_routing": "priority routing"}), from_zero=False),
        *tenant_plots(rows, task),
        *cluster_plots(rows, task),
    ]
    return (
        status_markdown(run),
        gr.update(visible=not started),
        gr.update(visible=started),
        grade_markdown(run),
        run.grade.model_dump(mode="json") if run is not None and run.grade is not None else None,
        tenant_totals(run) if run is not None else None,
        *only_changed_props(plots, run.plot_props if run is not None else {}),
        action_table(rows),
    )


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
        out.append(gr.update(value=update["value"], **changed))
    return out


def tenant_plots(rows: list[dict[str, Any]], task: TaskSpec | None) -> list[Any]:
    """MAX_TENANTS plot updates: one per tenant of the task, titled with its name; the rest hidden."""
    names = [t.name for t in task.tenants] if task is not None else []
    out = []
    for i in range(MAX_TENANTS):
        if i < len(names):
            out.append(plotted(tenant_frame(rows, names[i]), from_zero=False, visible=True,
                               title=f"SLO attainment: tenant {names[i]}"))
        else:
            out.append(gr.update(value=None, visible=False))
    return out


CLUSTER_SERIES = (
    ("replicas", "asked for"),
    ("replicas_ready", "ready"),
    ("replicas_starting", "starting (billed, loading)"),
    ("replicas_draining", "draining (no new requests)"),
    ("cost_usd", "$ per window"),
)


def cluster_plots(rows: list[dict[str, Any]], task: TaskSpec | None) -> list[Any]:
    """The replicas asked for, ready, starting and draining, and the cost: on cluster tasks only."""
    shown = task is not None and task.is_cluster
    if not shown:
        return [gr.update(value=None, visible=False) for _ in CLUSTER_SERIES]
    cluster_rows = [r if r.get("replicas") is not None else {**r, "replicas": r["replicas_ready"]} for r in rows]
    # from_zero=False: these axes are fixed where the plots are built
    return [plotted(series_frame(cluster_rows, {key: label}), from_zero=False, visible=True)
            for key, label in CLUSTER_SERIES]


def error_lines(exc: Exception) -> str:
    """An error as one short line per field (pydantic's own text, without its links), else one line."""
    if isinstance(exc, ValidationError):
        return "\n".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def first_heuristic_action(task_id: str, seed: int = 0) -> ServeAction:
    """The heuristic's action for the first window of (task, seed): where the manual knobs start,
    a valid action that keeps up with the task's load (the old defaults were a poor fixed setting)."""
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


def server_url(headers: dict[str, str]) -> str:
    """The URL a browser reached this server at (behind a proxy, the forwarded host and scheme)."""
    if os.environ.get("SPACE_HOST"):
        return f"https://{os.environ['SPACE_HOST']}"
    host = headers.get("x-forwarded-host") or headers.get("host") or "localhost:7860"
    scheme = headers.get("x-forwarded-proto") or "http"
    return f"{scheme.split(',')[0].strip()}://{host.split(',')[0].strip()}"


def python_markdown(url: str, task_id: str, seed: int, action: ServeAction) -> str:
    knobs = ",\n".join(f"    {k!r}: {v!r}" for k, v in action.knobs().items())
    return (
        "Play the same episode from Python against this server "
        f"(`pip install -e .` in a clone of the project):\n\n```python\n"
        "from llmserve_env import LLMServeEnv\n\n"
        f'env = LLMServeEnv.from_url("{url}")\n'
        f'observation = env.reset(task_id="{task_id}", seed={seed})\n'
        f"action = {{\n{knobs},\n}}\n"
        "while not observation.done:\n"
        "    observation, reward, done, info = env.step(action)\n"
        "print(env.grade())\n```"
    )


def build_dashboard(
    web_manager: Any,
    action_fields: list[dict[str, Any]],
    metadata: Any,
    is_chat_env: bool,
    title: str,
    quick_start_md: str,
) -> gr.Blocks:
    """OpenEnv's `gradio_builder` hook: the Dashboard tab (the landing tab; OpenEnv's generic
    Playground is the second tab)."""
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

    def start(task_id: str, seed: float | None, policy_name: str) -> DashboardRun:
        seed_value = seed_of(seed)
        try:
            return new_run(make_env(), task_id, seed_value, policy_name)
        except Exception as exc:  # shown to the visitor rather than as a server error page
            raise gr.Error(error_lines(exc)) from exc

    def advance(run: DashboardRun, manual: ServeAction) -> None:
        try:
            run.step(manual)
        except Exception as exc:
            raise gr.Error(f"step {run.obs.step_index + 1}: {error_lines(exc)}") from exc

    def on_new(task_id, seed, policy_name):
        run = start(task_id, seed, policy_name)
        return (run, *views(run))

    def current(
        run: DashboardRun | None, task_id: str, seed: float | None, policy_name: str
    ) -> tuple[DashboardRun, bool]:
        """The session's episode if it is unfinished and still what the page asks for, else a new one."""
        if run is None or run.done or not run.plays(task_id, seed_of(seed), policy_name):
            return start(task_id, seed, policy_name), True
        return run, False

    # A new episode first clears the plots: a plot rebuilt from empty takes the new episode's series
    # (another task's tenants and SLOs); one updated in place keeps the series it started with.
    def on_step(run, task_id, seed, policy_name, *knob_values_in) -> Iterator[tuple[Any, ...]]:
        manual = knobs(*knob_values_in)
        run, fresh = current(run, task_id, seed, policy_name)
        if fresh:
            yield (run, *views(run))
        advance(run, manual)
        yield (run, *views(run))

    def on_run(run, task_id, seed, policy_name, *knob_values_in) -> Iterator[tuple[Any, ...]]:
        manual = knobs(*knob_values_in)
        run, fresh = current(run, task_id, seed, policy_name)
        if fresh:
            yield (run, *views(run))
        while not run.done:
            advance(run, manual)
            if run.done or len(run.rows) % RUN_UPDATE_EVERY == 0:
                yield (run, *views(run))

    def on_task(task_id: str):
        """A new task: its description, and the manual knobs at its heuristic's first action."""
        return (task_markdown(task_id), *knob_values(first_heuristic_action(task_id)))

    def on_connect(task_id: str, seed: float | None, batch_cap: float, kv: float, spec: float, quant: str,
                   split: bool, prio: bool, request: gr.Request):
        headers = {k.lower(): v for k, v in dict(getattr(request, "headers", None) or {}).items()}
        try:
            action = make_action(int(batch_cap), float(kv), int(spec), quant, bool(split), bool(prio))
            seed_value = int(seed or 0)
        except (ValidationError, ValueError, TypeError):
            return gr.update()
        return python_markdown(server_url(headers), task_id, seed_value, action)

    def plot(title_text: str, y_title: str, y_lim: list[float | None] | None = None, **kw: Any) -> gr.LinePlot:
        # A plot that may be hidden sits in its row directly: a hidden plot in a column of its own
        # would leave the empty column's width behind.
        with gr.Column(min_width=PLOT_MIN_WIDTH) if kw.get("visible", True) else contextlib.nullcontext():
            return gr.LinePlot(
                x="step",
                y="value",
                color="series",
                title=title_text,
                x_title="window",
                y_title=y_title,
                y_lim=y_lim,  # type: ignore[arg-type]  # gradio defaults it to None, annotates a list
                color_title="",
                elem_classes=["llmserve-plot"],
                **{"height": PLOT_HEIGHT, "min_width": PLOT_MIN_WIDTH, **kw},
            )

    default_task = next(iter(TASKS))
    start_action = first_heuristic_action(default_task)
    b0, kv0, spec0, quant0, split0, prio0 = knob_values(start_action)
    with gr.Blocks(title=title) as dashboard:
        gr.HTML(DASHBOARD_CSS, container=False, padding=False, js_on_load=None)
        gr.Markdown(
            "## Episode dashboard\nPlay one episode in process and watch the server, window by "
            "window. Pick a task, a seed and a policy, then press **Run episode**. (The **Playground** "
            "tab is OpenEnv's generic form for single `reset`/`step` calls.)"
        )
        with gr.Row():
            task_in = gr.Dropdown(list(TASKS), value=default_task, label="Task", elem_id="dash-task",
                                  min_width=220)
            seed_in = gr.Number(value=0, precision=0, minimum=0, label="Seed", elem_id="dash-seed", min_width=120)
            policy_in = gr.Dropdown(
                policy_choices(),
                value="heuristic" if "heuristic" in POLICIES else MANUAL,
                label="Policy",
                elem_id="dash-policy",
                min_width=220,
            )
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
                    with gr.Accordion("Grade details: terms and reference points", open=False):
                        grade_json = gr.JSON(show_label=False)
                with gr.Column(scale=2, min_width=PLOT_MIN_WIDTH):
                    tenants_df = gr.Dataframe(
                        label="Per-tenant SLO attainment over the episode",
                        interactive=False,
                        elem_id="dash-tenants",  # scrolls inside its box on a phone (DASHBOARD_CSS)
                    )
            with gr.Row():
                ttft_plot = plot("Time to first token vs SLO", "ms")
                itl_plot = plot("Inter-token latency and TPOT vs the TPOT SLO", "ms")
            gr.Markdown(ITL_TPOT_NOTE, elem_id="dash-itl-note")
            with gr.Row():
                tps_plot = plot("Throughput", "output tokens/s")
                req_plot = plot("Arrivals vs goodput", "requests/s")
            with gr.Row():
                queue_plot = plot("Queue", "requests")
                kv_plot = plot("KV-cache occupancy and SLO compliance", "fraction", [0.0, 1.05])
            with gr.Row():
                evict_plot = plot("Evictions (preemptions)", "per window")
                reward_plot = plot("Reward", "per window")
            gr.Markdown(LAST_WINDOW_NOTE, elem_id="dash-last-window-note")
            with gr.Row():
                batch_plot = plot("Action: batch cap", "running sequences (most)")
                kvb_plot = plot("Action: KV budget", "fraction of free memory", [0.0, 1.05])
            with gr.Row():
                spec_plot = plot("Action: speculation depth", "draft tokens per step")
                bits_plot = plot("Action: quantization", "weight bits", [0.0, 17.0])
            with gr.Row():
                split_plot = plot("Action: prefill/decode split", "on = 1, off = 0", [0.0, 1.05], height=150)
                prio_plot = plot("Action: priority routing", "on = 1, off = 0", [0.0, 1.05], height=150)
            with gr.Row():
                tenant_plots_out = [plot("SLO attainment", "fraction of settled requests", [0.0, 1.05],
                                         visible=False) for _ in range(MAX_TENANTS)]
            # Fixed axes from the start: the replica counts often sit at one value for many windows.
            replicas_axis: list[float | None] = [0.0, max(t.replicas[1] for t in TASKS.values()) + 0.5]
            with gr.Row():
                replicas_plot = plot("Cluster: replicas asked for", "replicas", replicas_axis, height=180,
                                     visible=False)
                ready_plot = plot("Cluster: ready replicas", "replicas", replicas_axis, height=180, visible=False)
            with gr.Row():
                starting_plot = plot("Cluster: starting replicas", "replicas", replicas_axis, height=180,
                                     visible=False)
                draining_plot = plot("Cluster: draining replicas", "replicas", replicas_axis, height=180,
                                     visible=False)
            with gr.Row():
                cost_plot = plot("Cluster: cost", "$ per window", [0.0, None], visible=False)
            actions_df = gr.Dataframe(label="Action timeline", interactive=False, elem_id="dash-actions")
        with gr.Accordion("Connect from Python", open=False, elem_id="dash-connect"):
            python_md = gr.Markdown(elem_id="dash-python")
        run_state = gr.State(None, time_to_live=SESSION_TTL_S)

        outputs = [
            run_state,
            status_md,
            empty_md,
            results,
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
            kvb_plot,
            spec_plot,
            bits_plot,
            split_plot,
            prio_plot,
            *tenant_plots_out,
            replicas_plot,
            ready_plot,
            starting_plot,
            draining_plot,
            cost_plot,
            actions_df,
        ]
        knob_inputs = [batch_in, kv_in, spec_in, quant_in, split_in, prio_in]
        connect_inputs = [task_in, seed_in, *knob_inputs]
        # The form's own updates (task text, knobs, the Python panel) bypass Gradio's queue: a queued
        # event that finished while Step was being submitted could close the page's event stream
        # under the step, whose result then never arrived (the page waited forever; seen in the
        # browser test, 3 runs in ~15). Only the episode's buttons use the queue.
        task_in.change(on_task, inputs=task_in, outputs=[task_md, *knob_inputs], queue=False).then(
            on_connect, inputs=connect_inputs, outputs=python_md, queue=False)
        seed_in.change(on_connect, inputs=connect_inputs, outputs=python_md, queue=False)
        for knob in knob_inputs:
            knob.change(on_connect, inputs=connect_inputs, outputs=python_md, queue=False)  # type: ignore[attr-defined]  # every knob is an input component; the list is typed by their base class
        dashboard.load(on_connect, inputs=connect_inputs, outputs=python_md, queue=False)
        new_btn.click(on_new, inputs=[task_in, seed_in, policy_in], outputs=outputs)
        step_btn.click(
            on_step, inputs=[run_state, task_in, seed_in, policy_in, *knob_inputs], outputs=outputs
        )
        run_btn.click(on_run, inputs=[run_state, task_in, seed_in, policy_in, *knob_inputs], outputs=outputs)
    return dashboard
