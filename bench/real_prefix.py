"""Cache-aware routing against real engines (issue 32 item 4): TTFT with and without prefix affinity over
two llama-server processes (cache_prompt on, one thread each), against the simulator's prediction for the
same run on a profile fitted to that engine.

Opt-in (needs the engine: scripts/build_llama_server.sh, ~15-45 min to compile on 2 cores):

    python bench/real_prefix.py [--conversations 8] [--turns 4] [--gap-s 15] [--system-prompts 2] [--out DIR]
    python bench/real_prefix.py --replay DIR [the run's own workload options]   # refit and predict, no engine

The workload is multiturn_cluster's shape, shrunk for a 135M model on one CPU thread: `--conversations`
chats, conversation c on system prompt c mod `--system-prompts` (`--system-tokens` each), `--turns` turns
`--gap-s` apart, each turn resending the whole history (its system prompt, earlier messages and answers)
plus a new message of `--user-tokens`, answers of `--answer-tokens` (ignore_eos). It is written as a
Mooncake-format trace with 16-token prefix units and played as a trace task (2 replicas). Later turns
share their history's units with the earlier turns' prompts, but not the answer's: the gateway resends its
own text for an answer, never the engine's generated one, so only the earlier prompt can be cached (in the
engine and in the simulator alike).

Runs, each on fresh servers (empty caches):
  1. calibration: a quarter of the conversations, no prefix ids (every prompt unique), on one server; its
     records fit the simulator's profile (`calibrate records`, from h100-llama3.1-8b, affine step model);
  2. least work: cache_affinity 0 over both servers;
  3. affinity: cache_affinity `--affinity` (0.5) over both servers.
Then runs 2 and 3 are played in the simulator (ClusterBackend, 2 replicas, the fitted profile) twice: with
vLLM's block cache and with llama-server's slot cache (sim/slot_cache.py, `-np` slots), in the engine's
tokens (the profile is fitted to them; `in_engine_tokens`), and a third time with the slot cache on the
routes the gateway took (each request on the server its record names: the prediction for the run as it was
routed, since the gateway's least-work router decides near-ties by the streams' timing; its TTFT is printed
by the engine's hit share per request beside the engine's). A fourth prediction plays the slot cache on the
simulator's own routing again with the tracked router (sim/cluster.py `router="tracked"`: each arrival routed
on the replicas' true outstanding work at its arrival, as the gateway counts its in-flight requests, rather
than on the default router's estimate drained from the window's start), and for each routing the
conversations split across the servers (turns of one conversation on both) and the turn-to-turn server
changes are counted beside the gateway's, from its records. The TTFT reduction measured (1 - mean TTFT with
affinity / at 0) is set against each prediction; the engines' own cache counts (usage / timings) give the
measured hit rates; and each run's requests are replayed through the slot model in the engine's own order
of dispatches and finishes, which checks the cache mechanism per request, free of step times.
`--cached-context-s S` fits the profile with the engine's attention over a cached prefix priced
(sim/cached_context.py; bench/cached_prefill.py measures S). The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llmserve_env.gateway.backend import GatewayBackend  # noqa: E402
from llmserve_env.gateway.config import GatewayConfig, Secret  # noqa: E402
from llmserve_env.gateway.pricing import TierPrice, TierTable  # noqa: E402
from llmserve_env.gateway.recorder import read_records  # noqa: E402
from llmserve_env.shared.backend import Arrival, WindowReport  # noqa: E402
from llmserve_env.shared.models import ServeAction  # noqa: E402
from llmserve_env.shared.prefix import chain_ids  # noqa: E402
from llmserve_env.shared.workloads import generate_arrivals, resolve_task, windows  # noqa: E402
from llmserve_env.sim.calibration.calibrate import FitRefusedError, run_records  # noqa: E402
from llmserve_env.sim.calibration.replay import prompt_ratio  # noqa: E402
from llmserve_env.sim.caps import RequestCaps  # noqa: E402
from llmserve_env.sim.cluster import ClusterBackend  # noqa: E402
from llmserve_env.sim.profiles import load_profile  # noqa: E402
from llmserve_env.sim.slot_cache import SlotCache, SlotCacheSpec  # noqa: E402
from real_engine import free_port, llama_dir, served_model, start_server  # noqa: E402

UNIT = 16
MODEL_ALIAS = "smollm2-135m"
BASE_PROFILE = "h100-llama3.1-8b"
DRAIN_WINDOWS = 30


def action(affinity: float | None) -> ServeAction:
    return ServeAction(batch_cap=4, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
                       prefill_decode_split=False, priority_routing=False, replicas=2, cache_affinity=affinity)


def write_trace(path: Path, conversations: int, turns: int, gap_s: float, system_tokens: int, user_tokens: int,
                answer_tokens: int, spread_s: float, system_prompts: int = 2) -> None:
    """Mooncake-format rows (timestamp ms, input/output lengths, 16-token hash_ids, prefix-unique)."""
    rows = []
    next_id = 0
    systems = []
    for _ in range(system_prompts):
        systems.append(list(range(next_id, next_id + system_tokens // UNIT)))
        next_id += system_tokens // UNIT
    for c in range(conversations):
        ids = list(systems[c % system_prompts])
        start = spread_s * c / conversations
        for t in range(turns):
            # the new message's units (and, after the first turn, the last answer's: never shared)
            new = user_tokens // UNIT + (answer_tokens // UNIT if t else 0)
            ids += list(range(next_id, next_id + new))
            next_id += new
            rows.append({"timestamp": round(1000 * (start + gap_s * t)), "input_length": UNIT * len(ids),
                         "output_length": answer_tokens, "hash_ids": list(ids)})
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def play_real(urls: list[str], arrivals: Sequence[Arrival], task: Any, affinity: float | None, record: Path,
              replicas: int) -> list[WindowReport]:
    tiers = TierTable({t: TierPrice(MODEL_ALIAS, 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "bench")
    config = GatewayConfig(api_key=Secret("EMPTY"), base_url=urls[0], endpoints=tuple(urls), model=MODEL_ALIAS,
                           ignore_eos=True, record_path=str(record), max_prompt_tokens=4096,
                           max_completion_tokens=256)
    backend = GatewayBackend(config, tiers=tiers)
    act = action(affinity).model_copy(update={"replicas": replicas})
    reports = []
    try:
        backend.begin(0, f"prefix-{affinity}", task.window_s, arrivals, initial_replicas=replicas)
        dt = task.window_s
        ws = windows(arrivals, task)
        for k, w in enumerate(ws):
            reports.append(backend.run_window(act, w, k * dt, dt))
        k = len(ws)
        done = {r.request_id for rep in reports for r in rep.finished}
        while len(done) < len(arrivals) and k < len(ws) + DRAIN_WINDOWS:
            reports.append(backend.run_window(act, [], k * dt, dt))
            done |= {r.request_id for r in reports[-1].finished}
            k += 1
    finally:
        backend.close()
    return reports


class RouteLog(ClusterBackend):
    """The cluster under its own router (`router`: sim/cluster.py's "estimated" or "tracked"), noting where
    each request went (`routes`: request id to replica index) to count the conversations it split."""

    def __init__(self, profile: Any, router: str) -> None:
        super().__init__(profile, (2, 2), 2, router=router)
        self.routes: dict[int, int] = {}

    def _choose(self, a: Arrival, eligible: list[Any], work: list[float], affinity: float | None,
                sent: dict[int, set[int]]) -> tuple[int, int]:
        i, hit = super()._choose(a, eligible, work, affinity, sent)
        self.routes[a.request_id] = eligible[i].index
        return i, hit


class RoutedAsRecorded(ClusterBackend):
    """The cluster with each request sent where the gateway sent it in a real run (`route`: request id to
    replica index), for the prediction of that run's TTFT given its routes: the gateway's least-work router
    decides near-ties in outstanding work by the streams' timing, which no deterministic replay repeats."""

    def __init__(self, profile: Any, route: dict[int, int]) -> None:
        super().__init__(profile, (2, 2), 2)
        self.route = route

    def _route(self, arrivals: Sequence[Arrival], affinity: float | None = None) -> dict[int, list[Arrival]]:
        routed: dict[int, list[Arrival]] = {r.index: [] for r in self.replicas}
        for a in arrivals:
            routed[self.route[a.request_id]].append(a)
        return routed


def recorded_routes(records: Path) -> dict[int, int]:
    """Request id to replica index (the endpoints in sorted order) from a run's records, every request."""
    recs = read_records(records)
    endpoints = sorted({r["endpoint"] for r in recs if r.get("endpoint")})
    if len(endpoints) > 2:
        raise ValueError(f"{records}: {len(endpoints)} endpoints, the replay has 2 replicas")
    return {r["request_id"]: endpoints.index(r["endpoint"]) for r in recs if r.get("endpoint")}


def play_sim(profile: Any, arrivals: Sequence[Arrival], task: Any, affinity: float | None,
             route: dict[int, int] | None = None, router: str = "estimated",
             routes_out: dict[int, int] | None = None) -> list[WindowReport]:
    """The run in the simulator: on `route` (the gateway's) if given, else on the cluster's own `router`,
    whose routes are copied into `routes_out` if given."""
    backend: ClusterBackend = RouteLog(profile, router) if route is None else RoutedAsRecorded(profile, route)
    backend.reset(0)
    dt = task.window_s
    ws = windows(arrivals, task)
    reports = [backend.run_window(action(affinity), w, k * dt, dt) for k, w in enumerate(ws)]
    for k in range(len(ws), len(ws) + DRAIN_WINDOWS):
        reports.append(backend.run_window(action(affinity), [], k * dt, dt))
    if routes_out is not None and isinstance(backend, RouteLog):
        routes_out.update(backend.routes)
    return reports


def conversations(arrivals: Sequence[Arrival]) -> dict[int, int]:
    """Request id to its conversation (its first turn's request id): every later turn resends the first
    turn's prompt, whose units then lead its own, and no other conversation's (its first message differs)."""
    firsts: list[Arrival] = []
    out = {}
    for a in sorted(arrivals, key=lambda x: x.arrival_s):
        ids = a.prefix_ids or ()
        head = next((f for f in firsts if f.prefix_ids and ids[:len(f.prefix_ids)] == f.prefix_ids), None)
        if head is None:
            firsts.append(a)
            head = a
        out[a.request_id] = head.request_id
    return out


def splits(routes: dict[int, int], convo: dict[int, int]) -> dict[str, int]:
    """How a routing treats the conversations: those with turns on more than one server, and the turns that
    went to another server than their conversation's previous turn (request ids rise with arrival time)."""
    servers: dict[int, list[int]] = {}
    for rid in sorted(routes):
        if rid in convo:
            servers.setdefault(convo[rid], []).append(routes[rid])
    return {"split": sum(1 for s in servers.values() if len(set(s)) > 1),
            "changes": sum(sum(1 for x, y in zip(s, s[1:], strict=False) if x != y) for s in servers.values())}


def replay_slots(records: Path, arrivals: Sequence[Arrival], spec: SlotCacheSpec) -> list[dict[str, Any]]:
    """The engine's per-request hits against the slot model's, on the engine's own order of events: each
    endpoint's requests are taken at their dispatch and released at their finish, as the records say, so
    the comparison is of the cache mechanism alone, free of any step time. Rows: request, endpoint, the
    engine's hit share (cached / its prompt tokens) and the model's (units hit x unit / prompt tokens)."""
    by_id = {a.request_id: a for a in arrivals}
    recs = read_records(records)
    events = []  # (time, 0 = release before 1 = take at one instant, record)
    for r in recs:
        if r.get("status") == "ok" and r.get("dispatch_s") is not None and r["request_id"] in by_id:
            events.append((r["dispatch_s"], 1, r))
            events.append((r["finish_s"], 0, r))
    events.sort(key=lambda e: (e[0], e[1]))
    caches: dict[str, SlotCache] = {}
    slot_of: dict[int, int] = {}
    rows = []
    for t, kind, r in events:
        cache = caches.setdefault(r["endpoint"], SlotCache(spec))
        a = by_id[r["request_id"]]
        keys = a.prefix_ids or ()
        cache.unit = a.prefix_block_tokens or UNIT
        if kind == 1:
            plan = cache.plan(keys, a.prompt_tokens)
            slot_of[a.request_id] = cache.take(plan)
            engine = (r["cached_tokens"] / r["engine_prompt_tokens"]
                      if r.get("cached_tokens") is not None and r.get("engine_prompt_tokens") else None)
            rows.append({"request_id": a.request_id, "endpoint": r["endpoint"], "engine_hit": engine,
                         "model_hit": plan[2] * cache.unit / a.prompt_tokens})
        else:
            cache.release(slot_of.pop(a.request_id), keys, a.prompt_tokens + a.output_tokens - 1, t)
    return rows


def in_engine_tokens(arrivals: Sequence[Arrival], ratio: float) -> list[Arrival]:
    """The run as the engine counts it, for the simulator's prediction: the profile is fitted to the
    engine's own counts (sim/calibration/replay.py), so the trace's o200k lengths are scaled by `ratio`,
    and so are the shared prefixes: engine unit k stands for trace unit floor(k / ratio), so requests that
    share n trace units share about n x ratio engine units."""
    out = []
    for a in arrivals:
        ids = a.prefix_ids or ()
        n = min(int(a.prompt_tokens * ratio) // UNIT, int(len(ids) * ratio))
        content = [hash((ids[min(int(k / ratio), len(ids) - 1)], k)) for k in range(n)]
        out.append(replace(a, prompt_tokens=max(1, round(a.prompt_tokens * ratio)),
                           prefix_ids=chain_ids(tuple(content)) if a.prefix_ids is not None else None))
    return out


def summary_records(path: Path) -> dict[str, Any]:
    """`summary` from a run's records (`--replay`): TTFT from arrival, the engines' own hit counts."""
    ok = [r for r in read_records(path) if r.get("status") == "ok"]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in ok if r.get("first_token_s") is not None]
    measured = [r for r in ok if r.get("prefix_units_sent") is not None and r.get("cached_tokens") is not None
                and r.get("engine_prompt_tokens")]
    query = sum(r["engine_prompt_tokens"] for r in measured)
    return {"requests_ok": len(ok), "ttft_mean_ms": 1e3 * statistics.fmean(ttft) if ttft else None,
            "ttft_p50_ms": 1e3 * statistics.median(ttft) if ttft else None,
            "hit_rate": sum(r["cached_tokens"] for r in measured) / query if query else None,
            "hit_measured_requests": len(measured)}


def ttft_by_hit(records: Path, reports: list[WindowReport]) -> dict[str, dict[str, Any]]:
    """Per bucket of the engine's hit share (its cached over its prompt tokens: under 0.3, 0.3-0.7, over
    0.7), the requests, the engine's mean TTFT and the simulator's over the same requests (a run played on
    its own routes): where the prediction of a reduction goes wrong, by how much each request was cached."""
    sim = {i: t for rep in reports for i, _, t in rep.first_tokens}
    rows = [(r["cached_tokens"] / r["engine_prompt_tokens"], r["first_token_s"] - r["arrival_s"], sim[r["request_id"]])
            for r in read_records(records)
            if r.get("status") == "ok" and r.get("first_token_s") is not None and r.get("engine_prompt_tokens")
            and r.get("cached_tokens") is not None and r["request_id"] in sim]
    out = {}
    for name, lo, hi in (("under_0.3", 0.0, 0.3), ("0.3-0.7", 0.3, 0.7), ("over_0.7", 0.7, 1.01)):
        group = [x for x in rows if lo <= x[0] < hi]
        if group:
            real, model = statistics.fmean(x[1] for x in group), statistics.fmean(x[2] for x in group)
            out[name] = {"requests": len(group), "engine_ttft_ms": 1e3 * real, "sim_ttft_ms": 1e3 * model,
                         "sim_over_engine": model / real}
    return out


def summary(reports: list[WindowReport]) -> dict[str, Any]:
    ttft = [t for rep in reports for _, _, t in rep.first_tokens]
    query = sum(r.prefix_query_tokens for r in reports)
    hit = sum(r.prefix_hit_tokens for r in reports)
    measured = sum(int(r.notes.get("prefix_hit_measured") or 0) for r in reports)
    ok = sum(1 for rep in reports for r in rep.finished if r.status == "ok")
    return {"requests_ok": ok, "ttft_mean_ms": 1e3 * statistics.fmean(ttft) if ttft else None,
            "ttft_p50_ms": 1e3 * statistics.median(ttft) if ttft else None,
            "hit_rate": hit / query if query else None, "hit_measured_requests": measured}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--gap-s", type=float, default=15.0)
    ap.add_argument("--spread-s", type=float, default=30.0, help="conversations start over this span")
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--system-prompts", type=int, default=2,
                    help="conversation c opens with system prompt c mod this (as many as conversations: no "
                         "two conversations share a prefix, so only a conversation's own history can hit)")
    ap.add_argument("--user-tokens", type=int, default=48)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--window-s", type=float, default=5.0)
    ap.add_argument("--slots", type=int, default=8, help="llama-server -np (its cache holds a prompt per slot)")
    ap.add_argument("--affinity", type=float, default=0.5,
                    help="cache_affinity of the affinity run (1 follows the cache alone: a shared system prompt "
                         "then sends every request to one server)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replay", type=Path, default=None,
                    help="a finished run's folder: refit and predict from its records, starting no engine "
                         "(give the run's own workload options)")
    ap.add_argument("--cached-context-s", type=float, default=0.0,
                    help="engine.cached_context_s, held fixed in the calibration fit: seconds per pair of a computed "
                         "prompt token and a token before it (bench/cached_prefill.py measures it; 0: not priced)")
    a = ap.parse_args(argv)
    if not a.cached_context_s >= 0:
        ap.error(f"--cached-context-s must be >= 0, got {a.cached_context_s}")
    folder = llama_dir()
    if a.replay is None and not (folder / "llama-server").exists():
        print(json.dumps({"skipped": f"no llama-server in {folder} (scripts/build_llama_server.sh)"}))
        return
    out = a.replay or a.out or Path(tempfile.mkdtemp(prefix="real_prefix-"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "conversations.jsonl"
    write_trace(trace, a.conversations, a.turns, a.gap_s, a.system_tokens, a.user_tokens, a.answer_tokens,
                a.spread_s, a.system_prompts)
    span = a.spread_s + a.gap_s * (a.turns - 1)
    horizon = int(span // a.window_s) + 1
    task = resolve_task(f"trace:{trace}?prefix_block_tokens={UNIT}&replicas=2&initial_replicas=2"
                        f"&window_s={a.window_s:g}&horizon={horizon}")
    arrivals = generate_arrivals(task, 0)
    # the calibration run: a quarter of the conversations, prompts unique, on one server (about the load
    # each of the two servers carries later, at full prefill: the whole run on one server saturated it)
    calib = out / "calibration.jsonl"
    write_trace(calib, max(1, a.conversations // 4), a.turns, a.gap_s, a.system_tokens, a.user_tokens,
                a.answer_tokens, a.spread_s)
    calib_task = resolve_task(f"trace:{calib}?prefix_block_tokens={UNIT}&replicas=2&initial_replicas=2"
                              f"&window_s={a.window_s:g}&horizon={horizon}")
    cold = [replace(x, prefix_ids=None, prefix_block_tokens=0) for x in generate_arrivals(calib_task, 0)]
    print(f"{len(arrivals)} requests: {a.conversations} conversations x {a.turns} turns {a.gap_s:g} s apart, "
          f"system {a.system_tokens}, user {a.user_tokens}, answer {a.answer_tokens} tokens (o200k); prompts "
          f"{min(x.prompt_tokens for x in arrivals)}-{max(x.prompt_tokens for x in arrivals)} tokens; "
          f"windows of {a.window_s:g} s x {horizon}")

    def servers(n: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
        procs, urls = [], []
        for i in range(n):
            port = free_port()
            log = out / f"llama{i}-{port}.log"
            procs.append(start_server(folder, folder / "model.gguf", MODEL_ALIAS, port, log, [], slots=a.slots))
            urls.append(f"http://127.0.0.1:{port}/v1")
        return procs, urls

    def stop(procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)

    results: dict[str, Any] = {}

    def reduction(lo: dict[str, Any], hi: dict[str, Any]) -> float | None:
        if not lo["ttft_mean_ms"] or hi["ttft_mean_ms"] is None:
            return None
        return 1.0 - hi["ttft_mean_ms"] / lo["ttft_mean_ms"]

    runs = [("calibration", None, cold, 1), ("least_work", 0.0, arrivals, 2), ("affinity", a.affinity, arrivals, 2)]
    for name, affinity, arr, n in runs:
        if a.replay is not None:
            results[name] = summary_records(out / f"records_{name}.jsonl")
            print(f"real {name:>12} (recorded): {json.dumps(results[name])}")
            continue
        procs, urls = servers(n)
        try:
            if name == "calibration":
                print(f"engine: {served_model(urls[0])}, llama-server -np {a.slots} -t 1, cache_prompt on")
            reports = play_real(urls, arr, task, affinity, out / f"records_{name}.jsonl", n)
        finally:
            stop(procs)
        results[name] = summary(reports)
        print(f"real {name:>12}: {json.dumps(results[name])}")
    caps = RequestCaps(max_prompt_tokens=4096, max_completion_tokens=256)
    fit_action = action(None).model_copy(update={"replicas": 1})
    try:
        prof, fit = run_records(BASE_PROFILE, out / "records_calibration.jsonl", [fit_action],
                                out / "llama-fit.json", window_s=task.window_s, windows=None, caps=caps,
                                step_model="affine", cached_context=a.cached_context_s or None)
    except FitRefusedError as exc:
        print(f"fit refused: {exc}")
        print(json.dumps({"real_ttft_reduction": reduction(results["least_work"], results["affinity"]),
                          "sim_ttft_reduction": None, "refused": str(exc), "out": str(out)}))
        return
    c = fit.coefficients
    if a.cached_context_s:  # the fit's per-token cost is then the rest (sim/cached_context.py)
        print(f"attention priced per pair of a computed token and a token before it: {a.cached_context_s * 1e6:.3f} "
              "us (engine.cached_context_s, held fixed in the fit)")
    print(f"fitted (calibration run): {c.step_s * 1e3:.2f} ms per iteration + {c.seq_s * 1e3:.2f} ms per decoding "
          f"sequence + {c.token_s * 1e3:.3f} ms per token + {c.ctx_s * 1e6:.3f} us per context token; fit TTFT err "
          f"{fit.after_summary['ttft_err_pct']:.1f} %")
    # the engine's cache: llama-server's slots and RAM prompt cache at its defaults (sim/slot_cache.py),
    # `-np` slots; the RAM cache's 8192 MiB hold ~370k tokens of SmolLM2-135M's KV (30 layers x 3 KV heads
    # x 64 x 2 (K, V) x 2 bytes = 23 KB a token), far more than a run sends: unbounded here
    spec = SlotCacheSpec(slots=a.slots)
    fitted = json.loads((out / "llama-fit.json").read_text())
    fitted["engine"]["prefix_cache"] = spec.to_engine()
    fitted["id"] = fitted["id"] + "-slots"
    (out / "llama-fit-slots.json").write_text(json.dumps(fitted, indent=1))
    models = {"blocks": load_profile(str(out / "llama-fit.json")),
              "slots": load_profile(str(out / "llama-fit-slots.json"))}
    # the engine's prompt tokens per o200k token on these runs (its tokenizer and chat template)
    ratio = prompt_ratio(r for name in ("least_work", "affinity") for r in read_records(out / f"records_{name}.jsonl"))
    engine_arrivals = in_engine_tokens(arrivals, ratio)
    print(f"the engine counts {ratio:.3f} tokens per o200k token on these runs (median); the simulator plays "
          f"the run in the engine's tokens, as its profile was fitted")
    convo = conversations(arrivals)
    routing: dict[str, dict[str, dict[str, int]]] = {name: {"engine": splits(
        recorded_routes(out / f"records_{name}.jsonl"), convo)} for name in ("least_work", "affinity")}
    # the slot cache a second time on the simulator's own routing with the tracked router: each arrival on
    # the replicas' true outstanding work at its arrival, as the gateway routes (sim/cluster.py)
    plays = [(cache, cache, "estimated") for cache in models] + [("slots_tracked", "slots", "tracked")]
    for key_cache, cache, router in plays:
        for name, affinity in (("least_work", 0.0), ("affinity", a.affinity)):
            key = f"sim_{key_cache}_{name}"
            routes: dict[int, int] = {}
            results[key] = summary(play_sim(models[cache], engine_arrivals, task, affinity, router=router,
                                            routes_out=routes))
            routing[name][f"sim_{key_cache}"] = splits(routes, convo)
            print(f"sim ({cache:>6} cache{', tracked router' if router == 'tracked' else ''}) {name:>12}: "
                  f"{json.dumps(results[key])}")
    # the same runs on the routes the gateway took (each request where its records say it went): what the
    # simulator predicts for these runs given their routing, which the least-work router decided by near-ties
    for name in ("least_work", "affinity"):
        key = f"sim_slots_routed_{name}"
        route = recorded_routes(out / f"records_{name}.jsonl")
        reports = play_sim(models["slots"], engine_arrivals, task, None, route)
        results[key] = summary(reports)
        print(f"sim ( slots cache, the gateway's routes) {name:>12}: {json.dumps(results[key])}")
        for bucket, row in ttft_by_hit(out / f"records_{name}.jsonl", reports).items():
            print(f"    engine hit share {bucket:>9}: {row['requests']:2d} requests, TTFT engine "
                  f"{row['engine_ttft_ms']:6.0f} ms, simulator {row['sim_ttft_ms']:6.0f} ms "
                  f"({row['sim_over_engine']:.2f})")
            results[key][f"sim_over_engine_ttft_hit_{bucket}"] = row["sim_over_engine"]

    print(f"conversations split across the servers (of {len(set(convo.values()))}) / turn-to-turn server "
          "changes, by routing:")
    for name, row in routing.items():
        print(f"  {name:>12}: " + ", ".join(f"{who} {x['split']} / {x['changes']}" for who, x in row.items()))

    # the cache mechanism alone: the engine's per-request hits against the slot model replayed on the
    # engine's own dispatch and finish times
    agree: dict[str, Any] = {}
    print("per-request hit share, engine vs slot model on the engine's own event order:")
    for name in ("least_work", "affinity"):
        rows = replay_slots(out / f"records_{name}.jsonl", arrivals, spec)
        pairs = [(x["engine_hit"], x["model_hit"]) for x in rows if x["engine_hit"] is not None]
        err = [abs(e - m) for e, m in pairs]
        agree[name] = {"requests": len(pairs), "mean_abs_err": statistics.fmean(err) if err else None,
                       "within_0.1": sum(1 for x in err if x <= 0.1),
                       "engine_mean": statistics.fmean(e for e, _ in pairs) if pairs else None,
                       "model_mean": statistics.fmean(m for _, m in pairs) if pairs else None}
        print(f"  {name:>12}: {json.dumps(agree[name])}")
        (out / f"hits_{name}.json").write_text(json.dumps(rows, indent=1))

    real_red = reduction(results["least_work"], results["affinity"])
    last: dict[str, Any] = {"real_ttft_reduction": real_red, "engine_tokens_per_o200k": ratio,
                            "cached_context_s": a.cached_context_s}
    for cache in (*models, "slots_tracked", "slots_routed"):
        sim_red = reduction(results[f"sim_{cache}_least_work"], results[f"sim_{cache}_affinity"])
        gap = abs(real_red - sim_red) / abs(sim_red) if real_red is not None and sim_red else None
        last[f"sim_{cache}_ttft_reduction"] = sim_red
        last[f"{cache}_reduction_gap_pct"] = None if gap is None else 100 * gap
    for name in ("least_work", "affinity"):
        last[f"real_{name}_hit_rate"] = results[name]["hit_rate"]
        for cache in (*models, "slots_tracked", "slots_routed"):
            last[f"sim_{cache}_{name}_hit_rate"] = results[f"sim_{cache}_{name}"]["hit_rate"]
        last[f"slot_replay_{name}_mean_abs_err"] = agree[name]["mean_abs_err"]
        last[f"routed_{name}_sim_over_engine_ttft_hit_over_0.7"] = results[f"sim_slots_routed_{name}"].get(
            "sim_over_engine_ttft_hit_over_0.7")
        for who, x in routing[name].items():  # flat keys, as every bench's last line
            last[f"split_conversations_{name}_{who}"] = x["split"]
            last[f"server_changes_{name}_{who}"] = x["changes"]
    last["out"] = str(out)
    print(json.dumps(last))


if __name__ == "__main__":
    main()
