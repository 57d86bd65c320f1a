"""Uniformly random actions: the floor every learned or hand-made policy must clear."""

from __future__ import annotations

import numpy as np
from llmserve_env.agents.base import make_action
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction, ServeObservation


class RandomPolicy:
    """Each knob drawn independently and uniformly over its whole range, every window.

    Seeded, so an evaluation is reproducible; `reset()` does not reseed (successive episodes
    see different draws, as a fresh random agent would).
    """

    name = "random"

    def __init__(self, seed: int = 0):
        self._rng = np.random.default_rng(seed)

    def reset(self) -> None:
        """Stateless between windows."""

    def act(self, obs: ServeObservation) -> ServeAction:
        r = self._rng
        return make_action(
            batch_cap=int(r.integers(1, 513)),
            kv_budget_fraction=round(float(r.uniform(0.1, 1.0)), 4),
            speculation_depth=int(r.integers(0, 9)),
            quantization_tier=QUANTIZATION_TIERS[int(r.integers(0, 3))],
            prefill_decode_split=bool(r.integers(0, 2)),
            priority_routing=bool(r.integers(0, 2)),
        )
