"""Pre-submission check: what the submission gate looks at, as one pass/fail checklist.

    python scripts/pre_submission_check.py --skip-docker
    python scripts/pre_submission_check.py --space-url https://NAME.hf.space
    python scripts/pre_submission_check.py --run-openai-baseline --baseline-runtime in-process \
        --model gpt-4.1-mini

The checks the test suite makes run as tests: `pytest -m presubmit` (every route a client uses,
a whole episode over HTTP and over OpenEnv's WebSocket client, the deterministic baseline in
process, over HTTP and from the command line, the shipped weights, openenv.yaml's reward floor,
OpenEnv's runtime graders over /ws; `--all-tests` runs the whole suite, `--skip-tests` none).
This script adds what tests cannot: `openenv validate` on the directory and on a live server
(started with llmserve_env.tools.launch.ServerProcess, the helper tests and benches use), that
server's peak memory against openenv.yaml's memory_mb, hadolint on the Dockerfile, the Space
front matter in README.md; without --skip-docker the image is built, run and validated by URL;
--space-url validates a deployed Space; --run-openai-baseline runs the OpenAI baseline.

Each check prints one line, PASS / FAIL / SKIP; the exit status is 1 when any check failed.
If the running interpreter cannot import llmserve_env, the script re-runs itself with the
project's .venv (made by `make install-dev` when missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
REEXEC_FLAG = "LLMSERVE_PRECHECK_REEXEC"


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
        return (f"pre-submission check {verdict}: {counts['PASS']} checks passed, {counts['FAIL']} failed, "
                f"{counts['SKIP']} skipped")


def run_command(argv: list[str], timeout_s: float) -> tuple[int, str]:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


def venv_tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    require(found is not None, f"{name} is not installed (make install-dev)")
    return str(found)


# -- checks -------------------------------------------------------------------------------------------
def check_tests(marker: str | None) -> Callable[[], str]:
    def check() -> str:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"] + (["-m", marker] if marker else [])
        code, out = run_command(argv, timeout_s=3600)
        require(code == 0, f"pytest exited {code}:\n{tail(out)}")
        return out.splitlines()[-1] if out else "no output"

    return check


def check_validate(target: str) -> Callable[[], str]:
    """`openenv validate` on the directory (target = its path) or on a server (target = a URL)."""

    def check() -> str:
        argv = [venv_tool("openenv"), "validate"]
        argv += ["--url", target, "--timeout", "30"] if target.startswith("http") else [target]
        code, out = run_command(argv, timeout_s=300)
        require(code == 0, f"openenv validate exited {code}:\n{tail(out)}")
        return next((line for line in out.splitlines() if line.startswith("Verdict")), out[-200:])

    return check


def check_hadolint() -> str:
    code, out = run_command([venv_tool("hadolint"), str(ROOT / "Dockerfile")], timeout_s=120)
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


def check_memory(peak_mb: Callable[[], float | None]) -> Callable[[], str]:
    """The server's peak memory after serving `openenv validate --url` against openenv.yaml's memory_mb."""

    def check() -> str:
        from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser

        limit = OpenEnvYamlParser().parse(ROOT).resources.memory_mb
        peak = peak_mb()
        if peak is None:
            return f"not measurable here (no /proc); declared {limit} MB"
        require(peak <= limit, f"the server peaked at {peak:.0f} MB > memory_mb {limit}")
        return f"{peak:.0f} MB peak <= memory_mb {limit}"

    return check


def check_openai_baseline(runtime: str, model: str | None, url: str) -> Callable[[], str]:
    def check() -> str:
        require(bool(os.environ.get("OPENAI_API_KEY")), "OPENAI_API_KEY is not set")
        argv = [sys.executable, "-m", "server.baseline_inference", "--mode", "openai", "--runtime", runtime,
                "--output", str(ROOT / "artifacts" / "baseline_openai.json")]
        argv += (["--model", model] if model else []) + (["--base-url", url] if runtime == "http" else [])
        code, out = run_command(argv, timeout_s=3600)
        require(code == 0, f"OpenAI baseline exited {code}:\n{tail(out)}")
        return tail(out, 1)

    return check


class DockerImage:
    """`docker build` the root Dockerfile and run it on a loopback port."""

    def __init__(self) -> None:
        from llmserve_env.tools.launch import free_port

        self.tag = "llmserve-env:pre-submission"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.container: str | None = None

    def build(self) -> str:
        require(shutil.which("docker") is not None, "docker is not installed (or pass --skip-docker)")
        code, out = run_command(["docker", "info"], timeout_s=60)
        require(code == 0, f"no Docker engine answers (pass --skip-docker): {tail(out, 3)}")
        code, out = run_command(["docker", "build", "-t", self.tag, "."], timeout_s=3600)
        require(code == 0, f"docker build failed:\n{tail(out)}")
        return self.tag

    def run(self) -> str:
        from llmserve_env.tools.launch import ServerStartError, wait_for_health

        port = self.url.rsplit(":", 1)[1]
        code, out = run_command(["docker", "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:7860", self.tag],
                                timeout_s=120)
        require(code == 0, f"docker run failed:\n{tail(out)}")
        self.container = out.splitlines()[-1]
        try:
            wait_for_health(self.url, 120)
        except ServerStartError as exc:
            raise CheckFailed(str(exc)) from None
        return f"container {self.container[:12]} healthy on {self.url}"

    def stop(self) -> None:
        if self.container:
            run_command(["docker", "rm", "-f", self.container], timeout_s=60)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-docker", action="store_true", help="do not build and run the Docker image")
    ap.add_argument("--space-url", default=None, help="also validate a deployed Space, e.g. https://NAME.hf.space")
    ap.add_argument("--run-openai-baseline", action="store_true", help="run the OpenAI baseline (OPENAI_API_KEY)")
    ap.add_argument("--baseline-runtime", choices=("in-process", "http"), default="in-process",
                    help="the OpenAI baseline in this process or against the local server")
    ap.add_argument("--model", default=None, help="chat model for the OpenAI baseline")
    tests = ap.add_mutually_exclusive_group()
    tests.add_argument("--skip-tests", action="store_true", help="run no tests (CI has run the suite already)")
    tests.add_argument("--all-tests", action="store_true", help="run the whole suite, not only -m presubmit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from llmserve_env.tools.launch import ServerProcess, ServerStartError

    args = parse_args(argv)
    checks = Checklist()
    if args.skip_tests:
        checks.add("test suite", "SKIP", "--skip-tests")
    else:
        marker = None if args.all_tests else "presubmit"
        checks.run(f"tests (pytest{' -m ' + marker if marker else ''})", check_tests(marker))
    checks.run("openenv validate (directory)", check_validate(str(ROOT)))
    checks.run("Dockerfile lint (hadolint)", check_hadolint)
    checks.run("README Space front matter", check_space_front_matter)

    log = ROOT / "artifacts" / "pre_submission_server.log"
    server = ServerProcess(env=dict(os.environ, LLMSERVE_MODE="sim", GRADIO_ANALYTICS_ENABLED="False"), log=log)

    def start() -> str:
        try:
            server.start()
        except ServerStartError as exc:
            raise CheckFailed(str(exc)) from None
        return f"serving at {server.url} (log {log.relative_to(ROOT)})"

    try:
        if checks.run("local server (uvicorn llmserve_env.server.app:app, sim mode)", start):
            checks.run("openenv validate --url (local server)", check_validate(server.url))
            checks.run("openenv.yaml memory_mb (local server's peak)", check_memory(server.peak_rss_mb))
            if args.run_openai_baseline:
                checks.run(f"OpenAI baseline ({args.baseline_runtime})",
                           check_openai_baseline(args.baseline_runtime, args.model, server.url))
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
                checks.run("openenv validate --url (image)", check_validate(image.url))
        finally:
            image.stop()

    if args.space_url:
        checks.run("openenv validate --url (Space)", check_validate(args.space_url.rstrip("/")))
    else:
        checks.add("deployed Space", "SKIP", "pass --space-url URL")

    print(checks.summary())
    return 1 if checks.failed else 0


if __name__ == "__main__":
    ensure_project_python()
    sys.exit(main())
