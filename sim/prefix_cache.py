"""Prefix caching: full KV blocks kept by the hash of their prefix chain, shared, and evicted LRU.

The model is vLLM V1's automatic prefix caching (vllm/v1/core/kv_cache_manager.py and
kv_cache_utils.py, read to learn; none of its code is used):

- A request's prompt is cut into full units of `block_tokens` tokens (a multiple of the engine's
  16-token KV block), each named by a prefix-unique id (`Arrival.prefix_ids`): equal ids mean an
  equal prefix up to and including that unit, as V1's block hash is a hash of (parent hash, block
  tokens) and Mooncake's remapped `hash_ids` are (shared/prefix.py checks a trace for it;
  `shared.prefix.chain_ids` makes such ids from per-position ones). Hits are the run of a request's
  *leading* units found cached, so a later unit never hits without every unit before it. A partial
  last unit is never cached.
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
- `chain_ids` hashes with Python's built-in hash of int tuples (deterministic across processes; a
  64-bit collision would merge two prefixes, as V1's builtin-hash mode can).
- Evictions are sized against an upper bound of the decoding requests' blocks (each request's context
  / 16 + 1, not its exact ceiling), which keeps an O(requests) count off every release: up to one
  block per decoding request more than V1 may be evicted (about 1 % of an H100's pool at 256
  sequences; the least recently used units).

Accounting, in 16-token blocks (sim/engine.py): a unit referenced by a running request counts once
in the pool's used blocks (`KVCache.used_fixed`), whatever the number of requests sharing it; each
request's own blocks exclude the units it references. Evictable units are free blocks that still
hold data: `free_blocks` of them, trimmed whenever in-use blocks + evictable blocks would exceed the
pool.
"""

from __future__ import annotations

import heapq

from llmserve_env.shared.admission import KV_BLOCK_TOKENS


def shared_depth(rk: tuple[int, ...], keys: tuple[int, ...], i: int, end: int) -> int:
    """How many units from depth i (< end; rk[i] == keys[i]) two chains of prefix-unique ids share: such ids
    agree up to some depth and differ after it, so a binary search on single ids finds it."""
    if rk is keys or rk[end - 1] == keys[end - 1]:
        return end - i
    lo, hi = i, end - 1  # rk[lo] == keys[lo]; find the deepest equal depth
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if rk[mid] == keys[mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1 - i


class _Run:
    """Consecutive cached units of one chain, `keys[lo:hi]` (index = depth in the chain), with one
    reference count and one release stamp for all of them (a radix-tree edge, as SGLang's
    RadixAttention keeps runs of tokens): requests reference chains from depth 0, so a run is split
    where a request's referenced prefix ends, and every unit of a run has the same referrers."""

    __slots__ = ("keys", "lo", "hi", "refs", "stamp")

    def __init__(self, keys: tuple[int, ...], lo: int, hi: int, refs: int, stamp: int) -> None:
        self.keys = keys
        self.lo = lo
        self.hi = hi
        self.refs = refs
        self.stamp = stamp


class PrefixCache:
    """The cached units of one engine: runs of units with reference counts, and an LRU order of the
    evictable runs.

    Per request, the work is per run on its chain (a few), never per unit (a 12k-token prompt has 750
    units of 16 tokens). Runs are found by the id of their first unit (`starts`) and of their last
    (`ends`): every lookup lands on a run boundary, because requests reference chains from depth 0,
    a run is cut wherever a request's referenced prefix ends or two chains part, and the cache is
    prefix-closed (a unit's parent is cached while it is: a request releases its deeper runs first,
    and a run is referenced only with its parents). Prefix-unique ids make "does this run continue
    our chain up to depth d" one comparison: the ids at depth d are equal."""

    __slots__ = ("block_tokens", "unit_blocks", "starts", "ends", "heap", "clock", "seq", "units", "free_units",
                 "evicted")

    def __init__(self) -> None:
        self.block_tokens = 0       # tokens per unit, set by the first request that carries ids
        self.unit_blocks = 0        # 16-token KV blocks per unit
        self.starts: dict[int, _Run] = {}  # id of a run's first unit -> the run
        self.ends: dict[int, _Run] = {}    # id of a run's last unit -> the run
        # evictable runs by (release stamp, deeper first, push order): stale entries skipped lazily
        self.heap: list[tuple[int, int, int, _Run]] = []
        self.clock = 0
        self.seq = 0
        self.units = 0              # cached units, referenced or not
        self.free_units = 0         # units of evictable runs (no reference)
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
        return self.units * self.unit_blocks

    def match(self, keys: tuple[int, ...], cap: int) -> tuple[int, int]:
        """(units hit, of those how many are evictable now) among the first `cap` keys: the longest run
        of leading keys that are cached. Nothing changes until `acquire`."""
        starts = self.starts
        cap = min(cap, len(keys))
        i = revive = 0
        while i < cap:
            run = starts.get(keys[i])
            if run is None:
                break
            end = run.hi if run.hi < cap else cap
            m = shared_depth(run.keys, keys, i, end)  # (run.lo == i: keys[i] is its first id)
            if run.refs == 0:
                revive += m
            i += m
            if i < end:
                break  # the chains part inside the run: nothing deeper of ours is cached
        return i, revive

    def _split(self, run: _Run, at: int) -> _Run:
        """Cut `run` at depth `at` (lo < at < hi); returns the deeper part, same references and stamp."""
        rk = run.keys
        tail = _Run(rk, at, run.hi, run.refs, run.stamp)
        run.hi = at
        self.starts[rk[at]] = tail
        self.ends[rk[tail.hi - 1]] = tail
        self.ends[rk[at - 1]] = run
        if tail.refs == 0:  # evictable: its own heap entry, before its parent's (deeper first)
            self.seq += 1
            heapq.heappush(self.heap, (tail.stamp, -at, self.seq, tail))
        return tail

    def acquire(self, keys: tuple[int, ...], lo: int, hi: int) -> int:
        """Reference keys[lo:hi] for a request that references keys[:lo] already: cached units are
        shared (revived when evictable), the rest inserted. Returns how many units were not referenced
        before (new, or revived): their blocks become in-use blocks of the pool."""
        starts = self.starts
        i = lo
        fresh = 0
        while i < hi:
            run = starts.get(keys[i])
            if run is None:
                # prefix-closed: nothing deeper of this chain is cached either. The request's own last
                # run (inserted from these keys, this request its only referrer) grows; else a new run
                last = self.ends.get(keys[i - 1]) if i else None
                if last is not None and last.keys is keys and last.hi == i and last.refs == 1:
                    del self.ends[keys[i - 1]]
                    last.hi = hi
                else:
                    last = _Run(keys, i, hi, 1, 0)
                    starts[keys[i]] = last
                self.ends[keys[hi - 1]] = last
                self.units += hi - i
                fresh += hi - i
                break
            end = run.hi if run.hi < hi else hi
            m = shared_depth(run.keys, keys, i, end)  # (run.lo == i: keys[i] is its first id)
            if i + m < run.hi:
                self._split(run, i + m)
            if run.refs == 0:
                run.stamp = 0  # off the LRU order (its heap entries go stale)
                self.free_units -= m
                fresh += m
            run.refs += 1
            i += m
        return fresh

    def release(self, keys: tuple[int, ...], n: int) -> int:
        """Drop a request's references to keys[:n], deeper runs first (so they are evicted first);
        returns how many units became evictable."""
        starts = self.starts
        held = []
        i = 0
        while i < n:
            run = starts[keys[i]]
            held.append(run)
            i = run.hi
        freed = 0
        heap = self.heap
        for run in reversed(held):
            run.refs -= 1
            if run.refs == 0:
                self.clock += 1
                self.seq += 1
                run.stamp = self.clock
                heapq.heappush(heap, (self.clock, -run.lo, self.seq, run))
                freed += run.hi - run.lo
        self.free_units += freed
        return freed

    def evict(self, units: int) -> None:
        """Evict `units` evictable units, least recently released first (a run from its deep end)."""
        heap = self.heap
        while units > 0 and heap:
            stamp, _, _, run = heap[0]
            if run.refs or run.stamp != stamp or run.hi <= run.lo:
                heapq.heappop(heap)  # referenced again, or emptied, since this entry was pushed
                continue
            k = min(units, run.hi - run.lo)
            rk = run.keys
            del self.ends[rk[run.hi - 1]]
            run.hi -= k
            if run.hi > run.lo:
                self.ends[rk[run.hi - 1]] = run
            else:
                del self.starts[rk[run.lo]]
                heapq.heappop(heap)
            self.units -= k
            self.free_units -= k
            self.evicted += k
            units -= k
