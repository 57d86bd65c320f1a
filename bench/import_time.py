"""How long the server takes to import: `python -X importtime -c 'import llmserve_env.server.app'`.

    python bench/import_time.py [--repeats 5]
    python bench/import_time.py --against main --repeats 5     # before (REV) and after in one run

Each repeat is a fresh interpreter (nothing cached in memory; the OS's file cache is warm after the
first), timed by the wall clock around the whole process, start-up included; the best of
`--repeats` is kept (the slower runs measure the neighbours on a shared machine). The table lists
the imports that took longest in the best run, cumulative, as `-X importtime` reports them. Last
line: one JSON object, `server_import_s` (and `simulator_import_s`, `import llmserve_env.sim.backend`
with the in-process environment, for the training workers' start), plus `_before`/`_speedup` keys
with `--against REV` (bench/against.py: REV's package and this tree's, alternating).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/against.py, run from anywhere

TARGETS = {
    "server_import_s": "import llmserve_env.server.app",
    "simulator_import_s": "import llmserve_env.sim.backend, llmserve_env.core.inprocess",
}


def _simulator_target() -> str:
    """The in-process environment's module: core/ since issue 25, runtime/ before (for --against)."""
    probe = subprocess.run([sys.executable, "-c", "import llmserve_env.core.inprocess"], capture_output=True)
    return TARGETS["simulator_import_s"] if probe.returncode == 0 else \
        "import llmserve_env.sim.backend, llmserve_env.runtime.inprocess"  # before issue 25 (for --against)


def time_import(code: str, repeats: int) -> tuple[float, list[tuple[float, str]]]:
    """Best wall time of `repeats` fresh processes, and that run's slowest imports (cumulative s)."""
    best = float("inf")
    best_log = ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{code!r} failed:\n{done.stderr[-2000:]}")
        if wall < best:
            best, best_log = wall, done.stderr
    rows: list[tuple[float, str]] = []
    for line in best_log.splitlines():
        # "import time:   self [us] | cumulative | imported package"
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative) / 1e6, name.rstrip()))
    return best, rows


def measure(repeats: int, top: int, quiet: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, code in (("server_import_s", TARGETS["server_import_s"]), ("simulator_import_s", _simulator_target())):
        wall, rows = time_import(code, repeats)
        out[key] = round(wall, 3)
        if not quiet:
            print(f"{code}: {wall:.3f} s wall (best of {repeats}); slowest imports (cumulative s):")
            # the imports at depth 0 and 1 (what the statement imports, and what those import directly):
            # deeper ones are inside these figures already
            shallow = [(c, n) for c, n in rows if (len(n) - len(n.lstrip()) - 1) // 2 <= 1]
            for cumulative, name in sorted(shallow, reverse=True)[:top]:
                print(f"  {cumulative:8.3f}  {name.strip()}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/import_time.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="fresh processes per figure; the best is kept (default 5)")
    ap.add_argument("--top", type=int, default=8, help="slowest top-level imports listed (default 8)")
    ap.add_argument("--against", metavar="REV", help="also measure git revision REV's package, alternating")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"argument --repeats: expected an integer >= 1, got {args.repeats}")
    if args.against:
        from against import alternate, check_rev, compare

        bad = check_rev(args.against)
        if bad:
            ap.error(f"argument --against: {bad}")
        # each child times once; the rounds alternate REV and this tree, and the best of each is kept
        rounds = alternate(__file__, ["--child", "--repeats", "1"], args.against, rounds=args.repeats)
        print(json.dumps(compare(rounds, lower_is_better=("_s",))))
        return 0
    out = measure(args.repeats, args.top, quiet=args.child)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
