"""A trained PPO actor served with numpy alone (torch is only needed to train it).

Weights are written by train.py as `weights/<task>.npz` (the actor's layers) beside
`weights/<task>.json` (observation normalisation, the training command, commit and scores):

    npz: actor_w0 (OBS_DIM, H), actor_b0 (H,), ..., actor_wL (H, sum(nvec)), actor_bL, nvec
    json: {"obs_norm": {"mean": [...], "var": [...], "clip": c, "epsilon": e}, "activation": "tanh", ...}

The action is the most likely choice of each head (deterministic), decoded through the same
grid the Gymnasium wrapper trained on. Weights trained with advice (`"advice": "heuristic"` in
the JSON, agents/advice.py) run the task's tuned heuristic beside the actor: its proposal is
appended to the features and each head's choice 0 means "follow the proposal". Weights for a
cluster task carry `"replicas_range": [lo, hi]` in the JSON: their grid has the `replicas` head
and their features the cluster state (agents/encoding.py); single-server weights have neither.
Weights whose JSON says `"encoding": "family-v1"` (the scenario families, issue 28) use
agents/family_features.py's view instead: richer inputs and a replica count head.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llmserve_env.agents.prefix_view import has_affinity_head, uses_prefix_view
from llmserve_env.agents.views import View, encoding_of, make_view, weights_shape
from llmserve_env.shared import portable_math as pm
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import get_task, is_cluster_range

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"


class WeightsNotFoundError(FileNotFoundError):
    """No trained weights for this task (train them with train.py)."""


@dataclass(frozen=True)
class ActorWeights:
    """An MLP actor: tanh hidden layers, one linear head of concatenated logits."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    nvec: tuple[int, ...]
    obs_mean: np.ndarray
    obs_var: np.ndarray
    obs_clip: float
    obs_epsilon: float
    meta: dict

    @classmethod
    def load(cls, npz_path: Path) -> ActorWeights:
        json_path = npz_path.with_suffix(".json")
        if not npz_path.exists() or not json_path.exists():
            raise WeightsNotFoundError(f"no trained weights at {npz_path} (+ .json); run train.py first")
        meta = json.loads(json_path.read_text())
        with np.load(npz_path) as z:
            return cls.from_arrays({k: z[k] for k in z.files}, meta)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: dict) -> ActorWeights:
        """The actor from the npz layout's arrays and the JSON's metadata (`obs_norm`, `advice`, ...);
        train.py builds its validation actor this way without a round trip through files."""
        n = sum(1 for k in arrays if k.startswith("actor_w"))
        norm = meta["obs_norm"]
        w = cls(
            layers=tuple((np.asarray(arrays[f"actor_w{i}"], np.float64), np.asarray(arrays[f"actor_b{i}"], np.float64))
                         for i in range(n)),
            nvec=tuple(int(v) for v in arrays["nvec"]),
            obs_mean=np.asarray(norm["mean"], dtype=np.float64),
            obs_var=np.asarray(norm["var"], dtype=np.float64),
            obs_clip=float(norm["clip"]),
            obs_epsilon=float(norm["epsilon"]),
            meta=meta,
        )
        w.check()
        return w

    @property
    def advice(self) -> bool:
        return self.meta.get("advice") == "heuristic"

    @staticmethod
    def replicas_meta(replicas: tuple[int, int]) -> dict[str, list[int]]:
        """What a trainer writes into the JSON for this replica range (read back by `replicas`): the range on
        a cluster task, nothing on a single-server one, so single-server weights stay as before."""
        return {"replicas_range": list(replicas)} if is_cluster_range(replicas) else {}

    @property
    def replicas(self) -> tuple[int, int]:
        """The replica range the weights were trained for ((1, 1): a single-server task)."""
        lo, hi = self.meta.get("replicas_range") or (1, 1)
        return int(lo), int(hi)

    def check(self) -> None:
        """Shapes must match the encoder and action grid this code was built with."""
        # the view named in the JSON: the family view's, and the prefix view's affinity head (agents/views.py)
        nvec, dim = weights_shape(self.meta, self.advice, self.replicas)
        if self.nvec != nvec:
            raise ValueError(f"weights were trained for action grid {self.nvec}, this code uses {nvec}")
        if self.layers[0][0].shape[0] != dim or self.obs_mean.shape != (dim,):
            raise ValueError(f"weights expect {self.layers[0][0].shape[0]} features, the encoder makes {dim}")
        if self.layers[-1][0].shape[1] != sum(self.nvec):
            raise ValueError("last layer width does not match the action heads")

    def logits(self, features: np.ndarray) -> list[np.ndarray]:
        x = np.clip((features - self.obs_mean) / np.sqrt(self.obs_var + self.obs_epsilon), -self.obs_clip, self.obs_clip)
        for i, (w, b) in enumerate(self.layers):
            # x @ w summed row by row in order, and C's tanh: BLAS's kernels and NumPy's tanh are the CPU's own, and
            # their last bit (which differs between machines: shared/portable_math.py) can flip an argmax near a tie
            x = (x[:, None] * w).sum(axis=0) + b
            if i < len(self.layers) - 1:
                x = pm.tanh(x)
        return np.split(x, np.cumsum(self.nvec)[:-1])


class PPOPolicy:
    """Greedy PPO actor for one task, from `weights/<task>.npz`."""

    def __init__(self, task_id: str, weights_path: str | Path | None = None, weights: ActorWeights | None = None):
        """Weights from `weights_path` (default weights/<task>.npz), or `weights` already in memory."""
        if weights is None:
            weights = ActorWeights.load(Path(weights_path) if weights_path else WEIGHTS_DIR / f"{task_id}.npz")
        self.weights = weights
        self.name = "ppo"
        task = get_task(task_id)
        if self.weights.replicas != task.replicas:
            raise ValueError(f"weights were trained for replicas {self.weights.replicas}, task {task_id!r} "
                             f"allows {task.replicas}")
        if has_affinity_head(self.weights.meta) != uses_prefix_view(task):
            raise ValueError(f"weights were trained {'with' if has_affinity_head(self.weights.meta) else 'without'} "
                             f"the prefix view's cache_affinity head; task {task_id!r} has "
                             f"{'it' if uses_prefix_view(task) else 'none'}")
        self._view: View = make_view(task, self.weights.advice, encoding_of(self.weights.meta))

    def reset(self) -> None:
        self._view.reset()

    def act(self, obs: ServeObservation) -> ServeAction:
        x = self._view.features(obs)
        return self._view.decode([int(np.argmax(h)) for h in self.weights.logits(x.astype(np.float64))])
