"""Baseline runs: a reference policy plays every task, and the grader scores each episode.

    python -m server.baseline_inference --mode deterministic
    python -m server.baseline_inference --mode openai --runtime in-process --model gpt-4.1-mini
    python -m server.baseline_inference --mode openai --runtime http --base-url http://localhost:7860 \
        --model gpt-4.1-mini --output baseline_openai.json

`deterministic` plays the rule-based heuristic (agents/heuristic.py): no model calls, the same
numbers on every run. `openai` plays the LLM policy through the official OpenAI client
(OPENAI_API_KEY, and OPENAI_BASE_URL for another compatible endpoint). A window whose reply is
invalid (or whose call failed) plays the policy's safe fallback, so the score beside it is printed
with the invalid-reply share; past --max-invalid-share (default 50 %) of windows decided by the
fallback rather than the model, the run fails (exit 1): its score is the fallback's, not the model's. `in-process` drives the simulator directly; `http` drives
a running server through `llmserve_env.LLMServeEnv`. `GET /baseline` calls `run_baseline_suite`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from llmserve_env.agents.llm_policy import DEFAULT_MODEL, LLMPolicy, LLMPolicyStats
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import EpisodeEnv, play_episode
from llmserve_env.client import LLMServeEnv
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TASKS
from llmserve_env.tools import cli

BASELINE_SEED = 42
DETERMINISTIC_POLICY = "heuristic"
# Above this share of windows played by the fallback (invalid replies + API errors), an OpenAI
# baseline run fails: the score measures SAFE_ACTION, not the model.
MAX_INVALID_SHARE = 0.5


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
              runtime: str, llm_options: dict[str, Any] | None = None, quiet: bool = True) -> dict[str, Any]:
    """Play the baseline policy on every (task, seed); per-task mean score and per-episode details.

    `llm_options` reach `LLMPolicy` (client, http_client, base_url, json_mode, ...). With the LLM
    policy, each task's entry and the result carry `invalid_reply_share` and `fallback_share`.
    """
    started = time.perf_counter()
    tasks: dict[str, Any] = {}
    overall = LLMPolicyStats()
    for task_id in task_ids:
        if use_openai:
            policy: Any = LLMPolicy(task_id, model=model or DEFAULT_MODEL, **(llm_options or {}))
        else:
            policy = make_policy(DETERMINISTIC_POLICY, task_id)
        runs = cli.progress(seeds, desc=task_id, unit="ep", quiet=quiet)
        episodes = [play_episode(env, policy, task_id, seed) for seed in runs]
        entry: dict[str, Any] = {
            "score": statistics.fmean(e.score for e in episodes),
            "episodes": [e.summary() | {"grade": e.grade} for e in episodes],
        }
        if use_openai:
            entry["llm"] = policy.stats.as_dict()
            entry["invalid_reply_share"] = entry["llm"]["invalid_share"]
            entry["fallback_share"] = entry["llm"]["fallback_share"]
            overall.merge(policy.stats)
        tasks[task_id] = entry
    llm_totals = {"invalid_reply_share": round(overall.invalid_share, 4),
                  "fallback_share": round(overall.fallback_share, 4)} if use_openai else {}
    return llm_totals | {
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
                       seeds: list[int] | None = None, llm_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The suite `GET /baseline` serves: in process, in the simulator, every task (or `task_id`).
    `llm_options` reach LLMPolicy (the route passes a client that makes no retries)."""
    task_ids = [task_id] if task_id else list(TASKS)
    return run_suite(InProcessEnv(), use_openai, model, task_ids, seeds or [BASELINE_SEED], "in-process",
                     llm_options=llm_options)


def fallback_failures(result: dict[str, Any], max_share: float) -> list[str]:
    """The tasks whose windows the LLM's fallback played more than `max_share` of, as message lines."""
    return [f"{task_id}: {entry['llm']['invalid']} invalid replies and {entry['llm']['api_errors']} API errors "
            f"in {entry['llm']['calls']} calls ({100 * entry['fallback_share']:.1f} % played by the fallback)"
            for task_id, entry in result["tasks"].items()
            if "fallback_share" in entry and entry["fallback_share"] > max_share]


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in 0..1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in 0..1, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(prog="python -m server.baseline_inference", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--mode", choices=("deterministic", "openai"), default="deterministic",
                    help="the heuristic (no model calls) or the LLM policy")
    ap.add_argument("--runtime", choices=("in-process", "http"), default="in-process",
                    help="play in this process, or against a running server")
    ap.add_argument("--base-url", type=cli.http_url, default="http://localhost:7860",
                    help="server URL for --runtime http")
    ap.add_argument("--model", default=None, help=f"chat model for --mode openai (None: {DEFAULT_MODEL})")
    ap.add_argument("--task", type=cli.task_list, default="all", help="comma-separated task ids, or 'all'")
    ap.add_argument("--seed", type=cli.int_at_least(0), default=BASELINE_SEED, help="first episode seed")
    ap.add_argument("--episodes", type=cli.int_at_least(1), default=1,
                    help="episodes per task (seeds seed, seed+1, ...)")
    ap.add_argument("--max-invalid-share", type=_share, default=MAX_INVALID_SHARE,
                    help="--mode openai fails (exit 1) when more than this share of a task's windows were "
                         "played by the fallback (invalid replies and API errors)")
    ap.add_argument("--output", type=cli.writable_file, default=None,
                    help="also write the JSON result here (its folder must exist)")
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)

    task_ids = args.task
    seeds = [args.seed + i for i in range(args.episodes)]
    use_openai = args.mode == "openai"
    if use_openai and not os.environ.get("OPENAI_API_KEY"):
        print("--mode openai needs OPENAI_API_KEY (and OPENAI_BASE_URL for a non-OpenAI endpoint); "
              "--mode deterministic needs neither", file=sys.stderr)
        return 2
    if args.runtime == "http":
        env = HttpEnv(args.base_url)
        try:
            result = run_suite(env, use_openai, args.model, task_ids, seeds, "http", quiet=args.quiet)
        finally:
            env.close()
    else:
        result = run_suite(InProcessEnv(), use_openai, args.model, task_ids, seeds, "in-process", quiet=args.quiet)

    llm_head = "  invalid replies (share of calls)" if use_openai else ""
    print(f"{'task':<26} {'score':>7}  episodes{llm_head}")
    for task_id, entry in result["tasks"].items():
        extra = ""
        if "llm" in entry:
            llm = entry["llm"]
            extra = (f"  {llm['invalid']}/{llm['calls']} ({100 * llm['invalid_share']:.1f} %), "
                     f"API errors {llm['api_errors']}")
        print(f"{task_id:<26} {entry['score']:7.4f}  {len(entry['episodes']):>8}{extra}")
    mean_extra = f"  {100 * result['invalid_reply_share']:.1f} % invalid" if use_openai else ""
    print(f"{'mean':<26} {result['mean_score']:7.4f}{'':>10}{mean_extra}")
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}")
    failures = fallback_failures(result, args.max_invalid_share) if use_openai else []
    if failures:
        print(f"FAILED: the model did not decide more than {100 * args.max_invalid_share:g} % of the windows, "
              "so these scores are the safe fallback's, not the model's:", file=sys.stderr)
        for line in failures:
            print(f"  {line}", file=sys.stderr)
        last = result["tasks"][next(iter(result["tasks"]))]["llm"]["last_error"]
        if last:
            print(f"  last error: {last}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
