"""The rollout planner: one step of policy improvement over every base policy (Bertsekas' rollout algorithm).

    python tools/evaluate.py --agent planner,operator --task diurnal_autoscale --episodes 5
    python tools/evaluate.py --agent clairvoyant --task diurnal_autoscale   # an upper bound, not a policy

Each window, for each candidate first action, the planner forks the episode, serves this window with the
candidate and plays each base policy from there to the episode's end, scores the finished branch with the
grader's own formula (`core.grader.objective`), and commits the candidate whose best continuation scores
highest (Bertsekas, "Rollout, Policy Iteration, and Distributed Reinforcement Learning", 2020, ch. 2: the
rollout policy of a set of base policies is at least as good as each of them).

- Base policies (`bases`): on cluster tasks every rival (`RIVALS_TO_BEAT`: tuned_static, hpa,
  dynamo_planner, operator, schedule); on single-server tasks tuned_static and the heuristic. Each base
  policy is a tracker that sees every real observation (its controllers keep state); a rollout plays a
  copy of it, so a continuation starts where the base policy itself stands.
- Candidates: each base policy's own proposal for this window, and variants of the incumbent's action
  that bridge a cold start (INT8, batch cap x2, speculation off: faster service from the replicas already
  ready while new ones start) and move the replica count one either way (cluster tasks).
- Screening (`keep`): every base policy's own proposal continued by itself, and every variant continued by
  the incumbent's base policy; then the `keep` best candidates with every other base policy.

Information modes, named in every output (`name`):

- `clairvoyant`: the rollouts see the episode's true future arrivals. The planner keeps the incumbent (the
  best finished branch found so far, as its list of actions) and replaces it only by a strictly better
  one, committing its next action (the "fortified" rollout). At the first window the incumbent is the best
  base policy's own episode, so the planner's grade is at least every base policy's grade on every seed,
  by construction (tests/test_planner.py checks it). An upper bound, never a policy ("clairvoyant_bound").
- `sampled` (default, the fair policy): the rollouts' arrivals (this window included) are `samples` futures
  drawn by `forecast`. On a scenario family (`posterior`, agents/forecast.py): from the day's posterior
  given the episode so far (the cycle's parameters weighted by the counts observed, the noise's expected
  path from the last window, the announced jobs, a running job continued, the unseen jobs drawn). On any
  other task (`nearest`): the task's own workload model under other seeds (`samples` of a pool of `pool`
  training seeds, the ones whose arrival counts over the last `match_windows` windows are nearest the
  counts observed; on a multi-turn chat, that day's conversations that start from now on plus a draw of
  the next turns of the episode's own running conversations, `running_turns`, so the rollouts resend
  histories the replicas have cached). A candidate's value is the best base policy's mean over the samples (with
  `aggregate="worst"`, opt-in, its worst sample: a risk-averse value, docs/benchmarks.md; with `surprises=n`,
  opt-in, the mean weighted over `samples` futures without an ad-hoc job or flash crowd ahead and n with some,
  each set at its chance: agents/forecast.py `stratified`; with `surprise_peak` too, that set split again by
  whether its first surprise meets the day's peak); the grader's
  references are those of the observed past plus the sampled future. A candidate no base policy
  proposed is committed only if it beats the best base proposal by `margin` (0.01): with 2 samples, small
  gains are mostly their noise (validation seed 500,000 of multitenant_autoscale: 0.720 with no margin,
  0.789 with 0.01; deviations from every base proposal on 42 % of decisions against 8 %). With `fortify`
  (default) the base policy whose proposal was last committed keeps the window unless another base's
  proposal is valued `margin` higher too (multitenant_family validation seeds 500,000-500,003: 0.741,
  0.837, 0.690, 0.575 with it, 0.734, 0.755, 0.685, 0.562 without). The planner sees the simulator's present state exactly (the
  mirror is of the simulator, not of a real engine).

How it sees the episode: it mirrors the episode in its own simulator (a "shadow": the reset observation
names the task and seed; the simulator is deterministic), so it works through any front in sim mode;
every observation is checked against the shadow's, and a mismatch is an error, not a silent wrong plan.
Deterministic for a seed: the sample pool is drawn from `seed`, nothing else is random.

The shifted split (shared/splits.py): a planner built for a family also plays the family's shifted test
task, as every rival does, with what it was built from: its base policies tuned on the family and its
forecast's prior the family's ranges (the shift never shown). What it reads from the played day is what
the observation shows (the windows seen, the announced jobs); the mirror and the grade are the played task's.
In clairvoyant mode the mirror's future is the played day's, so the bound holds there too.

The off-family judge (`off_family=BASE`, sampled mode on a family; off by default): the rollouts' futures
are the family's, so on a day outside it they rank the bases as if it were a family day. A second
posterior (agents/forecast.py) whose prior is hedged, a quarter of its cycle particles drawn from ranges
far wider than the family's (`OFF_FAMILY_WIDE`, prior odds 1:3), is asked at every decision; once it puts
more than half its mass on the wide particles, the planner follows BASE's own proposal for that window,
without rollouts (`PlannerStats.off_family`). Where the judge stays silent, every decision is the plain
planner's (its futures still come from the family's posterior). Chosen before any shifted day was
played: the operator is the base whose forecast corrects itself by the level it observes.

Cost: (bases + variants + keep x (bases - 1)) rollouts to the episode's end per decision (measured in
docs/benchmarks.md, Headroom); `PlannerStats.cpu_s` keeps the CPU seconds spent deciding. The rollouts
play on `Episode.advance` (no pydantic observation, the step logged unvalidated), their base policies
seeing `core.episode.ObservedWindow` (`LIGHT_VIEW_BASES`; any other base gets the full observation built
from the same window); `fast_rollouts=False` plays them on `Episode.step` as before, with the same
decisions (tests/test_planner.py). The real decision path (the trackers' `act` on the real observation,
the shadow's `step`) is unchanged. Where a decision's CPU goes (diurnal_autoscale, first decisions): the
simulator's engine ~77 %, the metrics tracker's `observe` ~12 %, the rest of the episode's step (reward,
step log) ~4 %, the base policies ~1-5 %, observation building ~1 % before the fast path, the planner's
own bookkeeping (forks, clones, grading) under 1 %.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from llmserve_env.agents.base import Policy
from llmserve_env.agents.forecast import NOISE_MODES, DayForecast, OffFamilyJudge, tenant_counts
from llmserve_env.agents.seeds import TRAIN_SEED_LIMIT
from llmserve_env.agents.singles import SINGLES, make_single
from llmserve_env.core.episode import Episode, ObservedWindow, StepOutcome
from llmserve_env.core.errors import EnvError
from llmserve_env.core.grader import References, Totals, add_window, compute_references, objective
from llmserve_env.shared.arrival_list import concat_arrivals
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.day_shape import publishes_day
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.prefix import (
    MultiTurnSpec,
    as_sampled_day,
    continued_arrivals,
    conversation_starts,
    running_conversations,
)
from llmserve_env.shared.scenarios import announced_jobs, is_family
from llmserve_env.shared.splits import SHIFTED_TASKS
from llmserve_env.shared.tasks import PREFIX_TASKS, TaskSpec
from llmserve_env.shared.workloads import generate_arrivals, resolve_task, windows
from llmserve_env.sim.cluster import ClusterBackend

MODES = ("sampled", "clairvoyant")
# How a candidate's continuation is valued over the sampled futures: their mean (the rollout algorithm's
# expected value), or the worst of them (a risk-averse value: a switch must pay on every future drawn)
AGGREGATES = ("mean", "worst")
FORECASTS = ("posterior", "nearest")
# What a learner or the planner is judged against on cluster tasks (bench/score_table.py, bench/headroom.py,
# `<task>.best_rival`), and the planner's base policies there. The heuristic is not among them: it sets
# knobs only and holds the starting replicas all day (0.13 on diurnal_autoscale); a queue-feedback replica
# rule is what `hpa` is, tuned on the same seeds, so a heuristic with replica control would be hpa again.
# The registry names that plan on forks: seconds to minutes of CPU an episode (4-26 s a decision on a
# cluster task), so the score table and training validation leave them out
PLANNERS = ("planner", "clairvoyant")
RIVALS_TO_BEAT = ("tuned_static", "hpa", "dynamo_planner", "operator", "schedule")
# On the prefix-caching cluster tasks (issue 32): the field's routing rules, each tuned (agents/routing.py), the
# production autoscalers routing at a tuned cache affinity (agents/autoscale.py: they scale on what they observe,
# the only scaling rules on a trace replay that publishes no day), and where the task publishes a day
# (multiturn_cluster) the day-plan rules too, routing with a tuned cache affinity (agents/operator.py).
PREFIX_RIVALS = ("least_work", "llmd_scorer", "dynamo_kv")
SCALING_RIVALS = ("hpa", "dynamo_planner")
DAY_PLAN_RIVALS = ("operator", "schedule")
SINGLE_SERVER_BASES = ("tuned_static", "heuristic")  # vllm_default for tuned_static where none is tuned
# The base policies whose `act` reads only what `core.episode.ObservedWindow` holds (the numeric fields,
# reward, done, step_index, prefix_hit_rate and metadata["cluster"]; the Gym wrapper's fast path gives the
# same view): their rollouts play on `Episode.advance` and never build the pydantic observation. Any other
# (the LLM policy sends the whole observation as JSON; a policy added later until it is listed here) is
# given the full observation, built from the same window (tests/test_planner.py checks the list).
LIGHT_VIEW_BASES = frozenset({"random", "starve", "vllm_default", "static", "tuned_static", "heuristic", "ppo",
                              "hpa", "dynamo_planner", "operator", "schedule", "least_work", "llmd_scorer",
                              "dynamo_kv"})
# Sampled arrivals get ids far above any real one, so they never collide with the episode's own; the drawn next
# turns of the episode's running conversations (multi-turn tasks) get their own range above those.
SAMPLE_ID_BASE = 1 << 40
CONTINUED_ID_BASE = 1 << 41
# One future a rollout plays: its arrival windows (None: the episode's true ones), the grader's references, and its
# weight in a candidate's value (the futures' weights sum to 1)
Future = tuple[list[Sequence[Arrival]] | None, References, float]


class PlannerError(EnvError):
    status = 409


def rivals_for(task: TaskSpec) -> tuple[str, ...]:
    """The hand-made rules a learner or the planner is judged against on a cluster task: RIVALS_TO_BEAT, or on a
    prefix-caching task the routing rules and the autoscalers, with the day-plan rules where it publishes a day."""
    if task.task_id in PREFIX_TASKS:
        return PREFIX_RIVALS + SCALING_RIVALS + (DAY_PLAN_RIVALS if publishes_day(task) else ())
    return RIVALS_TO_BEAT


def default_bases(task: TaskSpec) -> tuple[str, ...]:
    """Every rival (`rivals_for`) on a cluster task with a published day or prefix caching; else tuned_static
    (vllm_default where none is tuned, e.g. a trace replay) and the heuristic."""
    if task.is_cluster and (task.workload.get("kind") == "cycle" or task.task_id in PREFIX_TASKS):
        return rivals_for(task)
    from llmserve_env.agents.search import tuned_entry
    from llmserve_env.agents.tuned_static import TUNED_PATH

    if tuned_entry(TUNED_PATH, task.task_id) is not None:
        return SINGLE_SERVER_BASES
    return tuple("vllm_default" if b == "tuned_static" else b for b in SINGLE_SERVER_BASES)


@dataclass(frozen=True)
class PoolDay:
    """One day of the sampled pool: its arrival windows, their counts, and (multi-turn tasks, `running_turns`)
    each arrival's conversation's first arrival, in the windows' shape."""

    windows: list[Sequence[Arrival]]
    counts: np.ndarray
    starts: list[list[float]]


@dataclass
class PlannerStats:
    decisions: int = 0
    simulated_windows: int = 0
    rollouts: int = 0
    cpu_s: float = 0.0
    changed: int = 0  # decisions where the committed action is no base policy's own proposal
    improved: int = 0  # clairvoyant: decisions where a strictly better branch replaced the incumbent
    off_family: int = 0  # decisions handed to the `off_family` base: the day judged outside the family

    def as_dict(self) -> dict[str, float]:
        n = self.decisions
        return {"decisions": n, "simulated_windows": self.simulated_windows, "rollouts": self.rollouts,
                "cpu_s_per_decision": self.cpu_s / n if n else 0.0,
                "changed_share": self.changed / n if n else 0.0,
                "improved_share": self.improved / n if n else 0.0,
                "off_family_share": self.off_family / n if n else 0.0}


@dataclass
class Branch:
    """A finished rollout: its value and the actions it took from the window it started at."""

    value: float
    start: int
    actions: list[ServeAction] = field(default_factory=list)

    def action_at(self, k: int) -> ServeAction:
        return self.actions[k - self.start]


def bridging_variants(a: ServeAction, replicas: tuple[int, int] | None) -> list[ServeAction]:
    """Knob changes that carry load while replicas start (INT8, a doubled batch cap, speculation off) and,
    on a cluster (`replicas` the task's range), one replica more or fewer."""
    out = [a.model_copy(update={"quantization_tier": "INT8" if a.quantization_tier == "FP16" else "FP16"})]
    if a.batch_cap * 2 <= 512:
        out.append(a.model_copy(update={"batch_cap": a.batch_cap * 2}))
    if a.speculation_depth:
        out.append(a.model_copy(update={"speculation_depth": 0}))
    if replicas is not None and a.replicas is not None:
        lo, hi = replicas
        out += [a.model_copy(update={"replicas": m}) for m in (a.replicas + 1, a.replicas - 1) if lo <= m <= hi]
    return out


def _clone(policy: Policy, task: TaskSpec) -> Policy:
    """An independent copy of a base policy in its current state (the task object shared, not copied)."""
    return copy.deepcopy(policy, {id(task): task})


class PlannerPolicy:
    """Rollout over base policies on forks of the episode (module docstring)."""

    def __init__(self, task_id: str, mode: str = "sampled", bases: Sequence[str] | None = None, samples: int = 2,
                 pool: int = 16, match_windows: int = 2, keep: int = 2, bridging: bool = True, margin: float = 0.01,
                 seed: int = 0, fast_rollouts: bool = True, forecast: str | None = None, fortify: bool = True,
                 wide_prior: float = 0.0, off_family: str | None = None, running_turns: bool = True,
                 aggregate: str = "mean", noise: str = "expected", surprises: int = 0, surprise_peak: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if samples < 1 or pool < samples:
            raise ValueError(f"need samples >= 1 and pool >= samples (got samples={samples}, pool={pool})")
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
        self.aggregate = aggregate
        if keep < 0:
            raise ValueError(f"keep must be >= 0 (0: only each candidate's first continuation), got {keep}")
        self.task_id = task_id
        self.task: TaskSpec = resolve_task(task_id)
        # the task the episode plays: the one built for, or its family's shifted test task (shared/splits.py),
        # played as built for the family (tuned bases, the family's forecast prior), the shift unseen
        self.played: TaskSpec = self.task
        self.base_names = tuple(bases) if bases is not None else default_bases(self.task)
        if not self.base_names:
            raise ValueError("bases must name at least one base policy")
        # every registered policy but the planner itself and its clairvoyant bound (agents/singles.py)
        unknown = [b for b in self.base_names if b not in SINGLES]
        if unknown:
            raise ValueError(f"bases must be registered policies other than the planner, got {unknown}")
        self.mode = mode
        self.samples = 1 if mode == "clairvoyant" else samples
        # how sampled futures are drawn: `posterior` (scenario families: agents/forecast.py, the day's posterior
        # given the episode so far) or `nearest` (other days, nearest in their last `match_windows` counts)
        self.forecast = forecast or ("posterior" if is_family(self.task) else "nearest")
        if self.forecast not in FORECASTS:
            raise ValueError(f"forecast must be one of {', '.join(FORECASTS)}, got {forecast!r}")
        if self.forecast == "posterior" and not is_family(self.task):
            raise ValueError(f"forecast 'posterior' needs a scenario family task, {task_id!r} is not one")
        # wide_prior: the share of the posterior's cycle particles drawn outside the family (agents/forecast.py's
        # hedge against a day the family never drew); 0, the default, is the family's prior alone
        if wide_prior and self.forecast != "posterior":
            raise ValueError(f"wide_prior needs the 'posterior' forecast (a scenario family), not {self.forecast!r}")
        # noise: the futures' noise ahead, its expected path (default) or a drawn path with flash crowds
        # (agents/forecast.py's NOISE_MODES)
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
        if noise != "expected" and (self.forecast != "posterior" or mode != "sampled"):
            raise ValueError(f"noise {noise!r} needs a sampled planner with the 'posterior' forecast (a scenario "
                             f"family), not mode {mode!r} with forecast {self.forecast!r}")
        self._day_forecast = DayForecast(self.task, seed=seed, wide=wide_prior, noise=noise) \
            if self.forecast == "posterior" and mode == "sampled" else None
        # surprises: futures stratified by the day's surprises ahead (agents/forecast.py `stratified`): `samples`
        # futures without an ad-hoc job or flash crowd and `surprises` with one, each weighted by its chance
        if surprises < 0 or (surprises and self._day_forecast is None):
            raise ValueError(f"surprises must be >= 0, and > 0 only for a sampled planner on a scenario family "
                             f"(the 'posterior' forecast), got {surprises} (mode {mode}, forecast {self.forecast})")
        self.surprises = surprises
        # surprise_peak: the surprise futures split again by whether their first surprise meets the day's peak,
        # each half at its chance (agents/forecast.py `stratified`'s `peak`)
        if surprise_peak and surprises < 2:
            raise ValueError(f"surprise_peak needs surprises >= 2 (a surprise future in the peak zone and one "
                             f"outside it), got surprises={surprises}")
        self.surprise_peak = surprise_peak
        # off_family: the base policy followed, without rollouts, once the day is judged outside the family (a
        # second posterior, hedged with OFF_FAMILY_WIDE of wide particles, holds more than half its mass on
        # them): the rollouts' futures are the family's, so there they rank the bases as if the day were a
        # family day. The futures still come from the forecast above: where the judge stays silent, every
        # decision is the plain planner's.
        if off_family is not None and (self.forecast != "posterior" or mode != "sampled"
                                       or off_family not in self.base_names):
            raise ValueError(f"off_family must name one of the bases ({', '.join(self.base_names)}) of a sampled "
                             f"planner on a scenario family, got {off_family!r} (mode {mode}, task {task_id!r})")
        self._off_family = None if off_family is None else self.base_names.index(off_family)
        self._judge = OffFamilyJudge(self.task, seed) if off_family is not None else None
        self._seed = seed
        # a multi-turn task's sampled futures (`nearest`): the other day's conversations that start from now on,
        # and the next turns of the episode's own running conversations drawn from the turn model given what was
        # seen (shared/prefix.continued_arrivals), so the rollouts resend histories the replicas have cached.
        # False: the other day's windows as they are (its running conversations are strangers to every cache).
        self._turn_spec = MultiTurnSpec(**self.task.workload.get("spec", {})) \
            if running_turns and self.task.workload.get("kind") == "multiturn" and self.forecast == "nearest" else None
        self.match_windows = match_windows
        self.keep = keep
        self.bridging = bridging
        self.margin = margin
        # sampled mode: keep following the base policy whose proposal was last committed unless another
        # proposal beats its own by `margin` too (with 2 futures, an argmax over the bases' proposals picks
        # whichever got the luckiest futures)
        self.fortify = fortify
        self._followed: int | None = None
        # rollouts on `Episode.advance` with the light view (LIGHT_VIEW_BASES); False: on `Episode.step` with
        # the pydantic observation every window, as before (the same decisions, kept to check that they are)
        self.fast_rollouts = fast_rollouts
        self._light = [n in LIGHT_VIEW_BASES for n in self.base_names]
        self.name = "clairvoyant_bound" if mode == "clairvoyant" else "planner"
        self.cluster = self.task.is_cluster
        self.stats = PlannerStats()
        self.last_decision: dict[tuple[int, int], float] = {}  # (candidate, base) -> value, for diagnosis
        self.last_candidates: list[ServeAction] = []
        self._pool_seeds = [int(s) for s in np.random.default_rng([seed, 0x504C414E]).choice(
            TRAIN_SEED_LIMIT, size=pool, replace=False)] if mode == "sampled" else []
        self._pool: list[PoolDay] | None = None
        self.shadow: Episode | None = None
        self._expected: ServeObservation | None = None  # what the mirror saw after the last action
        self._decided: ServeAction | None = None  # decide()'s action, until commit() plays one
        self.bases: list[Policy] = []
        self.incumbent: Branch | None = None
        self._true_ref: tuple[int, References] | None = None  # clairvoyant: (seed, the true references)
        # every base is built here, so one that cannot play the task (a learned one without the task's weights,
        # a rule not tuned for it, a cluster rule on a single server) is refused by name at construction, for
        # every caller (the registry, evaluate, the benches), not at the first episode's reset
        try:
            self.reset()
        except (FileNotFoundError, KeyError, ValueError) as exc:
            name = self.base_names[len(self.bases)]
            raise ValueError(f"bases: {name!r} cannot play {task_id}: {exc}") from exc

    # ------------------------------------------------------------------------------- episode

    def reset(self) -> None:
        self.shadow = None
        self.incumbent = None
        self._followed = None
        self.bases = []
        for n in self.base_names:  # appended one by one: the constructor names the base that failed
            self.bases.append(make_single(n, self.task_id))
            self.bases[-1].reset()

    def act(self, obs: ServeObservation) -> ServeAction:
        return self.commit(self.decide(obs))

    def decide(self, obs: ServeObservation) -> ServeAction:
        """The planner's action for this window, without playing it: `commit` then plays the action the
        episode really took (its own in `act`; another policy's when the planner labels the states that
        policy visits, as DAgger's expert does: tools/dagger.py)."""
        c0 = time.process_time()
        self._sync(obs)
        ep = self.shadow
        assert ep is not None
        k = ep.step_count
        own = [self._complete(b.act(obs)) for b in self.bases]  # the trackers see every observation
        if self._off_family is not None and self.judged_outside(ep.windows[:k]):
            self._followed = self._off_family
            self.stats.off_family += 1
            self.last_decision, self.last_candidates = {}, []
            return self._decided_as(own[self._off_family], own, c0)
        futures = self._futures()
        if self.mode == "clairvoyant" and self.incumbent is not None:
            anchor = self.incumbent.action_at(k)
        else:
            anchor = None
        cands: list[ServeAction] = []
        for a in own:
            if a not in cands:
                cands.append(a)
        # stage 1: each base policy's own proposal continued by itself
        values: dict[tuple[int, int], float] = {}
        branches: dict[tuple[int, int], Branch] = {}
        for j, a in enumerate(own):
            i = cands.index(a)
            values[(i, j)], branches[(i, j)] = self._value(a, j, futures)
        lead_base = self._lead_base(values)
        if anchor is None:
            anchor = cands[max(((i, j) for i, j in values), key=lambda ij: values[ij])[0]]
        if self.bridging:
            for v in [anchor, *bridging_variants(anchor, self.played.replicas if self.cluster else None)]:
                if v not in cands:
                    cands.append(v)
                    i = len(cands) - 1
                    values[(i, lead_base)], branches[(i, lead_base)] = self._value(v, lead_base, futures)
        # stage 2: the best candidates with every other base policy
        q = self._q(values, len(cands))
        for i in sorted(range(len(cands)), key=lambda i: (-q[i], i))[: self.keep]:
            for j in range(len(self.bases)):
                if (i, j) not in values:
                    values[(i, j)], branches[(i, j)] = self._value(cands[i], j, futures)
        q = self._q(values, len(cands))
        best_i = max(range(len(cands)), key=lambda i: (q[i], -i))
        if self.mode == "clairvoyant":
            top = max(values, key=lambda ij: (values[ij], -ij[0], -ij[1]))
            if self.incumbent is None or values[top] > self.incumbent.value:
                self.stats.improved += self.incumbent is not None
                self.incumbent = branches[top]
            action = self.incumbent.action_at(k)
        else:
            # a candidate no base policy proposed must beat the best own proposal by `margin`: with a
            # few sampled futures, small gains are mostly the samples' noise
            own_i = max({cands.index(a) for a in own}, key=lambda i: (q[i], -i))
            if self.fortify and self._followed is not None:
                held = cands.index(own[self._followed])
                if q[own_i] <= q[held] + self.margin:
                    own_i = held
            action = cands[best_i] if q[best_i] > q[own_i] + self.margin else cands[own_i]
            if action in own and (self._followed is None or own[self._followed] != action):
                self._followed = own.index(action)
        self.last_decision, self.last_candidates = values, cands
        return self._decided_as(action, own, c0)

    def _decided_as(self, action: ServeAction, own: list[ServeAction], c0: float) -> ServeAction:
        self.stats.decisions += 1
        self.stats.changed += action not in own
        self._decided = action
        self.stats.cpu_s += time.process_time() - c0
        return action

    def commit(self, action: ServeAction) -> ServeAction:
        """Play `action` in the mirror (the action the episode took after the last `decide`); returns it."""
        c0 = time.process_time()
        ep = self.shadow
        if ep is None or self._decided is None:
            raise PlannerError("commit() follows decide(): the planner has not decided this window")
        action = self._complete(action)
        if action != self._decided:
            # another policy acted: the incumbent's branch no longer starts from the played episode
            self.incumbent = None
        self._decided = None
        self._expected = ep.step(action)
        add_window(self._done_totals, self._done_met, ep.steps[-1].metrics)
        self.stats.cpu_s += time.process_time() - c0
        return action

    # ------------------------------------------------------------------------------- internals

    def _complete(self, a: ServeAction) -> ServeAction:
        """On a cluster task every candidate names its replica count (None in an action keeps the target)."""
        if self.cluster and a.replicas is None:
            backend = self.shadow.backend if self.shadow else None
            assert isinstance(backend, ClusterBackend)
            return a.model_copy(update={"replicas": backend.target})
        return a

    def _q(self, values: dict[tuple[int, int], float], n: int) -> list[float]:
        """Each candidate's value: its best continuation so far."""
        q = [-np.inf] * n
        for (i, _), v in values.items():
            q[i] = max(q[i], v)
        return q

    def _lead_base(self, values: dict[tuple[int, int], float]) -> int:
        """The base policy continuing the variants: the incumbent's (clairvoyant), else the best own branch."""
        return max(values, key=lambda ij: (values[ij], -ij[1]))[1]

    def _value(self, cand: ServeAction, j: int, futures: list[Future]) -> tuple[float, Branch]:
        """The grade after serving `cand` now and base policy j to the end, over the futures (their mean, weighted
        where their weights differ (`surprises`), or their worst with `aggregate="worst"`); the branch (actions)
        of the first future."""
        out = [self._rollout(cand, j, wins, ref) for wins, ref, _ in futures]
        grades = [b.value for b in out]
        weights = [w for _, _, w in futures]
        if self.aggregate == "worst":
            value = float(np.min(grades))
        elif len(set(weights)) == 1:
            value = float(np.mean(grades))  # equal weights: the plain mean (1/3 is not exact in floating point)
        else:
            value = float(np.average(grades, weights=weights))
        return value, Branch(value, out[0].start, out[0].actions)

    def _rollout(self, cand: ServeAction, j: int, wins: list[Sequence[Arrival]] | None,
                 ref: References) -> Branch:
        ep = self.shadow
        assert ep is not None
        branch = ep.fork(episode_id="planner-branch")
        k = ep.step_count
        if wins is not None:
            branch.windows = ep.windows[:k] + wins[k:]
        base = _clone(self.bases[j], self.task)
        actions = [cand]
        if self.fast_rollouts:
            light, task = self._light[j], self.played
            out: StepOutcome = branch.advance(cand)
            while not out.done:
                view = ObservedWindow(out, task) if light else branch.last_observation
                a = self._complete_on(base.act(view), branch)  # type: ignore[arg-type]
                actions.append(a)
                out = branch.advance(a)
        else:
            obs = branch.step(cand)
            while not branch.done:
                a = self._complete_on(base.act(obs), branch)
                actions.append(a)
                obs = branch.step(a)
        self.stats.simulated_windows += self.played.horizon - k
        self.stats.rollouts += 1
        tot = copy.copy(self._done_totals)
        met_by = dict(self._done_met)
        for step in branch.steps[k:]:
            add_window(tot, met_by, step.metrics)
        return Branch(objective(self.played, tot, met_by, ref)[0], k, actions)

    def _complete_on(self, a: ServeAction, branch: Episode) -> ServeAction:
        if self.cluster and a.replicas is None:
            backend = branch.backend
            assert isinstance(backend, ClusterBackend)
            return a.model_copy(update={"replicas": backend.target})
        return a

    def _sync(self, obs: ServeObservation) -> None:
        if self.shadow is None or obs.step_index == 0:
            meta = obs.metadata or {}
            if meta.get("mode", "sim") != "sim" or "seed" not in meta:
                raise PlannerError("the planner mirrors the episode in its own simulator: it needs a sim-mode "
                                   "episode's reset observation (metadata 'seed' and mode 'sim')")
            shifted = SHIFTED_TASKS.get(self.task_id)
            if obs.task_id not in (self.task_id, shifted):
                also = f" or its shifted test task {shifted!r}" if shifted else ""
                raise PlannerError(f"this planner was built for task {self.task_id!r}{also}, the episode is "
                                   f"{obs.task_id!r}")
            if self.shadow is not None:  # a new episode without reset(): start the trackers afresh too
                self.reset()
            self.played = resolve_task(obs.task_id)
            self.shadow = Episode.start(self.played, int(meta["seed"]), "sim", episode_id="planner-shadow")
            self._expected = None
            self.incumbent = None
            self._done_totals, self._done_met = Totals(), {t.name: 0.0 for t in self.played.tenants}
            self._true_arrivals = concat_arrivals(self.shadow.windows)
            return
        exp = self._expected
        if exp is None or obs.step_index != exp.step_index or obs.reward != exp.reward or \
                obs.queue_depth != exp.queue_depth or obs.throughput_tps != exp.throughput_tps:
            raise PlannerError("the episode diverged from the planner's mirror of it (is it a sim-mode episode "
                               "played from its reset by this planner alone?)")

    def _futures(self) -> list[Future]:
        """(arrival windows for the rollouts or None for the true ones, the grader's references, the weight)."""
        ep = self.shadow
        assert ep is not None
        if self.mode == "clairvoyant":
            if self._true_ref is None or self._true_ref[0] != ep.seed:
                self._true_ref = (ep.seed, compute_references(self.played, ep.seed, arrivals=self._true_arrivals))
            return [(None, self._true_ref[1], 1.0)]
        k = ep.step_count
        past = ep.windows[:k]
        drawn, weights = self.weighted_futures(ep.seed, past)
        return [(wins, compute_references(self.played, ep.seed, arrivals=concat_arrivals(past + wins[k:])), wt)
                for wins, wt in zip(drawn, weights, strict=True)]

    def judged_outside(self, seen: list[Sequence[Arrival]]) -> bool:
        """Whether the windows seen make the day more likely outside the family than in it (`off_family`)."""
        return self._judge is not None and self._judge.outside(tenant_counts(self.task, seen))

    def future_windows(self, seed: int, seen: list[Sequence[Arrival]]) -> list[list[Sequence[Arrival]]]:
        """The sampled futures after the windows `seen` of the episode with `seed`: each the whole episode's
        windows, the seen ones as they were, the rest drawn by `forecast` (only the announced jobs of the
        seed's day are read, as the observation shows them)."""
        return self.weighted_futures(seed, seen)[0]

    def weighted_futures(self, seed: int, seen: list[Sequence[Arrival]]) -> tuple[list[list[Sequence[Arrival]]], list[float]]:
        """`future_windows` and each future's weight in a candidate's value: equal, or with `surprises` each
        stratum's chance (agents/forecast.py `stratified`)."""
        k = len(seen)
        if self._day_forecast is not None:
            counts, announced = tenant_counts(self.task, seen), announced_jobs(self.played, seed, k)
            if self.surprises:
                fut, weights = self._day_forecast.stratified(k, counts, announced, self.samples, self.surprises,
                                                             self._seed, SAMPLE_ID_BASE, peak=self.surprise_peak)
                return [seen + wins for wins in fut], weights
            fut = self._day_forecast.futures(k, counts, announced, self.samples, self._seed, SAMPLE_ID_BASE)
            return [seen + wins for wins in fut], [1.0 / len(fut)] * len(fut)
        out = self._nearest_futures(seed, seen)
        return out, [1.0 / len(out)] * len(out)

    def _nearest_futures(self, seed: int, seen: list[Sequence[Arrival]]) -> list[list[Sequence[Arrival]]]:
        """The `nearest` forecast's futures: days of the task's workload under other seeds (module docstring)."""
        k = len(seen)
        pool = self._sample_pool()
        lo = max(0, k - self.match_windows)
        counts_seen = np.array([len(w) for w in seen[lo:k]], dtype=float)
        dist = [float(np.abs(d.counts[lo:k] - counts_seen).sum()) for d in pool]
        order = sorted(range(len(pool)), key=lambda i: (dist[i], i))[: self.samples]
        if self._turn_spec is None:
            return [seen + pool[i].windows[k:] for i in order]
        now_s = k * self.task.window_s
        running = running_conversations([a for w in seen for a in w], self._turn_spec)
        out = []
        for n, i in enumerate(order):
            day = pool[i]
            fresh = [a for w, st in zip(day.windows[k:], day.starts[k:], strict=True)
                     for a, s in zip(w, st, strict=True) if s >= now_s]
            rng = np.random.default_rng([self._seed, k, n, 0x5254])  # "RT": running turns
            drawn = continued_arrivals(running, self._turn_spec, now_s, self.task.horizon * self.task.window_s,
                                       rng, CONTINUED_ID_BASE)
            both = sorted(fresh + drawn, key=lambda a: a.arrival_s)
            out.append(seen + windows(both, self.task)[k:])
        return out

    def _sample_pool(self) -> list[PoolDay]:
        if self._pool is None:
            pool = []
            for day, s in enumerate(self._pool_seeds):
                # prefix ids kept (a multi-turn day's own conversations moved out of the episode's way): a
                # future without them would plan a prefix-caching task as if nothing were ever cached
                day_arrivals = as_sampled_day(generate_arrivals(self.task, s), self.task.workload, day, SAMPLE_ID_BASE)
                wins = windows(day_arrivals, self.task)
                starts: list[list[float]] = []
                if self._turn_spec is not None:  # each arrival's conversation's first arrival, window by window
                    flat = iter(conversation_starts(day_arrivals, self._turn_spec))
                    starts = [[next(flat) for _ in w] for w in wins]
                pool.append(PoolDay(wins, np.array([len(w) for w in wins], dtype=float), starts))
            self._pool = pool
        return self._pool
