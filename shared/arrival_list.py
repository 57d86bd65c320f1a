"""Arrivals held as columns, their objects built only when a reader asks for one.

The Backend contract hands a window's requests over as a `Sequence[Arrival]`. The workload generators
draw them as arrays, and the compiled simulator, the router, the metrics and the grader read arrays:
building ~10^4 frozen `Arrival` objects an episode that nothing on that path reads was a fifth of a
cluster episode (and of a Gym reset). `ArrivalList` is that sequence: its columns (`ArrivalColumns`)
always, its objects built all at once the first time one is read (indexing, iterating, comparing),
then kept. It is immutable, so the two can never disagree; slicing it slices the columns, and
`arrival_columns()` gives any sequence's columns (an ArrivalList's own, or gathered from the objects).
A plain `list[Arrival]` is a `Sequence[Arrival]` too: every consumer takes either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, overload

import numpy as np
from llmserve_env.shared.backend import ARRIVAL_SLOT_SETTERS, Arrival


@dataclass(frozen=True, slots=True)
class ArrivalColumns:
    """`Arrival`'s fields, one array per field, one row per arrival (tenant names in an object array).
    `prefixed`: some arrival carries prefix ids (they are not columns: such windows go to the Python
    engine, which reads the objects). `known_index`: where the generator drew the rows' tenants by index,
    (the task's tenant names, each row's index among them): `tenant_index` of those names is then that array,
    with no string compared (shared with every caller: read it, never write it)."""

    request_id: np.ndarray  # int64
    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    tenant: np.ndarray  # object
    priority: np.ndarray  # int64
    prefixed: bool = False
    known_index: tuple[tuple[str, ...], np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.request_id)

    def slice(self, lo: int, hi: int) -> ArrivalColumns:
        """Rows lo..hi-1 (views, no copy)."""
        known = self.known_index
        return ArrivalColumns(self.request_id[lo:hi], self.arrival_s[lo:hi], self.prompt_tokens[lo:hi],
                              self.output_tokens[lo:hi], self.tenant[lo:hi], self.priority[lo:hi], self.prefixed,
                              None if known is None else (known[0], known[1][lo:hi]))

    def take(self, rows: np.ndarray) -> ArrivalColumns:
        """Rows `rows`, in that order (copies)."""
        known = self.known_index
        return ArrivalColumns(self.request_id[rows], self.arrival_s[rows], self.prompt_tokens[rows],
                              self.output_tokens[rows], self.tenant[rows], self.priority[rows], self.prefixed,
                              None if known is None else (known[0], known[1][rows]))

    def tenant_index(self, names: Sequence[str]) -> np.ndarray:
        """Each row's tenant as its index in `names` (a task's tenants, in order); ValueError naming any
        tenant not among them. Never write it: it may be the columns' own `known_index`."""
        known = self.known_index
        if known is not None and tuple(names) == known[0]:
            return known[1]
        index = np.full(len(self), -1, dtype=np.int64)
        for i, name in enumerate(names):
            index[self.tenant == name] = i
        if len(self) and index.min() < 0:
            unknown = sorted(set(self.tenant[index < 0].tolist()))
            raise ValueError(f"arrivals from tenant(s) {unknown} the task does not have (tenants: {', '.join(names)})")
        return index

    def tenant_counts(self, names: Sequence[str]) -> list[int]:
        """How many rows each tenant of `names` has, in that order (ValueError naming any other tenant)."""
        return np.bincount(self.tenant_index(names), minlength=len(names)).tolist()

    @classmethod
    def concat(cls, parts: Sequence[ArrivalColumns]) -> ArrivalColumns:
        """The parts' rows one after another."""
        if not parts:
            return cls.of([])
        return cls(np.concatenate([p.request_id for p in parts]), np.concatenate([p.arrival_s for p in parts]),
                   np.concatenate([p.prompt_tokens for p in parts]), np.concatenate([p.output_tokens for p in parts]),
                   np.concatenate([p.tenant for p in parts]), np.concatenate([p.priority for p in parts]),
                   any(p.prefixed for p in parts), _joined_index(parts))

    @classmethod
    def of(cls, arrivals: Sequence[Arrival]) -> ArrivalColumns:
        """Gathered from the objects."""
        return cls(np.array([a.request_id for a in arrivals], dtype=np.int64),
                   np.array([a.arrival_s for a in arrivals], dtype=np.float64),
                   np.array([a.prompt_tokens for a in arrivals], dtype=np.int64),
                   np.array([a.output_tokens for a in arrivals], dtype=np.int64),
                   np.array([a.tenant for a in arrivals], dtype=object),
                   np.array([a.priority for a in arrivals], dtype=np.int64),
                   any(a.prefix_ids is not None for a in arrivals))


def _joined_index(parts: Sequence[ArrivalColumns]) -> tuple[tuple[str, ...], np.ndarray] | None:
    """The parts' known indices joined, where every part has one among the same names."""
    known = [p.known_index for p in parts]
    first = known[0]
    if first is None or any(k is None or k[0] != first[0] for k in known):
        return None
    return first[0], np.concatenate([k[1] for k in known])  # type: ignore[index]


def arrivals_of(columns: ArrivalColumns) -> list[Arrival]:
    """The `Arrival` objects of columns without prefix ids (`Arrival(request_id, arrival_s, ...)` each)."""
    n = len(columns)
    objs = list(map(object.__new__, repeat(Arrival, n)))  # then each field's slot written by a `map` (no frame each)
    values = (columns.request_id.tolist(), columns.arrival_s.tolist(), columns.prompt_tokens.tolist(),
              columns.output_tokens.tolist(), columns.tenant.tolist(), columns.priority.tolist(), repeat(None, n),
              repeat(0, n))
    for setter, vals in zip(ARRIVAL_SLOT_SETTERS, values, strict=True):
        deque(map(setter, objs, vals), maxlen=0)
    return objs


class ArrivalList(Sequence[Arrival]):
    """An immutable sequence of arrivals: columns, and the objects built on first read (module docstring).
    Built from columns (`ArrivalList(columns=...)`, no prefix ids) or from objects (`ArrivalList(objs)`, the
    columns gathered when first asked for, or given beside them)."""

    __slots__ = ("_columns", "_objects")

    def __init__(self, arrivals: Iterable[Arrival] | None = None, columns: ArrivalColumns | None = None):
        objects = None if arrivals is None else list(arrivals)
        if objects is None:
            if columns is None:
                objects = []
            elif columns.prefixed:
                raise ValueError("prefix ids are not columns: build an ArrivalList with prefix ids from its objects")
        elif columns is not None and len(columns) != len(objects):
            raise ValueError(f"{len(columns)} rows of columns for {len(objects)} arrivals")
        self._objects: list[Arrival] | None = objects
        self._columns = columns

    @property
    def columns(self) -> ArrivalColumns:
        if self._columns is None:
            self._columns = ArrivalColumns.of(self.objects)
        return self._columns

    @property
    def objects(self) -> list[Arrival]:
        """The arrivals as objects (built at the first call, then kept; read-only)."""
        if self._objects is None:
            assert self._columns is not None
            self._objects = arrivals_of(self._columns)
        return self._objects

    @property
    def built(self) -> bool:
        """Whether the objects exist (tests: what a path read)."""
        return self._objects is not None

    def __len__(self) -> int:
        return len(self._objects) if self._objects is not None else len(self.columns)

    @overload
    def __getitem__(self, i: int) -> Arrival: ...

    @overload
    def __getitem__(self, i: slice) -> ArrivalList: ...

    def __getitem__(self, i: int | slice) -> Arrival | ArrivalList:
        if not isinstance(i, slice):
            return self.objects[i]
        out = ArrivalList.__new__(ArrivalList)
        out._objects = None if self._objects is None else self._objects[i]
        cols = self._columns
        if cols is not None:
            lo, hi, step = i.indices(len(self))
            cols = cols.slice(lo, hi) if step == 1 else cols.take(np.arange(lo, hi, step))
        out._columns = cols
        return out

    def __iter__(self) -> Iterator[Arrival]:
        return iter(self.objects)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrivalList | list):
            return self.objects == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __add__(self, other: Sequence[Arrival]) -> list[Arrival]:
        return [*self, *other]

    def __radd__(self, other: Sequence[Arrival]) -> list[Arrival]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"ArrivalList({self.objects!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy keep what exists (the objects not built stay so)
        return (ArrivalList, (self._objects, self._columns))


def arrival_columns(arrivals: Sequence[Arrival]) -> ArrivalColumns:
    """`arrivals` as columns: an ArrivalList's own, else gathered from the objects."""
    if isinstance(arrivals, ArrivalList):
        return arrivals.columns
    return ArrivalColumns.of(arrivals)


def concat_arrivals(parts: Iterable[Sequence[Arrival]]) -> Sequence[Arrival]:
    """The parts' arrivals one after another: an ArrivalList of their columns where every part is one
    (without prefix ids; an empty part of any kind joins), else a list of the objects."""
    full = [p for p in parts if len(p)]
    lists = [p for p in full if isinstance(p, ArrivalList) and not p.columns.prefixed]
    if len(lists) == len(full):
        return ArrivalList(columns=ArrivalColumns.concat([p.columns for p in lists]))
    return [a for p in full for a in p]
