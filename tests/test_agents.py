"""Policies: action encoding, each policy's actions, PPO inference without torch, episodes in process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import train_extra
from llmserve_env.agents.base import Policy
from llmserve_env.agents.encoding import (
    ACTION_NVEC,
    BATCH_CAPS,
    OBS_DIM,
    OBS_HIGH,
    ObservationEncoder,
    decode_action,
    encode_action,
)
from llmserve_env.agents.heuristic import HeuristicParams, HeuristicPolicy
from llmserve_env.agents.ppo_policy import ActorWeights, PPOPolicy, WeightsNotFoundError
from llmserve_env.agents.random_policy import RandomPolicy
from llmserve_env.agents.registry import POLICIES, UnknownPolicyError, make_policy
from llmserve_env.agents.static import STARVE, VLLM_DEFAULT
from llmserve_env.agents.stats import mean_ci, paired_diff_ci
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import get_task


def obs(**kw) -> ServeObservation:
    return ServeObservation(reward=0.0, **kw)


def test_action_grid_round_trips_and_covers_the_extremes():
    rng = np.random.default_rng(0)
    for _ in range(200):
        idx = [int(rng.integers(0, n)) for n in ACTION_NVEC]
        assert list(encode_action(decode_action(idx))) == idx
    lo, hi = decode_action([0] * 6), decode_action([n - 1 for n in ACTION_NVEC])
    assert (lo.batch_cap, lo.kv_budget_fraction, lo.speculation_depth) == (1, 0.1, 0)
    assert (hi.batch_cap, hi.kv_budget_fraction, hi.speculation_depth) == (512, 1.0, 8)
    assert hi.quantization_tier == "INT4" and hi.prefill_decode_split and hi.priority_routing
    # Batch cap is on a log scale, and off-grid values snap to the nearest in log terms.
    assert all(b2 == 2 * b1 for b1, b2 in zip(BATCH_CAPS, BATCH_CAPS[1:], strict=False))
    assert encode_action(VLLM_DEFAULT.model_copy(update={"batch_cap": 300}))[0] == BATCH_CAPS.index(256)


def test_encoder_is_bounded_and_remembers_the_previous_window():
    enc = ObservationEncoder(horizon=64)
    huge = obs(queue_depth=10**9, p99_ttft_ms=1e12, throughput_tps=1e9, eviction_events=10**9,
               request_arrival_rate=1e6, step_index=64)
    x = enc.encode(huge)
    assert x.shape == (OBS_DIM,) and x.dtype == np.float32
    assert np.all(x >= 0) and np.all(x <= OBS_HIGH)
    enc.record_action(VLLM_DEFAULT)
    y = enc.encode(obs(request_arrival_rate=5.0))
    assert y[16] > 0  # previous arrival rate feature now holds the huge window's rate
    assert y[18] == pytest.approx(np.log2(256) / 9)
    enc.reset()
    assert enc.encode(obs())[16:].sum() == 0


def test_random_policy_is_seeded_and_spans_the_space():
    a, b = RandomPolicy(7), RandomPolicy(7)
    acts = [a.act(obs()) for _ in range(300)]
    assert acts == [b.act(obs()) for _ in range(300)]
    caps = [x.batch_cap for x in acts]
    assert min(caps) < 50 and max(caps) > 450
    assert {x.quantization_tier for x in acts} == {"FP16", "INT8", "INT4"}
    assert {x.speculation_depth for x in acts} == set(range(9))


def test_static_configurations():
    assert VLLM_DEFAULT.knobs() == {"batch_cap": 256, "kv_budget_fraction": 0.9, "speculation_depth": 0,
                                    "quantization_tier": "FP16", "prefill_decode_split": False,
                                    "priority_routing": False}
    assert STARVE.batch_cap == 1
    assert make_policy("vllm_default", "static_workload").act(obs(queue_depth=500)) == VLLM_DEFAULT


def test_heuristic_reacts_to_load_and_latency():
    task = get_task("adversarial_multitenant")
    params = HeuristicParams(batch_cap=128, kv=0.9, int8_queue=20, fp16_queue=2, spec_depth=2, spec_max_queue=0,
                             spec_max_active=32, spec_max_rate=15.0, priority_queue=4)
    h = HeuristicPolicy(task, params)
    h.reset()
    idle = h.act(obs())
    assert (idle.batch_cap, idle.speculation_depth, idle.quantization_tier, idle.priority_routing) == (128, 2, "FP16", False)
    slow = h.act(obs(step_index=1, p50_itl_ms=1000.0, active_requests=100))
    assert slow.batch_cap == 64 and slow.speculation_depth == 0  # tokens too slow: halve; busy: no drafts
    busy = h.act(obs(step_index=2, queue_depth=50, request_arrival_rate=60.0))
    assert busy.batch_cap == 128 and busy.quantization_tier == "INT8" and busy.priority_routing
    assert h.act(obs(step_index=3, queue_depth=10)).quantization_tier == "INT8"  # hysteresis holds INT8
    assert h.act(obs(step_index=4, queue_depth=1)).quantization_tier == "FP16"
    assert h.act(obs(step_index=5, eviction_events=3)).kv_budget_fraction == pytest.approx(1.0)
    # A single-tenant task never turns priority routing on.
    single = HeuristicPolicy(get_task("static_workload"), params)
    assert not single.act(obs(step_index=1, queue_depth=500)).priority_routing


def test_tuned_heuristic_and_static_are_stored_with_their_commands():
    from llmserve_env.agents.heuristic import TUNED_PATH as H_PATH
    from llmserve_env.agents.heuristic import tuned_params
    from llmserve_env.agents.tuned_static import TUNED_PATH as S_PATH
    from llmserve_env.agents.tuned_static import tuned_action

    for path, module in ((H_PATH, "agents.heuristic"), (S_PATH, "agents.tuned_static")):
        stored = json.loads(path.read_text())["tasks"]
        for task_id, entry in stored.items():
            # the cluster tasks' fixed replica counts are searched with their autoscaling rivals
            tuner = "agents.autoscale" if get_task(task_id).is_cluster else module
            assert entry["command"].startswith(f"python -m {tuner}")
            assert all(s < 100_000 for s in entry["train_seeds"])  # training seeds only
            get_task(task_id)
    for task_id in ("bursty_workload", "adversarial_multitenant"):
        assert isinstance(tuned_action(task_id), ServeAction)
        assert tuned_params(task_id) != HeuristicParams()


def test_registry_builds_every_policy_and_rejects_unknown_names(tmp_path):
    for name in ("random", "starve", "vllm_default", "static", "heuristic"):
        p = make_policy(name, "bursty_workload")
        assert isinstance(p, Policy)
        p.reset()
        assert isinstance(p.act(obs()), ServeAction)
    assert set(POLICIES) >= {"random", "starve", "vllm_default", "static", "tuned_static", "heuristic", "llm", "ppo"}
    with pytest.raises(UnknownPolicyError, match="choose one of"):
        make_policy("oracle", "bursty_workload")


def test_mean_ci_matches_a_hand_computation():
    ci = mean_ci([1.0, 2.0, 3.0, 4.0])
    # sd = 1.2910, se = 0.6455, t(3) = 3.182
    assert ci.mean == 2.5 and ci.half_width == pytest.approx(3.182 * 0.645497, rel=1e-4)
    d = paired_diff_ci([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert d.mean == pytest.approx(0.5) and d.half_width == pytest.approx(0.0)


# -- PPO inference: numpy only ----------------------------------------------------------------
def write_weights(path: Path, hidden: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "actor_w0": rng.normal(size=(OBS_DIM, hidden)).astype(np.float32),
        "actor_b0": rng.normal(size=hidden).astype(np.float32),
        "actor_w1": rng.normal(size=(hidden, sum(ACTION_NVEC))).astype(np.float32),
        "actor_b1": rng.normal(size=sum(ACTION_NVEC)).astype(np.float32),
        "nvec": np.asarray(ACTION_NVEC),
    }
    np.savez(path, **arrays)
    path.with_suffix(".json").write_text(json.dumps({
        "obs_norm": {"mean": [0.1] * OBS_DIM, "var": [0.25] * OBS_DIM, "clip": 10.0, "epsilon": 1e-8}}))
    return arrays


def test_ppo_policy_computes_the_mlp_by_hand(tmp_path):
    arrays = write_weights(tmp_path / "t.npz")
    policy = PPOPolicy("bursty_workload", tmp_path / "t.npz")
    policy.reset()
    o = obs(queue_depth=30, p99_ttft_ms=900.0, request_arrival_rate=40.0, step_index=5)
    x = ObservationEncoder(64).encode(o).astype(np.float64)
    h = np.tanh(((x - 0.1) / 0.5) @ arrays["actor_w0"] + arrays["actor_b0"])
    logits = h @ arrays["actor_w1"] + arrays["actor_b1"]
    expect, start = [], 0
    for n in ACTION_NVEC:
        expect.append(int(np.argmax(logits[start:start + n])))
        start += n
    assert policy.act(o) == decode_action(expect)


def test_ppo_weights_are_checked_against_the_grid(tmp_path):
    write_weights(tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz") as z:
        arrays = dict(z)
    arrays["nvec"] = np.asarray([10, 7, 7, 3, 2, 3])
    np.savez(tmp_path / "bad.npz", **arrays)
    (tmp_path / "bad.json").write_text((tmp_path / "t.json").read_text())
    with pytest.raises(ValueError, match="action grid"):
        ActorWeights.load(tmp_path / "bad.npz")
    with pytest.raises(WeightsNotFoundError):
        PPOPolicy("bursty_workload", tmp_path / "missing.npz")


def test_ppo_inference_never_imports_torch(tmp_path):
    write_weights(tmp_path / "t.npz")
    code = (
        "import sys\n"
        "from llmserve_env.agents.ppo_policy import PPOPolicy\n"
        "from llmserve_env.shared.models import ServeObservation\n"
        f"p = PPOPolicy('static_workload', {str(tmp_path / 't.npz')!r})\n"
        "p.act(ServeObservation(reward=0.0))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_trainer_export_matches_torch_forward(tmp_path):
    """The numpy actor computes the same logits as the torch actor it was exported from."""
    torch = train_extra("torch")
    import llmserve_env.tools.train as train

    agent = train.Agent(OBS_DIM, ACTION_NVEC, hidden=16)
    rms = train.RunningMeanStd((OBS_DIM,))
    rms.update(np.random.default_rng(0).uniform(0, 2, size=(64, OBS_DIM)))
    args = train.Args(task="bursty_workload", out_dir=tmp_path, command="test")
    train.save(agent, rms, args, {"status": "test"})
    weights = ActorWeights.load(tmp_path / "bursty_workload.npz")
    x = np.random.default_rng(1).uniform(0, 2, size=OBS_DIM).astype(np.float32)
    with torch.no_grad():
        expect = agent.actor(torch.as_tensor(rms.normalize(x[None], args.obs_clip, args.obs_epsilon)))[0].numpy()
    got = np.concatenate(weights.logits(x.astype(np.float64)))
    assert np.allclose(got, expect, atol=1e-4)


def test_evaluate_plays_the_same_held_out_seeds_for_every_agent(capsys):
    import llmserve_env.tools.evaluate as evaluate

    assert evaluate.main(["--agent", "static,random", "--task", "static_workload", "--episodes", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["seeds"] == [1_000_000, 1_000_001, 1_000_002]
    static, rnd = result["scores"]["static"]["static_workload"], result["scores"]["random"]["static_workload"]
    assert static["n"] == rnd["n"] == 3 and static["mean"] > rnd["mean"]
    assert any(line.startswith("paired difference static - agent") for line in out)


def test_evaluate_refuses_an_unknown_task_before_playing(capsys):
    import llmserve_env.tools.evaluate as evaluate

    with pytest.raises(SystemExit) as exc:
        evaluate.main(["--agent", "static", "--task", "static_workload,nope", "--episodes", "1"])
    assert exc.value.code == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("encoding", ["default", "family"])
def test_trainer_export_on_a_prefix_task_plays_through_ppo_policy(tmp_path, encoding):
    """Weights trained on a prefix-caching task carry the affinity head: train.py sizes the actor by the
    task's view and writes it into the JSON, PPOPolicy rebuilds the same view and the same logits."""
    torch = train_extra("torch")
    import llmserve_env.tools.train as train
    from llmserve_env.agents.views import make_view, view_dims

    task = get_task("multiturn_cluster")
    nvec, dim = view_dims(task, encoding=encoding)
    agent = train.Agent(dim, nvec, hidden=16)
    rms = train.RunningMeanStd((dim,))
    rms.update(np.random.default_rng(0).uniform(0, 2, size=(64, dim)))
    args = train.Args(task="multiturn_cluster", encoding=encoding, out_dir=tmp_path, command="test")
    train.save(agent, rms, args, {"status": "test"})
    policy = PPOPolicy("multiturn_cluster", weights_path=tmp_path / "multiturn_cluster.npz")
    assert policy.weights.nvec == nvec
    from llmserve_env.core.inprocess import InProcessEnv

    obs = InProcessEnv().reset("multiturn_cluster", 0)
    view = make_view(task, encoding=encoding)
    x = view.features(obs)
    with torch.no_grad():
        expect = agent.actor(torch.as_tensor(rms.normalize(x[None], args.obs_clip, args.obs_epsilon)))[0].numpy()
    assert np.allclose(np.concatenate(policy.weights.logits(x.astype(np.float64))), expect, atol=1e-4)
    assert policy.act(obs).cache_affinity is not None
