"""`RoutedPrefixes`: the prefixes the cluster's cache-aware router sent one replica in a window (sim/cluster.py).

The router scores a replica by the leading units of a request it holds: its engine's cache, or the units routed
there since the window began (shared/prefix_routing.py). Those units were a set of ids, each request's units added
one by one: a multi-turn request resends its whole history (~200 units on multiturn_cluster), so the additions were
~9 % of a multiturn_cluster episode. Here they are runs of prefix-unique ids, as the prefix cache keeps its units
(sim/prefix_cache.py): a run is `keys[lo:hi]` of one request's chain, split where two chains part, and found by its
first id. Adding a chain walks the runs it shares and adds one run for the rest; `overlap` walks them the same way.
Prefix-unique ids (equal ids: an equal prefix up to that unit, shared/prefix.py) make every answer the set's:
`overlap(keys, n)` is `leading_overlap(keys[:n], every unit added)` (tests/test_prefix_routing.py checks both on random
chains).
"""

from __future__ import annotations

from llmserve_env.sim.prefix_cache import shared_depth


class RoutedPrefixes:
    """Chains of prefix-unique ids added whole from depth 0; `overlap` is a chain's leading units among them."""

    __slots__ = ("_starts",)

    def __init__(self) -> None:
        # a run's first id -> [keys, hi]: the units keys[lo:hi], lo being where keys holds that first id (lists: a
        # split shortens a run in place)
        self._starts: dict[int, list] = {}

    def _walk(self, keys: tuple[int, ...], n: int) -> tuple[int, list | None]:
        """How deep `keys[:n]` follows the runs, and the run it parts from inside (None where it stopped at a run's
        end or reached n): runs are split where two chains part, so nothing deeper is among them."""
        starts = self._starts
        i = 0
        while i < n:
            run = starts.get(keys[i])
            if run is None:
                return i, None
            rk, hi = run
            i += shared_depth(rk, keys, i, hi if hi < n else n)
            if i < hi:
                return i, (run if i < n else None)
        return i, None

    def overlap(self, keys: tuple[int, ...], n: int) -> int:
        """How many leading units of `keys[:n]` (n <= len(keys)) are among the chains added."""
        return self._walk(keys, n)[0]

    def add(self, keys: tuple[int, ...], n: int) -> None:
        """Add the chain `keys[:n]` (n <= len(keys)): the run it parts from split there, the rest a run of its own."""
        i, run = self._walk(keys, n)
        if i == n:
            return
        starts = self._starts
        if run is not None:
            rk, hi = run
            starts[rk[i]] = [rk, hi]
            run[1] = i
        starts[keys[i]] = [keys, n]
