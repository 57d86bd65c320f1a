"""A Ray Tune sweep of train.py's PPO hyperparameters (its `Args` dataclass is the search space).

    pip install -e '.[rllib]'          # Ray Tune comes with ray; train.py needs torch
    python tools/tune_ppo.py --task bursty_workload --samples 8 --steps 60000
    python tools/tune_ppo.py --task bursty_workload --samples 64 --steps 120000 --ray-address auto   # a cluster

Each trial runs `train.train(train_config.Args(...))` with one environment worker process and the trial's
hyperparameters, writing its weights and logs into the trial's own folder (never weights/), and
reports its best validation score (validation seeds, never evaluation seeds). The search samples
the fields below at random; every other `Args` field keeps train.py's default. The best trial's
settings and score are printed, and the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

from llmserve_env.agents.parallel import init_ray
from llmserve_env.tools import cli

# Fields of train.Args searched, and how (Ray Tune sample spaces are built lazily in `space()`).
SEARCHED = {
    "learning_rate": ("loguniform", 1e-4, 1e-3),
    "ent_coef": ("loguniform", 3e-4, 3e-2),
    "clip_coef": ("choice", [0.1, 0.2, 0.3]),
    "update_epochs": ("choice", [4, 8, 12]),
    "num_minibatches": ("choice", [2, 4, 8]),
    "gae_lambda": ("choice", [0.9, 0.95, 0.98]),
    "hidden": ("choice", [32, 64, 128]),
}


def space() -> dict[str, Any]:
    from ray import tune

    out: dict[str, Any] = {}
    for name, (kind, *spec) in SEARCHED.items():
        out[name] = tune.loguniform(*spec) if kind == "loguniform" else tune.choice(spec[0])
    return out


def trial(config: dict[str, Any]) -> dict[str, float]:
    """One training run with the trial's hyperparameters; returns what Tune records."""
    from llmserve_env.tools.train import train
    from llmserve_env.tools.train_config import Args

    known = {f.name for f in fields(Args)}
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"not fields of train.Args: {sorted(unknown)}")
    out = Path(tempfile.mkdtemp(prefix="tune_ppo_"))
    args = Args(**{k: v for k, v in config.items() if k in known}, num_envs=8, num_workers=1,
                out_dir=out, run_dir=out, command="tune_ppo trial")
    summary = train(args)
    return {"val_score": float(summary["best"]["val_score"]), "wall_s": float(summary["wall_s"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", type=cli.task_id, default="bursty_workload", help="task id (default bursty_workload)")
    ap.add_argument("--samples", type=cli.int_at_least(1), default=8, help="trials (default 8)")
    ap.add_argument("--steps", type=cli.int_at_least(1), default=60_000, help="environment steps per trial (default 60000)")
    ap.add_argument("--seed", type=int, default=0, help="training seed of every trial (default 0)")
    ap.add_argument("--concurrent", type=cli.int_at_least(1), default=2, help="trials at once (default 2: one per core)")
    ap.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local Ray)")
    args = ap.parse_args(argv)

    import ray
    from ray import tune

    init_ray(args.ray_address, max(2, args.concurrent))
    param_space = space() | {"task": args.task, "total_steps": args.steps, "seed": args.seed}
    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 1}),
        param_space=param_space,
        tune_config=tune.TuneConfig(metric="val_score", mode="max", num_samples=args.samples,
                                    max_concurrent_trials=args.concurrent),
    )
    results = tuner.fit()
    best = results.get_best_result()
    chosen = {k: best.config[k] for k in SEARCHED}
    print(f"best of {args.samples} trials on {args.task}: validation score {best.metrics['val_score']:.4f} with {chosen}")
    print("train it: python tools/train.py --task " + args.task + " " +
          " ".join(f"--{k.replace('_', '-')} {v}" for k, v in chosen.items()))
    print(json.dumps({"task": args.task, "trials": args.samples, "best_val_score": best.metrics["val_score"],
                      "best_config": chosen}))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
