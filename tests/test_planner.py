"""The rollout planner: at least every base policy when clairvoyant (by construction), deterministic, runs on
every task, refuses what it cannot mirror."""

from __future__ import annotations

import pytest
from llmserve_env.agents.planner import (
    LIGHT_VIEW_BASES,
    PREFIX_RIVALS,
    RIVALS_TO_BEAT,
    Branch,
    PlannerError,
    PlannerPolicy,
    bridging_variants,
    default_bases,
    rivals_for,
)
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.singles import SINGLES
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.splits import SHIFTED_TASKS
from llmserve_env.shared.tasks import PREFIX_TASKS, TASKS, get_task
from llmserve_env.shared.traces import packaged_trace_path
from llmserve_env.shared.workloads import generate_arrivals, windows

TRACE = packaged_trace_path("azure_conv_2023.csv")
# A short overloaded cluster replay (one replica cannot keep up; a second one's cold start is 87 s): where
# the base policies differ and the planner's candidates can beat them.
SHORT_CLUSTER = f"trace:{TRACE}?speedup=12&window_s=5&horizon=6&replicas=4"
SHORT_BASES = ("vllm_default", "heuristic")
CHEAP = {"bases": ("tuned_static", "schedule"), "keep": 0, "samples": 1, "pool": 2, "bridging": False}


@pytest.mark.parametrize("start_s", [0, 1200])
def test_clairvoyant_is_at_least_every_base_policy_by_construction(start_s: int) -> None:
    """The fortified rollout keeps the best finished branch: its grade is the incumbent's value, which began
    as the best base policy's own episode and only ever rose."""
    task = f"{SHORT_CLUSTER}&start_s={start_s}"
    env = InProcessEnv()
    planner = PlannerPolicy(task, "clairvoyant", bases=SHORT_BASES)
    score = play_episode(env, planner, task, 0).score
    assert planner.incumbent is not None and score == pytest.approx(planner.incumbent.value, abs=1e-12)
    for name in SHORT_BASES:
        assert score >= play_episode(env, make_policy(name, task), task, 0).score - 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["diurnal_autoscale", "multitenant_autoscale"])
def test_clairvoyant_bounds_every_rival_on_the_cluster_tasks(task_id: str) -> None:
    """The same on the cluster tasks with every rival as a base policy (held-out seed 1,000,000)."""
    env = InProcessEnv()
    planner = make_policy("clairvoyant", task_id)
    score = play_episode(env, planner, task_id, 1_000_000).score
    assert [b.name for b in planner.bases] == list(RIVALS_TO_BEAT)
    for name in RIVALS_TO_BEAT:
        assert score >= play_episode(env, make_policy(name, task_id), task_id, 1_000_000).score - 1e-12


def test_deterministic_for_a_seed_and_labelled() -> None:
    env = InProcessEnv()
    runs = [play_episode(env, PlannerPolicy(SHORT_CLUSTER, "sampled", bases=SHORT_BASES, seed=3, samples=1, pool=2), SHORT_CLUSTER,
                         0, keep_actions=True) for _ in range(2)]
    assert runs[0].actions == runs[1].actions and runs[0].score == runs[1].score
    assert runs[0].policy == "planner"
    bound = PlannerPolicy(SHORT_CLUSTER, "clairvoyant", bases=SHORT_BASES)
    assert bound.name == "clairvoyant_bound" and bound.samples == 1


def test_candidates_hold_every_base_policys_proposal_and_the_bridging_variants() -> None:
    task = "multitenant_autoscale"
    planner = PlannerPolicy(task, "clairvoyant", bases=CHEAP["bases"], keep=0)
    planner.reset()
    obs = InProcessEnv().reset(task, 1_000_000)
    own = [make_policy(n, task).act(obs) for n in CHEAP["bases"]]
    assert all(a.replicas is not None for a in own)
    planner.act(obs)
    cands = planner.last_candidates
    assert all(a in cands for a in own)
    # the variants of the best own proposal (the first window has no incumbent yet)
    assert any(all(v in cands for v in bridging_variants(a, get_task(task).replicas)) for a in own)
    # every base policy's own proposal was continued by itself
    for j, a in enumerate(own):
        assert (cands.index(a), j) in planner.last_decision


def test_bridging_variants_change_one_thing() -> None:
    a = ServeAction(batch_cap=128, kv_budget_fraction=0.9, speculation_depth=2, quantization_tier="FP16",
                    prefill_decode_split=False, priority_routing=False, replicas=3)
    out = bridging_variants(a, (1, 8))
    changed = [{k for k, v in b.knobs().items() if a.knobs()[k] != v} for b in out]
    assert changed == [{"quantization_tier"}, {"batch_cap"}, {"speculation_depth"}, {"replicas"}, {"replicas"}]
    assert {b.replicas for b in out} == {2, 3, 4}
    single = bridging_variants(a.model_copy(update={"replicas": None, "batch_cap": 512, "speculation_depth": 0}), None)
    assert [b.quantization_tier for b in single] == ["INT8"]


@pytest.mark.parametrize("task_id", list(TASKS))
def test_plans_on_every_task(task_id: str) -> None:
    """Two decisions on each registered task, sampled and clairvoyant, with two base policies (cluster tasks)."""
    # the prefix-caching tasks have no tuned_static: their default bases, the routing rivals (and on
    # multiturn_cluster, which publishes a day, the day-plan rules)
    bases = CHEAP["bases"] if get_task(task_id).is_cluster and task_id not in PREFIX_TASKS else None
    for mode in ("planner", "clairvoyant"):
        env = InProcessEnv()
        policy = make_policy(mode, task_id, **{**CHEAP, "bases": bases})
        policy.reset()
        obs = env.reset(task_id, 1_000_000)
        for _ in range(2):
            obs = env.step(policy.act(obs))
        assert policy.stats.decisions == 2 and policy.stats.rollouts >= 2 * len(policy.bases)
        assert policy.stats.simulated_windows >= policy.stats.rollouts * (get_task(task_id).horizon - 1)


def test_default_bases() -> None:
    assert default_bases(get_task("diurnal_autoscale")) == RIVALS_TO_BEAT
    assert default_bases(get_task("bursty_workload")) == ("tuned_static", "heuristic")
    assert PlannerPolicy(SHORT_CLUSTER).base_names == SHORT_BASES  # no tuned configuration for a replay
    # the prefix-caching tasks: the routing rules and the autoscalers, and the day-plan rules where the task
    # publishes a day
    mooncake = PREFIX_RIVALS + ("hpa", "dynamo_planner")
    assert default_bases(get_task("mooncake_cluster")) == rivals_for(get_task("mooncake_cluster")) == mooncake
    assert default_bases(get_task("multiturn_cluster")) == mooncake + ("operator", "schedule")
    assert rivals_for(get_task("diurnal_family")) == RIVALS_TO_BEAT


def test_refuses_an_episode_it_does_not_mirror() -> None:
    env = InProcessEnv()
    policy = PlannerPolicy(SHORT_CLUSTER, bases=SHORT_BASES, pool=2)
    policy.reset()
    obs = env.reset(SHORT_CLUSTER, 5)
    env.step(policy.act(obs))
    other = make_policy("vllm_default", SHORT_CLUSTER)
    obs = env.step(other.act(obs))  # the environment moved without the planner
    with pytest.raises(PlannerError, match="diverged"):
        policy.act(obs)
    fresh = PlannerPolicy("bursty_workload", pool=2)
    with pytest.raises(PlannerError, match="task"):
        fresh.act(InProcessEnv().reset("static_workload", 0))


def test_a_planner_built_for_a_family_plays_its_shifted_task_as_built() -> None:
    """The shifted split: the planner built for a family plays the family's shifted test task with the family's
    bases and forecast prior (the shift unseen), its mirror and grade on the played day; any other task is refused."""
    for family, shifted in SHIFTED_TASKS.items():
        policy = make_policy("planner", family, **CHEAP)
        policy.reset()
        env = InProcessEnv()
        obs = env.reset(shifted, 1_000_000)
        for _ in range(2):  # the mirror follows the played day: a divergence would raise
            obs = env.step(policy.act(obs))
        assert policy.played is get_task(shifted) and policy.shadow is not None and policy.shadow.task is policy.played
        assert policy._day_forecast is not None and policy._day_forecast.task is get_task(family)
        h = get_task(shifted).horizon
        assert policy.stats.rollouts == 4 and policy.stats.simulated_windows == 2 * h + 2 * (h - 1)
    with pytest.raises(PlannerError, match="diurnal_family_shifted"):
        make_policy("planner", "diurnal_family", **CHEAP).act(InProcessEnv().reset("multitenant_family_shifted", 0))


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="mode"):
        PlannerPolicy("bursty_workload", mode="oracle")
    with pytest.raises(ValueError, match="samples"):
        PlannerPolicy("bursty_workload", samples=0)
    with pytest.raises(ValueError, match="bases"):
        PlannerPolicy("bursty_workload", bases=("planner",))
    with pytest.raises(ValueError, match="bases"):
        PlannerPolicy("bursty_workload", bases=())
    # a base that cannot play the task is refused by name when the planner is built, not at its first episode:
    # the shifted task has no learned weights of its own, and a cluster rule cannot play a single server
    with pytest.raises(ValueError, match="bases: 'ppo' cannot play multitenant_family_shifted"):
        PlannerPolicy("multitenant_family_shifted", bases=("schedule", "ppo"))
    with pytest.raises(ValueError, match="bases: 'hpa' cannot play bursty_workload"):
        PlannerPolicy("bursty_workload", bases=("heuristic", "hpa"))


def test_worst_future_values_a_branch_at_most_its_mean() -> None:
    """`aggregate="worst"` values each (candidate, base) pair by its worst sampled future: on the same futures (the
    same seed), never above the mean's value of that pair, and below it where the futures disagree."""
    obs = InProcessEnv().reset("multitenant_family", 500_000)
    seen = {}
    for aggregate in ("mean", "worst"):  # two futures drawn from the family's posterior: they differ
        planner = make_policy("planner", "multitenant_family", seed=3, **{**CHEAP, "samples": 2},
                              aggregate=aggregate)
        planner.decide(obs)
        seen[aggregate] = planner.last_decision
    both = seen["mean"].keys() & seen["worst"].keys()
    assert both
    assert all(seen["worst"][ij] <= seen["mean"][ij] + 1e-12 for ij in both)
    assert any(seen["worst"][ij] < seen["mean"][ij] - 1e-9 for ij in both)
    with pytest.raises(ValueError, match="aggregate must be one of mean, worst"):
        PlannerPolicy(SHORT_CLUSTER, aggregate="median")


def test_sampled_planner_leaves_the_base_proposals_only_by_its_margin() -> None:
    """With a margin no lookahead can beat, the sampled planner commits a base policy's own proposal every window."""
    env = InProcessEnv()
    never = PlannerPolicy(SHORT_CLUSTER, "sampled", bases=SHORT_BASES, samples=1, pool=2, margin=2.0)
    play_episode(env, never, SHORT_CLUSTER, 0)
    assert never.stats.decisions == 6 and never.stats.changed == 0


def test_fortified_sampled_planner_changes_base_only_by_its_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """fortify: the base policy last followed keeps the window unless another's proposal is valued `margin`
    higher (values scripted per base: the rollouts' noise is what the margin guards against)."""
    script = [{0: 0.50, 1: 0.40}, {0: 0.50, 1: 0.505}, {0: 0.50, 1: 0.52}, {0: 0.50, 1: 0.515}]
    step = {"k": 0}

    def scripted(self: PlannerPolicy, cand: ServeAction, j: int, futures: list) -> tuple[float, Branch]:
        v = script[step["k"]][j]
        return v, Branch(v, 0, [cand])

    monkeypatch.setattr(PlannerPolicy, "_value", scripted)
    env = InProcessEnv()
    policy = PlannerPolicy(SHORT_CLUSTER, bases=SHORT_BASES, samples=1, pool=2, keep=0, bridging=False, fortify=True)
    policy.reset()
    obs = env.reset(SHORT_CLUSTER, 5)
    followed = []
    for k in range(len(script)):
        step["k"] = k
        action = policy.act(obs)
        assert len(policy.last_candidates) == 2  # the two bases' proposals differ: there is a choice
        followed.append(policy._followed)
        obs = env.step(action)
    # window 0: base 0 is best; 1: base 1 by 0.005 < margin, base 0 kept; 2: by 0.02, base 1; 3: base 1 held
    assert followed == [0, 0, 1, 1]


def _decisions(planner: PlannerPolicy, task_id: str, n: int) -> list[tuple[ServeAction, dict]]:
    """The planner's first `n` actions on seed 1,000,000, each with every rollout's value behind it."""
    env = InProcessEnv()
    planner.reset()
    obs = env.reset(task_id, 1_000_000)
    out = []
    for _ in range(n):
        action = planner.act(obs)
        out.append((action, dict(planner.last_decision)))
        obs = env.step(action)
    return out


@pytest.mark.parametrize("task_id", ["diurnal_autoscale", "multitenant_autoscale", "bursty_workload"])
def test_fast_rollouts_decide_as_the_full_observation_does(task_id: str) -> None:
    """Rollouts on `Episode.advance` with the light view (the default) give every rollout the value, and the
    planner the actions, that rollouts on `Episode.step` with the pydantic observation give: every rival as a
    base on the cluster tasks (the operator reads each tenant's arrival rate, dynamo_planner the latencies),
    tuned_static and the heuristic on a single server, where the full view built from `advance` (what a base
    outside LIGHT_VIEW_BASES gets) is checked too."""
    cheap = {"samples": 1, "pool": 2, "keep": 0, "bridging": False}
    n = 2 if get_task(task_id).is_cluster else 3
    slow = _decisions(PlannerPolicy(task_id, **cheap, fast_rollouts=False), task_id, n)
    assert _decisions(PlannerPolicy(task_id, **cheap), task_id, n) == slow
    if not get_task(task_id).is_cluster:
        full = PlannerPolicy(task_id, **cheap)
        full._light = [False] * len(full.base_names)  # as a base outside LIGHT_VIEW_BASES is played
        assert _decisions(full, task_id, n) == slow


def test_every_single_policy_is_listed_as_reading_the_light_view_or_not() -> None:
    """A policy added to SINGLES is played on the full observation until it is listed in LIGHT_VIEW_BASES
    (it reads only what ObservedWindow holds); the LLM policy sends the whole observation as JSON."""
    assert set(SINGLES) - LIGHT_VIEW_BASES == {"llm"} and LIGHT_VIEW_BASES <= set(SINGLES)


def _played_actions(policy: PlannerPolicy, task_id: str, seed: int, steps: int = 10**9
                    ) -> tuple[list[ServeAction], list[list]]:
    """Play `policy` for `steps` windows (the whole episode by default); its actions and the windows played."""
    env = InProcessEnv()
    policy.reset()
    obs = env.reset(task_id, seed)
    actions: list[ServeAction] = []
    while not obs.done and len(actions) < steps:
        actions.append(policy.act(obs))
        obs = env.step(actions[-1])
    assert policy.shadow is not None
    return actions, policy.shadow.windows


def test_the_off_family_judge_hands_a_shifted_day_to_its_base_and_is_silent_on_a_family_day() -> None:
    """`off_family`: on a shifted day (validation seed 500,000, judged outside from window 1) the planner follows
    the operator without rollouts wherever the judge says so; on a family day it never does, and every action
    is the plain planner's."""
    cheap = {"bases": ("operator", "tuned_static"), "keep": 0, "bridging": False, "samples": 1}
    judged = PlannerPolicy("diurnal_family", off_family="operator", **cheap)
    actions, wins = _played_actions(judged, "diurnal_family_shifted", 500_000)
    outside = [k for k in range(len(actions)) if judged.judged_outside(wins[:k])]
    assert len(outside) >= 40 and judged.stats.off_family == len(outside)
    assert judged.stats.rollouts == 2 * (len(actions) - len(outside))
    family = get_task("diurnal_family")
    day = windows(generate_arrivals(family, 500_000), family)
    assert not any(judged.judged_outside(day[:k]) for k in range(family.horizon))
    plain_actions, _ = _played_actions(PlannerPolicy("diurnal_family", **cheap), "diurnal_family", 500_000, 12)
    judged = PlannerPolicy("diurnal_family", off_family="operator", **cheap)
    judged_actions, _ = _played_actions(judged, "diurnal_family", 500_000, 12)
    assert judged.stats.off_family == 0 and judged_actions == plain_actions
    with pytest.raises(ValueError, match="off_family must name one of the bases"):
        PlannerPolicy("diurnal_family", off_family="heuristic", **cheap)
    with pytest.raises(ValueError, match="off_family must name one of the bases"):
        PlannerPolicy("diurnal_autoscale", off_family="operator")


def test_multiturn_futures_go_on_with_the_episode_s_own_conversations() -> None:
    """On multiturn_cluster a sampled future is the other day's conversations that start from now on, plus
    drawn next turns of the conversations the episode has seen (their own ids, so they hit what the replicas
    cached); with `running_turns=False` it is the other day's windows as they are, whose running
    conversations no replica has seen."""
    from llmserve_env.shared.prefix import MultiTurnSpec, conversation_owner

    task = get_task("multiturn_cluster")
    n_sys = len(MultiTurnSpec(**task.workload["spec"]).system_tokens)
    seen = windows(generate_arrivals(task, 1_000_000), task)[:20]
    owners = {conversation_owner(a.prefix_ids, n_sys) for w in seen for a in w}
    now = 20 * task.window_s
    on, off = PlannerPolicy("multiturn_cluster", pool=2), PlannerPolicy("multiturn_cluster", pool=2,
                                                                          running_turns=False)
    for fut_on, fut_off in zip(on.future_windows(1_000_000, seen), off.future_windows(1_000_000, seen), strict=True):
        assert fut_on[:20] == fut_off[:20] == seen and len(fut_on) == task.horizon
        later_on = [a for w in fut_on[20:] for a in w]
        later_off = [a for w in fut_off[20:] for a in w]
        continued = [a for a in later_on if conversation_owner(a.prefix_ids, n_sys) in owners]
        assert len(continued) > 1000  # ~1,550 on this day at this hour (tests/test_prefix_workloads.py)
        assert not any(conversation_owner(a.prefix_ids, n_sys) in owners for a in later_off)
        # the rest are the other day's own, only those of its conversations that start from now on
        other = {a.request_id for a in later_on} - {a.request_id for a in continued}
        kept = [a for a in later_off if a.request_id in other]
        assert len(kept) == len(later_on) - len(continued) < len(later_off)
        first: dict[int | None, float] = {}
        for w in fut_off:
            for a in w:
                first.setdefault(conversation_owner(a.prefix_ids, n_sys), a.arrival_s)
        assert all(first[conversation_owner(a.prefix_ids, n_sys)] >= now for a in kept)
    assert on.future_windows(1_000_000, seen) == on.future_windows(1_000_000, seen)  # deterministic
