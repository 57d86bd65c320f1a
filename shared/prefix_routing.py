"""Cache-aware routing: weigh each replica's cached prefix of a request against its load.

`ServeAction.cache_affinity` (0..1, optional; None keeps today's router exactly) mixes two scores per
ready replica, as llm-d's inference scheduler sums weighted, normalised scorers (a prefix-cache scorer
and load scorers) and NVIDIA Dynamo's KV router weighs a request's overlap blocks against a worker's
active blocks:

    cost(replica) = (1 - a) x load + a x (1 - overlap)

- load: the router's outstanding-work estimate for the replica (shared/routing.py's rule), divided by
  the largest among the eligible replicas (0 when all are idle);
- overlap: the share of the request's prompt tokens the replica holds cached (its engine's prefix
  cache at the window's start, as a router fed by the engines' KV-cache events sees it, plus the
  prefixes the router itself sent there since);
- the lowest cost wins; ties go to the less loaded replica, then the lower index.

a = 0 is least outstanding work (the cost is the load alone, ties to the lower index, as the default
router); a = 1 follows the cache alone (load only breaks ties). No weights are taken from llm-d's or
Dynamo's defaults: the knob is the policy's to set.

Real mode (gateway/dispatcher.py) routes over LLMSERVE_REAL_ENDPOINTS by the same rule: load is its
exact outstanding work per endpoint, and overlap the leading units of the request it already sent to
that endpoint in the episode (it sees no engine's cache, only what it sent).
"""

from __future__ import annotations

from collections.abc import Sequence


def hit_cap_units(prompt_tokens: int, unit: int) -> int:
    """The most leading units of a prompt a cache may serve: at least one token is left to compute."""
    return (prompt_tokens - 1) // unit


def leading_overlap(keys: tuple[int, ...], routed: set[int]) -> int:
    """Leading units of `keys` in `routed` (a set closed under prefixes: it holds whole prefixes), by
    binary search."""
    if not keys or keys[0] not in routed:
        return 0
    lo, hi = 1, len(keys)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in routed:
            lo = mid
        else:
            hi = mid - 1
    return lo


def affinity_choice(work: Sequence[float], overlap: Sequence[float], affinity: float) -> int:
    """The index of the replica with the lowest (1 - a) x load + a x (1 - overlap); ties to the less
    loaded, then the lower index. `work` in tokens, `overlap` in 0..1."""
    if not work:
        raise ValueError("no replica to route to")
    top = max(work)
    best = 0
    best_key: tuple[float, float, int] | None = None
    for i, (w, o) in enumerate(zip(work, overlap, strict=True)):
        load = w / top if top > 0 else 0.0
        key = ((1.0 - affinity) * load + affinity * (1.0 - o), w, i)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best
