"""Every third-party module the package imports comes from a distribution pyproject.toml declares
(an extra's for the files that need one: train.py, train_rllib.py, tune_ppo.py, agents/parallel.py's
Ray runner), not from one that merely happens to be installed alongside."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_THE_PACKAGE = ("tests", "bench", "scripts", "build", "outputs", "runs", "weights")


def _top_level_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


# Files that may import an extra's distributions (imported lazily, or only by an opt-in command).
EXTRAS_OF = {
    "tools/train.py": ("train",),
    "tools/train_rllib.py": ("rllib", "train"),
    "tools/tune_ppo.py": ("rllib", "train"),
    "agents/parallel.py": ("ray",),
    "agents/autoscale.py": ("autoscale",),
}


def test_every_imported_distribution_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"])
    extras = project["optional-dependencies"]
    providers = md.packages_distributions()
    missing = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or rel.parts[0] in NOT_THE_PACKAGE:
            continue
        allowed = set(declared)
        for extra in EXTRAS_OF.get(rel.as_posix(), ()):
            allowed |= _names(extras.get(extra, []))
        for module in _top_level_imports(path) - set(sys.stdlib_module_names) - {"llmserve_env", "__future__"}:
            # an extra that is not installed here: its distribution is named after the module (ray)
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [module])}
            if not dists & allowed:
                missing.append(f"{rel}: {module} ({sorted(dists) or 'not installed'})")
    assert missing == [], "import not declared in pyproject.toml"
