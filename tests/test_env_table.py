"""The variable table (docs/configuration.md) is the one generated from the settings, and lists every variable."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("env_table", ROOT / "scripts" / "env_table.py")
assert spec is not None and spec.loader is not None
env_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(env_table)

# Read by tests and scripts only (CI switches), not by the package.
NOT_SETTINGS = {"LLMSERVE_REQUIRE_BROWSER", "LLMSERVE_REQUIRE_TORCH", "LLMSERVE_PRECHECK_REEXEC"}


def test_readme_table_is_the_generated_one():
    assert env_table.readme_table(env_table.README.read_text()) == env_table.table(), \
        "run `python scripts/env_table.py --write`"


def test_every_variable_the_package_reads_is_in_the_table():
    listed = {v for v, _, _, _ in env_table.rows()}
    sources = [p for p in ROOT.rglob("*.py") if not p.relative_to(ROOT).parts[0].startswith(
        (".", "tests", "scripts", "bench", "build"))]
    used = {m for p in sources for m in re.findall(r"\bLLMSERVE_[A-Z0-9_]*[A-Z0-9]\b", p.read_text())}
    assert used - listed - NOT_SETTINGS == set()
