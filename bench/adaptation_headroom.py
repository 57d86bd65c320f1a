"""What knowing the workload's hidden regime is worth: an oracle against the tuned rivals.

    python bench/adaptation_headroom.py                      # bursty + adversarial, ~10 min on 2 cores
    python bench/adaptation_headroom.py --task bursty_workload --episodes 20 --train-seeds 4

The bursty task's arrivals switch between a lull and a burst phase, and the adversarial task's
batch tenant spikes; no policy observes either regime, only its effects (arrivals, queue,
latencies). The regime oracle is told the regime of the window it is about to serve
(`shared.workloads.high_load_regime`, which no real policy could know one window ahead) and plays
one grid action in the low regime and another in the high one. The pair is chosen by coordinate
descent over the PPO action grid (agents/encoding.py), from the tuned static configuration (and from it with INT8 in the
high regime), on training seeds only. It then plays the held-out evaluation seeds beside the tuned static
configuration and the tuned heuristic.

If the oracle does not beat the heuristic, the regime itself is not what a policy needs to know:
the heuristic's backlog feedback already captures what adaptation is worth on the task, and a
learned policy that sees the same observation can only gain by finer control of it.

Prints a table of mean score ± 95 % CI and paired differences, then one flat JSON object with
`<task>.<agent>.mean`, `<task>.oracle_minus_heuristic` and `<task>.oracle_minus_heuristic_ci95`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from llmserve_env.agents.encoding import ACTION_NVEC, decode_action, encode_action
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.search import coordinate_descent
from llmserve_env.agents.seeds import eval_seeds, train_seeds
from llmserve_env.agents.stats import mean_ci, paired_diff_ci
from llmserve_env.agents.tuned_static import tuned_action
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction, ServeObservation
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import high_load_regime
from llmserve_env.tools import cli
from llmserve_env.tools.evaluate import evaluate_agent

TASKS = ("bursty_workload", "adversarial_multitenant")


@dataclass
class RegimeOracle:
    """Plays `high` on windows whose hidden regime is high (>= half the window), else `low`."""

    low: ServeAction
    high: ServeAction
    regime: np.ndarray
    name: str = "regime_oracle"

    def reset(self) -> None:
        """Stateless: the regime is given whole."""

    def act(self, obs: ServeObservation) -> ServeAction:
        return self.high if self.regime[obs.step_index] >= 0.5 else self.low


_ENV: InProcessEnv | None = None


def _oracle_episode(job: tuple[str, int, tuple[int, ...]]) -> float:
    """One episode of the oracle playing `point` (6 grid indices per regime), in a worker."""
    global _ENV
    if _ENV is None:
        _ENV = InProcessEnv()
    task_id, seed, point = job
    policy = RegimeOracle(decode_action(point[:6]), decode_action(point[6:]), high_load_regime(get_task(task_id), seed))
    return play_episode(_ENV, policy, task_id, seed).score


def search_oracle(pool: ProcessPoolExecutor, task_id: str, seeds: list[int]) -> tuple[tuple[int, ...], float, int]:
    def score(point: tuple[int, ...]) -> float:
        return float(np.mean(list(pool.map(_oracle_episode, [(task_id, s, point) for s in seeds]))))

    # Two starts: the tuned static configuration in both regimes, and the same with INT8 in the
    # high regime (the heuristic's burst move), since one knob at a time cannot reach it alone.
    tuned = tuple(int(i) for i in encode_action(tuned_action(task_id)))
    int8 = tuned[:3] + (QUANTIZATION_TIERS.index("INT8"),) + tuned[4:]
    return coordinate_descent(score, list(ACTION_NVEC) * 2, [tuned + tuned, tuned + int8],
                              log=lambda m: print(f"[{task_id}] {m}", file=sys.stderr))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/adaptation_headroom.py", description=__doc__,
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--task", type=cli.names_from(TASKS), default=",".join(TASKS),
                    help="comma-separated task ids with a hidden regime")
    ap.add_argument("--episodes", type=cli.int_at_least(2), default=30, help="held-out evaluation seeds per agent")
    ap.add_argument("--train-seeds", type=cli.int_at_least(1), default=6, help="training seeds per oracle candidate")
    ap.add_argument("--workers", type=cli.int_at_least(1), default=2, help="worker processes")
    cli.add_output_options(ap)
    args = ap.parse_args(argv)
    cli.configure_logging(args)

    out: dict[str, float] = {}
    rows = []
    with ProcessPoolExecutor(args.workers) as pool:
        for task_id in args.task:
            t0 = time.perf_counter()
            point, train_score, evaluated = search_oracle(pool, task_id, train_seeds(args.train_seeds))
            rivals = {agent: pool.submit(evaluate_agent, agent, task_id, args.episodes)
                      for agent in ("tuned_static", "heuristic")}
            oracle = pool.map(_oracle_episode, [(task_id, s, point) for s in eval_seeds(args.episodes)])
            scores = {**{agent: f.result().scores for agent, f in rivals.items()}, "oracle": list(oracle)}
            diff_h = paired_diff_ci(scores["oracle"], scores["heuristic"])
            diff_s = paired_diff_ci(scores["oracle"], scores["tuned_static"])
            low, high = decode_action(point[:6]).knobs(), decode_action(point[6:]).knobs()
            rows.append((task_id, scores, diff_h, diff_s, low, high, train_score, evaluated,
                         time.perf_counter() - t0))
            for agent, xs in scores.items():
                out[f"{task_id}.{agent}.mean"] = round(mean_ci(xs).mean, 4)
            out[f"{task_id}.oracle_minus_heuristic"] = round(diff_h.mean, 4)
            out[f"{task_id}.oracle_minus_heuristic_ci95"] = round(diff_h.half_width, 4)
            out[f"{task_id}.oracle_minus_tuned_static"] = round(diff_s.mean, 4)

    print(f"held-out seeds: {args.episodes}; oracle searched on {args.train_seeds} training seeds\n")
    print("| task | tuned_static | heuristic | regime oracle | oracle − heuristic | oracle − tuned_static |")
    print("|---|---|---|---|---|---|")
    for task_id, scores, diff_h, diff_s, *_ in rows:
        cells = " | ".join(str(mean_ci(scores[a])) for a in ("tuned_static", "heuristic", "oracle"))
        print(f"| {task_id} | {cells} | {diff_h.mean:+.3f} ± {diff_h.half_width:.3f} | "
              f"{diff_s.mean:+.3f} ± {diff_s.half_width:.3f} |")
    print()
    for task_id, _, _, _, low, high, train_score, evaluated, wall in rows:
        print(f"{task_id}: oracle low regime {low}")
        print(f"{task_id}: oracle high regime {high}")
        print(f"{task_id}: train score {train_score:.4f}, {evaluated} pairs evaluated, {wall:.0f} s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
