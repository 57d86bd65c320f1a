"""What compiling the engine's event loop would buy: the loop's shape in plain Python and under numba.

    python bench/compiled_loop.py [--requests 30000] [--repeats 3]

Issue 27 asks for a simulator ten times faster, and the engine's Python is at its floor (sim/engine.py:
~8 us of CPU per event on a cluster episode, every hop already inlined; docs/benchmarks.md). Before porting ~1,000 lines to
a compiled core over arrays, this sizes the gain on the loop's shape alone: Poisson arrivals, each
admitted by one prefill iteration (a step time from dense and LM-head tables plus a context term),
decode runs between events summed in closed form (steps t_j = A + B j, `sim.engine.steps_to_cover`'s
formula), and a heap of finish iterations. The same function body runs as plain Python (on lists) and
compiled by numba's `njit` (on arrays); both must end at the same simulated clock to the last bit (no
fastmath: the compiled float operations are the interpreter's, in the same order), which the bench
checks. It is a model of the loop, not the engine: no scheduler, KV accounting, preemption,
speculation, measurements or records, which make the engine's Python ~10x slower per event than this
one's; how much of that the compiled core keeps is what the port would measure.

numba is not a dependency of the project: without it (`pip install numba`) only the Python column is
printed. Timed by `time.process_time`, the best of `--repeats`; the compiled function's first call
(compiling it, or loading it from numba's cache) is reported apart. Last line: one JSON object,
`events`, `python_ns_per_event`, and with numba `compiled_ns_per_event`, `compiled_speedup`,
`first_call_s`, `same_clock` (true when both ended at the same simulated time and event count).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TABLE_SIZE = 8192
T_FIXED_S = 1e-3       # host overhead per iteration (the order of sim/profiles' t_fixed_s)
CTX_S_PER_TOKEN = 1e-8  # decode attention per token of context


def event_loop(arr: Any, prompt: Any, target: Any, dense: Any, head: Any) -> tuple[int, int, float]:
    """(events, requests finished, final clock): the engine's loop shape (module docstring)."""
    n_req = len(arr)
    i = 0
    t = 0.0
    it = 0
    sync = [0] * n_req  # the iteration each request joined decoding at
    live = 0
    context = 0.0
    per_iter = 0.0
    fin = [(0, 0)]
    fin.pop()  # typed as (int, int) for numba, empty
    events = 0
    finished = 0
    while i < n_req or live:
        events += 1
        if i < n_req and arr[i] <= t:  # an arrival: one prefill iteration beside the decoding requests
            dt = T_FIXED_S + dense[live + prompt[i]] + head[live + 1] + CTX_S_PER_TOKEN * context
            t += dt
            it += 1
            context += per_iter
            sync[i] = it
            live += 1
            context += prompt[i] + 1.0
            per_iter += 1.0
            heapq.heappush(fin, (it + target[i] - 1, i))
            i += 1
            continue
        if live == 0:
            t = arr[i]
            continue
        a = T_FIXED_S + dense[live] + head[live] + CTX_S_PER_TOKEN * context
        b = CTX_S_PER_TOKEN * per_iter
        kcap = fin[0][0] - it
        span = arr[i] - t if i < n_req else math.inf
        if span == math.inf:
            k = kcap
        elif span <= a:
            k = 1
        elif b <= a * 1e-12:
            k = math.ceil(span / a)
        else:
            h = a - 0.5 * b
            k = math.ceil((-h + math.sqrt(h * h + 2.0 * b * span)) / b)
        k = max(1, min(k, kcap))
        t += k * a + b * k * (k - 1) * 0.5
        it += k
        context += k * per_iter
        while fin and fin[0][0] <= it:
            _, r = heapq.heappop(fin)
            context -= prompt[r] + 1.0 + (it - sync[r])
            per_iter -= 1.0
            finished += 1
            live -= 1
    return events, finished, t


def workload(n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / 20.0, n))
    prompt = rng.integers(50, 1500, n)
    target = rng.integers(20, 400, n)
    dense = np.arange(TABLE_SIZE) * 2e-6 + 5e-3
    head = np.arange(TABLE_SIZE) * 1e-7
    dense[0] = head[0] = 0.0
    return arr, prompt, target, dense, head


def best_of(fn: Callable[..., tuple[int, int, float]], args: tuple[Any, ...],
            repeats: int) -> tuple[float, tuple[int, int, float]]:
    best, out = math.inf, (0, 0, 0.0)
    for _ in range(repeats):
        c0 = time.process_time()
        out = fn(*args)
        best = min(best, time.process_time() - c0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    from llmserve_env.tools import cli

    ap = argparse.ArgumentParser(prog="python bench/compiled_loop.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=cli.int_at_least(1), default=30_000, help="arrivals simulated (default 30000)")
    ap.add_argument("--repeats", type=cli.int_at_least(1), default=3, help="timed runs, the fastest kept (default 3)")
    ap.add_argument("--seed", type=cli.int_at_least(0), default=0, help="the workload's seed (default 0)")
    args = ap.parse_args(argv)
    arrays = workload(args.requests, args.seed)
    py_s, py_out = best_of(event_loop, (*[a.tolist() for a in arrays[:3]], *[a.tolist() for a in arrays[3:]]),
                           args.repeats)
    events = py_out[0]
    out: dict[str, object] = {"events": events, "python_ns_per_event": round(py_s / events * 1e9, 1)}
    print(f"{'loop':<10} {'events':>8} {'finished':>9} {'CPU ms':>8} {'ns/event':>9}")
    print(f"{'python':<10} {events:>8} {py_out[1]:>9} {py_s * 1e3:>8.1f} {py_s / events * 1e9:>9.0f}")
    try:
        from numba import njit  # type: ignore[import-not-found]
    except ImportError:
        print("numba is not installed (pip install numba): the compiled loop is not measured")
    else:
        compiled = njit(event_loop)
        c0 = time.process_time()
        arr, prompt, target, dense, head = arrays
        compiled(arr[:10], prompt[:10], target[:10], dense, head)
        out["first_call_s"] = round(time.process_time() - c0, 2)
        nb_s, nb_out = best_of(compiled, arrays, args.repeats)
        print(f"{'numba':<10} {nb_out[0]:>8} {nb_out[1]:>9} {nb_s * 1e3:>8.1f} {nb_s / nb_out[0] * 1e9:>9.0f}")
        print(f"compiled / python: {py_s / nb_s:.1f}x faster; first call (compile) {out['first_call_s']} s; "
              f"same clock and events: {nb_out == py_out}")
        out.update(compiled_ns_per_event=round(nb_s / nb_out[0] * 1e9, 1), compiled_speedup=round(py_s / nb_s, 1),
                   same_clock=nb_out == py_out)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
