"""Request traces read from files, and the slice of one that an episode replays.

Two formats:

- CSV with a header naming `arrived_at,num_prefill_tokens,num_decode_tokens` (seconds, tokens;
  the format of Vidur and Splitwise; other columns are ignored, any order).
- JSONL, one object per line with `timestamp` (milliseconds), `input_length`, `output_length`
  (Mooncake's format; other keys such as `hash_ids` are ignored).

The format is taken from the extension (.csv; .jsonl/.json), else from the first non-blank
character (`{` means JSONL). Rules: times finite and >= 0; token counts integers >= 0, where 0 is
raised to 1 (every request prompts and produces at least one token); blank lines are skipped;
rows are sorted by time (stable). A missing, unreadable or malformed file raises `TraceError`
naming the file and, for a bad row, its 1-based line number; messages never echo file content.

Replay (`replay_slice`): the rows with start_s <= t < start_s + duration_s x speedup, shifted to
start at 0 and divided by `speedup` (speedup 4 plays the trace 4x faster). `start_s` defaults to
the first row's time, so a replay begins with the trace's first request.
"""

from __future__ import annotations

import csv
import json
import math
import os
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

CSV_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
JSONL_KEYS = ("timestamp", "input_length", "output_length")
# Guards against replaying something that is not a trace (or a file meant to exhaust memory or
# time). Each is checked while the file streams in, before the bytes past it are held: the file
# is read line by line (never whole), a line longer than MAX_LINE_BYTES is refused unread, and
# rows go into flat arrays (24 bytes each), so loading costs at most MAX_TRACE_ROWS x 24 bytes.
MAX_TRACE_BYTES = 256 * 1024 * 1024
MAX_TRACE_ROWS = 2_000_000
MAX_LINE_BYTES = 64 * 1024
# A request's prompt or output: more tokens than any model's context holds is not a request
# (1e19 tokens overflowed the simulator's int64 counters), so it is refused with its line.
MAX_REQUEST_TOKENS = 1 << 20
# Parsing stops with a TraceError past this much wall clock (checked every few thousand rows):
# a 2 M-row file parses in about 5 s on one core; a slower file is not worth a server's time.
MAX_PARSE_S = 20.0

class TraceError(ValueError):
    """A trace file that is missing, unreadable or malformed (the message names file and line)."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: parallel arrays sorted by arrival time (seconds, as recorded)."""

    path: str
    fmt: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


@dataclass(frozen=True, slots=True)
class TraceSlice:
    """The part of a trace one episode replays, on the episode clock (seconds from 0)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    start_s: float
    speedup: float

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace file (cached per path, size and modification time)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise TraceError(f"trace file {str(p)!r}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r}: not a regular file")
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceError(f"trace file {str(p)!r}: {st.st_size} bytes, more than the {MAX_TRACE_BYTES} allowed")
    return _load_cached(str(p.resolve()), st.st_size, st.st_mtime_ns, str(p))


@lru_cache(maxsize=16)
def _load_cached(resolved: str, size: int, mtime_ns: int, shown: str) -> Trace:
    del size, mtime_ns  # part of the cache key only: a rewritten file is read again
    fmt, t, prompt, output = _parse_elsewhere(resolved, shown) if _worker.enabled else _parse_file(resolved, shown)
    order = np.argsort(t, kind="stable")
    return Trace(path=shown, fmt=fmt, arrival_s=t[order], prompt_tokens=prompt[order], output_tokens=output[order])


def _parse_file(resolved: str, shown: str) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(format, arrival times, prompt tokens, output tokens) of a file, in file order."""
    try:
        with open(resolved, "rb") as f:
            fmt = _detect_format(resolved, f.read(MAX_LINE_BYTES))
            f.seek(0)
            rows = _Rows(shown)
            lines = _lines(f, shown, rows.deadline)
            _parse_jsonl(lines, rows) if fmt == "jsonl" else _parse_csv(lines, rows)
    except OSError as exc:
        raise TraceError(f"trace file {shown!r}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if not len(rows.t):
        raise TraceError(f"trace file {shown!r}: no requests in it")
    return (fmt, np.frombuffer(rows.t, dtype=np.float64), np.frombuffer(rows.prompt, dtype=np.int64),
            np.frombuffer(rows.output, dtype=np.int64))


class _Worker:
    """Trace files parse in a child process for a server (see `parse_in_worker_process`)."""

    def __init__(self) -> None:
        self.enabled = False
        self.slots = threading.BoundedSemaphore(2)  # parses at once; the others wait their turn


_worker = _Worker()


def parse_in_worker_process(enabled: bool = True) -> None:
    """Parse trace files in a child process instead of the calling thread (the server turns this on).

    Parsing is pure Python: in a thread of the server it held the GIL against the event loop (four
    bad traces refused at once put /health's p99 at ~150 ms), and a thread cannot be stopped. A
    child (`python -m llmserve_env.shared.traces`) costs the server nothing but the wait, is killed
    at its time limit, and at most two run at once, so memory stays two files' worth.
    """
    _worker.enabled = enabled


def _parse_elsewhere(resolved: str, shown: str) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    import io
    import subprocess
    import sys

    with _worker.slots:
        try:
            done = subprocess.run([sys.executable, "-m", "llmserve_env.shared.traces", resolved, shown],
                                  capture_output=True, timeout=MAX_PARSE_S + 10, check=False)
        except subprocess.TimeoutExpired:
            raise TraceError(f"trace file {shown!r}: not parsed within {MAX_PARSE_S:g} s") from None
    if done.returncode == 2:
        raise TraceError(done.stderr.decode("utf-8", "replace").strip()[-500:])
    if done.returncode != 0:
        raise TraceError(f"trace file {shown!r}: the trace parser process failed (exit {done.returncode})")
    with np.load(io.BytesIO(done.stdout)) as z:
        return str(z["fmt"]), z["t"], z["prompt"], z["output"]


def _child(argv: list[str]) -> int:
    """`python -m llmserve_env.shared.traces RESOLVED SHOWN`: parse, write the arrays (npz) to stdout;
    a TraceError's message to stderr with exit 2."""
    import sys

    resolved, shown = argv
    try:
        fmt, t, prompt, output = _parse_file(resolved, shown)
    except TraceError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    np.savez(sys.stdout.buffer, fmt=np.array(fmt), t=t, prompt=prompt, output=output)
    return 0


def _detect_format(path: str, head: bytes) -> str:
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "jsonl" if head.lstrip().startswith(b"{") else "csv"


class _Rows:
    """The rows read so far, in flat arrays, with the row cap and the time limit."""

    def __init__(self, shown: str):
        self.shown = shown
        self.t = array("d")
        self.prompt = array("q")
        self.output = array("q")
        self.deadline = time.monotonic() + MAX_PARSE_S

    def add(self, t: float, prompt: int, output: int) -> None:
        self.t.append(t)
        self.prompt.append(prompt)
        self.output.append(output)
        n = len(self.t)
        if n > MAX_TRACE_ROWS:
            raise TraceError(f"trace file {self.shown!r}: more than {MAX_TRACE_ROWS} requests")
        if n % 4096 == 0 and time.monotonic() > self.deadline:
            raise TraceError(f"trace file {self.shown!r}: not parsed within {MAX_PARSE_S:g} s "
                             f"(stopped at request {n})")


def _lines(f: BinaryIO, shown: str, deadline: float) -> Iterator[str]:
    """The file's lines as text, each at most MAX_LINE_BYTES, the total at most MAX_TRACE_BYTES,
    read before `deadline` (checked here too: blank lines add no rows)."""
    total = 0
    line_no = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        line_no += 1
        total += len(raw)
        if line_no % 65536 == 0 and time.monotonic() > deadline:
            raise TraceError(f"trace file {shown!r}: not parsed within {MAX_PARSE_S:g} s (stopped at line {line_no})")
        if total > MAX_TRACE_BYTES:
            raise TraceError(f"trace file {shown!r}: more than the {MAX_TRACE_BYTES} bytes allowed")
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"trace file {shown!r}, line {line_no}: longer than {MAX_LINE_BYTES} bytes")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"trace file {shown!r}, line {line_no}: not UTF-8 text") from None


def _time(value: object, shown: str, line: int, name: str, scale: float) -> float:
    if isinstance(value, bool):
        raise TraceError(f"trace file {shown!r}, line {line}: {name} must be a number")
    try:
        t = float(value) * scale  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"trace file {shown!r}, line {line}: {name} is not a number") from None
    if not math.isfinite(t) or t < 0:
        raise TraceError(f"trace file {shown!r}, line {line}: {name} must be finite and >= 0")
    return t


def _tokens(value: object, shown: str, line: int, name: str) -> int:
    if isinstance(value, bool):
        raise TraceError(f"trace file {shown!r}, line {line}: {name} must be an integer")
    if isinstance(value, int):
        n = value
    else:
        try:
            f = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise TraceError(f"trace file {shown!r}, line {line}: {name} is not an integer") from None
        if not math.isfinite(f) or f != int(f):
            raise TraceError(f"trace file {shown!r}, line {line}: {name} is not an integer")
        n = int(f)
    if n < 0:
        raise TraceError(f"trace file {shown!r}, line {line}: {name} must be >= 0")
    if n > MAX_REQUEST_TOKENS:
        raise TraceError(f"trace file {shown!r}, line {line}: {name} is above {MAX_REQUEST_TOKENS} tokens")
    return max(1, n)


def _parse_csv(lines: Iterator[str], rows: _Rows) -> None:
    shown = rows.shown
    reader = csv.reader(lines)
    header: list[str] | None = None
    idx: tuple[int, int, int] = (0, 0, 0)
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error:
            raise TraceError(f"trace file {shown!r}, line {reader.line_num}: not a well-formed CSV row") from None
        line_no = reader.line_num
        if not fields or all(not f.strip() for f in fields):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            missing = [c for c in CSV_COLUMNS if c not in header]
            if missing:
                raise TraceError(
                    f"trace file {shown!r}, line {line_no}: the CSV header must name "
                    f"{','.join(CSV_COLUMNS)} (missing: {','.join(missing)})"
                )
            idx = (header.index(CSV_COLUMNS[0]), header.index(CSV_COLUMNS[1]), header.index(CSV_COLUMNS[2]))
            continue
        if len(fields) != len(header):
            raise TraceError(
                f"trace file {shown!r}, line {line_no}: {len(fields)} fields, the header has {len(header)}"
            )
        rows.add(
            _time(fields[idx[0]].strip(), shown, line_no, CSV_COLUMNS[0], 1.0),
            _tokens(fields[idx[1]].strip(), shown, line_no, CSV_COLUMNS[1]),
            _tokens(fields[idx[2]].strip(), shown, line_no, CSV_COLUMNS[2]),
        )
    if header is None:
        raise TraceError(f"trace file {shown!r}: empty (expected a header {','.join(CSV_COLUMNS)})")


def _json_object(line: str, shown: str, line_no: int) -> dict[str, Any]:
    """One JSONL row as an object; TraceError naming the line otherwise (shared/prefix.py reads its
    rows with it too)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # bad JSON, an integer past 4300 digits, deep nesting
        raise TraceError(f"trace file {shown!r}, line {line_no}: not valid JSON") from None
    if not isinstance(obj, dict):
        raise TraceError(f"trace file {shown!r}, line {line_no}: expected a JSON object")
    return obj


def _parse_jsonl(lines: Iterator[str], rows: _Rows) -> None:
    shown = rows.shown
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        obj = _json_object(line, shown, line_no)
        missing = [k for k in JSONL_KEYS if k not in obj]
        if missing:
            raise TraceError(f"trace file {shown!r}, line {line_no}: missing key(s) {', '.join(missing)}")
        rows.add(
            _time(obj["timestamp"], shown, line_no, "timestamp", 1e-3),
            _tokens(obj["input_length"], shown, line_no, "input_length"),
            _tokens(obj["output_length"], shown, line_no, "output_length"),
        )


def replay_slice(trace: Trace, duration_s: float, speedup: float = 1.0, start_s: float | None = None) -> TraceSlice:
    """The rows an episode of `duration_s` seconds replays (see the module docstring)."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise TraceError(f"trace {trace.path!r}: speedup must be a positive number, got {speedup!r}")
    t0 = float(trace.arrival_s[0]) if start_s is None else float(start_s)
    if not (math.isfinite(t0) and t0 >= 0):
        raise TraceError(f"trace {trace.path!r}: start_s must be finite and >= 0, got {start_s!r}")
    lo = int(np.searchsorted(trace.arrival_s, t0, side="left"))
    hi = int(np.searchsorted(trace.arrival_s, t0 + duration_s * speedup, side="left"))
    t = (trace.arrival_s[lo:hi] - t0) / speedup
    # Scaling can push a time just under the end up to it; keep every replayed arrival inside.
    t = np.minimum(t, np.nextafter(duration_s, 0.0))
    return TraceSlice(
        arrival_s=t,
        prompt_tokens=trace.prompt_tokens[lo:hi].copy(),
        output_tokens=trace.output_tokens[lo:hi].copy(),
        start_s=t0,
        speedup=float(speedup),
    )


def packaged_trace_path(name: str) -> Path:
    """A trace shipped in shared/data (see shared/data/PROVENANCE.md)."""
    return Path(__file__).resolve().parent / "data" / name


if __name__ == "__main__":
    import sys

    sys.exit(_child(sys.argv[1:]))
