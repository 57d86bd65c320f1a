"""Arrivals held as columns (shared/arrival_list.py): the objects, built only when read, say what the columns
say, through generation, windowing, routing, slicing, comparing, pickling and copying; and the simulator's
path reads no object at all."""

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
    names = [t.name for t in task.tenants]
    assert same(arrival_columns(arrivals), ArrivalColumns.of(list(arrivals)))
    assert [a for w in wins for a in w] == list(arrivals)
    for w in wins:
        assert same(arrival_columns(w), ArrivalColumns.of(list(w)))
        # the generator's tenant indices, where kept, are the names' own indices
        assert np.array_equal(arrival_columns(w).tenant_index(names), ArrivalColumns.of(list(w)).tenant_index(names))
        assert arrival_columns(w).tenant_counts(names) == [sum(a.tenant == n for a in w) for n in names]
    rows = np.arange(len(arrivals))[::-3]
    joined = ArrivalColumns.concat([arrival_columns(w) for w in wins]).take(rows)
    assert np.array_equal(joined.tenant_index(names), ArrivalColumns.of([arrivals[i] for i in rows]).tenant_index(names))
    if arrival_columns(arrivals).known_index is not None:  # other names (another order): compared as strings
        assert np.array_equal(arrival_columns(arrivals).tenant_index(names[::-1]),
                              ArrivalColumns.of(list(arrivals)).tenant_index(names[::-1]))


def test_windows_of_a_plain_list_split_as_of_the_columns():
    task = TASKS["bursty_workload"]
    arrivals = generate_arrivals(task, 1)
    assert isinstance(arrivals, ArrivalList) and not arrivals.built
    assert windows(list(arrivals), task) == windows(arrivals, task)


def test_objects_are_built_once_on_first_read_and_equal_the_fields():
    cols = ArrivalColumns(np.array([4, 7]), np.array([0.25, 0.5]), np.array([10, 20]), np.array([3, 4]),
                          np.array(["a", "b"], dtype=object), np.array([0, 1]))
    arrivals = ArrivalList(columns=cols)
    assert len(arrivals) == 2 and not arrivals.built  # its length, from the columns
    assert arrivals[1] == Arrival(7, 0.5, 20, 4, "b", 1) and arrivals.built
    assert arrivals[1] is arrivals[1] and list(arrivals) == [Arrival(4, 0.25, 10, 3, "a", 0), arrivals[1]]
    assert arrivals == list(arrivals) and list(arrivals) == arrivals and arrivals != list(arrivals)[:1]
    assert arrivals + [arrivals[0]] == [*arrivals, arrivals[0]] and [arrivals[0]] + arrivals == [arrivals[0], *arrivals]


def test_a_slice_slices_the_columns_and_builds_nothing():
    arrivals = generate_arrivals(TASKS["adversarial_multitenant"], 0)
    part = arrivals[10:30]
    assert isinstance(part, ArrivalList) and not part.built and not arrivals.built
    assert same(part.columns, ArrivalColumns.of(list(arrivals)[10:30])) and part == list(arrivals)[10:30]
    stepped = arrivals[1:9:3]
    assert same(stepped.columns, ArrivalColumns.of(list(arrivals)[1:9:3]))


def test_it_is_immutable():
    arrivals = ArrivalList([Arrival(0, 0.0, 10, 5)])
    for change in (lambda x: x.append(Arrival(1, 1.0, 1, 1)), lambda x: x.__setitem__(0, None), lambda x: x.clear()):
        with pytest.raises((AttributeError, TypeError)):
            change(arrivals)
    with pytest.raises(TypeError, match="unhashable"):
        hash(arrivals)


def test_pickle_and_copy_keep_what_exists():
    arrivals = generate_arrivals(TASKS["adversarial_multitenant"], 0)[:40]
    for other in (pickle.loads(pickle.dumps(arrivals)), copy.copy(arrivals), copy.deepcopy(arrivals)):
        assert isinstance(other, ArrivalList) and not other.built and same(other.columns, arrivals.columns)
        assert other == arrivals
    kept = ArrivalList(list(arrivals))
    for other in (pickle.loads(pickle.dumps(kept)), copy.deepcopy(kept)):
        assert other.built and other == kept and same(other.columns, arrivals.columns)


def test_columns_must_match_the_objects_and_prefix_ids_need_the_objects():
    a = [Arrival(0, 0.0, 10, 5)]
    with pytest.raises(ValueError, match="2 rows of columns for 1 arrivals"):
        ArrivalList(a, ArrivalColumns.of(a + a))
    p = [Arrival(1, 0.5, 32, 5, prefix_ids=(1, 2), prefix_block_tokens=16)]
    with pytest.raises(ValueError, match="prefix ids are not columns"):
        ArrivalList(columns=ArrivalColumns.of(p))
    assert ArrivalList(p, ArrivalColumns.of(p))[0].prefix_ids == (1, 2)


@pytest.mark.parametrize("task_id", ["diurnal_autoscale", "multitenant_family", "static_workload", "azure_conv_trace"])
def test_the_simulator_reads_no_arrival_object(monkeypatch, task_id):
    """An episode in process (routing, engines, metrics, observation, grade) reads the arrivals' columns only,
    where every replica is ready from the window's start (a cold start's window routes arrival by arrival)."""
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.agents.rollout import play_episode
    from llmserve_env.core.inprocess import InProcessEnv
    from llmserve_env.shared import arrival_list

    built: list[int] = []
    real = arrival_list.arrivals_of
    monkeypatch.setattr(arrival_list, "arrivals_of", lambda cols: built.append(len(cols)) or real(cols))
    env = InProcessEnv()
    play_episode(env, make_policy("tuned_static" if TASKS[task_id].is_cluster else "static", task_id), task_id, 0)
    assert env.episode.done and not built


def test_prefix_ids_are_flagged():
    a = [Arrival(0, 0.0, 32, 5), Arrival(1, 0.5, 32, 5, prefix_ids=(1, 2), prefix_block_tokens=16)]
    assert ArrivalColumns.of(a).prefixed and not ArrivalColumns.of(a[:1]).prefixed
