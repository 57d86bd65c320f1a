"""One streaming chat completion, timed: dispatch, first token, every chunk, last token.

Three interchangeable clients send the same request (`stream=True`,
`stream_options={"include_usage": True}`):

- `RawStreamClient` (the default): gateway/http11.py's small HTTP/1.1 client (asyncio protocol,
  responses parsed by httptools) and an SSE parser fed straight from `data_received`. Each chunk is
  timestamped when its bytes are read from the socket. See gateway/http11.py for why (httpx's pool
  and the SDK's per-chunk parsing cost CPU that becomes event-loop lag, which lands in every
  measured latency; bench/gateway_accuracy.py).
- `AiohttpStreamClient`: aiohttp's client session and the same SSE parser, chunks timestamped as
  aiohttp hands them over (`iter_any`): the widely used asyncio client, for comparison and where
  the small client's narrow scope (no proxies) does not fit.
- `SdkStreamClient`: `openai.AsyncOpenAI` (built with `max_retries=0`: the dispatcher retries);
  for proxies and anything else the small client does not do. Its chunks are timestamped when
  the SDK yields them (`loop.time()`).

Timestamps are on the loop clock (virtual under looptime in tests). A chunk counts as a token
chunk when its delta carries text (content or reasoning); TTFT is the first such chunk and every
later one contributes one ITL gap, as vLLM's benchmark measures.
Neither client retries; failures raise `AttemptError` saying whether a retry may help.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import httpx2
import openai
from llmserve_env.gateway.http11 import Http11Pool, HttpError, Response, StallTimeout

TRANSPORT_ERRORS = (httpx.TransportError, httpx2.TransportError)
TIMEOUT_ERRORS = (httpx.TimeoutException, httpx2.TimeoutException)
# The statuses the OpenAI SDK itself would retry: request timeout, conflict, rate limit, server errors.
RETRYABLE_STATUS = frozenset({408, 409, 429})

ChunkCallback = Callable[[float, str], None]  # (loop time, chunk text)


@dataclass(slots=True, frozen=True)
class ChatRequest:
    model: str
    prompt: str
    max_tokens: int
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }


@dataclass(slots=True)
class AttemptOutcome:
    """What one HTTP attempt produced (complete, or partial when attached to an AttemptError)."""

    dispatch_t: float
    first_t: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    finish_reason: str | None = None
    completion_id: str | None = None
    served_model: str | None = None  # the `model` the server says answered (compared with the one asked for)
    status_code: int | None = None
    # the engine's prefix cache, as it reports it (None: not said): vLLM / OpenAI
    # usage.prompt_tokens_details.cached_tokens; llama-server's timings (prompt_n: prompt tokens it
    # evaluated, cache_n: taken from its cache) and its native `tokens_cached`
    usage_cached_tokens: int | None = None
    timings_prompt_n: int | None = None
    timings_cache_n: int | None = None
    tokens_cached: int | None = None

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the engine served from its prefix cache, from its own fields; None when it said
        nothing (never a guessed 0)."""
        if self.usage_cached_tokens is not None:
            return self.usage_cached_tokens
        if self.timings_cache_n is not None:
            return self.timings_cache_n
        if self.tokens_cached is not None:
            return self.tokens_cached
        if self.timings_prompt_n is not None and self.usage_prompt_tokens is not None:
            return max(0, self.usage_prompt_tokens - self.timings_prompt_n)
        return None

    @property
    def engine_prompt_tokens(self) -> int | None:
        """The prompt tokens the engine counted (its tokenizer and chat template): usage, else timings."""
        if self.usage_prompt_tokens is not None:
            return self.usage_prompt_tokens
        if self.timings_prompt_n is not None and self.timings_cache_n is not None:
            return self.timings_prompt_n + self.timings_cache_n
        return None

    @property
    def last_t(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add_chunk(self, t: float, text: str, on_chunk: ChunkCallback | None) -> None:
        if self.first_t is None:
            self.first_t = t
        self.chunk_times.append(t)
        self.text_parts.append(text)
        if on_chunk is not None:
            on_chunk(t, text)


class AttemptError(Exception):
    """One attempt failed.

    kind          http | connection | stall | protocol
    retryable     429/408/409/5xx and connection errors before the first token
    retry_after_s the server's Retry-After (retry-after-ms or retry-after), if it sent one
    """

    def __init__(self, kind: str, message: str, outcome: AttemptOutcome, *, status: int | None = None,
                 retryable: bool = False, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.outcome = outcome
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class StreamClient(Protocol):
    async def stream(self, request: ChatRequest, on_chunk: ChunkCallback | None = None) -> AttemptOutcome: ...

    async def aclose(self) -> None: ...


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` (OpenAI) or `retry-after` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _status_error(status: int, body: str, headers: Mapping[str, str], outcome: AttemptOutcome) -> AttemptError:
    retryable = status in RETRYABLE_STATUS or status >= 500
    return AttemptError("http", f"HTTP {status}: {body[:300]}", outcome, status=status, retryable=retryable,
                        retry_after_s=parse_retry_after(headers))


def _cut_error(outcome: AttemptOutcome, detail: str) -> AttemptError:
    # Before the first token nothing reached the user, so a retry is safe; after it, retrying
    # would stream the answer twice: the request ends `error` instead.
    started = outcome.first_t is not None
    where = f"after {len(outcome.chunk_times)} chunks" if started else "before the first token"
    return AttemptError("connection", f"stream cut {where}: {detail}", outcome, retryable=not started)


def _finish(outcome: AttemptOutcome, done: bool) -> AttemptOutcome:
    if not done and outcome.finish_reason is None:
        raise _cut_error(outcome, "ended without finish_reason or [DONE]")
    return outcome


def _delta_text(delta: dict[str, Any]) -> str | None:
    """The text a chunk's delta carries: content, or a reasoning model's reasoning (vLLM and SGLang
    stream it as `reasoning_content`, others as `reasoning`): its tokens are generated tokens too."""
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")


def _handle_payload(obj: dict[str, Any], outcome: AttemptOutcome, t: float, on_chunk: ChunkCallback | None) -> None:
    if "error" in obj and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        raise AttemptError("protocol", f"error event in stream: {msg}", outcome,
                           retryable=outcome.first_t is None)
    if outcome.completion_id is None:
        outcome.completion_id = obj.get("id")
    if outcome.served_model is None and isinstance(obj.get("model"), str):
        outcome.served_model = obj["model"]
    for choice in obj.get("choices") or ():
        text = _delta_text(choice.get("delta") or {})
        if text:
            outcome.add_chunk(t, text, on_chunk)
        if choice.get("finish_reason"):
            outcome.finish_reason = choice["finish_reason"]
    usage = obj.get("usage")
    if usage:
        outcome.usage_prompt_tokens = usage.get("prompt_tokens")
        outcome.usage_completion_tokens = usage.get("completion_tokens")
        outcome.usage_cached_tokens = _cached_detail(usage.get("prompt_tokens_details"))
    read_cache_fields(obj, outcome)


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _cached_detail(details: object) -> int | None:
    return _count(details.get("cached_tokens")) if isinstance(details, dict) else None


def read_cache_fields(obj: dict[str, Any], outcome: AttemptOutcome) -> None:
    """llama-server's cache fields of a chunk (its last carries the request's final `timings`)."""
    timings = obj.get("timings")
    if isinstance(timings, dict):
        outcome.timings_prompt_n = _count(timings.get("prompt_n"))
        outcome.timings_cache_n = _count(timings.get("cache_n"))
    if "tokens_cached" in obj:
        outcome.tokens_cached = _count(obj.get("tokens_cached"))


class SseParser:
    """Splits SSE bytes into `data:` payloads and applies them to an outcome, all at arrival time `t`."""

    __slots__ = ("outcome", "on_chunk", "buf", "done", "error")

    def __init__(self, outcome: AttemptOutcome, on_chunk: ChunkCallback | None):
        self.outcome = outcome
        self.on_chunk = on_chunk
        self.buf = b""
        self.done = False
        self.error: AttemptError | None = None

    def feed(self, data: bytes, t: float) -> None:
        buf = self.buf + data
        lines = buf.split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            if self.done or self.error is not None or not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                _handle_payload(json.loads(payload), self.outcome, t, self.on_chunk)
            except json.JSONDecodeError:
                self.error = AttemptError("protocol", f"malformed SSE data: {payload[:80]!r}", self.outcome,
                                          retryable=self.outcome.first_t is None)
            except AttemptError as exc:
                self.error = exc


class RawStreamClient:
    """POST /chat/completions over `Http11Pool` and parse the SSE stream as bytes arrive (cheap per chunk)."""

    def __init__(self, pool: Http11Pool, api_key: str, stall_timeout_s: float):
        self._pool = pool
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                         "Accept": "text/event-stream"}
        self._timeout = stall_timeout_s

    def __repr__(self) -> str:
        return f"RawStreamClient({self._pool!r})"

    async def stream(self, request: ChatRequest, on_chunk: ChunkCallback | None = None) -> AttemptOutcome:
        loop = asyncio.get_running_loop()
        outcome = AttemptOutcome(dispatch_t=loop.time())
        sse = SseParser(outcome, on_chunk)
        head: list[Response] = []
        error_body: list[bytes] = []

        def on_head(resp: Response) -> None:
            head.append(resp)
            outcome.status_code = resp.status

        def on_body(data: bytes, t: float) -> None:
            if outcome.status_code is not None and outcome.status_code >= 300:  # no redirects followed
                error_body.append(data)
            else:
                sse.feed(data, t)

        try:
            await self._pool.post("/chat/completions", self._headers, json.dumps(request.body()).encode(),
                                  on_head, on_body, self._timeout)
        except StallTimeout as exc:
            raise AttemptError("stall", str(exc), outcome) from None
        except HttpError as exc:
            raise _cut_error(outcome, str(exc)) from None
        if head and head[0].status >= 300:
            body = b"".join(error_body).decode("utf-8", "replace")
            raise _status_error(head[0].status, body, head[0].headers, outcome)
        if sse.error is not None:
            raise sse.error
        return _finish(outcome, sse.done)

    async def aclose(self) -> None:
        await self._pool.aclose()


class AiohttpStreamClient:
    """POST /chat/completions with aiohttp and parse the SSE stream with `SseParser` as chunks arrive."""

    def __init__(self, base_url: str, api_key: str, stall_timeout_s: float, max_connections: int = 1024):
        import aiohttp  # only when chosen: the other clients never load it

        self._aiohttp = aiohttp
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                         "Accept": "text/event-stream", "Accept-Encoding": "identity"}
        self._timeout = stall_timeout_s
        self._limit = max_connections
        self._session: Any = None

    def __repr__(self) -> str:
        return f"AiohttpStreamClient({self._url!r})"

    def _get_session(self) -> Any:
        if self._session is None:  # made on the loop that uses it
            aiohttp = self._aiohttp
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self._timeout))
        return self._session

    async def stream(self, request: ChatRequest, on_chunk: ChunkCallback | None = None) -> AttemptOutcome:
        aiohttp = self._aiohttp
        loop = asyncio.get_running_loop()
        outcome = AttemptOutcome(dispatch_t=loop.time())
        sse = SseParser(outcome, on_chunk)
        try:
            async with self._get_session().post(self._url, data=json.dumps(request.body()).encode(),
                                                headers=self._headers) as resp:
                outcome.status_code = resp.status
                if resp.status >= 300:
                    body = (await resp.read()).decode("utf-8", "replace")
                    raise _status_error(resp.status, body, resp.headers, outcome)
                async for data in resp.content.iter_any():
                    sse.feed(data, loop.time())
        except aiohttp.ServerTimeoutError as exc:
            if outcome.status_code is None and "connect" in str(exc).lower():
                raise _cut_error(outcome, f"connect timeout ({type(exc).__name__})") from None
            raise AttemptError("stall", f"no data for {self._timeout:g} s", outcome) from None
        except aiohttp.ClientError as exc:
            raise _cut_error(outcome, type(exc).__name__) from None
        if sse.error is not None:
            raise sse.error
        return _finish(outcome, sse.done)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class SdkStreamClient:
    """The same request through `openai.AsyncOpenAI` (which must have max_retries=0)."""

    def __init__(self, client: openai.AsyncOpenAI, stall_timeout_s: float):
        if client.max_retries != 0:
            raise ValueError("the dispatcher retries itself: build AsyncOpenAI with max_retries=0")
        self._client = client
        self._timeout = stall_timeout_s

    def __repr__(self) -> str:
        return f"SdkStreamClient(base_url={str(self._client.base_url)!r})"

    async def stream(self, request: ChatRequest, on_chunk: ChunkCallback | None = None) -> AttemptOutcome:
        loop = asyncio.get_running_loop()
        outcome = AttemptOutcome(dispatch_t=loop.time())
        try:
            chunks = await self._client.chat.completions.create(
                model=request.model,
                messages=[{"role": "user", "content": request.prompt}],
                max_tokens=request.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=dict(request.extra_body) or None,
                timeout=self._timeout,
            )
            outcome.status_code = 200
            async for chunk in chunks:
                if outcome.completion_id is None:
                    outcome.completion_id = chunk.id
                if outcome.served_model is None and chunk.model:
                    outcome.served_model = chunk.model
                for choice in chunk.choices:
                    d = choice.delta
                    # the same fields as the raw client reads (reasoning arrives as extra fields;
                    # content is a declared field, never among them)
                    text = (d.content or _delta_text(d.model_extra or {})) if d else None
                    if text:
                        outcome.add_chunk(loop.time(), text, on_chunk)
                    if choice.finish_reason:
                        outcome.finish_reason = choice.finish_reason
                if chunk.usage is not None:
                    outcome.usage_prompt_tokens = chunk.usage.prompt_tokens
                    outcome.usage_completion_tokens = chunk.usage.completion_tokens
                    details = chunk.usage.prompt_tokens_details
                    if details is not None:
                        outcome.usage_cached_tokens = _count(details.cached_tokens)
                if chunk.model_extra:  # llama-server's `timings` and `tokens_cached` arrive as extra fields
                    read_cache_fields(chunk.model_extra, outcome)
        except openai.APIStatusError as exc:
            outcome.status_code = exc.status_code
            raise _status_error(exc.status_code, exc.message, exc.response.headers, outcome) from None
        except (openai.APITimeoutError, *TIMEOUT_ERRORS) as exc:
            raise AttemptError("stall", f"no data for {self._timeout:g} s ({type(exc).__name__})", outcome) from None
        except (openai.APIConnectionError, *TRANSPORT_ERRORS) as exc:
            raise _cut_error(outcome, type(exc).__name__) from None
        except openai.APIError as exc:  # an error event inside the stream
            raise AttemptError("protocol", f"error event in stream: {exc.message}", outcome,
                               retryable=outcome.first_t is None) from None
        # The SDK stops at [DONE] without telling us it saw it; a finish_reason is the proof of a
        # complete stream.
        return _finish(outcome, done=False)

    async def aclose(self) -> None:
        await self._client.close()
