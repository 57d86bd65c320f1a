"""Arrivals as a list that also carries them as columns.

The Backend contract hands a window's requests over as `list[Arrival]`. The workload generators draw
them as arrays, and the compiled simulator wants arrays back; turning ~50 objects a window into columns
field by field was a sixth of a single-server window. `ArrivalList` is the list of objects every
consumer reads, with the generator's arrays kept beside it; `windows()` slices both, and
`arrival_columns()` gives a list's columns: the kept ones, or gathered from the objects once.

Any change to an `ArrivalList` drops its columns (they are gathered again on the next read), so they
can never disagree with the objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from llmserve_env.shared.backend import Arrival


@dataclass(frozen=True, slots=True)
class ArrivalColumns:
    """`Arrival`'s fields, one array per field, one row per arrival (tenant names in an object array).
    `prefixed`: some arrival carries prefix ids (they are not columns: such windows go to the Python
    engine, which reads the objects)."""

    request_id: np.ndarray  # int64
    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    tenant: np.ndarray  # object
    priority: np.ndarray  # int64
    prefixed: bool = False

    def __len__(self) -> int:
        return len(self.request_id)

    def slice(self, lo: int, hi: int) -> ArrivalColumns:
        """Rows lo..hi-1 (views, no copy)."""
        return ArrivalColumns(self.request_id[lo:hi], self.arrival_s[lo:hi], self.prompt_tokens[lo:hi],
                              self.output_tokens[lo:hi], self.tenant[lo:hi], self.priority[lo:hi], self.prefixed)

    def take(self, rows: np.ndarray) -> ArrivalColumns:
        """Rows `rows`, in that order (copies)."""
        return ArrivalColumns(self.request_id[rows], self.arrival_s[rows], self.prompt_tokens[rows],
                              self.output_tokens[rows], self.tenant[rows], self.priority[rows], self.prefixed)

    def tenant_index(self, names: Sequence[str]) -> np.ndarray:
        """Each row's tenant as its index in `names` (a task's tenants, in order); ValueError naming any
        tenant not among them."""
        index = np.full(len(self), -1, dtype=np.int64)
        for i, name in enumerate(names):
            index[self.tenant == name] = i
        if len(self) and index.min() < 0:
            unknown = sorted(set(self.tenant[index < 0].tolist()))
            raise ValueError(f"arrivals from tenant(s) {unknown} the task does not have (tenants: {', '.join(names)})")
        return index

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


def _dropping(name: str) -> Any:
    base = getattr(list, name)

    def method(self: ArrivalList, *args: Any, **kwargs: Any) -> Any:
        self._columns = None
        return base(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"list.{name}, dropping the columns."
    return method


class ArrivalList(list[Arrival]):
    """A list of arrivals with their columns kept beside it (see the module docstring). A slice of it is a
    plain list; `windows()` slices the columns with it."""

    __slots__ = ("_columns",)

    def __init__(self, arrivals: Iterable[Arrival] = (), columns: ArrivalColumns | None = None):
        super().__init__(arrivals)
        if columns is not None and len(columns) != len(self):
            raise ValueError(f"{len(columns)} rows of columns for {len(self)} arrivals")
        self._columns = columns

    @property
    def columns(self) -> ArrivalColumns:
        if self._columns is None:
            self._columns = ArrivalColumns.of(self)
        return self._columns

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy keep the columns (list's protocol appends after)
        return (ArrivalList, (list(self), self._columns))


# every list method that changes the list drops the columns
for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__", "__delitem__",
              "__iadd__", "__imul__"):
    setattr(ArrivalList, _name, _dropping(_name))


def arrival_columns(arrivals: Sequence[Arrival]) -> ArrivalColumns:
    """`arrivals` as columns: an ArrivalList's own, else gathered from the objects."""
    if isinstance(arrivals, ArrivalList):
        return arrivals.columns
    return ArrivalColumns.of(arrivals)
