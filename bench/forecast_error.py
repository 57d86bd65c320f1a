"""How far the sampled planner's futures are from the day that came: each forecast against the truth.

    python bench/forecast_error.py [--tasks diurnal_family,multitenant_family] [--seeds 20] [--every 4]
    python bench/forecast_error.py --split shifted --wide 0,0.25     # the family's forecast on shifted days

For each validation seed (500,000 + i; never a test seed) and each window k = 2, 2 + every, ... the planner's
forecasts (`nearest`: other days of the family nearest in their last 2 windows' counts, the planner's
forecast before agents/forecast.py; `posterior`: the day's posterior given the episode so far) draw
their 2 futures after the true windows 0..k-1, and each future's arrivals per window are compared with
the true ones: the mean absolute error per window, as a share of the true total's mean, over the
next 9 windows (one cold start: what a replica asked for now will serve) and over the rest of the day;
for multitenant, the batch tenant's (the jobs) on its own too. Costs no simulation: seconds a task.
`--split shifted` draws the true days from the family's shifted task (shared/splits.py) on the same
validation seeds and forecasts them as the planner does there, built for the family (its prior the
family's ranges). `--wide` lists shares of the posterior's particles drawn outside the family
(agents/forecast.py's hedge; 0, the default, is the planner's default): one `posterior` row per share,
named `posterior_wide<share>` where the share is not 0.
Last line: {"<task>.<forecast>.next9_err_pct", "<task>.<forecast>.rest_err_pct", ...} (<task> the
played task: the shifted one with `--split shifted`).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from llmserve_env.agents.planner import FORECASTS, PlannerPolicy
from llmserve_env.agents.seeds import validation_seeds
from llmserve_env.shared.splits import SPLITS, split_task
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.tools import cli

LOOKAHEAD = 9  # windows: one cold start (87 s) of 10 s windows
FAMILIES = ("diurnal_family", "multitenant_family")  # the training families (their shifted tests are not planned)


def counts(wins: list, tenants: list[str] | None) -> np.ndarray:
    return np.array([sum(1 for a in w if tenants is None or a.tenant in tenants) for w in wins], dtype=float)


def wide_shares(text: str) -> list[float]:
    try:
        shares = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated shares in [0, 1], got {text!r}") from None
    if not shares or any(not 0.0 <= x <= 1.0 for x in shares):
        raise argparse.ArgumentTypeError(f"expected comma-separated shares in [0, 1], got {text!r}")
    return shares


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/forecast_error.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--tasks", type=cli.names_from(FAMILIES), default=list(FAMILIES),
                    help="comma-separated scenario families (%(default)s)")
    ap.add_argument("--seeds", type=cli.int_at_least(1), default=20, help="validation seeds per task")
    ap.add_argument("--every", type=cli.int_at_least(1), default=4, help="windows between forecasts")
    ap.add_argument("--split", choices=SPLITS, default="test",
                    help="the days forecast: the family's own (test) or its shifted task's (%(default)s)")
    ap.add_argument("--wide", type=wide_shares, default=[0.0],
                    help="comma-separated shares of the posterior's particles drawn outside the family (0)")
    a = ap.parse_args(argv)
    out: dict[str, float] = {}
    print(f"{'task':<20} {'forecast':<18} {'part':<11} {'next 9 err %':>12} {'rest err %':>11} {'s':>6}")
    for family in a.tasks:
        task_id = split_task(family, a.split)
        task = get_task(task_id)
        parts: dict[str, list[str] | None] = {"total": None}
        if len(task.tenants) > 1:
            parts.update({t.name: [t.name] for t in task.tenants})
        truth = {s: windows(generate_arrivals(task, s), task) for s in validation_seeds(a.seeds)}
        variants = [(f, 0.0) for f in FORECASTS if f != "posterior"] + [("posterior", w) for w in a.wide]
        for base, wide in sorted(variants, key=lambda v: FORECASTS.index(v[0])):
            forecast = base if not wide else f"{base}_wide{wide:g}"
            t0 = time.process_time()
            planner = PlannerPolicy(family, forecast=base, wide_prior=wide)
            planner.played = task  # built for the family, forecasting the played day (as on the shifted split)
            err: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in parts}
            for seed, wins in truth.items():
                for k in range(2, task.horizon - 1, a.every):
                    scale = max(counts(wins[k:], None).mean(), 1.0)  # every part against the total's mean
                    for fut in planner.future_windows(seed, wins[:k]):
                        for part, tenants in parts.items():
                            true, got = counts(wins[k:], tenants), counts(fut[k:], tenants)
                            nxt = slice(0, LOOKAHEAD)
                            err[part][0].append(float(np.abs(got[nxt] - true[nxt]).mean() / scale))
                            err[part][1].append(float(np.abs(got - true).mean() / scale))
            dt = time.process_time() - t0
            for part, (e9, er) in err.items():
                n9, nr = 100 * float(np.mean(e9)), 100 * float(np.mean(er))
                print(f"{task_id:<20} {forecast:<18} {part:<11} {n9:>12.1f} {nr:>11.1f} {dt:>6.1f}")
                key = f"{task_id}.{forecast}" + ("" if part == "total" else f".{part}")
                out[f"{key}.next9_err_pct"] = round(n9, 2)
                out[f"{key}.rest_err_pct"] = round(nr, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
