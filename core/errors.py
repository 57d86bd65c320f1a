"""Errors the environment raises, each mapped to one HTTP status by server/app.py.

They carry a message that says what was wrong and what to do instead; none becomes a 500.
"""

from __future__ import annotations


class EnvError(Exception):
    """Base class: `status` is the HTTP status the server answers with."""

    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class EpisodeRequiredError(EnvError):
    status = 400

    def __init__(self, route: str):
        super().__init__(
            f"{route}: no episode to use. Over HTTP, call POST /reset first and pass the episode_id it returns "
            f"(in the JSON body for POST routes, as ?episode_id= for GET /state); a WebSocket /ws session or "
            f"the web playground (POST /web/reset, then /web/step) keeps its own episode: reset it first"
        )


class EpisodeNotFoundError(EnvError):
    status = 404

    def __init__(self, episode_id: str):
        super().__init__(
            f"episode_id {episode_id!r} is unknown or expired (idle episodes are dropped after the idle "
            f"timeout, and the least recently used when the store is full); call POST /reset for a new one"
        )


class EpisodeIdError(EnvError):
    status = 422

    def __init__(self, episode_id: object, max_len: int):
        shown = repr(episode_id)
        shown = shown if len(shown) <= 80 else f"{shown[:80]}... ({len(str(episode_id))} characters)"
        super().__init__(f"episode_id {shown} is not a valid id: 1 to {max_len} characters of A-Z a-z 0-9 "
                         f". _ : - (or leave it out and the server mints one)")


class EpisodeExistsError(EnvError):
    """A client named an id that is already taken: ids are never reused, whatever the episode's state."""

    status = 409

    def __init__(self, episode_id: str):
        super().__init__(f"episode_id {episode_id!r} is already in use; an id names one episode for good. "
                         f"Leave episode_id out (the server mints an unguessable one) or pick a new id")


class EpisodeDoneError(EnvError):
    status = 409

    def __init__(self, episode_id: str, horizon: int):
        super().__init__(
            f"episode {episode_id!r} is done (all {horizon} windows served); grade it with POST /grader "
            f"or call POST /reset for a new episode"
        )


class EpisodeNotDoneError(EnvError):
    status = 409

    def __init__(self, episode_id: str, step: int, horizon: int):
        super().__init__(
            f"episode {episode_id!r} is not finished ({step} of {horizon} windows served); "
            f"step it to done before grading"
        )


class UnknownSplitError(EnvError):
    status = 404

    def __init__(self, split: str, valid: str):
        super().__init__(f"unknown split {split!r}; this environment has one split, {valid!r}, holding every task")


class ForkUnsupportedError(EnvError):
    status = 409

    def __init__(self, episode_id: str, mode: str, failed: str | None = None):
        if failed is not None:
            why = f"its backend failed ({failed}); call POST /reset for a new episode"
        else:
            why = (f"its {mode} backend serves real requests on a real engine, whose state cannot be "
                   f"copied; forking needs sim mode (LLMSERVE_MODE=sim)")
        super().__init__(f"episode {episode_id!r} cannot be forked: {why}")

class UnknownProfileRequestError(EnvError):
    """POST /reset named a profile this server cannot serve (not an id it holds, or a broken file)."""

    status = 404


class SimOnlyOptionError(EnvError):
    """A sim-mode option (profile, caps) given to a real-mode server."""

    status = 409


class BackendFailure(EnvError):
    """The backend of one episode failed; that episode ends, others are untouched."""

    status = 502


class EndpointUnavailableError(EnvError):
    """Real mode's endpoint could not be reached for a whole window: the episode is kept at its step."""

    status = 503

    def __init__(self, episode_id: str, step: int, endpoint: str, reason: str):
        super().__init__(
            f"episode {episode_id!r}, step {step}: real-mode endpoint {endpoint} is unreachable ({reason}); "
            f"no window was served and the episode is kept at step {step}: send the same step again once the "
            f"endpoint is back, or end the episode (POST /reset starts a new one)")
        self.endpoint = endpoint


class TraceForbiddenError(EnvError):
    status = 403

    def __init__(self, path: str, root: str):
        super().__init__(f"trace file {path!r} is outside the folder this server replays traces from "
                         f"(LLMSERVE_TRACE_DIR={root}); put the file there and name it relative to it")


class ReplicasOutOfRangeError(EnvError):
    """`replicas` outside the task's allowed range (the single-server tasks allow exactly 1)."""

    status = 422

    def __init__(self, task_id: str, value: int, lo: int, hi: int, why: str | None = None):
        allowed = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
        where = f"; {why}" if why else ""
        super().__init__(f"replicas={value} is outside task {task_id!r}'s range: replicas must be {allowed} "
                         f"(or left out to keep the current count){where}; GET /tasks lists each task's range")
        self.loc = ["body", "action", "replicas"]
        self.input = value
