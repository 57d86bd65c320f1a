"""A measured engine's attention over a prompt's context: `engine.cached_context_s`.

A prompt whose prefix is cached (vLLM's prefix cache, llama-server's slots) skips that prefix's prefill,
but each token it does compute still attends to every token before it, cached or not. The kernel-based
step model prices that attention from the kernels (sim/step_time.py, `prefill_attention_s` over (new,
cached) chunks). A measured model fitted on prompts prefilled from scratch folds a prompt's own attention
into its per-token price and cannot see a cached prefix's. This field prices it, per pair of a computed
token and a token before it in its context:

- the affine model (sim/measured_step.py), every causal pair of the iteration's chunks:
  `+ cached_context_s * sum of c * (cached + (c + 1) / 2)`, with `token_s` fitted beside it (the records
  fit holds the field fixed), so that `token_s` is the per-token cost without attention;
- a step table (sim/step_table.py), whose prefill knots are whole prompts from scratch with their own
  pairs inside: only the pairs with the tokens cached before each chunk, `+ cached_context_s * sum of
  c * cached`.

Measured on llama-server by `bench/cached_prefill.py` (77 tokens computed after 0..768 cached on one
slot: the slope of their eval time over the cached tokens, divided by 77): SmolLM2-135M Q4_1, one CPU
thread: 2.13, 2.54 and 2.91 us in three runs, and 2.65 us on a line through 0..3,072 cached (each point
within 2.1 %; sim/data/llama_cpu_cached_prefill.csv, PROVENANCE.md). Absent: 0, every profile as before.
`calibrate records --cached-context-s` fits a profile with it.
"""

from __future__ import annotations

from typing import Any

KEY = "cached_context_s"


def cached_context_s(engine: dict[str, Any]) -> float:
    """The profile's `engine.cached_context_s` (seconds per computed token per cached token), 0 when absent."""
    v = engine.get(KEY)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise ValueError(f"engine.{KEY} must be a number >= 0 (seconds per computed prompt token per cached "
                         f"token), got {v!r}")
    return float(v)


def cached_pairs(chunks: list[tuple[int, int]]) -> float:
    """Pairs of a computed token and a cached token before it, over an iteration's (computed, cached) chunks."""
    return float(sum(c * ctx for c, ctx in chunks))


def causal_pairs(chunks: list[tuple[int, int]]) -> float:
    """Every pair of a computed token and a token before it (cached, or computed earlier in its chunk, or
    itself): sum of c * (cached + (c + 1) / 2), as the kernel model's prefill attention counts them."""
    return float(sum(c * (ctx + (c + 1) * 0.5) for c, ctx in chunks))
