"""Every third-party module the package imports comes from a distribution pyproject.toml declares
(the `train` extra for train.py), not from one that merely happens to be installed alongside."""

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


def test_every_imported_distribution_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"])
    train = declared | _names(project["optional-dependencies"]["train"])
    providers = md.packages_distributions()
    missing = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or rel.parts[0] in NOT_THE_PACKAGE:
            continue
        allowed = train if rel.name == "train.py" and len(rel.parts) == 1 else declared
        for module in _top_level_imports(path) - set(sys.stdlib_module_names) - {"llmserve_env", "__future__"}:
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            if not dists & allowed:
                missing.append(f"{rel}: {module} ({sorted(dists) or 'not installed'})")
    assert missing == [], "import not declared in pyproject.toml"
