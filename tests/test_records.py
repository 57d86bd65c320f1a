"""A report's requests as columns (shared/records.py `RequestBatch`) read as the records they stand for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llmserve_env.shared.backend import TERMINAL_STATUSES, WindowReport
from llmserve_env.shared.records import STATUSES, FirstTokens, ItlSamples, RequestBatch, RequestRecord


def records() -> list[RequestRecord]:
    return [
        RequestRecord(3, "chat", 0, 0.25, 120, 40, "ok", 0.3, 0.41, 1.2, 40, [], 0, 1, 0.0, None),
        RequestRecord(4, "batch", 2, 0.5, 9000, 10, "rejected", None, None, 0.5, 0, [], 0, 0, 0.0, "too long"),
        RequestRecord(7, "chat", 1, 0.75, 60, 30, "running", 0.8, 0.9, None, 12, [0.9, 0.95, 1.01], 2, 1, 0.002, None),
        RequestRecord(9, "code", 1, 0.9, 300, 200, "queued"),
        RequestRecord(11, "code", 1, 0.95, 30, 5, "preempted", 0.96, None, 1.0, 0, [], 1, 1, 0.0, "reclaimed"),
    ]


def test_records_survive_the_round_trip_through_columns():
    recs = records()
    batch = RequestBatch.from_records(recs)
    assert len(batch) == len(recs)
    assert batch.records() == recs
    assert list(batch) == recs
    assert np.isnan(batch.dispatch_s[1]) and np.isnan(batch.finish_s[3])  # None as NaN
    assert batch.records()[2].chunk_times_s is not recs[2].chunk_times_s  # a copy, not the caller's list
    assert RequestBatch.from_records([]).records() == []


def test_joined_batches_keep_each_rows_message_and_chunks():
    recs = records()
    parts = [RequestBatch.from_records(recs[:2]), RequestBatch.from_records([]), RequestBatch.from_records(recs[2:])]
    joined = RequestBatch.concat(parts)
    assert joined.records() == recs
    assert joined.error == {1: "too long", 4: "reclaimed"} and joined.chunk_times == {2: [0.9, 0.95, 1.01]}
    assert RequestBatch.concat([parts[0]]) is parts[0]
    assert len(RequestBatch.concat([])) == 0
    # batches from their 2-D blocks join by block; one without (columns given one by one) column by column
    assert joined.blocks is not None and joined.request_id.base is joined.blocks[0]
    loose = RequestBatch(**{f.name: getattr(parts[2], f.name) for f in dataclasses.fields(RequestBatch)
                            if f.name != "blocks"})
    assert loose.blocks is None
    mixed = RequestBatch.concat([parts[0], loose])
    assert mixed.blocks is None and mixed.records() == recs


def test_a_slice_is_its_rows_with_their_messages_and_chunks():
    recs = records()
    joined = RequestBatch.from_records(recs)
    loose = RequestBatch(**{f.name: getattr(joined, f.name) for f in dataclasses.fields(RequestBatch) if f.name != "blocks"})
    for batch in (joined, loose):
        for lo, hi in ((0, 2), (1, 4), (2, len(recs)), (3, 3)):
            part = batch.slice(lo, hi)
            assert part.records() == recs[lo:hi]
            assert (part.blocks is None) == (batch.blocks is None)
        assert batch.slice(0, len(recs)) is batch


def test_every_status_has_a_code():
    assert TERMINAL_STATUSES | {"queued", "running", "preempted"} == set(STATUSES)
    with pytest.raises(KeyError):
        RequestBatch.from_records([dataclasses.replace(records()[0], status="lost")])


def test_a_report_reads_columns_as_records_and_keeps_what_a_reader_changes():
    recs = records()
    rep = WindowReport(t0=0.0, dt=1.0, finished=RequestBatch.from_records(recs[:2]),
                       pending=RequestBatch.from_records(recs[2:4]))
    assert rep.finished == recs[:2] and rep.pending == recs[2:4]
    rep.finished.append(recs[4])  # the list is the truth once read
    assert rep.finished == [*recs[:2], recs[4]]
    assert rep.finished_batch().records() == [*recs[:2], recs[4]]
    assert rep.to_dict()["finished"] == [dataclasses.asdict(r) for r in (*recs[:2], recs[4])]
    plain = WindowReport(t0=0.0, dt=1.0, finished=recs[:2])
    assert plain.finished_batch().records() == recs[:2] and len(plain.pending_batch()) == 0


def test_first_tokens_and_itl_samples_join_as_lists_or_as_columns():
    """A cluster joins its replicas' first tokens and ITL samples: lists stay a list (the Python engine's),
    any columns make columns, and either reads as the rows joined in order."""
    a, b = [(1, "x", 0.5), (2, "y", 0.25)], [(7, "x", 1.5)]
    assert FirstTokens.concat([a, b]) == a + b
    joined = FirstTokens.concat([a, FirstTokens.of(b)])
    assert isinstance(joined, FirstTokens) and joined.rows() == a + b and len(joined) == 3
    gaps = [(0.01, 3), (0.02, 1)]
    assert ItlSamples.concat([gaps, []]) == gaps
    cols = ItlSamples.concat([ItlSamples.of(gaps), ItlSamples.of([])])
    assert isinstance(cols, ItlSamples) and cols.rows() == gaps
    assert ItlSamples.of([]).rows() == [] and FirstTokens.concat([]) == []
