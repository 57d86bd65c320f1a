"""The regression digest of 64 episodes: observations (episode ids left out) and grades, hashed.

    python tests/golden.py            # print the digests
    python tests/golden.py --write    # store them in tests/data/golden_episodes.json

A refactor must leave every digest unchanged (tests/test_golden_episodes.py). A change that is
meant to move the physics, the reward or the grader rewrites the file with `--write`, and its
commit says so and why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden_episodes.json"
TASKS = ("static_workload", "bursty_workload", "adversarial_multitenant", "azure_conv_trace")
POLICIES = ("random", "vllm_default", "tuned_static", "heuristic")
SEEDS = (0, 1, 2, 3)


def episode_digest(task_id: str, policy_name: str, seed: int) -> str:
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.core.inprocess import InProcessEnv

    env = InProcessEnv()
    policy = make_policy(policy_name, task_id, seed=seed)
    policy.reset()
    h = hashlib.sha256()
    obs = env.reset(task_id=task_id, seed=seed)
    while True:
        h.update(json.dumps(obs.model_dump(exclude={"episode_id"}), sort_keys=True).encode())
        if obs.done:
            break
        obs = env.step(policy.act(obs))
    grade = env.grade()
    grade.pop("episode_id", None)
    grade.pop("verified", None)  # provenance of the grade (core/verify.py), not part of it
    h.update(json.dumps(grade, sort_keys=True).encode())
    return h.hexdigest()


def all_digests() -> dict[str, str]:
    return {f"{t}/{p}/{s}": episode_digest(t, p, s) for t in TASKS for p in POLICIES for s in SEEDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"store the digests in {GOLDEN}")
    args = ap.parse_args()
    digests = all_digests()
    if args.write:
        GOLDEN.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(digests)} digests to {GOLDEN}")
    else:
        print(json.dumps(digests, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
