"""Replay a real-mode recording through the simulator and say how far apart they are.

    python -m llmserve_env.tools.calibrate replay --records FILE.jsonl --profile P [--actions A.jsonl]

A recording (gateway/recorder.py: one request a line) holds each request's arrival, the prompt
the server counted (`usage_prompt_tokens`; the project tokenizer's count when the server sent no
usage, scaled by the run's median server/tokenizer ratio) less the tokens it said it served from its
prompt cache (`cached_tokens`: llama-server keeps each slot's last prompt, and prompts of one episode
share their opening, so 25-40 of ~100 tokens were not computed; the prefill replayed is what the
engine computed), the tokens it produced and when its first
token and its end came. The replay sends the same arrivals, window by window, under the same actions
and real mode's caps (sim/caps.py) but the prompt cap (the gateway cut each prompt to it in its own
tokenizer's tokens before the engine counted it) through the simulator on profile P, and compares per
request and per window:

    TTFT   first token - arrival (what the environment scores), per request
    TPOT   (finish - first token) / (output tokens - 1), per request with 2+ tokens
    throughput  output tokens per window (the real side spreads each request's tokens over its
                streamed chunks' arrival times)

The overall errors are the medians over requests of |sim / real - 1| (TTFT, TPOT) and the error of
the total tokens produced within the played windows (throughput).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.backend import SimBackend
from llmserve_env.sim.caps import CappedBackend, RequestCaps
from llmserve_env.sim.profiles import Profile


@dataclass
class RecordedRun:
    """One real-mode episode as recorded: its request rows, windows, actions and caps."""

    key: str
    rows: list[dict[str, Any]]
    window_s: float
    windows: int
    actions: list[ServeAction]
    caps: RequestCaps
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.actions) not in (1, self.windows):
            raise ValueError(f"run {self.key}: {len(self.actions)} actions for {self.windows} windows "
                             "(give one action, or one per window)")

    def action(self, k: int) -> ServeAction:
        return self.actions[0] if len(self.actions) == 1 else self.actions[k]

    def prompt_ratio(self) -> float:
        return prompt_ratio(self.rows)

    def arrivals(self) -> list[Arrival]:
        ratio = self.prompt_ratio()
        out = []
        for row in self.rows:
            prompt = engine_prompt(row, ratio)
            if row["status"] == "ok":
                output = max(1, int(row["output_tokens"]))
            else:  # never finished: what it asked for
                output = int(row.get("max_tokens") or row["target_output_tokens"])
            out.append(Arrival(int(row["request_id"]), float(row["arrival_s"]), int(prompt), output,
                               row.get("tenant", "default"), int(row.get("priority", 1))))
        out.sort(key=lambda a: (a.arrival_s, a.request_id))
        return out


def prompt_ratio(rows: Iterable[dict[str, Any]]) -> float:
    """Median of the server's prompt count over the tokenizer's, per record (1.0 when the server sent none)."""
    r = [row["usage_prompt_tokens"] / row["prompt_tokens"] for row in rows
         if row.get("usage_prompt_tokens") and row.get("prompt_tokens")]
    return float(np.median(r)) if r else 1.0


def engine_prompt(row: dict[str, Any], ratio: float = 1.0) -> int:
    """The prompt tokens the engine computed for a request: its count less what it served from its prompt
    cache (when it said), or the tokenizer's count times `ratio` when it sent no usage."""
    usage = row.get("usage_prompt_tokens")
    if not usage:
        return max(1, round(row["prompt_tokens"] * ratio))
    cached = row.get("cached_tokens") or 0
    return max(1, int(usage) - int(cached)) if 0 < cached <= usage else int(usage)


@dataclass
class Side:
    """Per-request and per-window quantities of one side (real or simulated)."""

    ttft: dict[int, float] = field(default_factory=dict)
    tpot: dict[int, float] = field(default_factory=dict)
    window_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))
    window_ttft: list[list[float]] = field(default_factory=list)
    window_tpot: list[list[float]] = field(default_factory=list)


def _add_request(side: Side, rid: int, arrival: float, first_seen: float | None, finish: float | None, out: int,
                 status: str, window_s: float, windows: int, first: float | None = None) -> None:
    """`first_seen`: a first token to count for TTFT; `first`: one already counted (TPOT only)."""
    if first_seen is not None:
        first = first_seen
        side.ttft[rid] = first - arrival
        k = int(first // window_s)
        if k < windows:
            side.window_ttft[k].append(first - arrival)
    if status == "ok" and first is not None and finish is not None and out >= 2 and finish > first:
        side.tpot[rid] = (finish - first) / (out - 1)
        k = int(finish // window_s)
        if k < windows:
            side.window_tpot[k].append(side.tpot[rid])


def _empty_side(windows: int) -> Side:
    return Side(window_tokens=np.zeros(windows), window_ttft=[[] for _ in range(windows)],
                window_tpot=[[] for _ in range(windows)])


def real_side(run: RecordedRun) -> Side:
    side = _empty_side(run.windows)
    for row in run.rows:
        out = int(row.get("output_tokens") or 0)
        _add_request(side, int(row["request_id"]), float(row["arrival_s"]), row.get("first_token_s"),
                     row.get("finish_s"), out, row["status"], run.window_s, run.windows)
        chunks = row.get("chunk_times_s") or []
        if out and chunks:
            per = out / len(chunks)
            for t in chunks:
                k = int(t // run.window_s)
                if 0 <= k < run.windows:
                    side.window_tokens[k] += per
        elif out and row.get("finish_s") is not None:  # no chunk times: all at the end
            k = int(row["finish_s"] // run.window_s)
            if 0 <= k < run.windows:
                side.window_tokens[k] += out
    return side


def sim_side(run: RecordedRun, profile: Profile) -> Side:
    """The run replayed on `profile` (deterministic: same run, same profile, same numbers)."""
    # the recorded prompts are the engine's counts of prompts the gateway already cut to the prompt cap
    # (in its own tokenizer's tokens): capping them again would cut the engine's tokens at a cap in others
    backend = CappedBackend(SimBackend(profile), replace(run.caps, max_prompt_tokens=None))
    backend.reset(run.seed)
    arrivals = run.arrivals()
    times = [a.arrival_s for a in arrivals]
    side = _empty_side(run.windows)
    lo = 0
    dt = run.window_s
    n = len(arrivals)
    for k in range(run.windows):
        hi = lo
        while hi < n and times[hi] < (k + 1) * dt:
            hi += 1
        report = backend.run_window(run.action(k), arrivals[lo:hi], k * dt, dt)
        lo = hi
        side.window_tokens[k] = report.output_tokens
        for rid, _, ttft in report.first_tokens:  # still running at the end or not: its first token counts
            side.ttft[rid] = ttft
            side.window_ttft[k].append(ttft)
        for rec in report.finished:
            _add_request(side, rec.request_id, rec.arrival_s, None, rec.finish_s, rec.output_tokens, rec.status, dt,
                         run.windows, first=rec.first_token_s)
    backend.close()
    return side


def abs_err_pct(sim: float, real: float) -> float:
    return abs(sim / real - 1.0) * 100.0 if real > 0 else math.nan


def _median(x: list[float]) -> float:
    return float(np.median(x)) if x else math.nan


@dataclass(frozen=True, slots=True)
class WindowRow:
    window: int
    real_tokens: float
    sim_tokens: float
    real_ttft_ms: float
    sim_ttft_ms: float
    real_tpot_ms: float
    sim_tpot_ms: float


@dataclass(frozen=True, slots=True)
class Comparison:
    """How far the simulator's replay is from the recording."""

    n_ttft: int
    n_tpot: int
    ttft_err_pct: float        # median over requests of |sim / real - 1|
    tpot_err_pct: float
    throughput_err_pct: float  # |sim tokens / real tokens - 1| over the played windows
    unmatched: int             # requests with a first token in the recording but not in the replay
    windows: list[WindowRow]
    ttft_errs: tuple[float, ...] = ()   # per request, % (what the medians are taken over)
    tpot_errs: tuple[float, ...] = ()
    real_tokens: float = 0.0            # output tokens in the played windows
    sim_tokens: float = 0.0

    @property
    def score(self) -> float:
        """One number to compare profiles by: the mean of the TTFT and TPOT median errors."""
        return 0.5 * (self.ttft_err_pct + self.tpot_err_pct)

    def summary(self) -> dict[str, float]:
        return {"ttft_err_pct": round(self.ttft_err_pct, 2), "tpot_err_pct": round(self.tpot_err_pct, 2),
                "throughput_err_pct": round(self.throughput_err_pct, 2)}

    def table(self) -> str:
        lines = [f"{'window':>6} {'real tok':>9} {'sim tok':>9} {'real TTFT ms':>13} {'sim TTFT ms':>12} "
                 f"{'real TPOT ms':>13} {'sim TPOT ms':>12}"]
        for w in self.windows:
            lines.append(f"{w.window:>6} {w.real_tokens:>9.1f} {w.sim_tokens:>9.0f} {w.real_ttft_ms:>13.0f} "
                         f"{w.sim_ttft_ms:>12.0f} {w.real_tpot_ms:>13.1f} {w.sim_tpot_ms:>12.1f}")
        lines.append(f"overall: TTFT median error {self.ttft_err_pct:.1f} % ({self.n_ttft} requests), TPOT "
                     f"median error {self.tpot_err_pct:.1f} % ({self.n_tpot}), throughput error "
                     f"{self.throughput_err_pct:.1f} %, {self.unmatched} requests without a first token in "
                     "the replay")
        return "\n".join(lines)


def compare(real: Side, sim: Side) -> Comparison:
    ttft = [abs_err_pct(sim.ttft[r], v) for r, v in real.ttft.items() if r in sim.ttft]
    tpot = [abs_err_pct(sim.tpot[r], v) for r, v in real.tpot.items() if r in sim.tpot]
    rows = [WindowRow(k, float(real.window_tokens[k]), float(sim.window_tokens[k]),
                      _median(real.window_ttft[k]) * 1e3, _median(sim.window_ttft[k]) * 1e3,
                      _median(real.window_tpot[k]) * 1e3, _median(sim.window_tpot[k]) * 1e3)
            for k in range(len(real.window_tokens))]
    total_real, total_sim = float(real.window_tokens.sum()), float(sim.window_tokens.sum())
    return Comparison(len(ttft), len(tpot), _median(ttft), _median(tpot), abs_err_pct(total_sim, total_real),
                      sum(1 for r in real.ttft if r not in sim.ttft), rows, tuple(ttft), tuple(tpot),
                      total_real, total_sim)


def pooled(cs: list[Comparison]) -> Comparison:
    """Several runs as one: medians over all their requests, throughput over all their windows (the
    per-window rows are not pooled: windows of different runs are different times)."""
    ttft = [e for c in cs for e in c.ttft_errs]
    tpot = [e for c in cs for e in c.tpot_errs]
    real, sim = sum(c.real_tokens for c in cs), sum(c.sim_tokens for c in cs)
    return Comparison(len(ttft), len(tpot), _median(ttft), _median(tpot), abs_err_pct(sim, real),
                      sum(c.unmatched for c in cs), [], tuple(ttft), tuple(tpot), real, sim)


def replay(run: RecordedRun, profile: Profile) -> Comparison:
    return compare(real_side(run), sim_side(run, profile))


@dataclass(frozen=True, slots=True)
class ConcurrencyRow:
    """Requests whose mean concurrency (themselves plus the others in flight, averaged over their life on
    the real engine) fell in [lo, hi): where in the load the replay's error is."""

    lo: float
    hi: float
    n: int
    real_ttft_ms: float       # medians over the bucket's requests
    sim_ttft_ms: float
    ttft_err_pct: float       # median |sim / real - 1|
    real_tpot_ms: float
    sim_tpot_ms: float
    tpot_err_pct: float
    tpot_bias_pct: float      # median (sim / real - 1): negative = the simulator too fast


BUCKETS = ((1.0, 1.5), (1.5, 2.5), (2.5, 4.0), (4.0, math.inf))


def _concurrency(ok: list[dict[str, Any]]) -> dict[int, float]:
    """Each completed request's mean number of requests in flight (itself included) over dispatch..finish."""
    out = {}
    for r in ok:
        a, b = float(r["dispatch_s"]), float(r["finish_s"])
        if b <= a:
            continue
        over = sum(max(0.0, min(b, float(o["finish_s"])) - max(a, float(o["dispatch_s"]))) for o in ok if o is not r)
        out[int(r["request_id"])] = 1.0 + over / (b - a)
    return out


RequestPoint = tuple[float, float | None, float | None, float | None, float | None]


def _request_points(run: RecordedRun, profile: Profile) -> list[RequestPoint]:
    """Each completed request of `run`: (its concurrency on the real engine, real TTFT, replayed TTFT,
    real TPOT, replayed TPOT on `profile`), in seconds; None where a side has no value."""
    real, sim = real_side(run), sim_side(run, profile)
    conc = _concurrency([r for r in run.rows if r["status"] == "ok"])
    return [(c, real.ttft.get(rid), sim.ttft.get(rid), real.tpot.get(rid), sim.tpot.get(rid))
            for rid, c in conc.items()]


def by_concurrency(runs: list[RecordedRun], profile: Profile) -> list[ConcurrencyRow]:
    """The replay's per-request errors of `runs` on `profile`, bucketed by the real engine's concurrency."""
    return bucketed([p for run in runs for p in _request_points(run, profile)])


def bucketed(pts: list[RequestPoint]) -> list[ConcurrencyRow]:
    """Per-request points (concurrency, reference TTFT, compared TTFT, reference TPOT, compared TPOT) as
    one row per concurrency bucket that holds any."""
    rows = []
    for lo, hi in BUCKETS:
        g = [p for p in pts if lo <= p[0] < hi]
        if not g:
            continue
        tt = [(rt, st) for _, rt, st, _, _ in g if rt and st]
        tp = [(rp, sp) for _, _, _, rp, sp in g if rp and sp]
        rows.append(ConcurrencyRow(
            lo, hi, len(g), _median([a for a, _ in tt]) * 1e3, _median([b for _, b in tt]) * 1e3,
            _median([abs_err_pct(b, a) for a, b in tt]), _median([a for a, _ in tp]) * 1e3,
            _median([b for _, b in tp]) * 1e3, _median([abs_err_pct(b, a) for a, b in tp]),
            _median([(b / a - 1.0) * 100.0 for a, b in tp])))
    return rows


def repeat_points(first: RecordedRun, second: RecordedRun) -> list[RequestPoint]:
    """Two recordings of one seed's episode on the same engine, request by request: the first run's values
    as the reference (and its concurrency), the second's as compared. Where neither the arrivals nor the
    engine changed, what differs is the engine's and the machine's timing noise: the floor under any
    deterministic replay's per-request error."""
    if first.seed != second.seed:
        raise ValueError(f"runs of seeds {first.seed} and {second.seed}: a repeat compares one seed's episode")
    a, b = real_side(first), real_side(second)
    conc = _concurrency([r for r in first.rows if r["status"] == "ok"])
    return [(c, a.ttft.get(rid), b.ttft.get(rid), a.tpot.get(rid), b.tpot.get(rid)) for rid, c in conc.items()]


def engine_repeat(first: list[RecordedRun], second: list[RecordedRun]) -> tuple[Comparison, list[ConcurrencyRow]]:
    """How far a second recording of the same seeds is from the first: the replay's own error measures
    (medians of |second / first - 1| over requests, overall and by the first run's concurrency), runs
    matched by seed."""
    by_seed = {run.seed: run for run in second}
    pairs = [(run, by_seed[run.seed]) for run in first if run.seed in by_seed]
    if not pairs:
        raise ValueError(f"no seed recorded in both: {sorted(r.seed for r in first)} and {sorted(by_seed)}")
    total = pooled([compare(real_side(a), real_side(b)) for a, b in pairs])
    return total, bucketed([p for a, b in pairs for p in repeat_points(a, b)])


@dataclass(frozen=True, slots=True)
class AloneRow:
    """One run's requests that had the real engine to themselves (no other in flight over their life):
    the engine's own single-sequence TPOT, which should not move between runs of one engine, against
    the replay's. When it moves between the fit's runs and the held-out ones, the engine (or the
    machine under it) changed speed, and no step model fitted on the first can follow the second."""

    seed: int
    n: int
    real_tpot_ms: float  # medians over those requests
    sim_tpot_ms: float


def alone_by_run(runs: list[RecordedRun], profile: Profile) -> list[AloneRow]:
    out = []
    for run in runs:
        tp = [(rp, sp) for c, _, _, rp, sp in _request_points(run, profile) if c == 1.0 and rp and sp]
        out.append(AloneRow(run.seed, len(tp), _median([a for a, _ in tp]) * 1e3, _median([b for _, b in tp]) * 1e3))
    return out


def concurrency_table(rows: list[ConcurrencyRow], names: tuple[str, str] = ("real", "sim")) -> str:
    r0, s0 = names
    lines = [f"{'concurrency':>11} {'requests':>8} {r0 + ' TTFT ms':>12} {s0 + ' TTFT ms':>11} {'TTFT err %':>10} "
             f"{r0 + ' TPOT ms':>12} {s0 + ' TPOT ms':>11} {'TPOT err %':>10} {'TPOT bias %':>11}"]
    for r in rows:
        span = f"{r.lo:g}-{r.hi:g}" if math.isfinite(r.hi) else f"{r.lo:g}+"
        lines.append(f"{span:>11} {r.n:>8} {r.real_ttft_ms:>12.0f} {r.sim_ttft_ms:>11.0f} {r.ttft_err_pct:>10.1f} "
                     f"{r.real_tpot_ms:>12.1f} {r.sim_tpot_ms:>11.1f} {r.tpot_err_pct:>10.1f} {r.tpot_bias_pct:>+11.1f}")
    return "\n".join(lines)
