"""Which seeds are for what, so no search or training ever sees an evaluation episode.

- training seeds (0 .. 99,999): PPO rollouts and the tuned-static search
- validation seeds (500,000 + i): checkpoint scores printed by train.py
- evaluation seeds (1,000,000 + i): evaluate.py and the score table, the same for every agent

The ranges are defined once, in shared/splits.py (with the scenario families' shifted tasks); the
names here are the ones the agents have always imported.
"""

from __future__ import annotations

from llmserve_env.shared.splits import TEST_SEED_BASE as EVAL_SEED_BASE
from llmserve_env.shared.splits import TRAIN_SEED_LIMIT, VALIDATION_SEED_BASE, train_seeds, validation_seeds
from llmserve_env.shared.splits import test_seeds as eval_seeds

__all__ = ["EVAL_SEED_BASE", "TRAIN_SEED_LIMIT", "VALIDATION_SEED_BASE", "eval_seeds", "train_seeds",
           "validation_seeds"]
