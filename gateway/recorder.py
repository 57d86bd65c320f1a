"""Every finished request as one JSONL line: the simulator's calibration reads these files.

Enabled by `--record PATH` where a script offers it, or LLMSERVE_REAL_RECORD=PATH. Each line is
a `RequestRecord` (its fields as named in shared/backend.py, times on the episode clock) plus
what calibration needs beside it: the model and tier, tokens sent and billed, the episode, the
server's completion id, the offset from the episode clock to the loop clock (time.monotonic), and
every HTTP attempt (start, end, outcome, status, Retry-After).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TextIO

from llmserve_env.shared.backend import RequestRecord

_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))


class JsonlRecorder:
    """Appends records to `path` (parent directories created); not thread-safe: one loop writes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered: each record reaches the file when it is written (one write call, a few us),
        # so a crash or a kill loses none of the requests already ended.
        self._file: TextIO | None = self.path.open("a", encoding="utf-8", buffering=1)
        self.lines = 0

    def write(self, record: RequestRecord, extra: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"recorder for {self.path} is closed")
        # Shallow, not dataclasses.asdict: asdict deep-copies every chunk time (~0.5 ms a record
        # at 512 chunks, on the event loop); json.dumps needs no copy.
        row = {name: getattr(record, name) for name in _FIELDS}
        row.update(extra)
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.lines += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __repr__(self) -> str:
        return f"JsonlRecorder({str(self.path)!r}, lines={self.lines})"


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a recording, parsed (for calibration and tests)."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
