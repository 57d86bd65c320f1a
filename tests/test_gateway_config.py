"""Real-mode configuration, the key's secrecy, the tier table, the spend guard and offline token counting."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest
import tiktoken.load
from llmserve_env.gateway.budget import BudgetExceededError, SpendGuard
from llmserve_env.gateway.config import GatewayConfig, GatewayConfigError, redact
from llmserve_env.gateway.pricing import DEFAULT_TIERS, load_tier_table
from llmserve_env.gateway.tokens import (
    O200K_CACHE_NAME,
    O200K_SHA256,
    PromptBuilder,
    count_tokens,
    seed_tiktoken_cache,
)

CANARY = "sk-canary-config-5f2b9c0e7d4a1"


# The address tiktoken would fetch o200k_base from: only a cache key here (never fetched), and
# gateway.tokens.O200K_CACHE_NAME must be its sha1.
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def test_the_cache_name_is_the_sha1_of_tiktokens_address():
    assert O200K_CACHE_NAME == hashlib.sha1(O200K_URL.encode()).hexdigest()

def test_real_mode_needs_a_key_or_a_base_url():
    with pytest.raises(GatewayConfigError, match="OPENAI_API_KEY") as ei:
        GatewayConfig.from_env({})
    assert "OPENAI_BASE_URL" in str(ei.value)
    with pytest.raises(GatewayConfigError, match="not a loopback"):
        GatewayConfig.from_env({"OPENAI_BASE_URL": "http://gpu-box.internal:8000/v1"})


def test_key_for_openai_and_dummy_key_for_loopback():
    c = GatewayConfig.from_env({"OPENAI_API_KEY": CANARY})
    assert c.base_url == "https://api.openai.com/v1" and c.api_key.reveal() == CANARY
    for url in ("http://127.0.0.1:8000/v1/", "http://localhost:9/v1", "http://[::1]:8000/v1"):
        local = GatewayConfig.from_env({"OPENAI_BASE_URL": url})
        assert local.api_key.reveal() == "EMPTY" and not local.base_url.endswith("/")


def test_env_values_are_parsed_and_checked():
    c = GatewayConfig.from_env({
        "OPENAI_API_KEY": CANARY, "LLMSERVE_REAL_MODEL": "gpt-4.1-mini",
        "LLMSERVE_REAL_MAX_REQUESTS_PER_STEP": "8", "LLMSERVE_REAL_MAX_PROMPT_TOKENS": "100",
        "LLMSERVE_REAL_MAX_COMPLETION_TOKENS": "50", "LLMSERVE_REAL_MAX_USD_PER_EPISODE": "0.25",
        "LLMSERVE_REAL_STEP_TIMEOUT_S": "2.5", "LLMSERVE_REAL_CLIENT": "SDK", "LLMSERVE_REAL_IGNORE_EOS": "true",
        "LLMSERVE_REAL_RECORD": "/tmp/x.jsonl",
    })
    assert (c.model, c.max_requests_per_step, c.max_prompt_tokens, c.max_completion_tokens) == ("gpt-4.1-mini", 8, 100, 50)
    assert (c.max_usd_per_episode, c.step_timeout_s, c.client, c.ignore_eos) == (0.25, 2.5, "sdk", True)
    assert c.record_path == "/tmp/x.jsonl"
    for name, value in (("LLMSERVE_REAL_MAX_PROMPT_TOKENS", "lots"), ("LLMSERVE_REAL_STEP_TIMEOUT_S", "0"),
                        ("LLMSERVE_REAL_CLIENT", "curl"), ("LLMSERVE_REAL_IGNORE_EOS", "maybe")):
        with pytest.raises(GatewayConfigError) as ei:
            GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, name: value})
        assert CANARY not in str(ei.value)
    with pytest.raises(GatewayConfigError, match="http"):
        GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": "ftp://x"})


def test_the_key_never_shows():
    c = GatewayConfig.from_env({"OPENAI_API_KEY": CANARY})
    for text in (repr(c), str(c), f"{c}", repr(c.api_key), str(c.api_key), f"{c.api_key}", json.dumps(c.describe())):
        assert CANARY not in text
    with pytest.raises(TypeError):
        pickle.dumps(c.api_key)
    assert redact(f"Incorrect API key provided: {CANARY}.", c.api_key) == "Incorrect API key provided: ***."


def test_tier_table_default_override_and_pin(tmp_path):
    assert DEFAULT_TIERS.for_tier("FP16").model == "gpt-4.1" and DEFAULT_TIERS.distinct_models
    assert DEFAULT_TIERS.for_tier("INT4").cost(1_000_000, 1_000_000) == pytest.approx(0.50)
    path = tmp_path / "tiers.json"
    entry = {"input_usd_per_1m": 0.0, "output_usd_per_1m": 0.0, "quality": 1.0}
    path.write_text(json.dumps({t: {"model": f"llama-{t.lower()}", **entry} for t in ("FP16", "INT8", "INT4")}))
    table = load_tier_table(str(path))
    assert table.for_tier("INT8").model == "llama-int8" and table.distinct_models
    pinned = load_tier_table(None, "gpt-4.1-mini")
    assert not pinned.distinct_models and pinned.for_tier("FP16").output_usd_per_1m == 1.60
    unknown = load_tier_table(None, "my-local-model")
    assert unknown.for_tier("INT4").price_known is False and unknown.for_tier("INT4").cost(10, 10) == 0.0
    path.write_text(json.dumps({"FP16": {"model": "x", **entry}}))
    with pytest.raises(GatewayConfigError, match="LLMSERVE_REAL_TIERS"):
        load_tier_table(str(path))


def test_spend_guard_reserves_worst_case_and_settles():
    g = SpendGuard(max_requests=10, max_tokens=1000, max_usd=1.0)
    r = g.reserve(600, 0.5)
    g.settle(r, 100, 0.1)
    assert (g.requests, g.tokens, g.usd) == (1, 100, pytest.approx(0.1))
    g.reserve(800, 0.2)
    with pytest.raises(BudgetExceededError, match="1000 tokens"):
        g.reserve(200, 0.0)
    with pytest.raises(BudgetExceededError):  # stays exhausted
        g.reserve(1, 0.0)
    assert g.snapshot()["exhausted"] == "1000 tokens"


def test_tiktoken_is_seeded_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    path = seed_tiktoken_cache()
    assert path.name == hashlib.sha1(O200K_URL.encode()).hexdigest()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == O200K_SHA256

    def no_network(url):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    ranks = tiktoken.load.load_tiktoken_bpe(O200K_URL, O200K_SHA256)
    assert len(ranks) > 199_000
    assert count_tokens("hello world") == 2


def test_the_seeded_cache_file_is_the_one_tiktoken_looks_for():
    """tiktoken names its cache file after the download URL: if a release changed the URL, the seeded
    file would be missed and tiktoken would try to download. Pin our URL to tiktoken's own."""
    import inspect

    import tiktoken_ext.openai_public as openai_public

    assert O200K_URL in inspect.getsource(openai_public.o200k_base)


def test_prompts_have_exactly_the_target_token_count():
    b = PromptBuilder()
    for n in (1, 2, 3, 7, 64, 256, 1000, 3000, 9000):
        for salt in (0, 1, 99991):
            assert count_tokens(b.build(n, salt)) == n
    assert b.build(300, 1) != b.build(300, 2)  # no shared prefix across requests
    with pytest.raises(ValueError):
        b.build(0, 1)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("LLMSERVE_REAL_STEP_TIMEOUT_S", "inf", "finite"),
    ("LLMSERVE_REAL_REQUEST_TIMEOUT_S", "nan", "finite"),
    ("LLMSERVE_REAL_MAX_USD_PER_EPISODE", "1e23", "less than or equal"),
    ("LLMSERVE_REAL_MAX_PROMPT_TOKENS", "1e23", "valid integer"),
    ("LLMSERVE_REAL_MAX_INFLIGHT_TOTAL", "0", "greater than or equal to 1"),
    ("LLMSERVE_REAL_MAX_USD_TOTAL", "-1", "greater than 0"),
    ("LLMSERVE_REAL_TIERS", "/nonexistent/tiers.json", "no readable file"),
    ("LLMSERVE_REAL_RECORD", "", "set but empty"),
    ("LLMSERVE_REAL_MODEL", " ", "set but empty"),
    ("LLMSERVE_REAL_MAX_USD_PER_EPISOD", "1", "not a real-mode variable"),  # a typo would turn the guard off
    ("LLMSERVE_REAL_CLIENT", "curl", "'raw', 'aiohttp' or 'sdk'"),
])
def test_every_variable_is_checked_at_start_up(name, value, says):
    """Issue 20 item 9: bad values fail at start-up naming the variable, never at the first /reset."""
    with pytest.raises(GatewayConfigError) as ei:
        GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, name: value})
    assert name in str(ei.value) and says in str(ei.value) and CANARY not in str(ei.value)


def test_the_record_path_must_be_writable(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(GatewayConfigError, match="LLMSERVE_REAL_RECORD.*not a writable folder"):
        GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, "LLMSERVE_REAL_RECORD": str(afile / "rec.jsonl")})
    with pytest.raises(GatewayConfigError, match="not a writable file"):
        GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, "LLMSERVE_REAL_RECORD": str(tmp_path)})
    ok = GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, "LLMSERVE_REAL_RECORD": str(tmp_path / "new" / "r.jsonl")})
    assert ok.record_path == str(tmp_path / "new" / "r.jsonl")


def test_settings_hold_the_key_as_a_secret():
    from llmserve_env.gateway.config import GatewaySettings

    s = GatewaySettings.from_env({"OPENAI_API_KEY": CANARY, "LLMSERVE_REAL_MAX_USD_TOTAL": "2.5"})
    assert CANARY not in repr(s) and CANARY not in str(s.model_dump())
    c = s.to_config()
    assert c.api_key.reveal() == CANARY and c.max_usd_total == 2.5
    assert (c.max_inflight_total, c.abandon_s, c.reuse_prompts, c.probe) == (1024, 30.0, False, True)
