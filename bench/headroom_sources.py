"""Where the clairvoyant bound's headroom comes from: the day's forecastable part, its surprises, or its noise.

    python bench/headroom_sources.py [--task multitenant_family] [--seeds 1000000:1000004]
        [--oracles day,surprises] [--samples 2] [--bases tuned_static,operator,schedule]

The sampled planner (agents/planner.py) values its candidates on futures drawn from the day's posterior; the
clairvoyant bound on the true arrivals. Between them, this bench plays the same planner (same bases, candidates,
margin and fortifying) on futures from two oracles that know more than the observation shows and less than
the true arrivals, each a bound, not a policy:

- `day`: the drawn day's cycle (`shared.scenarios.draw_day`: its peak, level and peak-to-trough) and its
  scheduled jobs (start, length, rate) exactly; a flash crowd or an ad-hoc job only once it has begun (then
  whole: its length and size). The noise ahead is its expected path from the last window (as the posterior's
  futures play it), arrivals Poisson, `samples` futures.
- `surprises`: `day` plus every flash crowd and ad-hoc job of the day from the start.

Clairvoyant minus `surprises` is what knowing the noise and the Poisson draws adds; `surprises` minus `day`
is the surprises' share; `day` minus the schedule (the best rule on multitenant_family's test split) is what
a planner that forecast the day's every forecastable part exactly could take over the best rule: issue 26's
"if a family leaves no room, the table says so with numbers". Episodes are long (a planner decision is 2-4 s
of CPU, 48 a day), so `--seeds` is a range to split across processes; results print per seed as they come.

Prints a table (per seed: each oracle's grade, the schedule's, the clairvoyant bound's where `--clairvoyant`
plays it too) and, last, one JSON object: `<task>.<oracle>.mean`, `<task>.<oracle>.minus_schedule` (paired
mean) and `.minus_schedule_ci95`, `<task>.seeds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
from llmserve_env.agents.forecast import FORECAST_STREAM, DayForecast, Job, tenant_counts
from llmserve_env.agents.planner import PlannerPolicy
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.stats import paired_diff_ci
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.scenarios import Day, cycle_mean, draw_day, is_family, raised_cosine
from llmserve_env.shared.tasks import TaskSpec, get_task
from llmserve_env.tools import cli

ORACLES = ("day", "surprises")
ORACLE_STREAM = 0x4F524143  # "ORAC"


class DayOracle:
    """Futures from the drawn day itself (module docstring): `surprises` False knows a surprise once it has begun."""

    def __init__(self, task: TaskSpec, seed: int, surprises: bool):
        self.task, self.seed, self.surprises = task, seed, surprises
        self.day: Day = draw_day(task, seed)
        self.fc = DayForecast(task, particles=1, seed=seed)  # its expected noise path and arrivals, reused
        w = task.workload
        n = int(w["cycle_windows"])
        shape = raised_cosine(np.arange(task.horizon, dtype=np.float64), n, self.day.peak_window)
        # the day's mean cycle, its noise aside
        self.mean = {name: cycle_mean(spec, self.day.level, self.day.peak_to_trough, shape)
                     for name, spec in w["tenants"].items()}
        self.scheduled = len(w["family"].get("jobs", []))  # the day's first jobs are the scheduled ones

    def futures(self, k: int, seen: list[Sequence[Arrival]], samples: int, first_id: int) -> list[list[Sequence[Arrival]]]:
        known = self.surprises
        cycle = {name: m.copy() for name, m in self.mean.items()}
        for c in self.day.flash_crowds:
            if (known or c.start_window < k) and c.tenant in cycle:
                cycle[c.tenant][c.start_window:c.start_window + c.windows] *= c.factor
        # the particle is the day's own cycle (crowds included as known): the last window's residual against it
        # is the noise alone, and its expected path decays ahead as the posterior's futures play it
        self.fc.cycle = {name: m[None, :] for name, m in cycle.items()}
        jobs = [Job(j.tenant, j.start_window, j.windows, j.rate_rps) for i, j in enumerate(self.day.jobs)
                if i < self.scheduled or known or j.start_window < k]
        counts = tenant_counts(self.task, seen)
        rng = np.random.default_rng([int(self.seed), FORECAST_STREAM, k, ORACLE_STREAM])
        out, next_id = [], first_id
        for _ in range(samples):
            wins = self.fc._arrivals(k, self.fc._cycle_ahead(0, k, counts), list(jobs), rng, next_id)
            next_id += sum(len(x) for x in wins)
            out.append(wins)
        return out


class OraclePlanner(PlannerPolicy):
    """The sampled planner, its futures from a `DayOracle` of the episode's seed instead of the posterior."""

    def __init__(self, task_id: str, oracle: str, **options: Any):
        super().__init__(task_id, "sampled", **options)
        self.oracle_kind = oracle
        self.name = f"planner_{oracle}_oracle"
        self._oracle: DayOracle | None = None

    def weighted_futures(self, seed: int, seen: list[Sequence[Arrival]]) -> tuple[list[list[Sequence[Arrival]]], list[float]]:
        if self._oracle is None or self._oracle.seed != seed:
            self._oracle = DayOracle(self.played, seed, self.oracle_kind == "surprises")
        fut = self._oracle.futures(len(seen), seen, self.samples, 1 << 40)
        return [seen + wins for wins in fut], [1.0 / len(fut)] * len(fut)


def seed_list(text: str) -> list[int]:
    """FIRST:END (END excluded) or a comma list: at least one seed, every one >= 0."""
    try:
        seeds = ([int(t) for t in text.split(",") if t.strip()] if ":" not in text
                 else list(range(*(int(x) for x in text.split(":", 1)))))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST:END or a comma list of integers, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected at least one seed, each >= 0, got {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python bench/headroom_sources.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", default="multitenant_family", help="a scenario family task (%(default)s)")
    ap.add_argument("--seeds", type=seed_list, default="1000000:1000002",
                    help="episode seeds, FIRST:END (END excluded) or a comma list (%(default)s)")
    ap.add_argument("--oracles", type=cli.names_from(ORACLES), default=list(ORACLES), metavar="A,B",
                    help=f"which oracles play ({', '.join(ORACLES)})")
    ap.add_argument("--samples", type=cli.int_at_least(1), default=2, help="futures a candidate (%(default)s)")
    ap.add_argument("--bases", default="tuned_static,operator,schedule",
                    help="the planner's base policies (%(default)s: the shipped planner's grades, docs/benchmarks.md)")
    ap.add_argument("--clairvoyant", action="store_true", help="play the clairvoyant bound with the same bases too")
    cli.add_output_options(ap)
    a = ap.parse_args(argv)
    cli.configure_logging(a)
    task = get_task(a.task)
    if not is_family(task):
        ap.error(f"argument --task: {a.task!r} is not a scenario family (the oracles read its drawn day)")
    seeds = a.seeds
    bases = tuple(b for b in a.bases.split(",") if b)
    env = InProcessEnv()
    rows: dict[str, list[float]] = {o: [] for o in a.oracles}
    rows["schedule"] = []
    if a.clairvoyant:
        rows["clairvoyant"] = []
    names = list(rows)
    if not a.quiet:
        print(f"{'seed':>9} " + " ".join(f"{n:>12}" for n in names), flush=True)
    for s in seeds:
        got = {}
        for o in a.oracles:
            got[o] = play_episode(env, OraclePlanner(a.task, o, bases=bases, samples=a.samples, seed=s), a.task, s).score
        got["schedule"] = play_episode(env, make_policy("schedule", a.task), a.task, s).score
        if a.clairvoyant:
            got["clairvoyant"] = play_episode(env, PlannerPolicy(a.task, "clairvoyant", bases=bases), a.task, s).score
        for n in names:
            rows[n].append(got[n])
        if not a.quiet:
            print(f"{s:>9} " + " ".join(f"{got[n]:>12.4f}" for n in names), flush=True)
    out: dict[str, Any] = {f"{a.task}.seeds": len(seeds)}
    for n in names:
        out[f"{a.task}.{n}.mean"] = round(statistics.mean(rows[n]), 4)
        if n != "schedule":
            d = paired_diff_ci(rows[n], rows["schedule"])
            ci = d.finite_half_width
            out[f"{a.task}.{n}.minus_schedule"] = round(d.mean, 4)
            out[f"{a.task}.{n}.minus_schedule_ci95"] = None if ci is None else round(ci, 4)
            if not a.quiet:
                print(f"{n} minus schedule: {d.mean:+.4f}" + ("" if ci is None else f" ± {ci:.4f}")
                      + f" over {len(seeds)} seeds")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
