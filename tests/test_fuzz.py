"""Schemathesis over the whole OpenAPI schema: no input gets a 5xx, every response matches its schema.

Runs against the ASGI app in process (no sockets: an example costs about a millisecond), at most
MAX_EXAMPLES examples per operation. Every check Schemathesis has runs (no server error, only
documented status codes and content types, response bodies valid against their schemas,
schema-violating input rejected, schema-valid input accepted), with the exceptions below, each
for a reason outside this project's code.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.errors import FlakyStrategyDefinition
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings
from schemathesis.checks import positive_data_acceptance

MAX_EXAMPLES = 40

# Built at import: Schemathesis's lazy `from_fixture` loader breaks on pytest 9 (it writes the
# private `Function._nodeid`), so the schema is loaded eagerly, from an app of the fuzz's own.
APP = build_app(ServerSettings(mode="sim", max_episodes=64, idle_timeout_s=600.0, max_sessions=4,
                             max_body_bytes=256 * 1024))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(autouse=True, scope="module")
def stub_baseline_suite():
    """GET /baseline runs the whole baseline suite (minutes; with use_openai, calls to OpenAI):
    what is fuzzed here is its input handling, so the suite is a stub while this module runs, and a
    dummy key lets use_openai=true through (tests/test_baseline_inference.py runs the real suite)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("llmserve_env.server.baseline_inference.run_baseline_suite",
                   lambda **kwargs: {"stub": True, **kwargs})
        mp.setenv("OPENAI_API_KEY", "sk-fuzz-dummy-never-sent")
        yield


def excluded_checks(method: str, path: str) -> list[Any]:
    excluded = []
    if (method, path) == ("POST", "/grader"):
        # An episode_log can fit the schema and still not be a real episode of its task (the grader
        # replays the task's arrivals and checks every count): that is a 422 by design.
        excluded.append(positive_data_acceptance)
    if method == "POST" and path in ("/step", "/web/step"):
        # `replicas` fits the schema's 1..MAX_REPLICAS and can still be outside the episode's task's
        # own range (exactly 1 on the single-server tasks): a 422 naming the range, by design.
        excluded.append(positive_data_acceptance)
    return excluded


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,  # no example files in the checkout
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
def test_api_conforms_to_its_schema(case):
    case.call_and_validate(excluded_checks=excluded_checks(case.method, case.path))


# -- issue 20's inputs: each was a 500 (or worse) before; each is a 4xx naming what is wrong now -----
RAW_BODIES = [
    ("/grader", b'{"episode_log": {"seed": NaN}}'),
    ("/grader", b'{"episode_id": Infinity}'),
    ("/grader", b'{"episode_id": "\\ud800"}'),
    ("/mcp", b'{"jsonrpc": "2.0", "method": "\\ud800", "id": 1}'),
    ("/llmserve_env/task", b'{"split": "test", "index": NaN}'),
    ("/llmserve_env/task_range", b'{"split": "test", "start": -Infinity, "stop": 1}'),
    ("/llmserve_env/num_tasks", b'{"split": NaN}'),
    ("/llmserve_env/tasks", b'{"split": Infinity}'),
    ("/reset", b'{"seed": 18446744073709551616}'),
    ("/reset", b'{"seed": ' + b"9" * 400 + b"}"),
    ("/grader", b'{"episode_id": ' + b"9" * 5000 + b"}"),
    ("/grader", b"[" * 100_000 + b"]" * 100_000),
    ("/step", b'{"action": {"batch_cap": 1e400}, "episode_id": "x"}'),
    ("/reset", b'{"episode_id": "' + b"x" * 300 + b'"}'),
]


@pytest.mark.parametrize(("path", "body"), RAW_BODIES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(RAW_BODIES)])
def test_issue_inputs_are_4xx_never_500(path, body):
    from fastapi.testclient import TestClient

    with TestClient(APP, raise_server_exceptions=False) as client:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
        r.json()  # a readable JSON error, not a reset connection
        assert client.get("/health").status_code == 200  # and the connection/app carry on


TRACES = [
    ("tokens.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1e19,1\n", "", "above"),
    ("tokens30.jsonl", '{"timestamp": 0, "input_length": 1e30, "output_length": 1}\n', "", "above"),
    ("digits.jsonl", '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 1}\n', "", "JSON"),
    ("deep.jsonl", "[" * 200_000 + "\n", "", "longer than"),
    ("field.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1," + "1" * (128 * 1024) + "\n", "",
     "longer than"),
    ("speed.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,1,1\n", "?speedup=1e-310", "speedup"),
    ("window.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,1,1\n", "?window_s=1e-320",
     "window_s"),
    ("late.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1e300,1,1\n", "?horizon=1024", None),
]


@pytest.mark.parametrize(("name", "text", "query", "says"), TRACES, ids=[t[0] for t in TRACES])
def test_issue_traces_are_refused_or_served_never_500(tmp_path, name, text, query, says):
    from fastapi.testclient import TestClient

    (tmp_path / name).write_text(text)
    with TestClient(APP, raise_server_exceptions=False) as client:
        r = client.post("/reset", json={"task_id": f"trace:{tmp_path / name}{query}"})
        if says is None:
            assert r.status_code == 200, r.text
            eid = r.json()["observation"]["episode_id"]
            action = {"batch_cap": 8, "kv_budget_fraction": 0.9, "speculation_depth": 0,
                      "quantization_tier": "FP16", "prefill_decode_split": False, "priority_routing": False}
            assert client.post("/step", json={"action": action, "episode_id": eid}).status_code == 200
        else:
            assert r.status_code == 422, r.text
            assert says in r.json()["detail"][0]["msg"]


# -- the stateful phase: reset -> step -> step/state/grade through the schema's links --------------
# Its own app with room for every episode it starts: on the shared APP the stateless phase has filled
# the 64-episode store, so resets in a chain evicted earlier ones and the same derandomized draws met
# different answers (Hypothesis: FlakyStrategyDefinition, in the full suite only).
STATEFUL = schemathesis.openapi.from_asgi("/openapi.json", build_app(ServerSettings(
    mode="sim", max_episodes=4096, idle_timeout_s=600.0, max_sessions=4, max_body_bytes=256 * 1024))
).as_state_machine()


@pytest.mark.xfail(raises=FlakyStrategyDefinition, strict=False,
                   reason="Hypothesis sometimes reports its own draws as inconsistent between the derandomized "
                          "runs of the state machine (seen in the full suite and at times alone; not pinned "
                          "down). Only that error is tolerated: a 5xx or a failed check still fails the test.")
def test_stateful_chains_reset_step_grade():
    """Schemathesis chains calls along the OpenAPI links (server/openapi.py), with the episode_id a
    real /reset returned; every response is checked as in the stateless phase."""
    calls: list[tuple[str, int]] = []

    class Machine(STATEFUL):  # type: ignore[misc, valid-type]
        def after_call(self, response, case):
            calls.append((case.path, response.status_code))

        def validate_response(self, response, case, additional_checks=(), **kwargs):
            assert response.status_code < 500, (case.path, response.status_code, response.text[:300])
            # The same checks as the stateless phase, with the same exceptions (excluded_checks above).
            case.validate_response(response, additional_checks=additional_checks, transport_kwargs=kwargs,
                                   excluded_checks=excluded_checks(case.method, case.path))

    # Derandomized: the same sequences every run (a random 15 did not always reach /step).
    Machine.run(settings=settings(max_examples=25, stateful_step_count=8, deadline=None, database=None,
                                  derandomize=True, suppress_health_check=list(HealthCheck)))
    chained = {path for path, status in calls if status == 200}
    assert {"/reset", "/step"} <= chained, calls[:20]
    assert any(path == "/grader" for path, _ in calls), "no chain reached the grader"
