"""Before and after in one run: a bench measured on git revision REV's package and on this tree's.

    python bench/against.py --rounds 3 9d1832e fork -- --tasks adversarial_multitenant
    rounds = alternate(__file__, ["--child", "--episodes", "2"], "9d1832e", rounds=3)   # from a bench
    rows = compare(rounds, lower_is_better=("_ms", "_s"))

As a command it runs any bench script of this tree (its options after `--`) on both sides and
compares the numbers of its last JSON line (keys ending in `_ms` or `_s`, but not `_per_s`, are
times: lower is better). sim_speed, train_speed and http_step take `--against REV` themselves.

REV's tree is exported (`git archive`) into a temporary directory, and the bench script itself (this
tree's copy, so both sides measure the same way) runs as a child process with `--child`, once on
REV's package (put first on PYTHONPATH, ahead of the installed one) and once on this tree's,
alternating for `rounds` rounds: REV, this, REV, this, ... Both sides then see the same machine
load, which on a shared machine moves more than most changes do. Each child prints one JSON object
on its last line; every figure is the best of its rounds (the largest rate, the smallest time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check_rev(rev: str) -> str | None:
    """None when `rev` names a commit of this repository, else the reason it does not."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    return None if found.returncode == 0 else f"{rev!r} is not a commit of the repository at {ROOT}"


def alternate(script: str, child_args: Sequence[str], rev: str, rounds: int,
              quiet: bool = False) -> dict[str, list[dict[str, float]]]:
    """{"before": [one JSON result per round on REV], "after": [... on this tree]}."""
    out: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bench_against_") as tmp:
        pkg = Path(tmp) / "llmserve_env"
        pkg.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive.stdout, check=True)
        cmd = [sys.executable, str(Path(script).resolve()), *child_args]
        for rnd in range(rounds):
            for side in ("before", "after"):
                env = dict(os.environ)
                if side == "before":
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH")]))
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"the {side} child ({'REV ' + rev if side == 'before' else 'this tree'}) "
                                       f"failed:\n{done.stderr[-3000:]}")
                out[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
                if not quiet:
                    print(f"round {rnd + 1}/{rounds}: {side} measured", file=sys.stderr)
    return out


def compare(rounds: dict[str, list[dict[str, float]]], lower_is_better: Sequence[str],
            skip: Sequence[str] = (), counts: Sequence[str] = ()) -> dict[str, float]:
    """Prints a before / after / ratio table of the numeric figures (those whose key ends with one
    of `lower_is_better` are times: the smallest is kept and the ratio inverted, so above 1 is
    faster; keys ending with one of `skip` stay out of the table, not out of the JSON; `counts` are
    reported as measured here, without a ratio). Returns every figure as measured on this tree plus
    `<key>_before` and `<key>_speedup` (best of the rounds against best), and `<key>_paired` (the median over
    rounds of each round's after against the before measured just ahead of it: on a machine whose speed drifts
    between rounds, a best-of ratio compares two moments, a paired ratio the same one)."""
    def lower(key: str) -> bool:
        return key.endswith(tuple(lower_is_better)) and not key.endswith("_per_s")  # "_per_s": a rate

    def best(runs: list[dict[str, float]], key: str) -> float:
        vals = [r[key] for r in runs if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]
        return min(vals) if lower(key) else max(vals)

    def speedup(key: str, before: float, after: float) -> float:
        return (before / after if lower(key) else after / before) if before and after else float("nan")

    out: dict[str, float] = {}
    print(f"{'figure':<52} {'before':>10} {'after':>10} {'ratio':>7} {'paired':>7}")
    for key, value in rounds["after"][0].items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        after = best(rounds["after"], key)
        out[key] = after
        if key in counts:
            continue  # a count (steps, requests): the same on both sides, no ratio
        if not all(key in r for r in rounds["before"]):
            continue
        before = best(rounds["before"], key)
        ratio = speedup(key, before, after)
        paired = statistics.median(speedup(key, b[key], a[key]) for b, a in zip(rounds["before"], rounds["after"], strict=False)
                                   if key in a)
        out[f"{key}_before"] = before
        out[f"{key}_speedup"] = round(ratio, 3)
        out[f"{key}_paired"] = round(paired, 3)
        if not key.endswith(tuple(skip)):
            print(f"{key:<52} {before:>10.4g} {after:>10.4g} {ratio:>6.2f}x {paired:>6.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/against.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", help="the git revision measured as 'before'")
    ap.add_argument("script", help="a bench script's name (bench/NAME.py)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3; before REV)")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the script's options, after --")
    args = ap.parse_args(argv)
    bad = check_rev(args.rev)
    script = ROOT / "bench" / f"{args.script}.py"
    if bad:
        ap.error(f"argument rev: {bad}")
    if args.script in ("against", "local_server") or not script.is_file():
        ap.error(f"argument script: no bench script bench/{args.script}.py")
    if args.rounds < 1:
        ap.error(f"argument --rounds: expected an integer >= 1, got {args.rounds}")
    options = args.options[1:] if args.options[:1] == ["--"] else args.options
    print(json.dumps(compare(alternate(str(script), options, args.rev, args.rounds), lower_is_better=("_ms", "_s"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
