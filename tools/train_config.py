"""train.py's settings and command line, without torch (so `--help` and argument errors need no
`train` extra, and the checks run before any worker starts or any file is written).

Where a run writes: `runs/<task>__s<seed>/` holds the training curves and the exported actor
(`<task>.npz` + `.json`). The shipped actor that the `ppo` policy, the server and evaluate.py
load, `weights/<task>.npz`, is replaced only with `--replace-shipped-weights`.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from llmserve_env.agents.ppo_policy import WEIGHTS_DIR
from llmserve_env.agents.seeds import TRAIN_SEED_LIMIT
from llmserve_env.agents.views import ENCODINGS, view_dims
from llmserve_env.shared.tasks import CLUSTER_TASKS, PREFIX_TASKS, TaskSpec
from llmserve_env.shared.workloads import resolve_task
from llmserve_env.tools import cli

ROOT = Path(__file__).resolve().parents[1]  # the repository root (runs/ lives there)
INITS = ("bc", "heuristic", "follow", "tuned_static", "vllm_default", "uniform", "dagger")
# Whom `--init bc` imitates: the tuned heuristic, a rival (the autoscalers on cluster tasks only, the
# routing rules on the prefix-caching tasks only), or the sampled planner (agents/planner.py: ~0.1-0.2 s a
# decision, so its demonstrations are the slow part).
ROUTING_TEACHERS = ("least_work", "llmd_scorer", "dynamo_kv")
TEACHERS = ("heuristic", "tuned_static", "hpa", "dynamo_planner", "planner", "operator", "schedule",
            *ROUTING_TEACHERS)
# DAgger's experts: the policies that label states they did not choose (tools/dagger.py says how)
DAGGER_EXPERTS = ("operator", "schedule", "planner", *ROUTING_TEACHERS)


@dataclass
class Args:
    task: str = "adversarial_multitenant"
    total_steps: int = 120_000  # environment steps (windows) over the whole run, all envs together
    seed: int = 0
    num_envs: int = 16
    num_workers: int = 2  # processes stepping environments (one per core)
    rollout_steps: int = 64  # windows per env per rollout (one episode of a 64-window task)
    learning_rate: float = 3e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 8
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.003
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    hidden: int = 64
    # advice: the tuned heuristic's proposal is an input and each knob is followed or nudged
    # (agents/advice.py; use with --init follow); off, the agent acts on the plain grid. The
    # shipped weights were trained without it (see README, "PPO against the rivals").
    advice: bool = False
    # start from: bc (behaviour cloning of `teacher`), heuristic (= bc with teacher heuristic, the
    # name of earlier runs), follow (the heuristic exactly; needs advice), tuned_static, vllm_default, uniform
    init: str = "bc"
    teacher: str = "heuristic"
    init_prob: float = 0.8  # follow / tuned_static / vllm_default: initial probability of that choice, per knob
    bc_episodes: int = 32  # bc: episodes of the teacher to imitate (training seeds)
    bc_epochs: int = 30
    # the view of the environment: default (agents/encoding.py, every shipped fixed-day actor) or family
    # (agents/family_features.py: rate history, announced jobs, a replica count head; cluster tasks only)
    encoding: str = "default"
    dagger_rounds: int = 4  # --init dagger: rounds where the student plays and the expert labels (after round 0)
    dagger_episodes: int = 16  # --init dagger: training episodes per round
    # --init dagger: an earlier run's labelled states (its dagger_data.npz) to go on from, not play again
    dagger_data: Path | None = None
    obs_clip: float = 10.0
    obs_epsilon: float = 1e-8
    reward_scale: float = 1.0
    # Training-only shaping: add score_coef x the grader's episode score to the last window's
    # reward. The step reward sums goodput over tenants, while the grade also weighs the worst
    # tenant, quality and cost multiplicatively; the bonus points learning at the grade itself.
    score_coef: float = 0.0
    val_every: int = 10  # updates between validation runs
    # a wall-clock budget: the run stops after the update that passes it (validated then), as if it were the last
    max_wall_s: float | None = None
    val_episodes: int = 16
    torch_threads: int = 1
    # Where the exported actor goes: None = this run's folder (run_dir/<task>__s<seed>/).
    out_dir: Path | None = None
    run_dir: Path = ROOT / "runs"
    quiet: bool = False  # no progress bar
    command: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.init == "heuristic":  # the earlier name of behaviour cloning from the heuristic
            if self.teacher != "heuristic":
                raise ValueError(f"--init heuristic clones the heuristic; for teacher {self.teacher!r} use --init bc")
            self.init = "bc"

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.rollout_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return max(1, self.total_steps // self.batch_size)

    @property
    def run_path(self) -> Path:
        """This run's folder: training curves, TensorBoard events and (by default) the actor."""
        return self.run_dir / f"{self.task}__s{self.seed}"

    @property
    def weights_dir(self) -> Path:
        return self.out_dir if self.out_dir is not None else self.run_path


HELP: dict[str, str] = {
    "task": "task to train on",
    "total_steps": "total environment steps (windows); at least one rollout (num_envs x rollout_steps)",
    "seed": "seed of the run (environments, sampling, initialisation)",
    "num_envs": "environments stepped in parallel",
    "num_workers": "processes stepping the environments (one per core), 1..num_envs",
    "rollout_steps": "windows per environment per rollout (64 = one episode of a built-in task)",
    "learning_rate": "Adam step size",
    "anneal_lr": "decay the learning rate linearly to 0 over the run",
    "gamma": "discount factor, 0..1",
    "gae_lambda": "GAE lambda, 0..1",
    "num_minibatches": "minibatches per update epoch (must divide num_envs x rollout_steps)",
    "update_epochs": "passes over each rollout",
    "clip_coef": "PPO clipping range",
    "clip_vloss": "clip the value loss as well",
    "ent_coef": "entropy bonus weight",
    "vf_coef": "value loss weight",
    "max_grad_norm": "gradient norm clip",
    "target_kl": "stop an update's epochs early past this approximate KL (None: never)",
    "hidden": "hidden units per layer of the actor and critic MLPs",
    "advice": "give the tuned heuristic's proposal as input; each knob is followed or nudged (agents/advice.py)",
    "init": "where learning starts: bc (behaviour cloning of --teacher; not with --advice true), heuristic "
            "(= bc with --teacher heuristic), follow (the heuristic exactly; needs --advice true), tuned_static, "
            "vllm_default, uniform or dagger (the student plays, --teacher labels its states, several rounds; "
            "needs --encoding family)",
    "teacher": "--init bc: whom to imitate: heuristic, tuned_static, hpa, dynamo_planner, operator or schedule "
               "(the last four on cluster tasks), least_work, llmd_scorer or dynamo_kv (the routing rules, on the "
               "prefix-caching tasks), or planner (the sampled rollout planner, 0.1-5 s a decision); "
               "--init dagger: the expert labelling the student's states, operator, schedule, planner (decides "
               "on each state, then follows the student's action; seconds a decision) or a routing rule",
    "init_prob": "follow / tuned_static / vllm_default: initial probability of that choice per knob, in (0, 1)",
    "bc_episodes": "--init bc: the teacher's episodes to imitate (training seeds)",
    "bc_epochs": "--init bc: passes over the demonstrations; --init dagger: passes over the data set each round",
    "encoding": "the actor's view: default (agents/encoding.py) or family (agents/family_features.py: arrival "
                "history per tenant, announced jobs, starting replicas, a replica count head; cluster tasks)",
    "dagger_rounds": "--init dagger: rounds after the expert's own (round 0) where the student plays and the "
                     "expert labels its states (tools/dagger.py)",
    "dagger_episodes": "--init dagger: training episodes per round",
    "dagger_data": "--init dagger: go on from an earlier run's labelled states (its run folder's dagger_data.npz, "
                   "rounds 0..m, the same task, --dagger-episodes and view): they are fitted first and the "
                   "rounds m+1..--dagger-rounds are played, on the seeds those rounds would have had (none with "
                   "--dagger-rounds m: the student is fitted to them alone)",
    "obs_clip": "clip normalised observations to +-this",
    "obs_epsilon": "variance floor of the observation normalisation",
    "reward_scale": "multiply rewards by this while learning",
    "score_coef": "add this x the grader's episode score to the last window's reward (training only)",
    "val_every": "updates between validation runs",
    "max_wall_s": "stop after the update that passes this many seconds of wall time, validating it (None: run "
                  "all of --total-steps)",
    "val_episodes": "validation episodes (validation seeds, never the evaluation seeds)",
    "torch_threads": "torch threads of the learner",
    "out_dir": "write the exported actor here instead of the run folder (not weights/: see "
               "--replace-shipped-weights)",
    "run_dir": "parent of the run folder <task>__s<seed>/ (curves, TensorBoard events, the actor)",
    "quiet": "no progress bar",
}
POSITIVE_INTS = ("num_envs", "num_workers", "rollout_steps", "num_minibatches", "update_epochs", "hidden",
                 "val_every", "val_episodes", "torch_threads", "bc_episodes", "dagger_episodes")
NON_NEGATIVE_INTS = ("seed", "bc_epochs", "dagger_rounds")
POSITIVE_FLOATS = ("learning_rate", "clip_coef", "max_grad_norm", "obs_clip", "obs_epsilon", "reward_scale")
NON_NEGATIVE_FLOATS = ("ent_coef", "vf_coef", "score_coef")
UNIT_FLOATS = ("gamma", "gae_lambda")


def boolean(text: str) -> bool:
    """true/false (also 1/0, yes/no); anything else is an error, never a silent False."""
    value = text.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _positive_float(text: str) -> float:
    value = cli.float_at_least(0.0)(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _unit_float(text: str) -> float:
    value = cli.float_at_least(0.0)(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in 0..1, got {text}")
    return value


def _open_unit_float(text: str) -> float:
    value = _unit_float(text)
    if value in (0.0, 1.0):
        raise argparse.ArgumentTypeError(f"expected a number strictly between 0 and 1, got {text}")
    return value


def _optional_positive_float(text: str) -> float | None:
    return None if text.strip().lower() == "none" else _positive_float(text)


def _type_of(name: str, default: object):
    if name == "task":
        return cli.task_id
    if name in ("init", "teacher", "encoding"):
        return str
    if name == "init_prob":
        return _open_unit_float
    if name in ("target_kl", "max_wall_s"):
        return _optional_positive_float
    if name in ("out_dir", "run_dir"):
        return cli.writable_dir
    if name == "dagger_data":
        return Path
    if isinstance(default, bool):
        return boolean
    if name in POSITIVE_INTS:
        return cli.int_at_least(1)
    if name in NON_NEGATIVE_INTS:
        return cli.int_at_least(0)
    if name in POSITIVE_FLOATS:
        return _positive_float
    if name in NON_NEGATIVE_FLOATS:
        return cli.float_at_least(0.0)
    if name in UNIT_FLOATS:
        return _unit_float
    if name == "total_steps":
        return cli.int_at_least(1)
    raise AssertionError(f"train_config: no argument type for {name}")  # a new field needs one


def build_parser() -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(
        prog="python tools/train.py", formatter_class=cli.HelpFormatter,
        description="PPO for LLMServeEnv (needs the `train` extra: make install-train).\n\n" + __doc__.split("\n\n", 1)[1],
    )
    for f in dataclasses.fields(Args):
        if f.name in ("command", "quiet"):
            continue
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict = {"type": _type_of(f.name, f.default), "default": f.default, "help": HELP[f.name]}
        if f.name == "init":
            kwargs["choices"] = INITS
        if f.name == "teacher":
            kwargs["choices"] = TEACHERS
        if f.name == "encoding":
            kwargs["choices"] = ENCODINGS
        ap.add_argument(flag, **kwargs)
    ap.add_argument("--replace-shipped-weights", action="store_true",
                    help=f"write the actor into {WEIGHTS_DIR}/<task>.npz/.json, replacing the shipped one "
                         "that the `ppo` policy, the server and evaluate.py load")
    cli.add_output_options(ap)
    return ap


def dagger_data_problem(path: Path, task: TaskSpec, values: dict) -> str | None:
    """What keeps `path` from continuing this run's DAgger (None: nothing): it must be a dagger_data.npz of
    the same view (features and action grid), whole episodes, --dagger-episodes of them in each round, and
    no more rounds than --dagger-rounds + 1 (as many: the student is fitted to them and no round is played)."""
    if values["init"] != "dagger":
        return f"only with --init dagger (got --init {values['init']})"
    try:
        with np.load(path) as d:
            x, y, g, rounds = d["features"], d["labels"], d["returns"], d["round"]
    except (OSError, ValueError, KeyError) as exc:
        return f"{path}: not a run folder's dagger_data.npz ({exc})"
    nvec, dim = view_dims(task, values["advice"], values["encoding"])
    if x.ndim != 2 or x.shape[1] != dim or y.shape != (x.shape[0], len(nvec)) or rounds.shape != (x.shape[0],) \
            or g.shape != (x.shape[0],):
        return (f"{path}: states of {x.shape[1:]} features and {y.shape[1:]} labels; {task.task_id}'s view has "
                f"{dim} features and {len(nvec)} heads")
    per_round = values["dagger_episodes"] * task.horizon
    last = int(rounds.max()) if rounds.size else -1
    if rounds.size == 0 or any(int((rounds == r).sum()) != per_round for r in range(last + 1)):
        return (f"{path}: every round 0..{last} must hold --dagger-episodes ({values['dagger_episodes']}) "
                f"episodes of {task.horizon} windows ({per_round} states)")
    if last > values["dagger_rounds"]:
        return (f"{path} holds rounds 0..{last}: --dagger-rounds must be at least {last} ({last}: fit them and "
                "play none)")
    return None


def parse_args(argv: list[str]) -> Args:
    """Args from the command line; every error is argparse's (one line, exit 2) and comes before any work."""
    ap = build_parser()
    ns = ap.parse_args(argv)
    cli.configure_logging(ns)
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(Args) if f.name not in ("command", "quiet")}
    task = resolve_task(values["task"])
    if values["init"] not in ("bc", "heuristic", "dagger") and values["teacher"] != "heuristic":
        ap.error(f"argument --teacher: only with --init bc or dagger (got --init {values['init']})")
    if values["encoding"] == "family" and not task.is_cluster:
        ap.error(f"argument --encoding: the family view has a replica count head; {values['task']!r} is a "
                 "single-server task")
    if values["init"] == "dagger" and values["encoding"] != "family":
        ap.error("argument --init: dagger labels states with the family view's grid: add --encoding family")
    if values["init"] in ("bc", "heuristic") and values["encoding"] == "family":
        ap.error("argument --init: with --encoding family clone through dagger (--dagger-rounds 0 is plain "
                 "behaviour cloning of the expert's own episodes)")
    if values["init"] == "dagger" and (values["dagger_rounds"] + 1) * values["dagger_episodes"] > TRAIN_SEED_LIMIT:
        ap.error("argument --dagger-episodes: the rounds need more training seeds than there are")
    if values["dagger_data"] is not None:
        problem = dagger_data_problem(values["dagger_data"], task, values)
        if problem:
            ap.error(f"argument --dagger-data: {problem}")
    if values["init"] == "dagger" and values["teacher"] not in DAGGER_EXPERTS:
        ap.error(f"argument --teacher: DAgger's expert must label states it did not choose: one of "
                 f"{', '.join(DAGGER_EXPERTS)} (tools/dagger.py)")
    if values["teacher"] in ("hpa", "dynamo_planner", "operator", "schedule") and not task.is_cluster:
        ap.error(f"argument --teacher: {values['teacher']} autoscales the cluster tasks "
                 f"({', '.join(CLUSTER_TASKS)}); {values['task']!r} is a single-server task")
    if values["teacher"] in ROUTING_TEACHERS and not task.caches_prefixes:
        ap.error(f"argument --teacher: {values['teacher']} routes the prefix-caching tasks "
                 f"({', '.join(PREFIX_TASKS)}); {values['task']!r} is not one")
    if values["advice"] and task.is_cluster:
        ap.error(f"argument --advice: the heuristic's advice is for single-server tasks; {values['task']!r} "
                 "is a cluster task")
    try:  # Args checks what holds for every caller (--init heuristic with another teacher)
        args = Args(**values, quiet=ns.quiet, command="python tools/train.py " + " ".join(argv))
    except ValueError as exc:
        ap.error(f"argument --teacher: {exc}")
    shipped = WEIGHTS_DIR.resolve()
    if ns.replace_shipped_weights:
        if args.out_dir is not None and args.out_dir.resolve() != shipped:
            ap.error("argument --out-dir: not allowed with --replace-shipped-weights (which writes into "
                     f"{WEIGHTS_DIR})")
        args.out_dir = WEIGHTS_DIR
    elif args.out_dir is not None and args.out_dir.resolve() == shipped:
        ap.error(f"argument --out-dir: {args.out_dir} holds the shipped weights; pass --replace-shipped-weights "
                 "to replace them")
    if args.total_steps < args.batch_size:
        ap.error(f"argument --total-steps: expected at least one rollout, num_envs x rollout_steps = {args.batch_size}, "
                 f"got {args.total_steps}")
    if args.num_workers > args.num_envs:
        ap.error(f"argument --num-workers: expected 1..num_envs ({args.num_envs}), got {args.num_workers}")
    if args.batch_size % args.num_minibatches:
        ap.error(f"argument --num-minibatches: must divide num_envs x rollout_steps ({args.batch_size}), "
                 f"got {args.num_minibatches}")
    if args.init == "follow" and not args.advice:
        ap.error("argument --init: follow needs --advice true")
    if args.init == "bc" and args.advice:
        ap.error("argument --init: bc/heuristic (behaviour cloning) is for --advice false; with advice use follow")
    if args.init == "bc" and args.bc_episodes > TRAIN_SEED_LIMIT:
        ap.error(f"argument --bc-episodes: expected at most {TRAIN_SEED_LIMIT} (training seeds), got {args.bc_episodes}")
    return args
