"""The bounded store that keeps HTTP episodes between stateless calls.

OpenEnv's HTTP `/reset` and `/step` build a fresh environment per call, so an HTTP episode must
outlive the environment object: it lives here, keyed by `episode_id`, bounded by a maximum count
(least recently used dropped first) and an idle timeout. WebSocket sessions hold their `Episode`
directly and also register it, so `/grader` can grade it by id.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from llmserve_env.runtime.episode import Episode
from llmserve_env.runtime.errors import EpisodeExistsError, EpisodeNotFoundError


class EpisodeStore:
    """Thread-safe, bounded map episode_id -> Episode (LRU count limit + idle timeout)."""

    def __init__(self, max_episodes: int = 1024, idle_timeout_s: float = 1800.0):
        self.max_episodes = max_episodes
        self.idle_timeout_s = idle_timeout_s
        self._items: OrderedDict[str, Episode] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def check_free(self, episode_id: str) -> None:
        """EpisodeExistsError (409) if `episode_id` names a stored episode, running or done."""
        with self._lock:
            if episode_id in self._items:
                raise EpisodeExistsError(episode_id)

    def put(self, ep: Episode) -> None:
        """Register a new episode; EpisodeExistsError (409) if its id is taken (never replaced:
        an id is its owner's handle, and a reset naming someone else's must not take it over)."""
        dropped: list[Episode] = []
        now = time.monotonic()
        ep.last_used = now  # registered now: idle from now on, not from when it was built
        taken = False
        with self._lock:
            self._expire_locked(now, dropped)
            held = self._items.get(ep.episode_id)
            if held is not None and held is not ep:
                taken = True
            else:
                self._items[ep.episode_id] = ep
                self._items.move_to_end(ep.episode_id)
                while len(self._items) > self.max_episodes:
                    _, lru = self._items.popitem(last=False)
                    dropped.append(lru)
        for old_ep in dropped:
            old_ep.close()
        if taken:
            raise EpisodeExistsError(ep.episode_id)

    def get(self, episode_id: str) -> Episode:
        now = time.monotonic()
        with self._lock:
            ep = self._items.get(episode_id)
            if ep is None or now - ep.last_used > self.idle_timeout_s:
                if ep is not None:
                    del self._items[episode_id]
                raise EpisodeNotFoundError(episode_id)
            self._items.move_to_end(episode_id)
            ep.last_used = now
            return ep

    def _expire_locked(self, now: float, dropped: list[Episode]) -> None:
        while self._items:
            eid, ep = next(iter(self._items.items()))
            if now - ep.last_used <= self.idle_timeout_s:
                break
            del self._items[eid]
            dropped.append(ep)
