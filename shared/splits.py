"""Which seeds are for what, and which tasks are the shifted tests: the one definition of the splits.

- training seeds (0 .. 99,999): PPO rollouts and every rival's tuning search
- validation seeds (500,000 + i): checkpoint scores printed by train.py, model selection
- test seeds (1,000,000 + i): evaluate.py, the score and headroom tables, the same for every agent

The three ranges never overlap (tests/test_scenarios.py checks the limits). On a scenario family
(shared/scenarios.py) a seed is also the day: the training seeds' days and the test seeds' days are
drawn from the same family, so the test split measures what was learned about the family rather
than about its training days. The **shifted** split is a second task per family (`SHIFTED_TASKS`)
whose ranges lie outside the training family's (peaks at hours never trained on, more load, jobs
at other times), played on the test seeds: a generalisation test in the manner of Procgen's
held-out levels (Cobbe et al. 2020, arXiv:1912.01588).
"""

from __future__ import annotations

TRAIN_SEED_LIMIT = 100_000
VALIDATION_SEED_BASE = 500_000
VALIDATION_SEED_LIMIT = 1_000_000
TEST_SEED_BASE = 1_000_000

# family task id -> its shifted test task id (both registered in shared.tasks.TASKS)
SHIFTED_TASKS: dict[str, str] = {
    "diurnal_family": "diurnal_family_shifted",
    "multitenant_family": "multitenant_family_shifted",
}
SPLITS = ("test", "shifted")


def tuned_task(task_id: str) -> str:
    """The task whose tuned settings a policy playing `task_id` uses: a shifted test task is never
    tuned on (it is test-only), so its rivals play with what was tuned on its training family, as
    the score and headroom tables build them; any other task uses its own."""
    return next((family for family, shifted in SHIFTED_TASKS.items() if shifted == task_id), task_id)


def train_seeds(n: int, offset: int = 0) -> list[int]:
    if n < 0 or offset < 0 or offset + n > TRAIN_SEED_LIMIT:
        raise ValueError(f"training seeds are 0..{TRAIN_SEED_LIMIT - 1}; asked for {n} from {offset}")
    return list(range(offset, offset + n))


def validation_seeds(n: int) -> list[int]:
    if not 0 <= n <= VALIDATION_SEED_LIMIT - VALIDATION_SEED_BASE:
        raise ValueError(f"at most {VALIDATION_SEED_LIMIT - VALIDATION_SEED_BASE} validation seeds, asked for {n}")
    return [VALIDATION_SEED_BASE + i for i in range(n)]


def test_seeds(n: int) -> list[int]:
    if n < 0:
        raise ValueError(f"seed count must be >= 0, got {n}")
    return [TEST_SEED_BASE + i for i in range(n)]


test_seeds.__test__ = False  # type: ignore[attr-defined]  # a seed list, not a pytest test


def split_of(seed: int) -> str:
    """'train', 'validation' or 'test': the split a seed belongs to (ValueError between the ranges)."""
    if 0 <= seed < TRAIN_SEED_LIMIT:
        return "train"
    if VALIDATION_SEED_BASE <= seed < VALIDATION_SEED_LIMIT:
        return "validation"
    if seed >= TEST_SEED_BASE:
        return "test"
    raise ValueError(f"seed {seed} is in no split (training 0..{TRAIN_SEED_LIMIT - 1}, validation "
                     f"{VALIDATION_SEED_BASE}..{VALIDATION_SEED_LIMIT - 1}, test {TEST_SEED_BASE}..)")


def split_task(family: str, split: str) -> str:
    """The task id a family's split is played on: the family itself on 'test', its shifted task on 'shifted'."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if family not in SHIFTED_TASKS:
        raise ValueError(f"{family!r} is not a scenario family; families: {', '.join(SHIFTED_TASKS)}")
    return family if split == "test" else SHIFTED_TASKS[family]
