"""Trace files: both formats, every malformation named by file and line, replay slicing."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from llmserve_env.shared.tasks import TASKS
from llmserve_env.shared.traces import (
    TraceError,
    load_trace,
    packaged_trace_path,
    replay_slice,
)
from llmserve_env.shared.workloads import _median_sigma, generate_arrivals, resolve_task

ROWS = [(0.0, 374, 44), (0.5, 396, 109), (1.25, 879, 55), (2.0, 91, 16), (7.5, 12, 3)]


def write_csv(path, rows=ROWS, header="arrived_at,num_prefill_tokens,num_decode_tokens"):
    path.write_text(header + "\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows))
    return path


def write_jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                                        "hash_ids": [1, 2]}) + "\n" for t, p, o in rows))
    return path


def test_packaged_azure_conv_trace_loads():
    tr = load_trace(packaged_trace_path("azure_conv_2023.csv"))
    assert len(tr) == 19366 and tr.fmt == "csv"
    assert tr.arrival_s[0] == 0.0 and tr.prompt_tokens[0] == 374 and tr.output_tokens[0] == 44
    assert np.all(np.diff(tr.arrival_s) >= 0)
    assert tr.prompt_tokens.min() >= 1 and tr.output_tokens.min() >= 1


def test_csv_and_jsonl_give_the_same_requests(tmp_path):
    a = load_trace(write_csv(tmp_path / "t.csv"))
    b = load_trace(write_jsonl(tmp_path / "t.jsonl"))
    assert a.fmt == "csv" and b.fmt == "jsonl"
    np.testing.assert_allclose(a.arrival_s, b.arrival_s)
    assert a.prompt_tokens.tolist() == b.prompt_tokens.tolist() == [r[1] for r in ROWS]
    assert a.output_tokens.tolist() == b.output_tokens.tolist() == [r[2] for r in ROWS]


def test_format_sniffed_without_extension_and_extra_columns_any_order(tmp_path):
    p = tmp_path / "trace.txt"
    p.write_text("num_decode_tokens,extra,arrived_at,num_prefill_tokens\n5,x,1.5,10\n7,y,0.5,20\n")
    tr = load_trace(p)
    assert tr.fmt == "csv"
    assert tr.arrival_s.tolist() == [0.5, 1.5]  # sorted by time
    assert tr.prompt_tokens.tolist() == [20, 10] and tr.output_tokens.tolist() == [7, 5]
    q = tmp_path / "trace.log"
    write_jsonl(q)
    assert load_trace(q).fmt == "jsonl"


def test_zero_tokens_raised_to_one_and_blank_lines_skipped(tmp_path):
    p = tmp_path / "z.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n\n0.0,0,0\n1.0,5.0,3\n")
    tr = load_trace(p)
    assert tr.prompt_tokens.tolist() == [1, 5] and tr.output_tokens.tolist() == [1, 3]


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(TraceError, match="nope.csv"):
        load_trace(missing)
    with pytest.raises(TraceError, match="not a regular file"):
        load_trace(tmp_path)


@pytest.mark.parametrize(
    ("name", "text", "line", "what"),
    [
        ("a.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,2,2\nx,3,3\n", 4, "arrived_at"),
        ("b.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1.5,1\n", 2, "num_prefill_tokens"),
        ("c.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,-4\n", 2, "num_decode_tokens"),
        ("d.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\nnan,1,1\n", 2, "arrived_at"),
        ("e.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1\n", 2, "fields"),
        ("f.csv", "time,prompt,output\n0,1,1\n", 1, "header"),
        ("g.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1,\n', 2, "JSON"),
        ("h.jsonl", '{"timestamp": 0, "input_length": 5}\n', 1, "output_length"),
        ("i.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n\n[1, 2]\n', 3, "object"),
        ("j.jsonl", '{"timestamp": -1, "input_length": 5, "output_length": 2}\n', 1, "timestamp"),
        ("k.jsonl", '{"timestamp": 0, "input_length": true, "output_length": 2}\n', 1, "input_length"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, name, text, line, what):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TraceError) as err:
        load_trace(p)
    msg = str(err.value)
    assert name in msg and f"line {line}" in msg and what in msg


def test_errors_never_echo_file_content(tmp_path):
    p = tmp_path / "secret.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\nhunter2,1,1\n")
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert "hunter2" not in str(err.value)
    q = tmp_path / "passwd"
    q.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(TraceError) as err:
        load_trace(q)
    assert "root" not in str(err.value).replace(str(q), "")


def test_empty_and_non_utf8_files(tmp_path):
    e = tmp_path / "empty.csv"
    e.write_text("")
    with pytest.raises(TraceError, match="empty"):
        load_trace(e)
    h = tmp_path / "header_only.csv"
    h.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(h)
    b = tmp_path / "bin.csv"
    b.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="UTF-8"):
        load_trace(b)


def test_rewritten_file_is_read_again(tmp_path):
    p = write_csv(tmp_path / "t.csv")
    assert len(load_trace(p)) == 5
    write_csv(p, ROWS[:2])
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert len(load_trace(p)) == 2


def test_replay_slice_cuts_shifts_and_scales(tmp_path):
    tr = load_trace(write_csv(tmp_path / "t.csv"))
    s = replay_slice(tr, duration_s=1.0, speedup=2.0)  # trace seconds [0, 2)
    assert s.arrival_s.tolist() == [0.0, 0.25, 0.625]
    assert s.prompt_tokens.tolist() == [374, 396, 879]
    s = replay_slice(tr, duration_s=10.0, speedup=1.0, start_s=0.5)
    assert s.arrival_s.tolist() == [0.0, 0.75, 1.5, 7.0]
    with pytest.raises(TraceError, match="speedup"):
        replay_slice(tr, 1.0, speedup=0.0)


def test_trace_task_from_either_format(tmp_path):
    for p in (write_csv(tmp_path / "t.csv"), write_jsonl(tmp_path / "t.jsonl")):
        task = resolve_task(f"trace:{p}")
        assert task.task_id == f"trace:{p}"
        assert task.workload["kind"] == "trace" and task.workload["requests"] == 5
        assert task.horizon == 8  # cut to the trace: last request at 7.5 s, windows of 1 s
        arr = generate_arrivals(task, 0)
        assert [a.arrival_s for a in arr] == [r[0] for r in ROWS]
        assert [(a.prompt_tokens, a.output_tokens) for a in arr] == [(r[1], r[2]) for r in ROWS]
        assert arr == generate_arrivals(task, 12345)  # a trace ignores the seed
        assert task.describe()["tenants"][0]["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 60.0}


def test_trace_task_options(tmp_path):
    p = write_csv(tmp_path / "t.csv")
    task = resolve_task(f"trace:{p}?speedup=2&horizon=2&ttft_ms=250&tpot_ms=30&window_s=0.5")
    assert task.horizon == 2 and task.window_s == 0.5
    assert task.tenants[0].ttft_slo_ms == 250.0 and task.tenants[0].tpot_slo_ms == 30.0
    assert [a.arrival_s for a in generate_arrivals(task, 0)] == [0.0, 0.25, 0.625]
    with pytest.raises(TraceError, match="unknown option"):
        resolve_task(f"trace:{p}?speed=2")
    with pytest.raises(TraceError, match="speedup"):
        resolve_task(f"trace:{p}?speedup=-1")
    with pytest.raises(TraceError, match="horizon"):
        resolve_task(f"trace:{p}?horizon=1.5")
    with pytest.raises(TraceError, match="start_s"):
        resolve_task(f"trace:{p}?start_s=100")
    with pytest.raises(TraceError, match="missing.csv"):
        resolve_task(f"trace:{tmp_path / 'missing.csv'}")


def test_builtin_azure_task_replays_seeded_stretches_of_equal_work():
    task = TASKS["azure_conv_trace"]
    trace = load_trace(packaged_trace_path(task.workload["packaged"]))
    t = task.tenants[0]
    assert (t.prompt_tokens, t.output_tokens) == (_median_sigma(trace.prompt_tokens), _median_sigma(trace.output_tokens))
    total_s = task.horizon * task.window_s
    a, b = generate_arrivals(task, 0), generate_arrivals(task, 1)
    assert a == generate_arrivals(task, 0) and a != b  # deterministic per seed, different across seeds
    target = task.workload["tokens_per_s"] * total_s
    biggest = int((trace.prompt_tokens + trace.output_tokens).max())
    for arr in (a, b):
        tokens = sum(x.prompt_tokens + x.output_tokens for x in arr)
        assert target - biggest <= tokens <= target  # the stretch holds the target work
        assert 0.0 <= arr[0].arrival_s and arr[-1].arrival_s < total_s
    # The replayed lengths are real rows of the trace, in order.
    rows = list(zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=True))
    got = [(x.prompt_tokens, x.output_tokens) for x in a]
    assert any(rows[i:i + len(got)] == got for i in range(len(rows) - len(got) + 1) if rows[i] == got[0])
