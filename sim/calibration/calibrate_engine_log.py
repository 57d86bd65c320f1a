"""A llama.cpp server's own per-request timings, lined up with the requests real mode recorded.

`llama-server` logs, when a request's slot is released, how long its prompt took and how long its
generated tokens took, as the engine measured them (no HTTP, no client clock):

    slot print_timing: id  7 | task 0 | prompt eval time =  123.97 ms /  22 tokens ( 5.63 ms per token, ...)
    slot print_timing: id  7 | task 0 |        eval time =  354.89 ms /  32 tokens (11.45 ms per token, ...)

These are the truth a records fit and a replay are checked against: the gateway's TTFT from dispatch
should be the prompt eval time plus loopback, and its TPOT the eval time over the tokens after the first.
`prompt eval` counts only the tokens the slot had to process (a prefix already in the slot's cache is
skipped), so it can be below the prompt the server reported in `usage`.

Lines are matched to records in completion order: the server logs a request when it releases the
slot, right after its last token, so the k-th timing line is the k-th request to finish (each pair
is checked: the line generated the tokens the record counted). Requests the episode's end cut off
may have lines of their own, after all the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_PROMPT = re.compile(r"print_timing: id\s+(\d+) \| task (\d+) \| prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"print_timing: id\s+(\d+) \| task (\d+) \|\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """One request as the engine timed it (milliseconds and tokens)."""

    slot: int
    task: int
    prompt_ms: float
    prompt_tokens: int
    eval_ms: float
    eval_tokens: int

    @property
    def prompt_ms_per_token(self) -> float:
        return self.prompt_ms / self.prompt_tokens if self.prompt_tokens else float("nan")

    @property
    def eval_ms_per_token(self) -> float:
        return self.eval_ms / self.eval_tokens if self.eval_tokens else float("nan")


def read_engine_log(path: Path) -> list[EngineTiming]:
    """Every completed request's timing in the log, in the order the server released them."""
    prompts: dict[tuple[int, int], tuple[float, int]] = {}
    out: list[EngineTiming] = []
    for line in Path(path).read_text(errors="replace").splitlines():
        m = _PROMPT.search(line)
        if m:
            prompts[(int(m[1]), int(m[2]))] = (float(m[3]), int(m[4]))
            continue
        m = _EVAL.search(line)
        if m:
            key = (int(m[1]), int(m[2]))
            if key in prompts:
                pm, pn = prompts.pop(key)
                out.append(EngineTiming(key[0], key[1], pm, pn, float(m[3]), int(m[4])))
    return out


def match(rows: list[dict[str, Any]], timings: list[EngineTiming]) -> list[tuple[dict[str, Any], EngineTiming]]:
    """Pair the recorded requests that completed with the engine's lines, both in completion order.

    Raises ValueError when they cannot be the same requests (counts or generated tokens differ), so a
    log from another run is never silently compared."""
    done = sorted((r for r in rows if r.get("status") == "ok"),
                  key=lambda r: (round(float(r["finish_s"]), 3), -(r.get("usage_prompt_tokens") or 0)))
    # a request cut off by the episode's end (recorded `cancelled`) may still have been finished by the
    # server, after every request that was recorded finishing: its line comes last
    cut = sum(1 for r in rows if r.get("status") == "cancelled" and r.get("dispatch_s") is not None)
    if not len(done) <= len(timings) <= len(done) + cut:
        raise ValueError(f"{len(done)} completed requests recorded ({cut} cut off by the episode's end) but "
                         f"{len(timings)} timing lines in the log")
    pairs = []
    for r, t in zip(done, timings[:len(done)], strict=True):
        # the engine's eval tokens count the first (sampled with the prompt) in some versions, not in others
        if int(r["output_tokens"]) - t.eval_tokens not in (0, 1):
            raise ValueError(f"request {r['request_id']}: {r['output_tokens']} tokens recorded, the engine's "
                             f"line (slot {t.slot}, task {t.task}) generated {t.eval_tokens}")
        pairs.append((r, t))
    return pairs


@dataclass(frozen=True, slots=True)
class EngineSpeed:
    """The engine's speed over one run, from its own log: what moves when the machine is loaded."""

    requests: int
    prompt_ms_per_token: float     # median over requests
    eval_ms_per_token: float       # median over requests (all concurrencies)

    def line(self) -> str:
        return (f"engine log: {self.requests} requests, prompt {self.prompt_ms_per_token:.2f} ms/token, "
                f"eval {self.eval_ms_per_token:.2f} ms/token (medians)")


def engine_speed(timings: list[EngineTiming]) -> EngineSpeed:
    pp = [t.prompt_ms_per_token for t in timings if t.prompt_tokens]
    ev = [t.eval_ms_per_token for t in timings if t.eval_tokens]
    return EngineSpeed(len(timings), float(np.median(pp)) if pp else float("nan"),
                       float(np.median(ev)) if ev else float("nan"))
