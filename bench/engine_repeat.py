"""The engine against itself: how far two recordings of the same seeds on the same engine are apart.

    python bench/engine_repeat.py DIR_A DIR_B [--seeds 4,5,6]

`bench/real_engine.py --out-dir DIR` keeps each seed's records (`records_seed{S}.jsonl`). Played twice, the
same seeds send the same requests at the same times to the same engine; what differs between the two is
the engine's and the machine's timing noise (and the queueing it feeds back into). This bench measures it
with the replay's own measures (sim/calibration/replay.py `engine_repeat`): per request |B / A - 1| of TTFT
and TPOT, medians over every request of the seeds recorded in both, overall and by run A's concurrency
(the buckets issue 29's target is stated in). A deterministic replay cannot follow that noise: where run
A against run B is e.g. 20 % in a bucket, a perfect step model's error against one run is about that over
sqrt(2) for symmetric noise (each run's own share), not zero. Both directions are printed (A as reference,
then B), since a median of |x - 1| is not symmetric in the ratio.

Last line: one JSON object, `ttft_err_pct`, `tpot_err_pct` (A as reference, pooled over seeds), `seeds`,
and per bucket `c{lo}_{hi}_ttft_err_pct`, `c{lo}_{hi}_tpot_err_pct`, `c{lo}_{hi}_n` ("c4_inf" for 4+).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from llmserve_env.sim.calibration.record_fit import load_runs
from llmserve_env.sim.calibration.replay import ConcurrencyRow, concurrency_table, engine_repeat
from real_engine import ACTION, replay_options  # what every real_engine.py episode plays

SEED_FILE = re.compile(r"records_seed(\d+)\.jsonl$")


def recorded_seeds(folder: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in folder.glob("records_seed*.jsonl") if (m := SEED_FILE.search(p.name)))


def bucket_key(r: ConcurrencyRow) -> str:
    return f"c{r.lo:g}_{r.hi:g}".replace(".", "p") if math.isfinite(r.hi) else f"c{r.lo:g}_inf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", type=Path, help="run A's --out-dir")
    ap.add_argument("second", type=Path, help="run B's --out-dir")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: every seed recorded in both)")
    ap.add_argument("--max-prompt-tokens", type=int, default=64, help="the caps the runs were played with")
    ap.add_argument("--max-completion-tokens", type=int, default=32)
    a = ap.parse_args()
    for d in (a.first, a.second):
        if not d.is_dir():
            ap.error(f"{d}: no such folder (give two bench/real_engine.py --out-dir folders)")
    both = sorted(set(recorded_seeds(a.first)) & set(recorded_seeds(a.second)))
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else both
    missing = [s for s in seeds if s not in both]
    if missing or not seeds:
        ap.error(f"seed {missing[0] if missing else '(none)'} is not recorded in both folders "
                 f"(in both: {both or 'none'})")

    kw = replay_options(a.max_prompt_tokens, a.max_completion_tokens)
    runs = {d: [r for s in seeds for r in load_runs(d / f"records_seed{s}.jsonl", [ACTION], **kw)]
            for d in (a.first, a.second)}
    print(f"the same seeds {seeds} recorded twice on one engine: A = {a.first}, B = {a.second}")
    print("per seed (A as reference): TTFT / TPOT median |B / A - 1|")
    for s in seeds:
        one = [r for r in runs[a.first] if r.seed == s]
        two = [r for r in runs[a.second] if r.seed == s]
        total, _ = engine_repeat(one, two)
        print(f"  seed {s:>3}: {total.ttft_err_pct:5.1f} / {total.tpot_err_pct:5.1f} %  ({total.n_ttft} requests; "
              f"output tokens A {total.real_tokens:.0f}, B {total.sim_tokens:.0f})")
    out: dict[str, float | int | str] = {}
    for ref, other, label in ((a.first, a.second, "A"), (a.second, a.first, "B")):
        total, rows = engine_repeat(runs[ref], runs[other])
        names = (label, "B" if label == "A" else "A")
        print(f"\n{label} as reference: TTFT {total.ttft_err_pct:.2f} %, TPOT {total.tpot_err_pct:.2f} % over "
              f"{total.n_ttft} requests; by {label}'s concurrency:")
        print(concurrency_table(rows, names))
        if label == "A":
            out.update({"ttft_err_pct": round(total.ttft_err_pct, 2), "tpot_err_pct": round(total.tpot_err_pct, 2),
                        "seeds": ",".join(map(str, seeds))})
            for r in rows:
                k = bucket_key(r)
                out.update({f"{k}_ttft_err_pct": round(r.ttft_err_pct, 2),
                            f"{k}_tpot_err_pct": round(r.tpot_err_pct, 2), f"{k}_n": r.n})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
