"""The router's rule, one definition for both backends: least outstanding work.

A request's outstanding work is the tokens still to process for it: its prompt until its first
token (prefill), plus the output tokens still to come. A new request goes to the replica with the
least outstanding work, ties to the lowest index.

- sim (`sim/cluster.py`): the work is the router's own estimate between window starts (it sees no
  engine's queue mid-window), drained at each replica's measured processing rate;
- real (`gateway/dispatcher.py`): the gateway sees every request it routed, so the work is exact:
  the prompt until the first streamed chunk, plus max_tokens minus the chunks received so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llmserve_env.shared.jit import njit_borrowing


def outstanding_work(prompt_tokens: int, target_output_tokens: int, produced_tokens: int, started: bool) -> float:
    """Tokens still to process for one request (prompt until its first token, then output to come)."""
    return max(0, target_output_tokens - produced_tokens) + (0 if started else prompt_tokens)


def total_outstanding_work(prompt_tokens: np.ndarray, target_output_tokens: np.ndarray, produced_tokens: np.ndarray,
                           started: np.ndarray) -> int:
    """`outstanding_work` summed over many requests given as integer columns, `started` a boolean column (the
    simulator's pending requests come as columns, shared/records.py, thousands of rows under a long queue; its
    cluster asks for every replica's at once: `outstanding_work_by_segment`)."""
    return int(_total_work(prompt_tokens, target_output_tokens, produced_tokens, started))


@njit_borrowing
def _total_work(prompt: np.ndarray, target: np.ndarray, produced: np.ndarray, started: np.ndarray) -> int:
    """`outstanding_work`'s rule over the rows, in one loop (compiled where numba imports)."""
    total = 0
    for j in range(prompt.shape[0]):
        left = target[j] - produced[j]
        total += (left if left > 0 else 0) + (0 if started[j] else prompt[j])
    return total


def outstanding_work_by_segment(prompt_tokens: np.ndarray, target_output_tokens: np.ndarray,
                                produced_tokens: np.ndarray, started: np.ndarray, bounds: Sequence[int]) -> list[int]:
    """`total_outstanding_work` of each run of rows bounds[s]..bounds[s+1]-1, in one call (a cluster's replicas'
    pending requests, joined in replica order)."""
    out = np.empty(len(bounds) - 1, dtype=np.int64)
    _segment_work(prompt_tokens, target_output_tokens, produced_tokens, started, np.asarray(bounds, dtype=np.int64), out)
    return out.tolist()


@njit_borrowing
def _segment_work(prompt: np.ndarray, target: np.ndarray, produced: np.ndarray, started: np.ndarray,
                  bounds: np.ndarray, out: np.ndarray) -> None:
    for s in range(out.shape[0]):
        lo, hi = bounds[s], bounds[s + 1]
        out[s] = _total_work(prompt[lo:hi], target[lo:hi], produced[lo:hi], started[lo:hi])


def least_outstanding(work: Sequence[float]) -> int:
    """The index of the replica with the least outstanding work; ties to the lowest index."""
    if not work:
        raise ValueError("no replica to route to")
    best = 0
    for i in range(1, len(work)):
        if work[i] < work[best]:
            best = i
    return best
