"""Which seeds are for what, so no search or training ever sees an evaluation episode.

- training seeds (0 .. 99,999): PPO rollouts and the tuned-static search
- validation seeds (500,000 + i): checkpoint scores printed by train.py
- evaluation seeds (1,000,000 + i): evaluate.py and the score table, the same for every agent
"""

from __future__ import annotations

TRAIN_SEED_LIMIT = 100_000
VALIDATION_SEED_BASE = 500_000
EVAL_SEED_BASE = 1_000_000


def train_seeds(n: int, offset: int = 0) -> list[int]:
    if offset + n > TRAIN_SEED_LIMIT:
        raise ValueError(f"only {TRAIN_SEED_LIMIT} training seeds")
    return list(range(offset, offset + n))


def validation_seeds(n: int) -> list[int]:
    return [VALIDATION_SEED_BASE + i for i in range(n)]


def eval_seeds(n: int) -> list[int]:
    return [EVAL_SEED_BASE + i for i in range(n)]
