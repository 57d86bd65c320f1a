"""Arrivals carried as columns beside the objects (shared/arrival_list.py): the columns always say what the
objects say, through generation, windowing, changes, pickling and copying."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from llmserve_env.shared.arrival_list import ArrivalColumns, ArrivalList, arrival_columns
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.tasks import TASKS
from llmserve_env.shared.workloads import generate_arrivals, windows


def same(a: ArrivalColumns, b: ArrivalColumns) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) and getattr(a, f).dtype == getattr(b, f).dtype
               for f in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "tenant", "priority")) \
        and a.prefixed == b.prefixed


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_generated_columns_are_the_objects_fields(task_id):
    task = TASKS[task_id]
    arrivals = generate_arrivals(task, 3)
    wins = windows(arrivals, task)
    assert same(arrival_columns(arrivals), ArrivalColumns.of(list(arrivals)))
    assert [a for w in wins for a in w] == list(arrivals)
    for w in wins:
        assert same(arrival_columns(w), ArrivalColumns.of(list(w)))


def test_windows_of_a_plain_list_split_as_of_the_columns():
    task = TASKS["bursty_workload"]
    arrivals = generate_arrivals(task, 1)
    assert isinstance(arrivals, ArrivalList) and arrivals._columns is not None
    assert windows(list(arrivals), task) == windows(arrivals, task)


def test_any_change_drops_the_columns():
    a = [Arrival(i, 0.1 * i, 10 + i, 5, "t", 1) for i in range(6)]
    extra = Arrival(9, 1.0, 3, 3, "u", 0)
    changes = [lambda x: x.append(extra), lambda x: x.extend([extra]), lambda x: x.insert(0, extra),
               lambda x: x.pop(), lambda x: x.remove(x[0]), lambda x: x.clear(), lambda x: x.sort(key=lambda r: -r.arrival_s),
               lambda x: x.reverse(), lambda x: x.__setitem__(1, extra), lambda x: x.__delitem__(slice(0, 2)),
               lambda x: x.__iadd__([extra]), lambda x: x.__imul__(2)]
    for change in changes:
        arrivals = ArrivalList(a, ArrivalColumns.of(a))
        change(arrivals)
        assert same(arrivals.columns, ArrivalColumns.of(list(arrivals)))


def test_pickle_and_copy_keep_the_columns():
    arrivals = generate_arrivals(TASKS["adversarial_multitenant"], 0)[:40]
    kept = ArrivalList(arrivals, ArrivalColumns.of(arrivals))
    for other in (pickle.loads(pickle.dumps(kept)), copy.copy(kept), copy.deepcopy(kept)):
        assert isinstance(other, ArrivalList) and other == kept
        assert other._columns is not None and same(other.columns, kept.columns)


def test_columns_must_match_the_list():
    a = [Arrival(0, 0.0, 10, 5)]
    with pytest.raises(ValueError, match="2 rows of columns for 1 arrivals"):
        ArrivalList(a, ArrivalColumns.of(a + a))


def test_prefix_ids_are_flagged():
    a = [Arrival(0, 0.0, 32, 5), Arrival(1, 0.5, 32, 5, prefix_ids=(1, 2), prefix_block_tokens=16)]
    assert ArrivalColumns.of(a).prefixed and not ArrivalColumns.of(a[:1]).prefixed
