"""The bounded store that keeps HTTP episodes between stateless calls.

OpenEnv's HTTP `/reset` and `/step` build a fresh environment per call, so an HTTP episode must
outlive the environment object: it lives here, keyed by `episode_id`, bounded by a maximum count
(least recently used dropped first) and an idle timeout. WebSocket sessions hold their `Episode`
directly and also register it, so `/grader` can grade it by id.

Ownership across eviction (issue 30): an `episode_id` is its owner's only handle. A client-named id
whose episode is dropped (pushed out by the count limit, or idle past the timeout) leaves a
tombstone for `idle_timeout_s`: a reset naming it in that time is a 409 (EpisodeIdRetiredError),
so whoever flooded the store cannot claim the id and have its owner's next `/step` drive their
episode; the owner's own step still gets the unchanged 404 "unknown or expired". Minted ids (128
random bits) cannot be guessed, so they need no tombstone. Tombstones are bounded too: when
TOMBSTONES_PER_EPISODE x max_episodes are held, a new client-named id is refused (503, "omit
episode_id") rather than a tombstone dropped, which would hand an id over again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from llmserve_env.core.episode import Episode
from llmserve_env.core.errors import EnvError, EpisodeExistsError, EpisodeNotFoundError

# Tombstones held at most, per episode the store keeps (a tombstone is one id string and a time).
TOMBSTONES_PER_EPISODE = 16


class EpisodeIdRetiredError(EnvError):
    """A client named an id whose episode was dropped recently: its owner may still come back."""

    status = 409

    def __init__(self, episode_id: str, hold_s: float):
        super().__init__(
            f"episode_id {episode_id!r} named an episode that was dropped (evicted or expired) less than "
            f"{hold_s:g} s ago; a dropped id is not given to anyone else while its owner may come back. "
            f"Leave episode_id out (the server mints an unguessable one) or pick a new id")


class NamedIdsFullError(EnvError):
    """Too many client-named ids were dropped recently to remember one more."""

    status = 503

    def __init__(self, held: int):
        super().__init__(
            f"this server holds {held} recently dropped client-named episode ids and takes no new named id "
            f"until they age out; leave episode_id out (the server mints an unguessable one)")


class EpisodeStore:
    """Thread-safe, bounded map episode_id -> Episode (LRU count limit + idle timeout), with
    tombstones for dropped client-named ids (see the module docstring)."""

    def __init__(self, max_episodes: int = 1024, idle_timeout_s: float = 1800.0):
        self.max_episodes = max_episodes
        self.idle_timeout_s = idle_timeout_s
        self.max_tombstones = TOMBSTONES_PER_EPISODE * max_episodes
        self._items: OrderedDict[str, Episode] = OrderedDict()
        self._named: set[str] = set()  # the stored ids a client chose
        self._tombstones: OrderedDict[str, float] = OrderedDict()  # dropped named id -> when
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def check_free(self, episode_id: str) -> None:
        """EpisodeExistsError (409) if `episode_id` names a stored episode, running or done;
        EpisodeIdRetiredError (409) if it named one dropped less than `idle_timeout_s` ago."""
        with self._lock:
            self._check_free_locked(episode_id, time.monotonic())

    def put(self, ep: Episode, named: bool = False) -> None:
        """Register a new episode; EpisodeExistsError (409) if its id is taken (never replaced:
        an id is its owner's handle, and a reset naming someone else's must not take it over).
        `named`: the client chose the id (it gets a tombstone when dropped)."""
        dropped: list[Episode] = []
        now = time.monotonic()
        ep.last_used = now  # registered now: idle from now on, not from when it was built
        error: EnvError | None = None
        with self._lock:
            self._expire_locked(now, dropped)
            held = self._items.get(ep.episode_id)
            if held is not ep:
                try:
                    self._check_free_locked(ep.episode_id, now)
                    if named and len(self._tombstones) >= self.max_tombstones:
                        raise NamedIdsFullError(len(self._tombstones))
                except EnvError as exc:
                    error = exc
            if error is None:
                self._items[ep.episode_id] = ep
                self._items.move_to_end(ep.episode_id)
                if named:
                    self._named.add(ep.episode_id)
                while len(self._items) > self.max_episodes:
                    eid, lru = self._items.popitem(last=False)
                    self._retire_locked(eid, now)
                    dropped.append(lru)
        for old_ep in dropped:
            old_ep.close()
        if error is not None:
            raise error

    def get(self, episode_id: str) -> Episode:
        now = time.monotonic()
        with self._lock:
            ep = self._items.get(episode_id)
            if ep is None or now - ep.last_used > self.idle_timeout_s:
                if ep is not None:
                    del self._items[episode_id]
                    self._retire_locked(episode_id, now)
                raise EpisodeNotFoundError(episode_id)
            self._items.move_to_end(episode_id)
            ep.last_used = now
            return ep

    def _check_free_locked(self, episode_id: str, now: float) -> None:
        if episode_id in self._items:
            raise EpisodeExistsError(episode_id)
        when = self._tombstones.get(episode_id)
        if when is not None:
            if now - when <= self.idle_timeout_s:
                raise EpisodeIdRetiredError(episode_id, self.idle_timeout_s)
            del self._tombstones[episode_id]

    def _retire_locked(self, episode_id: str, now: float) -> None:
        """`episode_id` left the store: a client-named one leaves a tombstone."""
        if episode_id in self._named:
            self._named.discard(episode_id)
            self._tombstones[episode_id] = now
            self._tombstones.move_to_end(episode_id)

    def _expire_locked(self, now: float, dropped: list[Episode]) -> None:
        while self._items:
            eid, ep = next(iter(self._items.items()))
            if now - ep.last_used <= self.idle_timeout_s:
                break
            del self._items[eid]
            self._retire_locked(eid, now)
            dropped.append(ep)
        while self._tombstones:  # oldest first: stop at the first one still held
            eid, when = next(iter(self._tombstones.items()))
            if now - when <= self.idle_timeout_s:
                break
            del self._tombstones[eid]
