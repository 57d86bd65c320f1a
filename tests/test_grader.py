"""Grader on synthetic episode logs: range, determinism, every term's sensitivity, validation."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from llmserve_env.core.episode_log import EpisodeLog, StepRecord
from llmserve_env.core.grader import GradeError, compute_references, grade_episode
from llmserve_env.core.metrics import MetricsTracker
from llmserve_env.shared.backend import RequestRecord, WindowReport
from llmserve_env.shared.tasks import MAX_HORIZON, TASKS, UnknownTaskError
from llmserve_env.shared.workloads import generate_arrivals, resolve_task, windows
from llmserve_env.tools.grade import main
from pydantic import ValidationError

ACTION = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, "quantization_tier": "FP16",
          "prefill_decode_split": False, "priority_routing": False}


def synthetic_log(task_id: str, seed: int = 0, met: float | dict[str, float] = 1.0, quality: float = 1.0,
                  cost_ratio: float = 0.5, done: bool = True, draw_seed: int = 0) -> EpisodeLog:
    """A log whose requests each settle in their arrival window, met with probability `met` (per tenant)."""
    task = resolve_task(task_id)
    p = met if isinstance(met, dict) else {t.name: met for t in task.tenants}
    rnd = random.Random(draw_seed)
    steps = []
    for k, w in enumerate(windows(generate_arrivals(task, seed), task)):
        per = {t.name: {"arrived": 0, "met": 0, "missed": 0} for t in task.tenants}
        for a in w:
            per[a.tenant]["arrived"] += 1
            per[a.tenant]["met" if rnd.random() < p[a.tenant] else "missed"] += 1
        out = sum(a.output_tokens for a in w)
        n_met = sum(v["met"] for v in per.values())
        n_missed = sum(v["missed"] for v in per.values())
        metrics = {"arrivals": len(w), "slo_met": n_met, "slo_missed": n_missed, "output_tokens": out,
                   "quality": quality, "cost_usd": cost_ratio * task.cost_budget_per_1k * out / 1e3, "per_tenant": per}
        steps.append(StepRecord(step_index=k, action=ACTION, metrics=metrics, reward=0.0, reward_terms={}))
    return EpisodeLog(episode_id=f"syn-{task_id}-{seed}", task_id=task_id, seed=seed, mode="sim",
                      profile=task.profile, horizon=task.horizon, done=done, steps=steps)


def test_perfect_episode_scores_one():
    g = grade_episode(synthetic_log("static_workload"))
    assert g.score == 1.0 and g.terms == {"goodput": 1.0, "quality": 1.0, "cost": 1.0}
    assert g.task_id == "static_workload" and g.episode_id == "syn-static_workload-0"


@pytest.mark.parametrize("task_id", list(TASKS))
def test_scores_in_range_and_monotone_in_goodput(task_id):
    scores = [grade_episode(synthetic_log(task_id, met=p)).score for p in (0.0, 0.3, 0.6, 0.9)]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores == sorted(scores) and scores[0] == 0.0 and scores[-1] > 0.8


def test_grading_is_deterministic_and_survives_json():
    log = synthetic_log("bursty_workload", seed=3, met=0.7, quality=0.98, cost_ratio=1.3)
    a = grade_episode(log)
    b = grade_episode(EpisodeLog.model_validate_json(log.model_dump_json()))
    assert a == b
    assert json.loads(a.model_dump_json())["score"] == a.score


def test_goodput_term_moves():
    lo = grade_episode(synthetic_log("static_workload", met=0.4)).terms["goodput"]
    hi = grade_episode(synthetic_log("static_workload", met=0.8)).terms["goodput"]
    assert 0.3 < lo < 0.5 < 0.7 < hi < 0.9


def test_worst_tenant_term_moves_and_matters():
    fair = grade_episode(synthetic_log("adversarial_multitenant", met=0.8))
    starved = grade_episode(synthetic_log("adversarial_multitenant", met={"interactive": 0.2, "code": 1.0, "batch": 1.0}))
    assert fair.terms["worst_tenant"] > 0.7 and starved.terms["worst_tenant"] < 0.3
    # Nearly the same goodput overall, but sacrificing one tenant costs the grade.
    assert abs(fair.terms["goodput"] - starved.terms["goodput"]) < 0.15
    assert starved.score < fair.score - 0.2
    assert "worst_tenant" not in grade_episode(synthetic_log("static_workload")).terms


def test_quality_term_moves():
    fp16 = grade_episode(synthetic_log("static_workload", quality=1.0))
    lossy = grade_episode(synthetic_log("static_workload", quality=0.96))
    assert fp16.terms["quality"] == 1.0 and 0.0 < lossy.terms["quality"] < 1.0
    assert lossy.score == pytest.approx(fp16.score * lossy.terms["quality"])


def test_cost_term_moves():
    cheap = grade_episode(synthetic_log("static_workload", cost_ratio=0.9))
    dear = grade_episode(synthetic_log("static_workload", cost_ratio=2.0))
    assert cheap.terms["cost"] == 1.0 and dear.terms["cost"] == pytest.approx(0.5)
    assert dear.score == pytest.approx(0.5 * cheap.score)


def test_floor_level_goodput_scores_zero():
    task = TASKS["static_workload"]
    ref = compute_references(task, 0)
    n = ref.arrivals
    g = grade_episode(synthetic_log("static_workload", met=ref.floor_met / n))
    assert g.terms["goodput"] < 0.02 and g.score < 0.02


@pytest.mark.parametrize("task_id", list(TASKS))
def test_references_bracket_the_arrivals(task_id):
    task = TASKS[task_id]
    ref = compute_references(task, 5)
    assert ref == compute_references(task, 5)
    assert 0 <= ref.floor_met < ref.upper_met <= ref.feasible <= ref.arrivals
    assert sum(ref.arrivals_by_tenant.values()) == ref.arrivals
    assert sum(ref.floor_met_by_tenant.values()) == ref.floor_met
    for name, up in ref.upper_met_by_tenant.items():
        assert ref.floor_met_by_tenant[name] <= up <= ref.arrivals_by_tenant[name]


def test_upper_bound_binds_when_the_episode_cannot_hold_the_work():
    task = TASKS["static_workload"]
    cap = task.capacity()
    slow = type(cap)(cap.profile, peak_tokens_per_s=2000.0, min_itl_ms=cap.min_itl_ms,
                     serial_prefill_tps=cap.serial_prefill_tps, serial_itl_ms=cap.serial_itl_ms, source="test")
    ref = compute_references(task, 0, slow)
    work = sorted(a.prompt_tokens + a.output_tokens for a in generate_arrivals(task, 0))
    assert 0 < ref.upper_met < ref.feasible
    # The least work of any upper_met requests must fit in the episode's GPU-seconds.
    assert sum(work[: ref.upper_met]) <= 2000.0 * task.horizon * task.window_s


def test_unfinished_episodes_are_refused():
    with pytest.raises(GradeError, match="unfinished"):
        grade_episode(synthetic_log("static_workload", done=False))
    log = synthetic_log("static_workload")
    with pytest.raises(GradeError, match="unfinished"):
        grade_episode(log.model_copy(update={"steps": log.steps[:-1]}))


def _tampered(mutate) -> EpisodeLog:
    log = synthetic_log("adversarial_multitenant", met=0.5)
    data = json.loads(log.model_dump_json())
    mutate(data)
    return EpisodeLog.model_validate(data)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d["steps"][3]["metrics"].update(arrivals=d["steps"][3]["metrics"]["arrivals"] + 1), "arrivals"),
        (lambda d: d["steps"][2]["metrics"].update(slo_met=d["steps"][2]["metrics"]["slo_met"] + 1), "add up"),
        (lambda d: d["steps"][4].update(step_index=9), "step_index"),
        (lambda d: d.update(horizon=32), "horizon"),
        (lambda d: d.update(seed=1), "arrivals"),
        (lambda d: d["steps"][1]["metrics"].update(quality=1.5), "quality"),
        (lambda d: d["steps"][1]["metrics"].update(cost_usd=-1.0), "cost_usd"),
        (lambda d: d["steps"][1]["metrics"].update(output_tokens=2.5), "output_tokens"),
        (lambda d: d["steps"][1]["metrics"].pop("slo_missed"), "slo_missed"),
        (lambda d: d["steps"][1]["metrics"]["per_tenant"].pop("batch"), "per_tenant"),
        (lambda d: d["steps"][1]["metrics"]["per_tenant"]["code"].update(arrived=99), "tenant 'code'"),
        (lambda d: d["steps"][1]["metrics"].update(slo_met="many"), "slo_met"),
        (lambda d: d["steps"].append(dict(d["steps"][-1], step_index=64)), "64 steps|65 steps"),
    ],
)
def test_inconsistent_logs_are_refused(mutate, match):
    with pytest.raises(GradeError, match=match):
        grade_episode(_tampered(mutate))


def test_unsettled_requests_are_refused():
    def drop_last_window(d):
        m = d["steps"][-1]["metrics"]
        for entry in m["per_tenant"].values():
            entry["missed"] = 0
        m["slo_missed"] = 0
        m["slo_met"] = sum(e["met"] for e in m["per_tenant"].values())
    with pytest.raises(GradeError, match="settled"):
        grade_episode(_tampered(drop_last_window))


def test_nan_is_refused():
    log = synthetic_log("static_workload")
    log.steps[0].metrics["cost_usd"] = float("nan")
    with pytest.raises(GradeError, match="finite"):
        grade_episode(log)


def test_unknown_task_is_its_own_error():
    log = synthetic_log("static_workload").model_copy(update={"task_id": "no_such_task"})
    with pytest.raises(UnknownTaskError):
        grade_episode(log)


def test_oversized_logs_fail_validation():
    log = synthetic_log("static_workload")
    data = json.loads(log.model_dump_json())
    data["steps"] = data["steps"] * (MAX_HORIZON // len(data["steps"]) + 1)
    with pytest.raises(ValidationError):
        EpisodeLog.model_validate(data)
    data = json.loads(log.model_dump_json())
    data["steps"][0]["metrics"].update({f"k{i}": i for i in range(100)})
    with pytest.raises(ValidationError):
        EpisodeLog.model_validate(data)
    data = json.loads(log.model_dump_json())
    data["steps"][0]["action"] = {"x" * 100: 1}
    with pytest.raises(ValidationError):
        EpisodeLog.model_validate(data)


class PerfectBackend:
    """Serves each request alone, instantly: first token 1 ms after arrival, 1 ms per token."""

    name = "perfect"

    def run(self, arrivals, t0: float, dt: float) -> WindowReport:
        finished = []
        for a in arrivals:
            first = a.arrival_s + 1e-3
            finish = min(first + 1e-3 * (a.output_tokens - 1), t0 + dt - 1e-9)
            finished.append(RequestRecord(a.request_id, a.tenant, a.priority, a.arrival_s, a.prompt_tokens,
                                          a.output_tokens, status="ok", dispatch_s=a.arrival_s, first_token_s=first,
                                          finish_s=max(finish, first), output_tokens=a.output_tokens, attempts=1))
        out = sum(a.output_tokens for a in arrivals)
        return WindowReport(t0=t0, dt=dt, finished=finished,
                            first_tokens=[(a.request_id, a.tenant, 1e-3) for a in arrivals],
                            output_tokens=out, cost_usd=0.0, quality=1.0)


def test_log_built_from_metrics_tracker_grades():
    task = TASKS["adversarial_multitenant"]
    tracker = MetricsTracker(task)
    steps = []
    backend = PerfectBackend()
    ws = windows(generate_arrivals(task, 2), task)
    for k, w in enumerate(ws):
        m = tracker.observe(backend.run(w, k * task.window_s, task.window_s), w, final=k == len(ws) - 1)
        steps.append(StepRecord(step_index=k, action=ACTION, metrics=m.to_dict(), reward=1.0, reward_terms={}))
    log = EpisodeLog(episode_id="perfect", task_id=task.task_id, seed=2, horizon=task.horizon, done=True,
                     profile=task.profile, steps=steps)
    g = grade_episode(EpisodeLog.model_validate_json(log.model_dump_json()))
    assert g.terms["goodput"] == 1.0 and g.terms["worst_tenant"] == 1.0 and g.score == 1.0
    assert g.reference["met"] == sum(len(w) for w in ws)


def _trace_task_id(d: str, output_tokens: int) -> str:
    p = Path(d) / f"t{output_tokens}.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 250 * i, "input_length": 100 + i, "output_length": output_tokens})
                         + "\n" for i in range(40)))
    return f"trace:{p}?horizon=8"


def test_trace_replay_episode_grades():
    with tempfile.TemporaryDirectory() as d:
        task_id = _trace_task_id(d, 200)  # 1.5 s of serial decoding per request, one every 0.25 s
        full = grade_episode(synthetic_log(task_id, met=1.0))
        half = grade_episode(synthetic_log(task_id, met=0.5))
        assert full.score == 1.0 and 0.2 < half.score < 0.8
        assert full.reference["arrivals"] == 32 and full.reference["floor_met"] < 5


def test_light_load_where_the_naive_server_suffices_still_rewards_serving_all():
    with tempfile.TemporaryDirectory() as d:
        task_id = _trace_task_id(d, 20)  # the serial server keeps up with this
        ref = compute_references(resolve_task(task_id), 0)
        assert ref.floor_met == ref.upper_met
        scores = [grade_episode(synthetic_log(task_id, met=p)).score for p in (0.4, 0.75, 1.0)]
        assert scores[0] == 0.0 < scores[1] < scores[2] == 1.0


def test_cli_prints_references(capsys):
    assert main(["references", "--task", "static_workload", "--seed", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task_id"] == "static_workload" and out["floor_met"] < out["upper_met"]
    assert out["capacity"]["profile"] == TASKS["static_workload"].profile
