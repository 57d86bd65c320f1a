"""Real mode's prefix caching (issue 32 item 4): prompts whose arrivals share prefix ids share that
prefix's text byte for byte; the gateway routes over its endpoints by the simulator's affinity rule
(shared/prefix_routing.py) from the prefix ids it sent each endpoint; and it reads the hit from the
engine's own fields (vLLM/OpenAI `usage.prompt_tokens_details.cached_tokens`, llama-server's `timings`),
reporting the window's prefix hit rate where the engine said it, None where it did not."""

from __future__ import annotations

import pytest
from llmserve_env.gateway.config import GatewayConfig, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.tokens import count_tokens, prompt_builder
from llmserve_env.shared.backend import Arrival

TIERS = TierTable({t: TierPrice("m", 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "test")


# ----------------------------------------------------------------------------------------- prompts

def test_prompts_sharing_leading_ids_share_their_text_and_keep_their_length():
    b = prompt_builder()
    cache: dict = {}
    system = (11, 12, 13, 14)
    turn1 = b.build_shared(16 * 6 + 5, system + (21, 22), 16, salt=1, nonce="n", cache=cache)
    turn2 = b.build_shared(16 * 9 + 3, system + (21, 22, 23, 24, 25), 16, salt=2, nonce="n", cache=cache)
    other = b.build_shared(16 * 5 + 7, system + (31,), 16, salt=3, nonce="n", cache=cache)
    assert [count_tokens(t) for t in (turn1, turn2, other)] == [101, 147, 87]
    head6 = "".join(cache[i, 16] for i in system + (21, 22))
    assert turn1.startswith(head6) and turn2.startswith(head6)
    head4 = "".join(cache[i, 16] for i in system)
    assert other.startswith(head4) and not other.startswith(head6)
    assert count_tokens(head6) == 96  # the units tokenize as they do alone
    # the same ids under another nonce (another episode) share nothing
    fresh = b.build_shared(101, system + (21, 22), 16, salt=1, nonce="m")
    assert fresh[:20] != turn1[:20]
    # without a cache, the same text
    assert b.build_shared(101, system + (21, 22), 16, salt=1, nonce="n") == turn1


@pytest.mark.parametrize("n", [1, 5, 16, 32, 33, 600, 1024, 1500])
def test_shared_prompts_are_exact_at_every_length(n):
    b = prompt_builder()
    ids = tuple(range(100, 100 + n // 16 + 3))
    for unit in (16, 512):
        assert count_tokens(b.build_shared(n, ids, unit, salt=n, nonce="x")) == n


def test_the_backend_builds_shared_prompts_for_prefix_arrivals_only(monkeypatch):
    from llmserve_env.gateway.backend import GatewayBackend

    b = GatewayBackend.__new__(GatewayBackend)  # its prompt builder alone: no dispatcher, no loop
    b.config = GatewayConfig(api_key=Secret("EMPTY"), base_url="http://127.0.0.1:9/v1")
    b._prompts, b._seed, b._nonce, b._units = prompt_builder(), 0, "e1", {}
    plain = [b._prompt(Arrival(i, 0.0, 64, 4)) for i in range(2)]
    assert plain[0][:24] != plain[1][:24]  # no shared prefix, as before
    assert plain[0] == prompt_builder().build(64, salt=0, nonce="e1")
    shared = [b._prompt(Arrival(i, 0.0, 64 + i, 4, prefix_ids=(7, 8, 9, 10 + i), prefix_block_tokens=16))
              for i in range(2)]
    assert shared[0][:len(shared[0]) // 2] == shared[1][:len(shared[0]) // 2]
    assert [count_tokens(t) for t in shared] == [64, 65]
