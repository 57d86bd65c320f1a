"""Prefix caching: full KV blocks kept by the hash of their prefix chain, shared, and evicted LRU.

The model is vLLM V1's automatic prefix caching (vllm/v1/core/kv_cache_manager.py and
kv_cache_utils.py, read to learn; none of its code is used):

- A request's prompt is cut into full units of `block_tokens` tokens (a multiple of the engine's
  16-token KV block). Unit j's key is a hash of (unit j-1's key, unit j's id): equal keys mean an
  equal prefix up to and including that unit, so a later unit never hits without every unit before
  it (`chain_keys`). Ids come from the workload (`Arrival.prefix_ids`: Mooncake's `hash_ids`, or
  the synthetic workloads' ids, shared/prefix.py); a partial last unit is never cached.
- At admission the longest run of the request's leading keys present in the cache is a hit, capped
  so that at least one prompt token is computed (V1 recomputes the last token to get its logits:
  the hit covers at most prompt - 1 tokens, in whole units). Hit tokens skip prefill; the request
  shares the units' blocks (a reference each).
- Prompt units a request computes join the cache as soon as its prefill has covered them (V1 caches
  a block when it is full), so a concurrent request with the same prefix hits them.
- A unit whose last reference is released (the request finished or was preempted) stays cached and
  becomes evictable. Evictable blocks count as free memory, as in V1's free-block queue: admission
  and preemption see them as free, so they are evicted (least recently released first; a request's
  units are released tail first, so its last unit goes before its first, as V1 frees them in
  reverse) before any running request is preempted.

Simplifications, stated:
- The cache works in units of `block_tokens` (512 tokens for Mooncake's `hash_ids`, 16 for the
  synthetic workloads): a unit is hit, shared and evicted whole. The trace carries nothing finer.
- Generated tokens' units are cached when the request releases its blocks (finished or preempted),
  not as each fills (V1 caches a block the moment it is full): only a request arriving while another
  still decodes could tell the difference. They are cached only when the workload gives them ids
  (Mooncake's `hash_ids` cover the prompt only).
- A unit computed by two requests at once is kept once: the second one's copy joins the first's
  (V1 keeps both copies until they are freed). Memory is counted once per unit either way.
- Keys are Python's built-in hash of int tuples (deterministic across processes; a 64-bit collision
  would merge two prefixes, as V1's builtin-hash mode can).

Accounting, in 16-token blocks (sim/engine.py): a unit referenced by a running request counts once
in the pool's used blocks (`KVCache.used_fixed`), whatever the number of requests sharing it; each
request's own blocks exclude the units it references. Evictable units are free blocks that still
hold data: `free_blocks` of them, trimmed whenever in-use blocks + evictable blocks would exceed the
pool.
"""

from __future__ import annotations

import heapq

from llmserve_env.shared.admission import KV_BLOCK_TOKENS


def chain_keys(ids: tuple[int, ...], block_tokens: int, tokens: int) -> tuple[int, ...]:
    """The prefix-chain keys of the full units among `tokens` (prompt + output) tokens.

    Key j = hash((key j-1, id j)), the chain rooted at the unit size so that workloads of different
    granularity never share a key."""
    n = min(len(ids), tokens // block_tokens)
    keys = []
    parent = block_tokens
    for i in range(n):
        parent = hash((parent, ids[i]))
        keys.append(parent)
    return tuple(keys)


class PrefixCache:
    """The cached units of one engine: reference counts, and an LRU order of the evictable ones."""

    __slots__ = ("block_tokens", "unit_blocks", "refs", "stamp", "heap", "clock", "free_units", "evicted")

    def __init__(self) -> None:
        self.block_tokens = 0       # tokens per unit, set by the first request that carries ids
        self.unit_blocks = 0        # 16-token KV blocks per unit
        self.refs: dict[int, int] = {}   # every cached unit: key -> running requests referencing it
        self.stamp: dict[int, int] = {}  # evictable units (0 references): key -> release order
        self.heap: list[tuple[int, int]] = []  # (release order, key), stale entries skipped lazily
        self.clock = 0
        self.free_units = 0
        self.evicted = 0            # units evicted so far (diagnostics)

    def bind(self, block_tokens: int) -> int:
        """Fix the unit size at the first request with ids; a different one later is a workload bug."""
        if self.block_tokens == 0:
            if block_tokens <= 0 or block_tokens % KV_BLOCK_TOKENS:
                raise ValueError(f"prefix block_tokens must be a positive multiple of {KV_BLOCK_TOKENS}, "
                                 f"got {block_tokens}")
            self.block_tokens = block_tokens
            self.unit_blocks = block_tokens // KV_BLOCK_TOKENS
        elif block_tokens != self.block_tokens:
            raise ValueError(f"one engine caches one unit size: {self.block_tokens} tokens, got {block_tokens}")
        return self.unit_blocks

    @property
    def free_blocks(self) -> int:
        """KV blocks held by evictable units (free to allocate, still holding data)."""
        return self.free_units * self.unit_blocks

    @property
    def cached_blocks(self) -> int:
        """KV blocks holding cached units, referenced or not."""
        return len(self.refs) * self.unit_blocks

    def match(self, keys: tuple[int, ...], cap: int) -> tuple[int, int]:
        """(units hit, of those how many are evictable now) for the first `cap` keys: the longest run
        of leading keys that are cached. Nothing changes until `acquire`."""
        refs = self.refs
        n = revive = 0
        for i in range(min(cap, len(keys))):
            c = refs.get(keys[i])
            if c is None:
                break
            n += 1
            if c == 0:
                revive += 1
        return n, revive

    def acquire(self, keys: tuple[int, ...], lo: int, hi: int) -> int:
        """Reference keys[lo:hi] (each cached or new); returns how many were not referenced before
        (new units, or evictable ones revived): their blocks become in-use blocks of the pool."""
        refs, stamp = self.refs, self.stamp
        fresh = 0
        for i in range(lo, hi):
            k = keys[i]
            c = refs.get(k)
            if c is None:
                refs[k] = 1
                fresh += 1
            elif c == 0:
                refs[k] = 1
                del stamp[k]
                self.free_units -= 1
                fresh += 1
            else:
                refs[k] = c + 1
        return fresh

    def release(self, keys: tuple[int, ...], n: int) -> int:
        """Drop the references of keys[:n], tail first; returns how many units became evictable."""
        refs, stamp, heap = self.refs, self.stamp, self.heap
        freed = 0
        for i in range(n - 1, -1, -1):
            k = keys[i]
            c = refs[k] - 1
            refs[k] = c
            if c == 0:
                self.clock += 1
                stamp[k] = self.clock
                heapq.heappush(heap, (self.clock, k))
                freed += 1
        self.free_units += freed
        return freed

    def evict(self, units: int) -> None:
        """Evict `units` evictable units, least recently released first."""
        refs, stamp, heap = self.refs, self.stamp, self.heap
        while units > 0 and heap:
            s, k = heapq.heappop(heap)
            if stamp.get(k) != s:
                continue  # referenced again (or re-released later) since this entry was pushed
            del stamp[k]
            del refs[k]
            self.free_units -= 1
            self.evicted += 1
            units -= 1
        if len(heap) > 4 * (self.free_units + 64):
            # stale entries pile up when units are revived and released again: rebuild from the live ones
            self.heap = [(s, k) for k, s in stamp.items()]
            heapq.heapify(self.heap)
