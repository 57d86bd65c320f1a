"""RLlib's PPO on LLMServe-v0, exported to the numpy actor format that `agents/ppo_policy.py` serves.

    pip install -e '.[rllib]'        # ray[rllib] 2.60.0 + torch 2.13.0 (CPU wheel)
    python tools/train_rllib.py --task bursty_workload --iterations 40 --env-runners 2
    python tools/train_rllib.py --task static_workload --iterations 2 --ray-address auto   # on a Ray cluster

The Gymnasium environment (`gym_env.LLMServeGymEnv`, registered as `LLMServe-v0`) is registered
with RLlib; env runners are Ray actors, each stepping its own simulator. The RL module is RLlib's
default PPO module with the actor shaped like train.py's: tanh hidden layers, one linear head of
concatenated MultiDiscrete logits, no shared value layers. After training, its actor layers are
written as `<out>/<task>.npz` + `.json` in the layout `ActorWeights` reads, so the policy runs in
the server (`PPOPolicy(task, weights_path=...)`) with numpy alone: no Ray, no torch.
RLlib adds no observation filter here, so the exported normalisation is the identity.

By default the weights go to `runs/rllib/<task>__s<seed>/`; `--out weights` would replace the
shipped PPO actor of that task.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from llmserve_env.agents.advice import view_shape
from llmserve_env.agents.parallel import init_ray
from llmserve_env.agents.ppo_policy import ActorWeights, PPOPolicy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.search import git_commit
from llmserve_env.agents.seeds import validation_seeds
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import ENV_ID, LLMServeGymEnv
from llmserve_env.shared.tasks import get_task
from llmserve_env.tools import cli

ROOT = Path(__file__).resolve().parents[1]  # the repository root (runs/ lives there)


def make_env(env_config: dict[str, Any]) -> LLMServeGymEnv:
    return LLMServeGymEnv(env_config.get("task", "static_workload"))


def build_config(task: str, env_runners: int, hidden: int, seed: int, train_batch: int, minibatch: int,
                 epochs: int, lr: float, entropy: float):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    register_env(ENV_ID, make_env)
    return (
        PPOConfig()
        .environment(ENV_ID, env_config={"task": task})
        .framework("torch")
        .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=1,
                     rollout_fragment_length="auto", num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(lr=lr, gamma=0.99, lambda_=0.95, clip_param=0.2, entropy_coeff=entropy, vf_loss_coeff=0.5,
                  grad_clip=0.5, train_batch_size_per_learner=train_batch, minibatch_size=minibatch,
                  num_epochs=epochs)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[hidden, hidden], fcnet_activation="tanh",
                                                   head_fcnet_hiddens=[], vf_share_layers=False))
        .debugging(seed=seed)
    )


def actor_arrays(module) -> dict[str, np.ndarray]:
    """The actor's Linear layers (encoder MLP, then the pi head) as actor_w{i} (in, out) / actor_b{i}."""
    import torch

    encoder = getattr(module.encoder, "actor_encoder", module.encoder)
    linears = [m for m in encoder.modules() if isinstance(m, torch.nn.Linear)]
    linears += [m for m in module.pi.modules() if isinstance(m, torch.nn.Linear)]
    arrays: dict[str, np.ndarray] = {}
    for i, layer in enumerate(linears):
        arrays[f"actor_w{i}"] = layer.weight.detach().cpu().numpy().astype(np.float64).T
        arrays[f"actor_b{i}"] = layer.bias.detach().cpu().numpy().astype(np.float64)
    return arrays


def export(module, task: str, out_dir: Path, meta: dict[str, Any]) -> Path:
    """Write the actor as `<out_dir>/<task>.npz` + `.json`; checked by loading it back."""
    replicas = get_task(task).replicas
    nvec, dim = view_shape(False, replicas)
    arrays = actor_arrays(module) | {"nvec": np.asarray(nvec, dtype=np.int64)}
    meta = {"obs_norm": {"mean": [0.0] * dim, "var": [1.0] * dim, "clip": 1e9, "epsilon": 0.0},
            "activation": "tanh", "advice": None, "trainer": "rllib PPO",
            **ActorWeights.replicas_meta(replicas)} | meta
    ActorWeights.from_arrays(arrays, meta)  # shapes must fit the encoder and grid, or this raises
    out_dir.mkdir(parents=True, exist_ok=True)
    npz = out_dir / f"{task}.npz"
    np.savez(npz, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle flag
    npz.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return npz


def validation_score(task: str, npz: Path, episodes: int) -> float:
    policy = PPOPolicy(task, weights_path=npz)
    env = InProcessEnv()
    return float(np.mean([play_episode(env, policy, task, s).score for s in validation_seeds(episodes)]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", type=cli.task_id, default="static_workload", help="task id (default static_workload)")
    ap.add_argument("--iterations", type=cli.int_at_least(1), default=20, help="RLlib training iterations (default 20)")
    ap.add_argument("--env-runners", type=cli.int_at_least(0), default=2, help="env runner actors (default 2)")
    ap.add_argument("--train-batch", type=cli.int_at_least(1), default=1024, help="env steps per iteration (default 1024)")
    ap.add_argument("--minibatch", type=cli.int_at_least(1), default=256, help="SGD minibatch (default 256)")
    ap.add_argument("--epochs", type=cli.int_at_least(1), default=8, help="SGD epochs per iteration (default 8)")
    ap.add_argument("--lr", type=float, default=3e-4, help="learning rate (default 3e-4)")
    ap.add_argument("--entropy", type=float, default=0.003, help="entropy coefficient (default 0.003)")
    ap.add_argument("--hidden", type=cli.int_at_least(1), default=64, help="hidden layer width (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="RLlib seed (default 0)")
    ap.add_argument("--val-episodes", type=cli.int_at_least(1), default=8, help="validation episodes of the export (default 8)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for <task>.npz/.json (default runs/rllib/<task>__s<seed>)")
    ap.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local Ray)")
    args = ap.parse_args(argv)
    if get_task(args.task).horizon > args.train_batch:
        ap.error("--train-batch must hold at least one episode")
    out_dir = args.out or ROOT / "runs" / "rllib" / f"{args.task}__s{args.seed}"

    import ray

    init_ray(args.ray_address, max(2, args.env_runners + 1))
    t0 = time.perf_counter()
    algo = build_config(args.task, args.env_runners, args.hidden, args.seed, args.train_batch, args.minibatch,
                        args.epochs, args.lr, args.entropy).build_algo()
    returns = []
    for i in range(args.iterations):
        result = algo.train()
        ret = result.get("env_runners", {}).get("episode_return_mean", float("nan"))
        returns.append(ret)
        print(f"iteration {i + 1}/{args.iterations}: episode return {ret:.3f}", file=sys.stderr)
    module = algo.get_module()
    wall = time.perf_counter() - t0
    command = "python tools/train_rllib.py " + " ".join(sys.argv[1:] if argv is None else argv)
    npz = export(module, args.task, out_dir, {"command": command, "git_commit": git_commit(),
                                             "iterations": args.iterations, "wall_s": round(wall, 1),
                                             "episode_return_mean": returns})
    algo.stop()
    ray.shutdown()
    score = validation_score(args.task, npz, args.val_episodes)
    print(f"exported {npz} ({wall:.0f} s); served by PPOPolicy: validation score {score:.4f} "
          f"over {args.val_episodes} episodes")
    print(json.dumps({"task": args.task, "weights": str(npz), "wall_s": round(wall, 1),
                      "validation_score": round(score, 4), "iterations": args.iterations}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
