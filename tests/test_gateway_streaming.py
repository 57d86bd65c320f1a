"""The three streaming clients: request shape, SSE parsing, HTTP framing and fault mapping.

`RawStreamClient` (gateway/http11.py underneath) and `AiohttpStreamClient` run against a scripted
asyncio server on 127.0.0.1 that sends exact bytes (split anywhere); `SdkStreamClient` runs on the
OpenAI SDK with a respx-mocked `httpx.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import ssl
import time

import httpx
import openai
import pytest
import respx
from llmserve_env.gateway.http11 import Http11Pool
from llmserve_env.gateway.streaming import (
    AiohttpStreamClient,
    AttemptError,
    ChatRequest,
    RawStreamClient,
    SdkStreamClient,
    parse_retry_after,
)

REQ = ChatRequest(model="m", prompt="hello", max_tokens=3)


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def tok(text: str | None, finish: str | None = None) -> bytes:
    return sse({"id": "c1", "choices": [{"index": 0, "delta": {"content": text} if text else {},
                                         "finish_reason": finish}]})


USAGE = sse({"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
GOOD_BODY = [sse({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
             tok(" a"), tok(" b"), tok(" c"), tok(None, "length"), USAGE, b"data: [DONE]\n\n"]


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class Scripted:
    """A loopback HTTP server; each connection answers requests with the next scripted action."""

    def __init__(self, responses: list, ssl_context: ssl.SSLContext | None = None):
        self.responses = responses
        self.ssl = ssl_context
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0
        self.handlers: list[tuple[asyncio.Task, asyncio.StreamWriter]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.handlers.append((asyncio.current_task(), writer))
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                headers = {}
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append((line.decode().strip(), headers, body))
                action = self.responses.pop(0)
                keep = await action(writer)
                if not keep:
                    writer.close()
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=self.ssl)
        port = self.server.sockets[0].getsockname()[1]
        self.base = f"{'https' if self.ssl else 'http'}://localhost:{port}/v1"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        for _, writer in self.handlers:
            writer.close()
        await asyncio.gather(*(task for task, _ in self.handlers), return_exceptions=True)


def send(data: bytes, pieces: int = 1, gap: float = 0.0, keep: bool = True):
    async def action(writer: asyncio.StreamWriter) -> bool:
        step = max(1, len(data) // pieces)
        for i in range(0, len(data), step):
            writer.write(data[i:i + step])
            await writer.drain()
            if gap:
                await asyncio.sleep(gap)
        return keep
    return action


def ok_response(parts: list[bytes] = GOOD_BODY) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(parts)


def raw_client(base: str, stall: float = 5.0, kind: str = "raw") -> RawStreamClient | AiohttpStreamClient:
    if kind == "aiohttp":
        return AiohttpStreamClient(base, "sk-test", stall, 8)
    return RawStreamClient(Http11Pool(base, 8), "sk-test", stall)


# The clients that read the socket themselves (the SDK's are below, on respx).
SOCKET_CLIENTS = pytest.mark.parametrize("kind", ["raw", "aiohttp"])


@SOCKET_CLIENTS
def test_raw_client_request_shape_and_byte_by_byte_parsing(kind):
    async def main():
        async with Scripted([send(ok_response(), pieces=10_000)]) as srv:
            c = raw_client(srv.base, kind=kind)
            seen = []
            out = await c.stream(REQ, lambda t, text: seen.append(text))
            await c.aclose()
            return srv, out, seen

    srv, out, seen = asyncio.run(main())
    line, headers, body = srv.requests[0]
    assert line == "POST /v1/chat/completions HTTP/1.1"
    assert headers["authorization"] == "Bearer sk-test" and headers["content-type"] == "application/json"
    assert json.loads(body) == {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
                                "stream": True, "stream_options": {"include_usage": True}}
    assert seen == [" a", " b", " c"] and out.text == " a b c"  # the empty role chunk is not a token
    assert out.usage_prompt_tokens == 7 and out.usage_completion_tokens == 3 and out.finish_reason == "length"
    assert out.completion_id == "c1" and out.status_code == 200 and len(out.chunk_times) == 3


@SOCKET_CLIENTS
def test_raw_client_times_chunks_when_they_arrive(kind):
    gaps = [0.15, 0.1, 0.1]

    async def paced(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for gap, part in zip(gaps, [tok(" a"), tok(" b"), tok(" c")], strict=True):
            await asyncio.sleep(gap)
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        writer.write(chunked([tok(None, "stop"), b"data: [DONE]\n\n"]))
        return True

    async def main():
        async with Scripted([paced]) as srv:
            c = raw_client(srv.base, kind=kind)
            out = await c.stream(REQ)
            await c.aclose()
            return out

    out = asyncio.run(main())
    ttft = out.first_t - out.dispatch_t
    itl = [b - a for a, b in zip(out.chunk_times, out.chunk_times[1:], strict=False)]
    assert 0.15 <= ttft < 0.25
    assert all(0.08 < g < 0.2 for g in itl)
    assert out.usage_completion_tokens is None  # no usage chunk: the dispatcher falls back to tiktoken


def test_raw_client_keeps_connections_alive_and_recovers_a_stale_one():
    async def main():
        async with Scripted([send(ok_response()), send(ok_response(), keep=False), send(ok_response())]) as srv:
            c = raw_client(srv.base)
            await c.stream(REQ)
            await c.stream(REQ)  # the same connection; the server closes it afterwards
            await asyncio.sleep(0.05)
            await c.stream(REQ)  # the idle connection is dead: a fresh one, transparently
            await c.aclose()
            return srv.connections

    assert asyncio.run(main()) == 2


@SOCKET_CLIENTS
def test_raw_client_error_status_and_retry_after(kind):
    body = json.dumps({"error": {"message": "Rate limit"}}).encode()
    resp = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 3\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))

    async def main():
        async with Scripted([send(resp, pieces=3), send(b"HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\nboom"),
                             send(b"HTTP/1.1 401 No\r\nconnection: close\r\n\r\nbad key", keep=False)]) as srv:
            c = raw_client(srv.base, kind=kind)
            errs = []
            for _ in range(3):
                with pytest.raises(AttemptError) as ei:
                    await c.stream(REQ)
                errs.append(ei.value)
            await c.aclose()
            return errs

    e429, e500, e401 = asyncio.run(main())
    assert (e429.kind, e429.status, e429.retryable, e429.retry_after_s) == ("http", 429, True, 3.0)
    assert "Rate limit" in e429.message
    assert (e500.status, e500.retryable) == (500, True) and "boom" in e500.message
    assert (e401.status, e401.retryable) == (401, False) and "bad key" in e401.message


@SOCKET_CLIENTS
def test_raw_client_stream_cut_and_stall(kind):
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    cut_mid = head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in [tok(" a"), tok(" b")])

    async def stall(writer):
        writer.write(head)
        await asyncio.sleep(1.0)
        return False

    async def main():
        async with Scripted([send(cut_mid, keep=False), send(head, keep=False), stall]) as srv:
            c = raw_client(srv.base, stall=0.3, kind=kind)
            errs = []
            for _ in range(3):
                t = time.monotonic()
                with pytest.raises(AttemptError) as ei:
                    await c.stream(REQ)
                errs.append((ei.value, time.monotonic() - t))
            await c.aclose()
            return errs

    (cut, _), (cut0, _), (st, waited) = asyncio.run(main())
    assert cut.kind == "connection" and not cut.retryable and "after 2 chunks" in cut.message
    assert len(cut.outcome.chunk_times) == 2
    assert cut0.kind == "connection" and cut0.retryable and "before the first token" in cut0.message
    assert st.kind == "stall" and 0.3 <= waited < 0.9


def self_signed(tmp_path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for `localhost`."""
    pytest.importorskip("cryptography")  # installed with openenv (through Authlib)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem, key_pem = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_pem, key_pem)
    return server, ssl.create_default_context(cafile=str(cert_pem))


def test_raw_client_over_tls(tmp_path):
    server_ctx, client_ctx = self_signed(tmp_path)

    async def main():
        async with Scripted([send(ok_response(), pieces=7), send(ok_response())], ssl_context=server_ctx) as srv:
            c = RawStreamClient(Http11Pool(srv.base, 4, ssl_context=client_ctx), "sk-test", 5.0)
            first = await c.stream(REQ)
            second = await c.stream(REQ)
            await c.aclose()
            return first, second, srv.connections

    first, second, connections = asyncio.run(main())
    assert first.text == second.text == " a b c" and connections == 1


@SOCKET_CLIENTS
def test_raw_client_connect_error_is_retryable(kind):
    async def main():
        c = raw_client("http://127.0.0.1:9/v1", kind=kind)
        with pytest.raises(AttemptError) as ei:
            await c.stream(REQ)
        return ei.value

    err = asyncio.run(main())
    assert err.kind == "connection" and err.retryable


@SOCKET_CLIENTS
def test_error_event_inside_the_stream(kind):
    parts = [tok(" a"), sse({"error": {"message": "engine died"}})]

    async def main():
        async with Scripted([send(ok_response(parts))]) as srv:
            c = raw_client(srv.base, kind=kind)
            with pytest.raises(AttemptError) as ei:
                await c.stream(REQ)
            await c.aclose()
            return ei.value

    err = asyncio.run(main())
    assert err.kind == "protocol" and "engine died" in err.message and not err.retryable


def test_parse_retry_after_forms():
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    future = email.utils.format_datetime(email.utils.localtime()).replace("+0000", "GMT")
    assert parse_retry_after({"retry-after": future}) == pytest.approx(0.0, abs=2.0)
    assert parse_retry_after({}) is None and parse_retry_after({"retry-after": "soon"}) is None


# ------------------------------------------------------------------ the SDK client (respx)

BASE = "http://sdk.test/v1"


def sdk_client() -> SdkStreamClient:
    return SdkStreamClient(openai.AsyncOpenAI(api_key="sk-test", base_url=BASE, max_retries=0,
                                              http_client=httpx.AsyncClient()), 5.0)


def sdk_run(side_effect):
    async def main():
        with respx.mock(base_url=BASE) as mock:
            route = mock.post("/chat/completions").mock(side_effect=side_effect)
            try:
                return await sdk_client().stream(REQ), route
            except AttemptError as exc:
                return exc, route
    return asyncio.run(main())


def test_sdk_client_streams_and_sends_the_same_request():
    out, route = sdk_run(lambda req: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                                    content=b"".join(GOOD_BODY)))
    assert out.text == " a b c" and out.usage_completion_tokens == 3 and out.finish_reason == "length"
    body = json.loads(route.calls[0].request.content)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 3


def test_reasoning_tokens_count_alike_on_both_clients():
    """A reasoning model streams `reasoning_content` before `content`: both clients time those
    chunks as tokens, so TTFT and ITL do not depend on LLMSERVE_REAL_CLIENT."""
    body = [sse({"id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]}),
            tok(" a"), tok(None, "stop"), USAGE, b"data: [DONE]\n\n"]
    out, _ = sdk_run(lambda req: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                                content=b"".join(body)))
    assert out.text == "think a" and len(out.chunk_times) == 2


def test_sdk_client_maps_faults():
    e429, _ = sdk_run(lambda r: httpx.Response(429, headers={"retry-after": "4"}, json={"error": {"message": "rl"}}))
    assert (e429.kind, e429.status, e429.retryable, e429.retry_after_s) == ("http", 429, True, 4.0)
    e500, _ = sdk_run(lambda r: httpx.Response(503, json={"error": {"message": "down"}}))
    assert e500.status == 503 and e500.retryable
    e400, _ = sdk_run(lambda r: httpx.Response(400, json={"error": {"message": "bad"}}))
    assert e400.status == 400 and not e400.retryable

    def boom(exc):
        def raise_(request):
            raise exc
        return raise_

    stall, _ = sdk_run(boom(httpx.ReadTimeout("slow")))
    assert stall.kind == "stall"
    conn, _ = sdk_run(boom(httpx.ConnectError("refused")))
    assert conn.kind == "connection" and conn.retryable
    cut, _ = sdk_run(lambda r: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                              content=tok(" a") + tok(" b")))
    assert cut.kind == "connection" and not cut.retryable and "after 2 chunks" in cut.message


def test_sdk_client_requires_max_retries_zero():
    with pytest.raises(ValueError, match="max_retries=0"):
        SdkStreamClient(openai.AsyncOpenAI(api_key="k", base_url=BASE), 5.0)
