"""How episode throughput scales with workers, on Ray and on the project's process pool.

    python bench/ray_scaling.py                  # 48 episodes of adversarial_multitenant (heuristic)
    python bench/ray_scaling.py --episodes 96 --task bursty_workload

Plays the same episodes (the heuristic on held-out seeds) serially, then with 1 and 2 Ray workers
(a local Ray started with that many CPUs) and with a 2-process pool, and checks every runner
returned the same scores. Ray's per-task overhead is measured with empty tasks against an
episode's duration. Needs the `ray` extra (`pip install -e '.[ray]'`).

Last line: {"ray_episodes_per_s_1", "ray_episodes_per_s_2", "ray_efficiency_2" (speed-up / 2),
"pool_episodes_per_s_2", "serial_episodes_per_s", "ray_task_overhead_ms", "episode_ms"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from llmserve_env.agents.parallel import PoolRunner, SerialRunner, make_runner, ray_available
from llmserve_env.agents.registry import registry_job
from llmserve_env.agents.seeds import eval_seeds
from llmserve_env.tools import cli


def _noop() -> None:
    return None


def timed(runner, jobs) -> tuple[float, list[float]]:
    runner.map(jobs[:2])  # warm the workers (imports, first episode) outside the timing
    t0 = time.perf_counter()
    out = runner.map(jobs)
    return time.perf_counter() - t0, [o.score for o in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", type=cli.task_id, default="adversarial_multitenant", help="task id (default adversarial_multitenant)")
    ap.add_argument("--episodes", type=cli.int_at_least(4), default=48, help="episodes per runner (default 48)")
    args = ap.parse_args(argv)
    if not ray_available():
        print("ray is not installed: pip install -e '.[ray]'", file=sys.stderr)
        return 2
    import ray

    jobs = [registry_job("heuristic", args.task, s) for s in eval_seeds(args.episodes)]
    rows = []
    serial_s, ref = timed(SerialRunner(), jobs)
    rows.append(("serial", 1, serial_s))
    results = {}
    for workers in (1, 2):
        runner = make_runner("ray", workers=workers)
        wall, scores = timed(runner, jobs)
        if scores != ref:
            raise SystemExit(f"ray with {workers} workers returned different scores than the serial run")
        results[workers] = wall
        rows.append(("ray", workers, wall))
        if workers == 1:
            noop = ray.remote(num_cpus=1)(_noop)
            ray.get([noop.remote() for _ in range(50)])
            t0 = time.perf_counter()
            ray.get([noop.remote() for _ in range(500)])
            overhead_ms = (time.perf_counter() - t0) / 500 * 1e3
        runner.close()
    pool = PoolRunner(2)
    pool_s, scores = timed(pool, jobs)
    pool.close()
    if scores != ref:
        raise SystemExit("the process pool returned different scores than the serial run")
    rows.append(("pool", 2, pool_s))

    n = len(jobs)
    print(f"{n} episodes of {args.task} (heuristic), same scores from every runner\n")
    print(f"{'runner':<8} {'workers':>7} {'wall s':>8} {'episodes/s':>11}")
    for name, w, wall in rows:
        print(f"{name:<8} {w:>7} {wall:>8.2f} {n / wall:>11.2f}")
    episode_ms = serial_s / n * 1e3
    print(f"\nRay task overhead (empty task, 1 worker): {overhead_ms:.2f} ms against {episode_ms:.0f} ms "
          f"per episode ({overhead_ms / episode_ms:.1%})")
    out = {
        "ray_episodes_per_s_1": round(n / results[1], 3),
        "ray_episodes_per_s_2": round(n / results[2], 3),
        "ray_efficiency_2": round(results[1] / results[2] / 2, 3),
        "pool_episodes_per_s_2": round(n / pool_s, 3),
        "serial_episodes_per_s": round(n / serial_s, 3),
        "ray_task_overhead_ms": round(overhead_ms, 3),
        "episode_ms": round(episode_ms, 2),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
