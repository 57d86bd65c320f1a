"""What a prompt costs after a cache hit on llama-server: its eval time by the tokens already cached.

    python bench/cached_prefill.py [--cached 0,128,256,384,512,768] [--new 77] [--repeats 3] [--out CSV]
    python bench/cached_prefill.py --base-url http://127.0.0.1:8080   # a running llama-server

Opt-in (needs the engine: scripts/build_llama_server.sh). Each measurement sends, on one slot
(`id_slot` 0, `cache_prompt`), a prompt of `cached` fresh token ids, then the same ids followed by `--new`
fresh ones; the engine's own `timings.prompt_ms` of the second is the cost of computing `new` tokens
after `cached` (`timings.prompt_n` must equal `new`: the cache held the rest, which the script checks).
The slope of that cost over `cached` (least squares through each length's median), divided by `new`, is `engine.cached_context_s` (sim/cached_context.py):
seconds per computed token per cached token, the attention over the cache that a measured step model,
fitted on prompts prefilled from scratch, cannot see. Prompts from scratch of several lengths are timed too,
for their own quadratic term beside it. Token ids go through llama-server's native `/completion` (a prompt
given as ids), so no tokenizer or chat template sits between the script and the count.

Prints a table, then one JSON object on its last line: `cached_context_s`, `intercept_ms`,
`slope_ms_per_cached_token`, `new_tokens`, `scratch_ms_per_token`, `scratch_pair_s`, `rows`.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_engine import MODEL_ALIAS, free_port, llama_dir, served_model, start_server  # noqa: E402

VOCAB = (1000, 40000)  # ids drawn from here: ordinary tokens of SmolLM2's 49,152 (no special ones)


@dataclass(frozen=True)
class Row:
    kind: str        # "cached": `new` tokens after `cached`; "scratch": `new` tokens from nothing
    cached: int
    new: int
    prompt_n: int    # what the engine computed (its timings)
    prompt_ms: float


def complete(url: str, ids: list[int]) -> tuple[int, float]:
    """(prompt tokens computed, their eval ms) of one prompt of token ids on slot 0, one token generated."""
    r = httpx.post(f"{url}/completion", json={"prompt": ids, "n_predict": 1, "cache_prompt": True, "id_slot": 0,
                                              "temperature": 0.0}, timeout=300.0)
    if r.status_code != 200:  # e.g. a prompt longer than a slot's context (-c / -np): the engine says which
        raise RuntimeError(f"a prompt of {len(ids)} tokens: HTTP {r.status_code} from {url}/completion: {r.text[:300]}")
    t = r.json()["timings"]
    return int(t["prompt_n"]), float(t["prompt_ms"])


def measure(url: str, cached: list[int], new: int, scratch: list[int], repeats: int, seed: int) -> list[Row]:
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(*VOCAB) for _ in range(n)]

    rows = []
    for _ in range(repeats):
        for n in cached:
            base = fresh(n)
            if n:
                complete(url, base)  # the slot now holds `base`
            got, ms = complete(url, base + fresh(new))
            if got != new:
                raise RuntimeError(f"after {n} cached tokens the engine computed {got}, not {new}: the slot did "
                                   "not keep the prefix (another client on this server?)")
            rows.append(Row("cached", n, new, got, ms))
            print(f"  cached {n:5d}  new {new:4d}  computed {got:4d}  {ms:8.1f} ms", flush=True)
        for n in scratch:
            got, ms = complete(url, fresh(n))
            rows.append(Row("scratch", 0, n, got, ms))
            print(f"  scratch        new {n:4d}  computed {got:4d}  {ms:8.1f} ms", flush=True)
    return rows


def medians(rows: list[Row], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, median ms at each): the cached lengths, or the scratch prompts' lengths. Medians, as one
    repeat that another process on the machine delayed would pull a least-squares line through every row."""
    key = (lambda r: r.cached) if kind == "cached" else (lambda r: r.new)
    xs = sorted({key(r) for r in rows if r.kind == kind})
    return (np.array(xs, float),
            np.array([float(np.median([r.prompt_ms for r in rows if r.kind == kind and key(r) == x])) for x in xs]))


def fit(rows: list[Row]) -> dict[str, float]:
    """The cached slope (least squares over the medians: ms per cached token, with `new` tokens computed)
    and the scratch prompts' ms per token and per causal pair (t = a n + b n (n + 1) / 2, over the medians)."""
    x, y = medians(rows, "cached")
    intercept, slope = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)[0]
    new = next(r.new for r in rows if r.kind == "cached")
    out = {"cached_context_s": float(slope) * 1e-3 / new, "intercept_ms": float(intercept),
           "slope_ms_per_cached_token": float(slope), "new_tokens": float(new)}
    n, ms = medians(rows, "scratch")
    if len(n) >= 2:
        a, b = np.linalg.lstsq(np.vstack([n, n * (n + 1) / 2]).T, ms, rcond=None)[0]
        out |= {"scratch_ms_per_token": float(a), "scratch_pair_s": float(b) * 1e-3}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cached", default="0,128,256,384,512,768", help="cached prefix lengths, tokens")
    ap.add_argument("--new", type=int, default=77, help="tokens computed after the prefix (a turn's new message)")
    ap.add_argument("--scratch", default="77,200,400,600,845", help="prompt lengths timed from scratch ('' none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slots", type=int, default=8, help="llama-server -np when the script starts it (-c 8192 is "
                    "shared: a slot holds 8192 / N tokens, 1024 at the runs' 8) [%(default)s]")
    ap.add_argument("--base-url", default=None, help="a running llama-server (its root, no /v1)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as CSV here")
    a = ap.parse_args(argv)
    cached = [int(x) for x in a.cached.split(",") if x.strip()]
    scratch = [int(x) for x in a.scratch.split(",") if x.strip()]
    if len(set(cached)) < 2 or min(cached) < 0 or a.new < 1 or a.slots < 1:
        ap.error("--cached needs two or more distinct lengths >= 0, --new >= 1, --slots >= 1")
    proc = None
    url = a.base_url
    if url is None:
        folder = llama_dir()
        if not (folder / "llama-server").exists():
            print(json.dumps({"skipped": f"no llama-server in {folder} (scripts/build_llama_server.sh)"}))
            return
        port = free_port()
        log = Path(tempfile.mkdtemp(prefix="cached_prefill-")) / "llama-server.log"
        proc = start_server(folder, folder / "model.gguf", MODEL_ALIAS, port, log, [], slots=a.slots)
        url = f"http://127.0.0.1:{port}"
    try:
        print(f"engine: {served_model(url + '/v1')} at {url}; {a.repeats} x ({len(cached)} cached lengths + "
              f"{len(scratch)} from scratch), one slot")
        rows = measure(url, cached, a.new, scratch, a.repeats, a.seed)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    if a.out is not None:
        with a.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
            w.writeheader()
            w.writerows(asdict(r) for r in rows)
    res = fit(rows)
    print(f"{'cached':>7} {'median ms':>10} {'fit ms':>8}")
    for n, ms in zip(*medians(rows, "cached"), strict=True):
        print(f"{int(n):7d} {ms:10.1f} {res['intercept_ms'] + res['slope_ms_per_cached_token'] * n:8.1f}")
    print(f"cached_context_s = {res['cached_context_s'] * 1e6:.3f} us per computed token per cached token "
          f"({a.new} computed)")
    if "scratch_pair_s" in res:
        print(f"from scratch: {res['scratch_ms_per_token']:.3f} ms a token + {res['scratch_pair_s'] * 1e6:.3f} us a "
              "causal pair")
    print(json.dumps(res | {"rows": len(rows)}))


if __name__ == "__main__":
    main()
