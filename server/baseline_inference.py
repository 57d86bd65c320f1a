"""Baseline runs: a reference policy plays every task, and the grader scores each episode.

    python -m server.baseline_inference --mode deterministic
    python -m server.baseline_inference --mode openai --runtime in-process --model gpt-4.1-mini
    python -m server.baseline_inference --mode openai --runtime http --base-url http://localhost:7860 \
        --model gpt-4.1-mini --output artifacts/baseline_openai.json

`deterministic` plays the rule-based heuristic (agents/heuristic.py): no model calls, the same
numbers on every run. `openai` plays the LLM policy through the official OpenAI client
(OPENAI_API_KEY, and OPENAI_BASE_URL for another compatible endpoint); its invalid replies and
API errors are counted in the result. `in-process` drives the simulator directly; `http` drives
a running server through `llmserve_env.LLMServeEnv`. `GET /baseline` calls `run_baseline_suite`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from llmserve_env.agents.llm_policy import DEFAULT_MODEL, LLMPolicy
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.client import LLMServeEnv
from llmserve_env.runtime.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TASKS

BASELINE_SEED = 42
DETERMINISTIC_POLICY = "heuristic"


class HttpEnv:
    """`EpisodeEnv` over a running server, through the project's HTTP client."""

    def __init__(self, base_url: str, timeout_s: float = 60.0):
        self.client = LLMServeEnv.from_url(base_url, timeout_s=timeout_s)

    def reset(self, task_id: str, seed: int) -> ServeObservation:
        return self.client.reset(task_id=task_id, seed=seed)

    def step(self, action: ServeAction) -> ServeObservation:
        obs, _, _, _ = self.client.step(action)
        return obs

    def grade(self) -> dict[str, Any]:
        return self.client.grade()

    def close(self) -> None:
        self.client.close()


def run_suite(env: EpisodeEnv, use_openai: bool, model: str | None, task_ids: list[str], seeds: list[int],
              runtime: str, llm_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Play the baseline policy on every (task, seed); per-task mean score and per-episode details.

    `llm_options` reach `LLMPolicy` (client, http_client, base_url, json_mode, ...).
    """
    started = time.perf_counter()
    tasks: dict[str, Any] = {}
    for task_id in task_ids:
        if use_openai:
            policy: Any = LLMPolicy(task_id, model=model or DEFAULT_MODEL, **(llm_options or {}))
        else:
            policy = make_policy(DETERMINISTIC_POLICY, task_id)
        episodes = [play_episode(env, policy, task_id, seed) for seed in seeds]
        entry: dict[str, Any] = {
            "score": statistics.fmean(e.score for e in episodes),
            "episodes": [e.summary() | {"grade": e.grade} for e in episodes],
        }
        if use_openai:
            entry["llm"] = policy.stats.as_dict()
        tasks[task_id] = entry
    return {
        "mode": "openai" if use_openai else "deterministic",
        "runtime": runtime,
        "policy": "llm" if use_openai else DETERMINISTIC_POLICY,
        "model": (model or DEFAULT_MODEL) if use_openai else None,
        "seeds": seeds,
        "tasks": tasks,
        "mean_score": statistics.fmean(t["score"] for t in tasks.values()),
        "wall_s": round(time.perf_counter() - started, 3),
    }


def run_baseline_suite(use_openai: bool = False, model: str | None = None, task_id: str | None = None,
                       seeds: list[int] | None = None) -> dict[str, Any]:
    """The suite `GET /baseline` serves: in process, in the simulator, every task (or `task_id`)."""
    task_ids = [task_id] if task_id else list(TASKS)
    return run_suite(InProcessEnv(), use_openai, model, task_ids, seeds or [BASELINE_SEED], "in-process")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m server.baseline_inference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("deterministic", "openai"), default="deterministic")
    ap.add_argument("--runtime", choices=("in-process", "http"), default="in-process")
    ap.add_argument("--base-url", default="http://localhost:7860", help="server URL for --runtime http")
    ap.add_argument("--model", default=None, help=f"chat model for --mode openai (default {DEFAULT_MODEL})")
    ap.add_argument("--task", default="all", help="a task id or 'all'")
    ap.add_argument("--seed", type=int, default=BASELINE_SEED, help="first episode seed")
    ap.add_argument("--episodes", type=int, default=1, help="episodes per task (seeds seed, seed+1, ...)")
    ap.add_argument("--output", type=Path, default=None, help="also write the JSON result here")
    args = ap.parse_args(argv)

    task_ids = list(TASKS) if args.task == "all" else [args.task]
    seeds = [args.seed + i for i in range(args.episodes)]
    use_openai = args.mode == "openai"
    if use_openai and not os.environ.get("OPENAI_API_KEY"):
        print("--mode openai needs OPENAI_API_KEY (and OPENAI_BASE_URL for a non-OpenAI endpoint); "
              "--mode deterministic needs neither", file=sys.stderr)
        return 2
    if args.runtime == "http":
        env = HttpEnv(args.base_url)
        try:
            result = run_suite(env, use_openai, args.model, task_ids, seeds, "http")
        finally:
            env.close()
    else:
        result = run_suite(InProcessEnv(), use_openai, args.model, task_ids, seeds, "in-process")

    print(f"{'task':<26} {'score':>7}  episodes")
    for task_id, entry in result["tasks"].items():
        extra = f"  llm {entry['llm']}" if "llm" in entry else ""
        print(f"{task_id:<26} {entry['score']:7.4f}  {len(entry['episodes'])}{extra}")
    print(f"{'mean':<26} {result['mean_score']:7.4f}")
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
