"""Grades a submitted episode log can be trusted for: a sim-mode log is replayed, not believed.

    result = grade_log(log)        # GradeResult; GradeError (a 422) when the log does not replay

A sim-mode log names everything the simulator needs to play it again: the task (its arrivals come
from task and seed), the profile, the seed (the engine's random stream) and every window's
action. `grade_log` plays those actions on a fresh simulator and compares each window's recorded
metrics and reward with the replay's. The first window that differs refuses the log (GradeError,
naming the window and the metric); a log that replays is graded on the replayed metrics, with
`verified: true`. The simulator is deterministic, so an honest log replays exactly (floats are
compared to 1e-9 relative, which only absorbs a JSON writer that prints fewer digits).

A real-mode log cannot be replayed (its latencies were measured against an endpoint): it is
refused unless the caller allows it (`allow_real`: a real-mode server, or a sim-mode one with
LLMSERVE_GRADE_REAL_LOGS=1, or `--allow-real` on `python -m llmserve_env.tools.grade verify`), and then graded as submitted with
`verified: false`, meaning the score is only as good as the client that wrote the metrics. Episodes this process played itself (`grade_own`) are graded with
`verified: true`: their metrics never left the server.

Replaying costs what playing cost (about 1-2 ms per window on the built-in tasks); callers on an
event loop run it in a worker thread.
"""

from __future__ import annotations

import math
from typing import Any

from llmserve_env.core.episode import Episode
from llmserve_env.core.episode_log import EpisodeLog
from llmserve_env.core.grader import GradeError, GradeResult, grade_episode
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.workloads import resolve_task
from pydantic import ValidationError

REL_TOL = 1e-9
ABS_TOL = 1e-9


def grade_own(ep: Episode) -> GradeResult:
    """Grade an episode this process played (its metrics are its own): verified."""
    return grade_episode(ep.episode_log(), ep.played).model_copy(update={"verified": True})


def grade_log(log: EpisodeLog, allow_real: bool = False) -> GradeResult:
    """Grade a submitted log: replayed and verified in sim mode; a real-mode log only with
    `allow_real` (as submitted, verified: false), else GradeError: nothing can check its metrics,
    so a made-up log labelled `mode: real` would otherwise earn any score it claims."""
    if log.mode == "real":
        if not allow_real:
            raise GradeError("a mode: real log cannot be replayed (its latencies were measured against an "
                             "endpoint), so its metrics are only the submitter's word; this server grades only "
                             "sim-mode logs. A real-mode server grades real logs, and a sim-mode one does when "
                             "its operator sets LLMSERVE_GRADE_REAL_LOGS=1 (verified: false)")
        return grade_episode(log).model_copy(update={"verified": False})
    replayed = replay(log)
    return grade_episode(replayed.episode_log()).model_copy(
        update={"verified": True, "episode_id": log.episode_id})


def replay(log: EpisodeLog) -> Episode:
    """Play the log's actions on a fresh simulator; GradeError at the first window that differs."""
    task = resolve_task(log.task_id)  # UnknownTaskError / TraceError propagate
    if log.horizon != task.horizon:
        raise GradeError(f"log horizon {log.horizon} differs from task {task.task_id!r}'s {task.horizon}")
    if not log.done or len(log.steps) != task.horizon:
        raise GradeError(f"episode {log.episode_id!r} is unfinished or overlong: {len(log.steps)} of "
                         f"{task.horizon} steps{'' if log.done else ', not done'}")
    profile = None
    if log.profile and log.profile != task.profile:
        # Played on another profile (reset's `profile`): replayable when this machine holds that id.
        # Only an id: a log never names a file for the server to read.
        from llmserve_env.sim.profiles import list_profiles

        if log.profile not in list_profiles():
            raise GradeError(f"log profile {log.profile!r} is not a simulator profile this machine holds, so "
                             f"the log cannot be replayed (task {task.task_id!r} runs on {task.profile!r})")
        profile = log.profile
    # The log's id is only a label here (grade_log keeps it). Known limit: an episode played with
    # reset's `caps` does not record them, so it does not replay and is refused.
    ep = Episode.start(task, log.seed, "sim", profile=profile)
    try:
        for k, step in enumerate(log.steps):
            if step.step_index != k:
                raise GradeError(f"step {k}: step_index is {step.step_index}, expected {k}")
            try:
                action = ServeAction.model_validate(step.action)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                where = ".".join(str(p) for p in first["loc"])
                raise GradeError(f"step {k}: action is not a valid ServeAction ({where}: {first['msg']})") from None
            obs = ep.step(action)
            mine = ep.steps[-1]
            diff = first_difference(step.metrics, mine.metrics)
            if diff is None and not _close(step.reward, mine.reward):
                diff = f"reward: logged {step.reward!r}, replayed {mine.reward!r}"
            if diff is not None:
                raise GradeError(f"window {k} does not replay: {diff}; the log's metrics are not what "
                                 f"its task, seed, profile and actions produce")
            del obs
    finally:
        ep.close()
    return ep


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return bool(a == b)


def first_difference(logged: dict[str, Any], replayed: dict[str, Any], prefix: str = "") -> str | None:
    """The first key (in the replay's order) whose value differs, as text; None when all agree."""
    extra = sorted(set(logged) - set(replayed))
    if extra:
        return f"metric {prefix}{extra[0]!r} is not one the simulator reports"
    for key, mine in replayed.items():
        if key not in logged:
            return f"metric {prefix}{key!r} is missing"
        theirs = logged[key]
        if isinstance(mine, dict):
            if not isinstance(theirs, dict):
                return f"metric {prefix}{key!r}: logged {type(theirs).__name__}, replayed a mapping"
            inner = first_difference(theirs, mine, f"{prefix}{key}.")
            if inner is not None:
                return inner
        elif not _close(theirs, mine):
            return f"metric {prefix}{key!r}: logged {theirs!r}, replayed {mine!r}"
    return None
