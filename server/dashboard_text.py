"""The dashboard's words: the notes beside the plots, the status line, the grade in words and bars,
the per-tenant table, and the "Connect from Python" code that replays the episode's own actions."""

from __future__ import annotations

import html
import math
import os

from llmserve_env.core.grader import GradeResult
from llmserve_env.server.dashboard_data import DashboardRun, tenant_totals
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import TaskSpec, get_task
from pydantic import ValidationError

EMPTY_STATE = (
    "**No episode yet.** Pick a task, a seed and a policy above, then press **Run episode** to play "
    "the whole episode (a few seconds) or **Step** to play one window at a time. The plots, the grade "
    "and the per-tenant table appear here as the episode runs. Run a second policy on the same task "
    "and seed and both are drawn on the same plots."
)
ITL_TPOT_NOTE = (
    "**ITL vs TPOT.** ITL is the gap between consecutive output chunks of the requests running in the "
    "window (with speculation one chunk carries several tokens, so its gap is longer). TPOT is a "
    "request's (finish − first token) / (output tokens − 1), over the requests that finished in the "
    "window: the SLO is on TPOT, so p50 ITL can sit above the TPOT SLO line while requests meet it."
)
LAST_WINDOW_NOTE = (
    "**The last window.** After it, no new request arrives and the engine keeps serving what is queued "
    "or running under the last action until every request is settled (at most 32 more windows; what is "
    "left then is missed): those drain windows are folded into the last window, so its reward, latencies "
    "and cost (on the cluster tasks, a jump) include them. A policy cannot defer its backlog past the "
    "horizon."
)
# Far-apart SLOs squash a plot: a TTFT SLO line more than this many times the task's tightest one is
# left off the plot and named in its note (multitenant_autoscale: batch 20,000 ms beside 1,000 ms;
# adversarial_multitenant's 300 / 800 / 4,000 ms, 13x apart, stay on one plot).
SLO_LINE_SPAN = 15.0

# Short names in the policy picker (a phone shows ~25 characters under its arrow); the description
# follows the pick in a line of its own.
POLICY_NAMES: dict[str, str] = {
    "heuristic": "Heuristic",
    "ppo": "PPO (trained)",
    "tuned_static": "Tuned static",
    "static": "Static (vLLM defaults)",
    "vllm_default": "vLLM defaults",
    "starve": "Starve (bad floor)",
    "random": "Random",
    "llm": "LLM (chat model)",
    "planner": "Planner",
    "clairvoyant": "Clairvoyant (a bound)",
    "hpa": "HPA (autoscaler)",
    "dynamo_planner": "Dynamo Planner",
    "manual": "Manual knobs",
}
POLICY_ABOUT: dict[str, str] = {
    "heuristic": "adaptive rules on the queue and the latencies",
    "ppo": "the shipped PPO actor (numpy, no torch)",
    "tuned_static": "the best fixed action found by a per-task search",
    "static": "vLLM's default settings, held",
    "vllm_default": "vLLM's default settings, held",
    "starve": "batch cap 1: a bad floor",
    "random": "a uniformly random action each window",
    "llm": "an OpenAI-compatible chat model picks each action",
    "planner": "lookahead on forks of the episode",
    "clairvoyant": "a planner that sees future arrivals: a bound, not a policy",
    "hpa": "the Kubernetes horizontal autoscaler's rule (cluster tasks)",
    "dynamo_planner": "Dynamo's predictive autoscaler (cluster tasks)",
    "manual": "the six knobs set by hand below",
}


def policy_about(name: str) -> str:
    return f"**{POLICY_NAMES.get(name, name)}**: {POLICY_ABOUT.get(name, name)}."


def task_markdown(task_id: str) -> str:
    task = get_task(task_id)
    return f"**{task.task_id}** ({task.difficulty}): {task.description}"


def status_markdown(run: DashboardRun | None) -> str:
    if run is None:
        return "No episode yet."
    state = "finished" if run.done else "running"
    total = run.rows[-1]["cumulative_reward"] if run.rows else 0.0
    text = (f"Episode `{run.obs.episode_id}`: task **{run.task.task_id}**, seed {run.seed}, "
            f"policy **{run.policy_name}**: {state}, window {run.obs.step_index}/{run.task.horizon}, "
            f"cumulative reward {total:.3f}.")
    if run.other is not None and run.other.grade is not None:
        text += f" Drawn beside it: **{run.other.policy_name}** on the same task and seed (grade {run.other.grade.score:.3f})."
    return text


def ttft_slo_lines(task: TaskSpec) -> tuple[dict[str, float], list[str]]:
    """The TTFT SLO lines drawn, and the tenants whose line is left off (far above the others)."""
    tightest = min(t.ttft_slo_ms for t in task.tenants)
    drawn = {f"SLO {t.name}": t.ttft_slo_ms for t in task.tenants if t.ttft_slo_ms <= SLO_LINE_SPAN * tightest}
    left = [f"{t.name} {t.ttft_slo_ms:,.0f} ms" for t in task.tenants if t.ttft_slo_ms > SLO_LINE_SPAN * tightest]
    return drawn, left


def ttft_note(task: TaskSpec | None) -> str:
    if task is None:
        return ""
    _, left = ttft_slo_lines(task)
    if not left:
        return ""
    return (f"TTFT SLO line left off the plot, far above the others (it would squash them): {', '.join(left)}. "
            "The per-tenant table and plots still judge each tenant by its own SLO.")


# -- the grade -----------------------------------------------------------------------------------------
TERM_WORDS = {"goodput": "goodput", "worst_tenant": "worst tenant", "quality": "quality", "cost": "cost"}


def worst_tenant(grade: GradeResult) -> str | None:
    """The tenant whose normalised met count is the grade's worst_tenant term (multi-tenant tasks)."""
    ref = grade.reference
    if "worst_tenant" not in grade.terms:
        return None
    best, name = math.inf, None
    for n, met in ref.get("met_by_tenant", {}).items():
        if not ref["arrivals_by_tenant"].get(n):
            continue
        floor, upper = ref["floor_met_by_tenant"][n], ref["upper_met_by_tenant"][n]
        share = (met - floor) / (upper - floor) if upper > floor else 1.0
        if share < best:
            best, name = share, n
    return name


def grade_formula(grade: GradeResult) -> str:
    """`grade = sqrt(goodput 0.81 x worst tenant 0.62) x quality 1.00 x cost 0.88` in words."""
    t = grade.terms
    base = (f"√(goodput {t['goodput']:.2f} × worst tenant {t['worst_tenant']:.2f})" if "worst_tenant" in t
            else f"goodput {t['goodput']:.2f}")
    return f"{base} × quality {t['quality']:.2f} × cost {t['cost']:.2f}"


def grade_markdown(run: DashboardRun | None) -> str:
    if run is None or run.grade is None:
        return "The grade appears when the episode ends."
    g = run.grade
    ref = g.reference
    lines = [f"## Grade: {g.score:.3f}", f"= {grade_formula(g)}"]
    if run.other is not None and run.other.grade is not None:
        diff = g.score - run.other.grade.score
        lines.append(f"**{run.policy_name} {g.score:.3f}** vs **{run.other.policy_name} "
                     f"{run.other.grade.score:.3f}** ({diff:+.3f}) on the same task and seed.")
    worst = worst_tenant(g)
    met = int(ref.get("met", 0))
    floor, upper = ref.get("floor_met", 0), ref.get("upper_met", 0)
    lines.append(f"Goodput: {met:,} requests met every SLO, against {floor:,.0f} for a naive server (0) and "
                 f"{upper:,.0f} for the upper bound (1).")
    if worst is not None:
        lines.append(f"Worst tenant: **{worst}** ({int(ref['met_by_tenant'][worst]):,} met of "
                     f"{int(ref['arrivals_by_tenant'][worst]):,}).")
    lines.append(f"Cost: ${ref.get('cost_per_1k_tokens', 0.0):.5f} per 1k output tokens against a budget of "
                 f"${ref.get('cost_budget_per_1k', 0.0):.5f}; quality: mean {ref.get('mean_quality', 1.0):.3f} "
                 "(quantization's accuracy).")
    return "  \n".join(lines)


def grade_bars(run: DashboardRun | None) -> str:
    """Each term of the grade as a bar from 0 to 1 (plain HTML: no script, no CDN)."""
    if run is None or run.grade is None:
        return ""
    graded = [(run.policy_name, run.grade)]
    if run.other is not None and run.other.grade is not None:
        graded.append((run.other.policy_name, run.other.grade))
    colours = ("#4c78a8", "#f58518")
    rows = []
    for term, word in (("score", "grade"), *TERM_WORDS.items()):
        if term != "score" and term not in run.grade.terms:
            continue
        for (name, grade), colour in zip(graded, colours, strict=False):
            value = grade.score if term == "score" else grade.terms.get(term, 0.0)
            label = word if len(graded) == 1 else f"{word} ({name})"
            rows.append(
                f'<div class="grade-bar" data-term="{term}" data-policy="{html.escape(name)}" data-value="{value:.4f}">'
                f'<span class="grade-bar-label">{html.escape(label)}</span>'
                f'<span class="grade-bar-track"><span class="grade-bar-fill" '
                f'style="width:{100 * max(0.0, min(1.0, value)):.1f}%;background:{colour}"></span></span>'
                f'<span class="grade-bar-value">{value:.2f}</span></div>')
    return f'<div id="dash-grade-bars-inner">{"".join(rows)}</div>'


def tenant_table(run: DashboardRun | None) -> str:
    """The per-tenant totals as a narrow HTML table (five columns fit a phone's 390 px)."""
    if run is None:
        return ""
    body = []
    for t in tenant_totals(run):
        att = "–" if t["attainment"] is None else f"{t['attainment']:.3f}"
        body.append(f"<tr><td>{html.escape(t['tenant'])} <small>(p{t['priority']})</small></td>"
                    f"<td>{t['ttft_slo_ms']:,.0f} / {t['tpot_slo_ms']:,.0f}</td>"
                    f"<td>{t['met']:,}</td><td>{t['missed']:,}</td><td>{att}</td></tr>")
    return ('<table class="dash-tenant-table"><caption>Per-tenant SLO attainment over the episode</caption>'
            "<thead><tr><th>tenant</th><th>SLO ms TTFT/TPOT</th><th>met</th><th>missed</th>"
            f"<th>share met</th></tr></thead><tbody>{''.join(body)}</tbody></table>")


def cluster_note(run: DashboardRun | None) -> str:
    """What the cluster plots do not show by themselves: draining replicas, and the last window's cost."""
    if run is None or not run.task.is_cluster or not run.rows:
        return ""
    most_draining = max(r["replicas_draining"] for r in run.rows)
    draining = ("no replica was still draining at any window's end in this episode (a drain ends in the "
                "window its last request finishes, and is billed until then: its cost is in the cost plot)"
                if most_draining == 0 else f"at most {most_draining} replica(s) draining at a window's end")
    return (f"**Replicas.** The x-axis is the time of day ({run.task.horizon} windows of "
            f"{run.task.window_s:g} s compress a day). Draining: {draining}. "
            "**Cost** is billed per replica-second from the request until the replica is gone, starting "
            "replicas included; the last window's also pays for the drain after the horizon (see the note "
            "on the last window), hence its jump.")


# -- Connect from Python ------------------------------------------------------------------------------
def server_url(headers: dict[str, str]) -> str:
    """The URL a browser reached this server at (behind a proxy, the forwarded host and scheme)."""
    if os.environ.get("SPACE_HOST"):
        return f"https://{os.environ['SPACE_HOST']}"
    host = headers.get("x-forwarded-host") or headers.get("host") or "localhost:7860"
    scheme = headers.get("x-forwarded-proto") or "http"
    return f"{scheme.split(',')[0].strip()}://{host.split(',')[0].strip()}"


def python_markdown(url: str, task_id: str, seed: int, actions: list[ServeAction],
                    played_by: str | None = None, grade: float | None = None) -> str:
    """Code that plays `actions` (the episode's own, one per window) on this server and prints the
    grade. Before any episode, `actions` is one action held for every window."""
    fields = list(actions[0].knobs()) if actions else []
    if played_by is None:
        intro = ("Play an episode from Python against this server, holding the action below every window "
                 "(run an episode here and this code replays its own actions instead)")
        rows = [tuple(actions[0].knobs().values())] if actions else []
        loop = ("while not observation.done:\n"
                "    observation, reward, done, info = env.step(dict(zip(FIELDS, ACTIONS[0])))\n")
    else:
        got = f" (the dashboard's grade: {grade:.3f})" if grade is not None else ""
        intro = (f"Replay this episode from Python against this server: the {len(actions)} actions "
                 f"**{played_by}** took, one per window, in order{got}")
        rows = [tuple(a.knobs().values()) for a in actions]
        loop = ("for values in ACTIONS:\n"
                "    observation, reward, done, info = env.step(dict(zip(FIELDS, values)))\n")
    table = "".join(f"    {row!r},\n" for row in rows)
    return (
        f"{intro} (`pip install -e .` in a clone of the project):\n\n```python\n"
        "from llmserve_env import LLMServeEnv\n\n"
        f"FIELDS = {tuple(fields)!r}\n"
        f"ACTIONS = [\n{table}]\n"
        f'env = LLMServeEnv.from_url("{url}")\n'
        f'observation = env.reset(task_id="{task_id}", seed={seed})\n'
        f"{loop}"
        'print(env.grade()["score"])\n```'
    )


def error_lines(exc: Exception) -> str:
    """An error as one short line per field (pydantic's own text, without its links), else one line."""
    if isinstance(exc, ValidationError):
        return "\n".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
