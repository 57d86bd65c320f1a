"""A slot-based prompt cache, as llama.cpp's `llama-server` keeps one (the engine `bench/real_prefix.py`
checks the simulator against), beside the block cache of vLLM (sim/prefix_cache.py).

llama-server (tools/server/server-context.cpp `get_available_slot`, server-task.cpp
`server_prompt_cache`; read to learn, none of its code is used) has `-np` slots, each holding the tokens
of the last request it served (its prompt and what it generated), and a host-RAM prompt cache
(`--cache-ram`, 8192 MiB by default) of whole saved slot states:

- A new request takes an idle slot. Among idle slots holding tokens, the one whose tokens share the
  longest common prefix (LCP) with the new prompt, as a fraction of the prompt, if that fraction is above
  `--slot-prompt-similarity` (0.10 by default; the first such slot on ties). Else the least recently
  used idle slot (the last one on ties: never-used slots count as oldest).
- The chosen slot's tokens are saved to the RAM cache, and the cached state that keeps more of itself
  (LCP over its length, at least 0.25) and more of the prompt than the slot does is loaded into the slot
  (and leaves the cache): when the slot was chosen by LRU, or by similarity while it would keep under half
  of its own tokens. Saving skips a state already held as a prefix of a cached one and drops cached states
  that are prefixes of it; the cache drops its oldest states (FIFO) past its size.
- With `--cache-idle-slots` (on by default; `kv_unified` off, as with an explicit `-np`), every other idle
  slot's tokens are saved to the RAM cache too when a request starts (a copy: the slot keeps them).
- The hit is the LCP of the slot's tokens and the prompt, less one token at most (the last prompt token
  is always computed, as in vLLM).

So a conversation's history survives only while its slot is not taken over by a prompt similar enough
to be given it (a new conversation on the same system prompt is), or while a copy sits in the RAM cache.
The simulator's block cache keeps everything sent until memory runs out: the two differ exactly where
routing for affinity pays or does not (docs/real-mode.md).

Simplifications, stated: tokens are the workload's prefix units (`Arrival.prefix_ids`, `block_tokens`
tokens each), so an LCP is counted in whole units, and fractions use the workload's token counts, not the
engine's tokenizer and chat template; a request without prefix ids shares nothing with any slot; the RAM
cache is bounded in tokens (`ram_tokens`, None: unbounded), not in bytes; no context checkpoints, no
`--cache-reuse` (KV shifting, off by default) and no disk tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmserve_env.shared.admission import KV_BLOCK_TOKENS

SLOTS_KIND = "slots"
BLOCKS_KIND = "blocks"


@dataclass(frozen=True)
class SlotCacheSpec:
    """How an engine with slots caches prompts: the profile's `engine.prefix_cache` when its kind is
    "slots" (the defaults are llama-server's)."""

    slots: int
    similarity: float = 0.10      # --slot-prompt-similarity
    ram: bool = True              # --cache-ram > 0
    ram_tokens: int | None = None  # the RAM cache's bound in tokens (None: unbounded)
    save_idle: bool = True        # --cache-idle-slots

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"prefix_cache.slots must be >= 1, got {self.slots}")
        if not 0.0 <= self.similarity < 1.0:
            raise ValueError(f"prefix_cache.similarity must be in [0, 1), got {self.similarity}")
        if self.ram_tokens is not None and self.ram_tokens < 0:
            raise ValueError(f"prefix_cache.ram_tokens must be >= 0 or null, got {self.ram_tokens}")

    @staticmethod
    def from_engine(engine: dict[str, Any]) -> SlotCacheSpec | None:
        """The spec in a profile's `engine` section, or None for the block cache (no `prefix_cache`, or
        its kind "blocks")."""
        d = engine.get("prefix_cache")
        if d is None or d.get("kind", BLOCKS_KIND) == BLOCKS_KIND:
            return None
        if d["kind"] != SLOTS_KIND:
            raise ValueError(f"engine.prefix_cache.kind must be {BLOCKS_KIND!r} or {SLOTS_KIND!r}, got {d['kind']!r}")
        return SlotCacheSpec(int(d["slots"]), float(d.get("similarity", 0.10)), bool(d.get("ram", True)),
                             None if d.get("ram_tokens") is None else int(d["ram_tokens"]),
                             bool(d.get("save_idle", True)))

    def to_engine(self) -> dict[str, Any]:
        return {"kind": SLOTS_KIND, "slots": self.slots, "similarity": self.similarity, "ram": self.ram,
                "ram_tokens": self.ram_tokens, "save_idle": self.save_idle}


def parse_prefix_cache(text: str) -> dict[str, Any]:
    """`calibrate records --prefix-cache`: "blocks" (vLLM's block cache) or "slots:N" (llama-server with
    `-np N`, its other cache settings at their defaults), as a profile's `engine.prefix_cache`."""
    if text == BLOCKS_KIND:
        return {"kind": BLOCKS_KIND}
    kind, _, n = text.partition(":")
    if kind != SLOTS_KIND or not n.isdigit() or int(n) < 1:
        raise ValueError(f"--prefix-cache must be {BLOCKS_KIND!r} or 'slots:N' with N >= 1 (llama-server's -np), "
                         f"got {text!r}")
    return SlotCacheSpec(slots=int(n)).to_engine()


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Common leading units of two chains. Prefix-unique ids agree up to some depth and differ after it,
    so comparing the last unit both could share settles the common case in one step."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[n - 1] == b[n - 1]:
        return n
    lo, hi = 0, n - 1  # a[lo] == b[lo], a[hi] != b[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid
        else:
            hi = mid
    return lo + 1


class _Held:
    """Tokens held by a slot or a saved state: the leading units that have ids, and the token count."""

    __slots__ = ("keys", "tokens")

    def __init__(self, keys: tuple[int, ...], tokens: int) -> None:
        self.keys = keys
        self.tokens = tokens


class SlotCache:
    """The slots of one engine and its RAM prompt cache. `plan` chooses a slot for a request without
    changing anything (the engine may not admit it yet); `take` commits the plan; `release` puts the
    request's tokens into its slot when it ends or is preempted."""

    __slots__ = ("spec", "unit", "held", "busy", "last_used", "states", "ram_held")

    def __init__(self, spec: SlotCacheSpec) -> None:
        self.spec = spec
        self.unit = 0                 # tokens per unit, from the first request with ids
        self.held = [_Held((), 0) for _ in range(spec.slots)]
        self.busy = [False] * spec.slots
        self.last_used = [-1.0] * spec.slots
        self.states: list[_Held] = []  # the RAM cache, oldest first
        self.ram_held = 0              # tokens in it

    def idle(self) -> bool:
        return not all(self.busy)

    def _keep(self, lcp_units: int, held: _Held) -> float:
        return min(lcp_units * self.unit, held.tokens) / held.tokens if held.tokens else -1.0

    def plan(self, keys: tuple[int, ...], prompt: int) -> tuple[int, int, int, bool]:
        """(slot, index of the RAM state loaded into it or -1, units hit, whether the slot's tokens are
        saved to the RAM cache on taking it) for a request whose prompt has `prompt` tokens and leading
        units `keys`; needs an idle slot."""
        unit = self.unit
        best, best_sim, best_lcp = -1, 0.0, 0
        if self.spec.similarity > 0.0:
            for i, h in enumerate(self.held):
                if self.busy[i] or not h.tokens:
                    continue
                n = _lcp(h.keys, keys)
                sim = n * unit / prompt
                if sim > best_sim and sim > self.spec.similarity:
                    best, best_sim, best_lcp = i, sim, n
        if best >= 0:
            update = self._keep(best_lcp, self.held[best]) < 0.5
        else:
            t_last = 0.0
            for i in range(len(self.held)):
                if not self.busy[i] and (best < 0 or self.last_used[i] <= t_last):
                    best, t_last = i, self.last_used[i]
            best_lcp = _lcp(self.held[best].keys, keys)
            update = True
        load = -1
        if update and self.spec.ram:
            f_keep, sim = self._keep(best_lcp, self.held[best]), best_lcp * unit / prompt
            for j, s in enumerate(self.states):
                n = _lcp(s.keys, keys)
                k, sm = self._keep(n, s), n * unit / prompt
                if k >= 0.25 and f_keep < k and sim < sm:
                    load, f_keep, sim, best_lcp = j, k, sm, n
        cap = (prompt - 1) // unit if unit else 0
        return best, load, min(best_lcp, cap), update

    def _save(self, h: _Held) -> None:
        """Save a slot's tokens to the RAM cache (a copy), as llama-server's `server_prompt_cache::alloc`."""
        if not h.tokens:
            return
        for s in self.states:
            if _lcp(s.keys, h.keys) == len(h.keys) and s.tokens >= h.tokens:
                return  # already held (as a prefix of a cached state)
        kept = []
        for s in self.states:
            if _lcp(s.keys, h.keys) == len(s.keys) and s.tokens <= h.tokens:
                self.ram_held -= s.tokens  # a prefix of the new state: obsolete
            else:
                kept.append(s)
        kept.append(_Held(h.keys, h.tokens))
        self.ram_held += h.tokens
        limit = self.spec.ram_tokens
        while limit is not None and len(kept) > 1 and self.ram_held > limit:
            self.ram_held -= kept.pop(0).tokens  # oldest first
        self.states = kept

    def take(self, plan: tuple[int, int, int, bool]) -> int:
        """Commit a plan: the RAM cache saves what the engine saves, the loaded state moves into the
        slot, and the slot is busy. Returns the slot."""
        slot, load, _, update = plan
        if update and self.spec.ram:
            chosen = self.states[load] if load >= 0 else None
            self._save(self.held[slot])  # never drops `chosen`: it shares more of the prompt than the slot does
            if chosen is not None:
                self.states.remove(chosen)
                self.ram_held -= chosen.tokens
                self.held[slot] = chosen
        if self.spec.save_idle and self.spec.ram:
            for i, h in enumerate(self.held):
                if i != slot and not self.busy[i]:
                    self._save(h)
        self.busy[slot] = True
        return slot

    def release(self, slot: int, keys: tuple[int, ...], tokens: int, t: float) -> None:
        """The request in `slot` ended (or was preempted) at t with `tokens` tokens computed, of which
        the leading `keys` units have ids: the slot holds them now."""
        unit = self.unit
        n = min(len(keys), tokens // unit) if unit else 0
        self.held[slot] = _Held(keys[:n], tokens)
        self.busy[slot] = False
        self.last_used[slot] = t

    @property
    def cached_blocks(self) -> int:
        """16-token KV blocks holding the slots' cached units (the RAM cache is host memory, not KV)."""
        return sum(len(h.keys) for h in self.held) * (self.unit // KV_BLOCK_TOKENS)

    def match(self, keys: tuple[int, ...], cap: int) -> int:
        """Leading units of `keys` (at most `cap`) held by any slot or RAM state: what a router that sees
        the engine's cache would count."""
        best = 0
        for h in self.held:
            best = max(best, _lcp(h.keys, keys))
        for s in self.states:
            best = max(best, _lcp(s.keys, keys))
        return min(best, cap)
