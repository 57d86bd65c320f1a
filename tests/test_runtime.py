"""The runtime layer: episodes behave as before (golden digests), layering holds, imports are light."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from golden import GOLDEN, POLICIES, SEEDS, TASKS, episode_digest
from llmserve_env.core.errors import EnvError, EpisodeDoneError, EpisodeNotDoneError
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeAction

ROOT = Path(__file__).resolve().parents[1]
STEADY = ServeAction(batch_cap=64, kv_budget_fraction=0.9, speculation_depth=0, quantization_tier="FP16",
                     prefill_decode_split=False, priority_routing=False)


@pytest.mark.parametrize("task_id", TASKS)
def test_episodes_match_their_golden_digests(task_id: str) -> None:
    """Observations and grades of 16 episodes per task hash as stored: a refactor changes nothing.
    (A change meant to move the dynamics rewrites the file: `python tests/golden.py --write`.)"""
    golden = json.loads(GOLDEN.read_text())
    for policy in POLICIES:
        for seed in SEEDS:
            key = f"{task_id}/{policy}/{seed}"
            assert episode_digest(task_id, policy, seed) == golden[key], key


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_nothing_outside_server_imports_server_or_openenv() -> None:
    """server/ wires the runtime to HTTP; nothing else imports it (or OpenEnv's web stack)."""
    offenders = []
    library = [*ROOT.glob("shared/*.py"), *ROOT.glob("sim/**/*.py"), *ROOT.glob("gateway/*.py"),
               *ROOT.glob("core/*.py"), *ROOT.glob("agents/*.py"), ROOT / "gym_env.py", *ROOT.glob("tools/*.py"),
               ROOT / "client.py", ROOT / "__init__.py"]
    for path in [*library, *ROOT.glob("bench/*.py")]:
        # the benches may drive a server through OpenEnv's own client, but start ours as a process
        banned = ("llmserve_env.server", "openenv", "gradio", "fastapi") if path in library else ("llmserve_env.server",)
        for name in _imports(path):
            if name.startswith(banned):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_simulator_imports_without_the_web_stack() -> None:
    code = ("import sys, llmserve_env.sim.backend, llmserve_env.core.inprocess; "
            "print(sorted(m for m in ('openenv', 'gradio', 'fastapi', 'mcp', 'httpx', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_in_process_env_errors_name_what_to_do() -> None:
    env = InProcessEnv()
    with pytest.raises(EnvError, match="reset"):
        env.step(STEADY)
    env.reset("static_workload", 0)
    with pytest.raises(EpisodeNotDoneError):
        env.grade()
    obs = env.reset("static_workload", 1)
    while not obs.done:
        obs = env.step(STEADY)
    assert 0.0 <= env.grade()["score"] <= 1.0
    with pytest.raises(EpisodeDoneError):
        env.step(STEADY)
