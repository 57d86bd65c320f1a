"""The Dockerfile, checked without a Docker engine.

The fast tests read the Dockerfile and .dockerignore and hold them to the Space's contract (slim
Python base, no torch, non-root user, port 7860, a health check on /health, sim mode, weights in
the build context). The slow test does what `docker build` + `docker run` would: it stages the
build context through .dockerignore, runs the Dockerfile's own install line in a fresh virtual
environment, starts the Dockerfile's own CMD (as uid 1000 when the test runs as root, like the
image's USER), and checks /health, /web, one simulated step and the HEALTHCHECK command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import STEADY_ACTION
from llmserve_env.tools.launch import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SPACE_PORT = "7860"
IMAGE_UID = 1000
IMAGE_HOME = "/home/app"  # the Dockerfile's `useradd --create-home ... app`


@dataclass
class Dockerfile:
    """The instructions this project's Dockerfile uses, parsed enough to replay them."""

    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    runs: list[str] = field(default_factory=list)
    user_runs: list[str] = field(default_factory=list)  # RUN lines after USER: they run as the image's user
    copies: list[str] = field(default_factory=list)
    user: str = ""
    expose: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    @property
    def install_line(self) -> str:
        lines = [r for r in self.runs if "pip install" in r]
        assert len(lines) == 1, f"expected exactly one pip install line, found {lines}"
        return lines[0]


def logical_lines(text: str) -> Iterator[str]:
    """Instructions with their backslash continuations joined; comments and blank lines dropped."""
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        yield buf + line
        buf = ""
    if buf:
        yield buf


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    df = Dockerfile()
    for line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            df.base = args.split()[0]
        elif keyword == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                df.env[key] = value
        elif keyword == "WORKDIR":
            df.workdir = args
        elif keyword == "RUN":
            df.runs.append(args)
            if df.user:
                df.user_runs.append(args)
        elif keyword == "COPY":
            df.copies.append(args)
        elif keyword == "USER":
            df.user = args
        elif keyword == "EXPOSE":
            df.expose.extend(args.split())
        elif keyword == "HEALTHCHECK":
            _, _, command = args.partition("CMD ")
            df.healthcheck = json.loads(command)
        elif keyword == "CMD":
            df.cmd = json.loads(args)
    return df


def ignore_rules(path: Path = DOCKERIGNORE) -> list[tuple[re.Pattern[str], bool]]:
    """.dockerignore as (regex, excludes) pairs, Docker's semantics: the last matching rule wins."""
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((re.compile(regex + "(?:/.*)?"), not negate))
    return rules


def ignored(relative: str, rules: list[tuple[re.Pattern[str], bool]]) -> bool:
    verdict = False
    for regex, excludes in rules:
        if regex.fullmatch(relative):
            verdict = excludes
    return verdict


def stage_context(dest: Path) -> None:
    """Copy the build context as `docker build .` would send it (symlinks are not followed)."""
    rules = ignore_rules()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = Path(dirpath).relative_to(ROOT)
        dirnames[:] = [d for d in dirnames if not ignored((rel_dir / d).as_posix(), rules)]
        (dest / rel_dir).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if not ignored(rel, rules):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(dirpath) / name, target, follow_symlinks=False)


def with_port(argv: list[str], port: int | str) -> list[str]:
    """The same command on a free port (7860 may be taken on a developer's machine)."""
    return [a.replace(SPACE_PORT, str(port)) if SPACE_PORT in a else a for a in argv]


# -- fast: the Dockerfile's contract ---------------------------------------------------------------
def test_base_image_is_slim_python():
    assert re.fullmatch(r"python:3\.1[1-9][\w.-]*-slim[\w.-]*", parse_dockerfile().base)


def test_install_line_uses_the_project_metadata_without_torch_or_extras():
    line = parse_dockerfile().install_line
    assert re.search(r"pip install (--no-cache-dir )?\.$", line), line
    assert "torch" not in line and "[" not in line and "requirements" not in line


def test_image_runs_as_a_non_root_user():
    user = parse_dockerfile().user
    assert user, "the Dockerfile must switch to a non-root USER"
    assert user.split(":")[0] not in {"0", "root"}


def test_serves_server_app_on_port_7860_in_sim_mode():
    df = parse_dockerfile()
    assert df.expose == [SPACE_PORT]
    assert df.env.get("LLMSERVE_MODE") == "sim"
    assert df.cmd[:3] == ["python", "-m", "llmserve_env.server.serving"]  # uvicorn with its bounds
    assert df.cmd[df.cmd.index("--host") + 1] == "0.0.0.0"
    assert df.cmd[df.cmd.index("--port") + 1] == SPACE_PORT


def test_healthcheck_probes_health():
    assert any(f"127.0.0.1:{SPACE_PORT}/health" in part for part in parse_dockerfile().healthcheck)


def test_build_context_keeps_what_the_image_needs_and_drops_the_rest():
    rules = ignore_rules()
    for needed in (
        "pyproject.toml",
        "README.md",
        "openenv.yaml",
        "weights",
        "server/app.py",
        "sim",
        "shared",
        "core",
        "tools",
    ):
        assert not ignored(needed, rules), needed
    for dropped in (".git", ".venv", "tests/test_x.py", "server/__pycache__/app.cpython-311.pyc", ".env"):
        assert ignored(dropped, rules), dropped


# -- slow: install and serve exactly as the image would --------------------------------------------
def _demote(uid: int) -> list[str]:
    """A prefix that runs a command as `uid` (the image's USER) when this test runs as root."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def _clean_env(extra: dict[str, str], venv: Path, home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"}
    }
    # the image user's home (useradd --create-home app) is the test's `home`
    env.update({k: str(home) + v[len(IMAGE_HOME):] if v.startswith(IMAGE_HOME + "/") else v for k, v in extra.items()})
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    env["HOME"] = str(home)
    # A container has its own /tmp; the host's may hold Gradio files another user made.
    env["TMPDIR"] = str(home)
    return env


@pytest.fixture(scope="module")
def installed_image() -> Iterator[tuple[Dockerfile, Path, Path, Path]]:
    """(dockerfile, staged context, fresh venv, home) after the Dockerfile's install line and its build steps
    as the image's user (the kernels' warm-up into that user's numba cache) ran."""
    df = parse_dockerfile()
    top = Path(tempfile.mkdtemp(prefix="llmserve-image-"))
    top.chmod(0o755)  # the demoted server must be able to read the context and the venv
    context, venv, home = top / "app", top / "venv", top / "home"
    context.mkdir()
    home.mkdir()
    try:
        stage_context(context)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = _clean_env(df.env, venv, home)
        started = time.monotonic()
        result = subprocess.run(
            ["/bin/sh", "-c", df.install_line],
            cwd=context,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, f"install failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        print(f"install took {time.monotonic() - started:.1f}s")
        # the build steps after USER (the kernels compiled into the user's numba cache, in `home`); run as this
        # test's user, their files then handed to the image's user as the image's own are
        for line in df.user_runs:
            done = subprocess.run(["/bin/sh", "-c", line], cwd=context, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, f"build step {line!r} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if _demote(IMAGE_UID):
            for path in [home, *home.rglob("*")]:
                os.chown(path, IMAGE_UID, IMAGE_UID)
        yield df, context, venv, home
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.slow
def test_installed_image_has_no_torch_and_ships_the_weights(installed_image):
    _, context, venv, _ = installed_image
    probe = (
        "import importlib.util, json, pathlib, llmserve_env; "
        "w = pathlib.Path(llmserve_env.__file__).parent / 'weights'; "
        "print(json.dumps({'torch': importlib.util.find_spec('torch') is not None, "
        "'weights': sorted(p.name for p in w.iterdir()) if w.is_dir() else None}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], cwd="/", capture_output=True, text=True, check=True
    )
    found = json.loads(out.stdout)
    assert found["torch"] is False
    # Whatever weights/ holds (tests/test_submission.py requires one file per task) is installed.
    weights = context / "weights"
    shipped = sorted(p.name for p in weights.iterdir() if p.is_file()) if weights.is_dir() else []
    assert sorted(found["weights"] or []) == shipped


# Folders of the source tree that are the package (the repository root is `llmserve_env`).
PACKAGE_DIRS = ("agents", "gateway", "server", "shared", "sim", "weights", "data")
ROOT_PACKAGE_FILES = ("openenv.yaml",)


@pytest.mark.slow
def test_installed_package_holds_every_file_of_the_source_packages(installed_image):
    """Data files the code reads beside itself (profiles, tuned settings, traces, weights) must reach
    the image: a file missing from package-data would be silently absent after `pip install .`."""
    _, context, venv, _ = installed_image
    source = {
        p.relative_to(context).as_posix()
        for top in PACKAGE_DIRS
        if (context / top).is_dir()
        for p in (context / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".md"  # notes, not data
    } | {name for name in ROOT_PACKAGE_FILES if (context / name).is_file()}
    probe = "import llmserve_env, pathlib; print(pathlib.Path(llmserve_env.__file__).parent)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], cwd="/", capture_output=True, text=True, check=True
    )
    installed = Path(out.stdout.strip())
    missing = sorted(rel for rel in source if not (installed / rel).is_file())
    assert not missing, f"not installed by `pip install .` (add them to package-data): {missing}"


@pytest.mark.slow
def test_image_cmd_serves_health_web_and_a_simulated_step(installed_image):
    df, context, venv, home = installed_image
    env = _clean_env(df.env, venv, home)
    # The image's trace folder (/app/traces: the install line made it under WORKDIR) is the staged
    # context's here.
    if env.get("LLMSERVE_TRACE_DIR", "").startswith(df.workdir):
        env["LLMSERVE_TRACE_DIR"] = str(context / Path(env["LLMSERVE_TRACE_DIR"]).relative_to(df.workdir))
    cmd = with_port(df.cmd, "{port}")
    cmd[0] = shutil.which(cmd[0], path=env["PATH"]) or cmd[0]
    log = home / "server.log"
    server = ServerProcess([*_demote(IMAGE_UID), *cmd], env=env, log=log, cwd=context).start()
    base, port = server.url, server.port
    try:
        health = httpx.get(base + "/health", timeout=2)
        assert health.status_code == 200 and health.json().get("status") == "healthy"

        web = httpx.get(base + "/web", timeout=30, follow_redirects=True)
        assert web.status_code == 200 and "text/html" in web.headers["content-type"]
        assert "gradio" in web.text.lower()
        config = httpx.get(base + "/web/config", timeout=30)
        assert config.status_code == 200 and "Dashboard" in config.text

        reset = httpx.post(base + "/reset", json={"task_id": "static_workload", "seed": 1}, timeout=30)
        assert reset.status_code == 200, reset.text
        episode_id = reset.json()["observation"]["episode_id"]
        step = httpx.post(base + "/step", json={"action": STEADY_ACTION, "episode_id": episode_id}, timeout=30)
        assert step.status_code == 200, step.text
        assert isinstance(step.json()["reward"], float)

        healthcheck = [
            str(venv / "bin" / "python") if a == "python" else a for a in with_port(df.healthcheck, port)
        ]
        assert subprocess.run(healthcheck, env=env, timeout=30).returncode == 0
    finally:
        server.stop()
