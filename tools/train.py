"""PPO for LLMServeEnv, in one file (after CleanRL's ppo.py).

    python tools/train.py --task adversarial_multitenant --total-steps 120000 --seed 0

Environments: `Args.num_envs` copies of the Gymnasium wrapper (gym_env.py, the simulator in
process), spread over `Args.num_workers` worker processes so both cores step the simulator.
Each worker steps its share and resets finished episodes at once (the observation returned with
done=True is the next episode's first); the learner sends a worker its next actions as soon as
that worker's step returns, so no shard waits for the other. Validation, rival and
behaviour-cloning episodes are played in the workers as well.

Policy: an MLP (tanh) with one categorical head per knob of the MultiDiscrete action; a
separate MLP critic. Observations are normalised by running mean/variance, updated once per
rollout and frozen for the final export. One sampling generator per worker keeps runs
reproducible whatever order the workers answer in.

Outputs, all in the run folder runs/<task>__s<seed>/:
    progress.csv and TensorBoard events   (training curves)
    <task>.npz   the actor's layers, for agents/ppo_policy.py (numpy, no torch)
    <task>.json  observation normalisation, the command, commit, hyperparameters, scores
With --replace-shipped-weights the actor replaces weights/<task>.npz/.json instead: the one the
`ppo` policy, the server and evaluate.py load (`PPOPolicy(task, "runs/<task>__s<seed>/<task>.npz")`
loads a run's own). `python tools/train.py --help` lists every option with its default
(train_config.py, which needs no torch).

The exported actor is the one with the best greedy score on validation seeds (never the
evaluation seeds evaluate.py uses) among the checkpoints validated during training.
torch comes from the `train` extra: pip install -e '.[train]'.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import sys
import time
from pathlib import Path

import numpy as np

try:
    import torch
    import torch.nn as nn
except ModuleNotFoundError as exc:  # the `train` extra is not installed
    if __name__ == "__main__":
        # --help and argument errors need no torch (train_config.py): they answer first
        from llmserve_env.tools.train_config import parse_args as _parse_args

        _parse_args(sys.argv[1:])
        sys.exit(f"train.py needs torch, from the `train` extra: make install-train ({exc})")
    raise
from llmserve_env.agents.advice import ADVICE_FEATURE_NAMES, FOLLOW
from llmserve_env.agents.base import Policy
from llmserve_env.agents.encoding import encode_action, feature_names
from llmserve_env.agents.planner import PLANNERS, rivals_for
from llmserve_env.agents.ppo_policy import ActorWeights, PPOPolicy
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.search import git_commit
from llmserve_env.agents.seeds import TRAIN_SEED_LIMIT, train_seeds, validation_seeds
from llmserve_env.agents.static import VLLM_DEFAULT
from llmserve_env.agents.tuned_static import NotTunedError, tuned_action
from llmserve_env.agents.views import make_view, view_dims, view_meta
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.tasks import PREFIX_TASKS
from llmserve_env.shared.workloads import resolve_task
from llmserve_env.tools import cli
from llmserve_env.tools.dagger import discounted_returns, label_episodes
from llmserve_env.tools.train_config import Args, parse_args
from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger("llmserve_env.tools.train")


# ----------------------------------------------------------------------------------------------
# Vectorised environments: num_workers processes, each stepping num_envs / num_workers envs.
# ----------------------------------------------------------------------------------------------
def _teacher_demos(task: str, seeds: list[int], gamma: float, teacher: str) -> list[tuple]:
    """(features, action indices, discounted returns, grade) of the teacher's episodes, one per seed (on the
    plain action grid: behaviour cloning is for --advice false). The teacher's own action is mapped to
    the nearest grid point and that is what the episode plays, so the demonstration's states are the
    ones its labels lead to."""
    env = LLMServeGymEnv(task, grade_on_done=False)
    demos = []
    for seed in seeds:
        policy = make_policy(teacher, task, seed=seed)  # the planner's sample pool follows the seed
        policy.reset()
        x, _ = env.reset(options={"episode_seed": seed})
        feats, acts, rewards = [], [], []
        while True:
            obs = env.last_observation
            assert obs is not None  # reset just set it
            idx = env.view.encode(policy.act(obs))
            feats.append(x)
            acts.append(idx)
            x, r, terminated, truncated, _ = env.step(idx)
            rewards.append(r)
            if terminated or truncated:
                break
        demos.append((np.stack(feats), np.stack(acts), discounted_returns(rewards, gamma),
                      env.runtime.grade_result().score))
    return demos


def _worker(remote, task: str, seeds: list[int], advice: bool, encoding: str = "default") -> None:
    torch.set_num_threads(1)
    envs = [LLMServeGymEnv(task, advice=advice, encoding=encoding) for _ in seeds]
    episode_env: InProcessEnv | None = None  # for whole episodes on given seeds
    remote.send(np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)]))
    while True:
        cmd, payload = remote.recv()
        if cmd == "close":
            remote.close()
            return
        # Whole episodes on given seeds (validation, rivals, demonstrations): each worker plays its
        # share, so both cores work while the learner waits for the results.
        if cmd == "scores":
            ep_seeds, policy = payload
            episode_env = episode_env or InProcessEnv()
            remote.send([play_episode(episode_env, policy, task, s).score for s in ep_seeds])
            continue
        if cmd == "demos":
            ep_seeds, (gamma, teacher) = payload
            remote.send(_teacher_demos(task, ep_seeds, gamma, teacher))
            continue
        if cmd == "dagger":  # a DAgger round's share: the student plays, the expert labels (tools/dagger.py)
            ep_seeds, (gamma, teacher, student) = payload
            remote.send(label_episodes(task, ep_seeds, teacher, student, gamma))
            continue
        obs, rew, done, score = [], [], [], []
        for genv, a in zip(envs, payload, strict=True):
            o, r, terminated, truncated, info = genv.step(a)
            finished = terminated or truncated
            if finished:
                o, _ = genv.reset()
            obs.append(o)
            rew.append(r)
            done.append(finished)
            score.append(info.get("score", np.nan) if finished else np.nan)
        remote.send((np.stack(obs), np.asarray(rew, np.float32), np.asarray(done), np.asarray(score)))


class ShardedVecEnv:
    """num_envs environments in num_workers processes; worker w steps envs `shards[w]` (a slice).

    Each worker is stepped on its own (send_step / ready / recv_step), so the learner chooses one
    worker's next actions while the other worker simulates, and a slow window in one shard does
    not hold the other back.
    """

    def __init__(self, task: str, num_envs: int, num_workers: int, seed: int, advice: bool,
                 encoding: str = "default"):
        # fork, not spawn: a spawned worker re-runs this script, whose torch and tensorboard imports
        # made 16-env start-up 14-28 s against 0.7-0.8 s forked (measured on the 2-core machine under
        # load). The fork happens before the learner runs any torch op, so no thread pool is copied.
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers must be in 1..num_envs ({num_envs}), got {num_workers}")
        ctx = mp.get_context("fork")
        shards = np.array_split(np.arange(num_envs), num_workers)
        self.remotes, self.procs = [], []
        for shard in shards:
            parent, child = ctx.Pipe()
            seeds = [seed * 10_000 + int(i) for i in shard]
            p = ctx.Process(target=_worker, args=(child, task, seeds, advice, encoding), daemon=True)
            p.start()
            child.close()
            self.remotes.append(parent)
            self.procs.append(p)
        self.shards = [slice(int(sh[0]), int(sh[-1]) + 1) for sh in shards]
        self.first_obs = np.concatenate([r.recv() for r in self.remotes])

    def send_step(self, w: int, actions: np.ndarray) -> None:
        """Worker w steps its envs (`self.shards[w]`) with `actions`; collect with `recv_step`."""
        self.remotes[w].send(("step", actions))

    def recv_step(self, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(observations, rewards, dones, scores) of worker w's last step."""
        return self.remotes[w].recv()

    def ready(self, workers: list[int]) -> list[int]:
        """Those of `workers` whose step result has arrived, in worker order (blocks for one)."""
        done = set(mp_connection.wait([self.remotes[w] for w in workers]))
        return [w for w in workers if self.remotes[w] in done]

    def play(self, cmd: str, seeds: list[int], extra: object = None) -> list:
        """Send (cmd, (share of `seeds`, extra)) to every worker with a share; their results in
        worker order (so concatenating them follows `seeds`)."""
        shares = [[int(s) for s in part] for part in np.array_split(np.asarray(seeds), len(self.remotes))]
        busy = []
        for r, share in zip(self.remotes, shares, strict=True):
            if share:
                r.send((cmd, (share, extra)))
                busy.append(r)
        return [r.recv() for r in busy]

    def close(self) -> None:
        for r in self.remotes:
            r.send(("close", None))
        for p in self.procs:
            p.join(timeout=5)


class RunningMeanStd:
    """Running mean/variance (parallel algorithm), as gymnasium's NormalizeObservation keeps."""

    def __init__(self, shape: tuple[int, ...]):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        b_mean, b_var, b_count = x.mean(0), x.var(0), x.shape[0]
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var, self.count = m2 / total, total

    def normalize(self, x: np.ndarray, clip: float, eps: float) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + eps), -clip, clip).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Agent
# ----------------------------------------------------------------------------------------------
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, nvec: tuple[int, ...], hidden: int):
        super().__init__()
        self.nvec = nvec
        # The heads' logits are laid into one (batch, heads, widest) tensor, -inf where a head is
        # narrower, so sampling, log-probabilities and entropies run as single tensor ops (six
        # torch Categorical objects per call cost more than the MLP itself, on the learner's
        # critical path while the workers wait for actions).
        self.width = max(nvec)
        self.register_buffer("slots", torch.tensor([k * self.width + j for k, n in enumerate(nvec) for j in range(n)]),
                             persistent=False)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
            layer_init(nn.Linear(hidden, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
            layer_init(nn.Linear(hidden, sum(nvec)), std=0.01),
        )

    def start_near(self, idx: np.ndarray, p: float) -> None:
        """Bias each head's logits so the untrained policy picks idx[k] with probability p.

        A uniformly random serving policy is very poor here (one bad knob, e.g. batch cap 1 or
        INT4, ruins a window) and slow to simulate (queues grow without bound), so learning starts
        around a known configuration and explores the rest with probability 1 - p per knob.
        """
        head = [m for m in self.actor if isinstance(m, nn.Linear)][-1]
        bias = torch.zeros(sum(self.nvec))
        start = 0
        for k, n in enumerate(self.nvec):
            bias[start + int(idx[k])] = float(np.log(p * (n - 1) / (1.0 - p)))
            start += n
        with torch.no_grad():
            head.bias.copy_(bias)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def _log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, heads, widest) log-probabilities of each head's choices (-inf past a head's width)."""
        logits = self.actor(x)
        padded = logits.new_full((logits.shape[0], len(self.nvec) * self.width), float("-inf"))
        padded[:, self.slots] = logits
        return torch.log_softmax(padded.view(-1, len(self.nvec), self.width), dim=2)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None,
                             generator: torch.Generator | None = None):
        logp = self._log_probs(x)
        if action is None:
            probs = logp.exp().view(-1, self.width)
            action = torch.multinomial(probs, 1, generator=generator).view(-1, len(self.nvec))  # (B, heads)
        logprob = logp.gather(2, action.unsqueeze(2)).squeeze(2).sum(1)
        entropy = -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum((1, 2))
        return action, logprob, entropy, self.critic(x)

    def greedy(self, x: torch.Tensor) -> np.ndarray:
        return self._log_probs(x).argmax(2).numpy()

    def export(self) -> dict[str, np.ndarray]:
        """The actor as numpy arrays in agents/ppo_policy.py's layout (x @ w + b)."""
        linears = [m for m in self.actor if isinstance(m, nn.Linear)]
        out: dict[str, np.ndarray] = {"nvec": np.asarray(self.nvec, np.int64)}
        for i, lin in enumerate(linears):
            out[f"actor_w{i}"] = lin.weight.detach().numpy().T.astype(np.float32)
            out[f"actor_b{i}"] = lin.bias.detach().numpy().astype(np.float32)
        return out


# ----------------------------------------------------------------------------------------------
# Validation, rivals and demonstrations: whole episodes on given seeds, played in the workers.
# ----------------------------------------------------------------------------------------------
def weights_meta(agent: Agent, rms: RunningMeanStd, args: Args) -> dict:
    """What the weights' JSON says about the actor: its inputs, normalisation and action grid."""
    task = resolve_task(args.task)
    replicas = task.replicas
    return {
        "format": "mlp-tanh actor; logits = layers(clip((obs - mean) / sqrt(var + epsilon), -clip, clip))",
        "activation": "tanh",
        "obs_norm": {"mean": rms.mean.tolist(), "var": rms.var.tolist(), "clip": args.obs_clip,
                     "epsilon": args.obs_epsilon},
        "feature_names": list(feature_names(replicas)) + (list(ADVICE_FEATURE_NAMES) if args.advice else []),
        "action_nvec": list(agent.nvec),
        "advice": "heuristic" if args.advice else None,
        **ActorWeights.replicas_meta(replicas),
        # the family or prefix view's inputs and heads (agents/views.py); PPOPolicy reads "encoding"
        **view_meta(make_view(task, args.advice, args.encoding)),
    }


def mean_score(envs: ShardedVecEnv, policy: Policy, args: Args) -> float:
    """`policy`'s mean score on the validation seeds, played in the workers."""
    parts = envs.play("scores", validation_seeds(args.val_episodes), policy)
    return float(np.mean([x for part in parts for x in part]))


def validate(agent: Agent, rms: RunningMeanStd, args: Args, envs: ShardedVecEnv) -> float:
    """The greedy actor as `ppo` would serve it once exported, on the validation seeds."""
    actor = ActorWeights.from_arrays(agent.export(), weights_meta(agent, rms, args))
    return mean_score(envs, PPOPolicy(args.task, weights=actor), args)


def behaviour_clone(agent: Agent, rms: RunningMeanStd, args: Args, envs: ShardedVecEnv) -> dict[str, float]:
    """Start from the teacher (`--teacher`, the tuned heuristic by default): imitate its actions, fit
    the critic to its returns.

    The teacher (the heuristic with thresholds tuned on training seeds, a rival, or the sampled
    planner) plays `bc_episodes` episodes on training seeds (in the workers, so a slow teacher's
    demonstrations take half the time on two cores); the actor learns its action per window by
    cross-entropy and the critic its discounted return, so PPO starts where the teacher is and has
    only to find what it misses. The observation statistics start from these episodes too.
    """
    seeds = train_seeds(args.bc_episodes, offset=TRAIN_SEED_LIMIT - args.bc_episodes)
    t0 = time.perf_counter()
    demos = [d for part in envs.play("demos", seeds, (args.gamma, args.teacher)) for d in part]
    demo_s = time.perf_counter() - t0
    X = np.concatenate([d[0] for d in demos])
    rms.update(X)
    xb = torch.as_tensor(rms.normalize(X, args.obs_clip, args.obs_epsilon))
    yb = torch.as_tensor(np.concatenate([d[1] for d in demos]), dtype=torch.long)
    # The critic learns the returns PPO will bootstrap from, so on the same scale as its rewards.
    gb = torch.as_tensor(np.concatenate([d[2] for d in demos]) * np.float32(args.reward_scale))
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
    fit_to_labels(agent, opt, xb, yb, gb, args.bc_epochs)
    with torch.no_grad():
        accuracy = float((torch.as_tensor(agent.greedy(xb)) == yb).all(1).float().mean())
    return {"accuracy": accuracy, "samples": float(len(xb)), "demo_wall_s": round(demo_s, 1),
            "teacher_train_score": float(np.mean([d[3] for d in demos]))}


def fit_to_labels(agent: Agent, opt: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor, gb: torch.Tensor,
                  epochs: int) -> None:
    """`epochs` passes of minibatches of 256: the actor's cross-entropy on the labels (every head) plus
    the critic's squared error on the returns (behaviour cloning and each DAgger round)."""
    for _ in range(epochs):
        for mb in torch.randperm(len(xb)).split(256):
            _, logp, _, value = agent.get_action_and_value(xb[mb], yb[mb])
            loss = -logp.mean() + 0.5 * ((value.view(-1) - gb[mb]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


def dagger_clone(agent: Agent, rms: RunningMeanStd, args: Args, envs: ShardedVecEnv) -> dict:
    """DAgger (tools/dagger.py): round 0 the expert (`--teacher`) plays `dagger_episodes` training
    episodes; each of the `dagger_rounds` rounds after it, the student of the round before plays its greedy
    action on new training seeds and the expert labels every state it visits. After each round the
    observation statistics are refitted to all labelled states and the actor (cross-entropy on every
    head) and critic (the discounted returns as played) train `bc_epochs` passes over the whole data set,
    which is written to the run folder's `dagger_data.npz` (features, labels, returns, round) each round.
    With `dagger_data` (an earlier run's file, checked by train_config) its rounds 0..m are fitted first
    and play resumes at round m + 1, on that round's seeds. Returns per round played: labelled states,
    wall time, the player's mean grade on those episodes and the share of states where the student's
    action was the expert's whole label."""
    X: list[np.ndarray] = []
    Y: list[np.ndarray] = []
    G: list[np.ndarray] = []
    R: list[np.ndarray] = []
    rounds = []
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3)

    def fit_all() -> tuple[int, float, float, float]:
        """Refit the statistics and the actor and critic to every labelled state: (states, wall s, accuracy
        on every head, on the count head)."""
        Xa = np.concatenate(X)
        # kept after every round: a costly expert's labels (the planner: hours) outlive the run
        np.savez_compressed(args.run_path / "dagger_data.npz", features=Xa, labels=np.concatenate(Y),
                            returns=np.concatenate(G), round=np.concatenate(R))
        # statistics of every labelled state so far (a fresh fit: the data set is the whole point)
        rms.mean, rms.var, rms.count = Xa.mean(0).astype(np.float64), Xa.var(0).astype(np.float64), float(len(Xa))
        xb = torch.as_tensor(rms.normalize(Xa, args.obs_clip, args.obs_epsilon))
        yb = torch.as_tensor(np.concatenate(Y), dtype=torch.long)
        gb = torch.as_tensor(np.concatenate(G) * np.float32(args.reward_scale))
        t1 = time.perf_counter()
        fit_to_labels(agent, opt, xb, yb, gb, args.bc_epochs)
        with torch.no_grad():
            right = torch.as_tensor(agent.greedy(xb)) == yb
        fit, count_fit = float(right.all(1).float().mean()), float(right[:, -1].float().mean())
        return len(Xa), time.perf_counter() - t1, fit, count_fit

    first = 0
    if args.dagger_data is not None:
        with np.load(args.dagger_data) as d:
            X, Y, G, R = [d["features"]], [d["labels"]], [d["returns"]], [d["round"].astype(np.int16)]
        first = int(R[0].max()) + 1
        n_states, fit_s, fit, count_fit = fit_all()
        rounds.append({"round": f"0-{first - 1}", "player": f"kept: {args.dagger_data}", "data_set": n_states,
                       "fit_wall_s": round(fit_s, 1), "fit_accuracy_all_heads": round(fit, 4),
                       "fit_accuracy_count_head": round(count_fit, 4)})
        log.info("DAgger data %s", rounds[-1])
    n = args.dagger_episodes
    for r in range(first, args.dagger_rounds + 1):
        seeds = train_seeds(n, offset=TRAIN_SEED_LIMIT - (r + 1) * n)
        student = None if r == 0 else (agent.export(), weights_meta(agent, rms, args))
        t0 = time.perf_counter()
        eps = [e for part in envs.play("dagger", seeds, (args.gamma, args.teacher, student)) for e in part]
        label_s = time.perf_counter() - t0
        X += [e.features for e in eps]
        Y += [e.labels for e in eps]
        G += [e.returns for e in eps]
        R += [np.full(len(e.labels), r, np.int16) for e in eps]
        n_states, fit_s, fit, count_fit = fit_all()
        rounds.append({"round": r, "player": "expert" if r == 0 else "student", "episodes": len(eps),
                       "labelled_states": int(sum(len(e.labels) for e in eps)), "data_set": n_states,
                       "label_wall_s": round(label_s, 1), "fit_wall_s": round(fit_s, 1),
                       "player_mean_score": round(float(np.mean([e.score for e in eps])), 4),
                       "student_agreement_before_fit": None if r == 0 else
                       round(float(np.mean([e.agreement for e in eps])), 4),
                       "fit_accuracy_all_heads": round(fit, 4), "fit_accuracy_count_head": round(count_fit, 4)})
        log.info("DAgger round %s", rounds[-1])
    return {"rounds": rounds, "expert": args.teacher}


def rival_names(args: Args) -> list[str]:
    """Who learning is compared with on the validation seeds: tuned_static and the heuristic, the
    autoscalers on a cluster task (the routing rules on a prefix-caching one), and the teacher."""
    task = resolve_task(args.task)
    names = ["tuned_static", "heuristic"]
    if task.task_id in PREFIX_TASKS:  # the score table's rivals there (agents/planner.rivals_for)
        names += list(rivals_for(task))
    elif task.is_cluster:
        names += ["hpa", "dynamo_planner"]
        if args.encoding == "family":  # the day-plan rules are the families' best rivals (README)
            names += ["operator", "schedule"]
    # a planner teacher is left out: validating it costs hours; its test-seed scores are docs/benchmarks.md's
    if args.init in ("bc", "dagger") and args.teacher not in names and args.teacher not in PLANNERS:
        names.append(args.teacher)
    return names


def validate_rivals(args: Args, envs: ShardedVecEnv) -> dict[str, float]:
    """The rivals' scores (`rival_names`) on the validation seeds."""
    out = {}
    for name in rival_names(args):
        try:
            out[name] = mean_score(envs, make_policy(name, args.task), args)
        except NotTunedError:
            continue
    return out


def initial_action(task: str, how: str) -> ServeAction:
    """The configuration learning starts around (tuned on training seeds; vLLM's default otherwise)."""
    if how == "tuned_static":
        try:
            return tuned_action(task)
        except NotTunedError:
            return VLLM_DEFAULT
    if how == "vllm_default":
        return VLLM_DEFAULT
    raise ValueError(f"init must be bc, heuristic, tuned_static, vllm_default or uniform, not {how!r}")


def save(agent: Agent, rms: RunningMeanStd, args: Args, meta: dict) -> Path:
    args.weights_dir.mkdir(parents=True, exist_ok=True)
    npz = args.weights_dir / f"{args.task}.npz"
    np.savez(npz, **agent.export())  # type: ignore[arg-type]  # numpy's stub reads **kwds as allow_pickle
    meta = {
        "task": args.task,
        **weights_meta(agent, rms, args),
        "command": args.command,
        "git_commit": git_commit(),
        "hyperparameters": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in dataclasses.asdict(args).items() if k != "command"},
        **meta,
    }
    npz.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return npz


# ----------------------------------------------------------------------------------------------
def train(args: Args) -> dict:
    if args.init == "follow" and not args.advice:
        raise ValueError("--init follow needs --advice true")
    if args.init == "bc" and args.advice:
        raise ValueError("--init bc (behaviour cloning) is for --advice false; with advice use follow")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    torch.use_deterministic_algorithms(True)
    run_dir = args.run_path
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("run folder %s; the actor goes to %s/%s.npz", run_dir, args.weights_dir, args.task)
    writer = SummaryWriter(str(run_dir))
    csv_file = (run_dir / "progress.csv").open("w", newline="")
    progress_log = csv.writer(csv_file)
    progress_log.writerow(["update", "global_step", "sps", "episodes", "mean_score", "mean_return", "val_score",
                  "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"])

    started = time.perf_counter()
    task = resolve_task(args.task)
    nvec, obs_dim = view_dims(task, args.advice, args.encoding)
    envs = ShardedVecEnv(args.task, args.num_envs, args.num_workers, args.seed, args.advice, args.encoding)
    agent = Agent(obs_dim, nvec, args.hidden)
    rms = RunningMeanStd((obs_dim,))
    bc: dict = {}
    if args.init == "bc":
        bc = behaviour_clone(agent, rms, args, envs)
        writer.add_scalar("init/bc_accuracy", bc["accuracy"], 0)
    elif args.init == "dagger":
        bc = dagger_clone(agent, rms, args, envs)
    elif args.init == "follow":
        agent.start_near(np.asarray(FOLLOW), args.init_prob)
    elif args.init != "uniform":
        start_action = initial_action(args.task, args.init)
        # on a cluster task the replica head starts at "keep" (a step every window would walk to a bound);
        # the task's view encodes it (a count head, an affinity head where it has them)
        keep = start_action.replicas or task.initial_replicas
        if args.advice:  # the advice grid: the plain action's indices, as the Advisor reads them
            start_idx = encode_action(start_action, task.replicas, keep)
        else:
            view = make_view(task, False, args.encoding)
            view.encoder.current_replicas = keep
            start_idx = view.encode(start_action)
        agent.start_near(start_idx, args.init_prob)

    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    N, T = args.num_envs, args.rollout_steps
    obs_buf = torch.zeros((T, N, obs_dim))
    act_buf = torch.zeros((T, N, len(nvec)), dtype=torch.long)
    logp_buf = torch.zeros((T, N))
    rew_buf = torch.zeros((T, N))
    done_buf = torch.zeros((T, N))
    val_buf = torch.zeros((T, N))

    next_raw = envs.first_obs
    rms.update(next_raw)
    next_done = torch.zeros(N)
    ep_return = np.zeros(N)
    recent_scores: list[float] = []
    recent_returns: list[float] = []
    # One sampling stream per worker: shards are served in whatever order their steps finish, and
    # a stream of each shard's own keeps its actions, and so the whole run, reproducible.
    gens = [torch.Generator().manual_seed(args.seed * 1_000 + w) for w in range(len(envs.shards))]
    # Where learning starts, and the rivals, on the same validation seeds.
    rivals = validate_rivals(args, envs)
    best = {"val_score": validate(agent, rms, args, envs), "update": 0, "global_step": 0}
    save(agent, rms, args, {"status": "in training", "best": best})
    log.info("validation: start %.4f, rivals %s, bc %s", best["val_score"], rivals, bc)
    global_step, episodes = 0, 0
    env_time = 0.0
    raw_buf = np.zeros((T, N, obs_dim), np.float32)

    def act(w: int, t: int, obs: torch.Tensor) -> None:
        """Choose worker w's actions for rollout step t from its normalised observations, and send them."""
        sl = envs.shards[w]
        obs_buf[t, sl], done_buf[t, sl] = obs[sl], next_done[sl]
        with torch.no_grad():
            action, logp, _, value = agent.get_action_and_value(obs[sl], generator=gens[w])
        val_buf[t, sl], act_buf[t, sl], logp_buf[t, sl] = value.flatten(), action, logp
        envs.send_step(w, action.numpy())

    bar = cli.progress(range(1, args.num_updates + 1), desc=f"PPO {args.task}", unit="upd", quiet=args.quiet)
    loop_started = time.perf_counter()  # after the start-up (workers, behaviour cloning, rivals, first validation)
    for update in bar:
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (update - 1.0) / args.num_updates)
        # Observations are normalised with the statistics as they stood when the rollout began;
        # they take in the rollout's observations once it is complete (in (t, env) order).
        next_obs = torch.as_tensor(rms.normalize(next_raw, args.obs_clip, args.obs_epsilon))
        t_of = [0] * len(envs.shards)
        finished: list[tuple[int, int, float, float]] = []  # (t, env, score, return)

        running = list(range(len(envs.shards)))
        for w in running:
            act(w, 0, next_obs)
        while running:
            t_env = time.perf_counter()
            arrived = envs.ready(running)
            env_time += time.perf_counter() - t_env
            for w in arrived:
                raw, reward, done, score = envs.recv_step(w)
                sl, t = envs.shards[w], t_of[w]
                raw_buf[t, sl] = next_raw[sl] = raw
                shaped = reward + args.score_coef * np.where(done, np.nan_to_num(score), 0.0)
                rew_buf[t, sl] = torch.as_tensor(shaped * args.reward_scale, dtype=torch.float32)
                next_obs[sl] = torch.as_tensor(rms.normalize(raw, args.obs_clip, args.obs_epsilon))
                next_done[sl] = torch.as_tensor(done, dtype=torch.float32)
                ep_return[sl] += reward
                for i in np.flatnonzero(done):
                    env = sl.start + int(i)
                    finished.append((t, env, float(score[i]), float(ep_return[env])))
                    ep_return[env] = 0.0
                t_of[w] += 1
                if t_of[w] < T:
                    act(w, t_of[w], next_obs)
                else:
                    running.remove(w)
        global_step += N * T
        rms.update(raw_buf.reshape(-1, obs_dim))
        for _, _, score_i, return_i in sorted(finished):
            episodes += 1
            recent_scores.append(score_i)
            recent_returns.append(return_i)

        # GAE over the rollout, bootstrapping from the value of the observation after it.
        with torch.no_grad():
            next_value = agent.get_value(next_obs).flatten()
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                nonterminal = 1.0 - (next_done if t == T - 1 else done_buf[t + 1])
                nv = next_value if t == T - 1 else val_buf[t + 1]
                delta = rew_buf[t] + args.gamma * nv * nonterminal - val_buf[t]
                last = delta + args.gamma * args.gae_lambda * nonterminal * last
                adv[t] = last
            ret = adv + val_buf

        b_obs, b_act = obs_buf.reshape(-1, obs_dim), act_buf.reshape(-1, len(nvec))
        b_logp, b_adv, b_ret, b_val = logp_buf.reshape(-1), adv.reshape(-1), ret.reshape(-1), val_buf.reshape(-1)
        idx = np.arange(args.batch_size)
        clipfracs: list[float] = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(idx)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = idx[start : start + args.minibatch_size]
                _, newlogp, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_act[mb])
                logratio = newlogp - b_logp[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                mb_adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio,
                                    -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_clipped = b_val[mb] + torch.clamp(newvalue - b_val[mb], -args.clip_coef, args.clip_coef)
                    v_loss = 0.5 * torch.max((newvalue - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_ret[mb]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        val_score = float("nan")
        out_of_time = args.max_wall_s is not None and time.perf_counter() - started >= args.max_wall_s
        if update % args.val_every == 0 or update == args.num_updates or out_of_time:
            val_score = validate(agent, rms, args, envs)
            writer.add_scalar("charts/val_score", val_score, global_step)
            if val_score > best["val_score"]:
                best = {"val_score": val_score, "update": update, "global_step": global_step}
                save(agent, rms, args, {"status": "in training", "best": best})
        sps = global_step / (time.perf_counter() - started)
        mean_score = float(np.mean(recent_scores[-2 * N:])) if recent_scores else float("nan")
        mean_return = float(np.mean(recent_returns[-2 * N:])) if recent_returns else float("nan")
        for name, v in (("charts/episode_score", mean_score), ("charts/episode_return", mean_return),
                        ("losses/policy_loss", pg_loss.item()), ("losses/value_loss", v_loss.item()),
                        ("losses/entropy", entropy.mean().item()), ("losses/approx_kl", approx_kl.item()),
                        ("losses/clipfrac", float(np.mean(clipfracs))), ("charts/SPS", sps)):
            writer.add_scalar(name, v, global_step)
        progress_log.writerow([update, global_step, round(sps, 1), episodes, mean_score, mean_return, val_score,
                      pg_loss.item(), v_loss.item(), entropy.mean().item(), approx_kl.item(), float(np.mean(clipfracs))])
        csv_file.flush()
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(score=f"{mean_score:.3f}", val=f"{best['val_score']:.3f}", sps=f"{sps:.0f}")
        if not np.isnan(val_score):
            log.info("update %d/%d: validation %.4f (best %.4f), %.0f env steps/s", update, args.num_updates,
                     val_score, best["val_score"], sps)
        if out_of_time:
            log.info("stopping after update %d: --max-wall-s %.0f s passed", update, args.max_wall_s)
            break

    loop_wall = time.perf_counter() - loop_started
    envs.close()
    wall = time.perf_counter() - started
    summary = {
        "status": "done",
        "global_steps": global_step,
        "episodes": episodes,
        "wall_s": round(wall, 1),
        "stopped_by_max_wall_s": bool(global_step < args.num_updates * args.batch_size),
        "env_steps_per_s": round(global_step / wall, 1),
        "env_step_share": round(env_time / wall, 3),
        # the rollouts and updates alone (their validation runs included): what a long run tends to
        "loop_env_steps_per_s": round(global_step / loop_wall, 1),
        "final_train_score": float(np.mean(recent_scores[-2 * N:])) if recent_scores else None,
        "best": best,
        "validation_seeds": validation_seeds(args.val_episodes),
        "validation_rivals": rivals,
        "behaviour_cloning": bc,
    }
    # Re-write the JSON of the best checkpoint with the finished run's summary.
    best_json = args.weights_dir / f"{args.task}.json"
    meta = json.loads(best_json.read_text())
    meta.update(summary)
    best_json.write_text(json.dumps(meta, indent=2) + "\n")
    writer.close()
    csv_file.close()
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    summary = train(args)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
