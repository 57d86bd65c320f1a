"""A window's resource samples as the compiled engine wrote them (`SampleColumns`), built into
`ResourceSample` records only when a reader asks for them (shared/backend.py `WindowReport.samples`).

No hot path reads the samples (the metrics, the reward and the observation do not), yet every window
built two or three records per replica (~2 µs of a ~70 µs static_workload window, timed; py-spy's
share overstated it): the engine now hands over its sample buffers' rows (copies) with the KV pool's
figures of that window, and the records are the same ones, field for field, when they are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from llmserve_env.shared.backend import ResourceSample
from llmserve_env.sim.kv_cache import kv_memory_gib

# One block of samples: times, (running, queued, KV blocks used) rows, the window-end sample (or None),
# then the KV pool's total blocks, weights GiB, bytes per block and GPUs, as they were that window.
Block = tuple[np.ndarray, np.ndarray, tuple[float, int, int, int] | None, int, float, float, int]


class SampleColumns:
    """Resource samples in order: blocks of the compiled engine's rows, or records (a Python engine's)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Iterable[Block | list[ResourceSample]] = ()):
        self.parts: list[Block | list[ResourceSample]] = list(parts)

    def __len__(self) -> int:
        n = 0
        for p in self.parts:
            n += len(p) if isinstance(p, list) else p[0].shape[0] + (p[2] is not None)
        return n

    def records(self) -> list[ResourceSample]:
        out: list[ResourceSample] = []
        for p in self.parts:
            if isinstance(p, list):
                out += p
                continue
            t_s, counts, close, total, weights_gib, block_bytes, gpus = p
            rows = [(t, *c) for t, c in zip(t_s.tolist(), counts.tolist(), strict=True)]
            if close is not None:
                rows.append(close)
            out += [ResourceSample(t, running, queued, used, total, kv_memory_gib(weights_gib, block_bytes, gpus, used))
                    for t, running, queued, used in rows]
        return out

    @staticmethod
    def concat(parts: Sequence[list[ResourceSample] | SampleColumns]) -> list[ResourceSample] | SampleColumns:
        """`parts` joined in order: a list where every part is one (the Python engines'), else columns."""
        if all(isinstance(p, list) for p in parts):
            return [s for p in parts for s in p]  # type: ignore[union-attr]
        joined: list[Block | list[ResourceSample]] = []
        for p in parts:
            if isinstance(p, list):
                if p:
                    joined.append(p)
            else:
                joined += p.parts
        return SampleColumns(joined)
