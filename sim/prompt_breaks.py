"""Where llama-server stops a prompt's prefill between iterations: its context checkpoints.

A model with sliding-window attention (Gemma 3) or a recurrent or hybrid memory cannot roll its cache
back to an arbitrary position, so llama-server saves context checkpoints while it prefills a prompt,
and a checkpoint covers only tokens of earlier iterations: filling a batch, it stops a slot's prompt at
the start of the last user message, `4 + n_ubatch` tokens before the prompt's end and 4 tokens before
it (`checkpoint_offsets` in tools/server/server-context.cpp, read at 001d906 to learn; on by default:
`--ctx-checkpoints 32`). The rest of the prompt runs in the next iterations, each with every decoding
slot's token again. So a one-turn prompt of N < 4 + n_ubatch tokens takes three iterations ([0, 1),
[1, N - 4), [N - 4, N)) where a plain Llama model takes one, and under load each extra iteration costs a
decode step of every running slot: with 4 slots decoding, gemma-3-270m (one CPU thread) served a new
70-token prompt in three iterations of 69, 295 and 92 ms that stalled the 4 streams three times
(its -lv 4 log: checkpoints at n_tokens 1 and 66), where SmolLM2 (no sliding window) stalled them once.

Stated simplifications: the last user message starts at a fixed position (`head`: 1 for one user turn
after the BOS token, as the log shows); the mid-prompt breaks at earlier user messages
(`--checkpoint-min-step`, 8192 tokens apart) and llama-server's rule that generating slots wait while a
prompt restored from a checkpoint runs are not modelled. A profile selects it with
`engine.prompt_breaks` = {"kind": "llama_checkpoints", "head": 1, "tail": 4, "ubatch": 512}; absent,
every prompt is chunked by the token budget alone, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KIND = "llama_checkpoints"


@dataclass(frozen=True, slots=True)
class PromptBreaks:
    head: int = 1      # the last user message's first position
    tail: int = 4      # the last checkpoint, this many tokens before the prompt's end
    ubatch: int = 512  # llama-server's -ub: the other one is tail + ubatch before the end

    def __post_init__(self) -> None:
        if self.head < 0 or self.tail < 1 or self.ubatch < 1:
            raise ValueError(f"engine.prompt_breaks: head must be >= 0, tail and ubatch >= 1; got head "
                             f"{self.head}, tail {self.tail}, ubatch {self.ubatch}")

    @staticmethod
    def from_engine(engine: dict[str, Any]) -> PromptBreaks | None:
        """The breaks in a profile's `engine` section, or None (no `prompt_breaks`)."""
        d = engine.get("prompt_breaks")
        if d is None:
            return None
        if d.get("kind") != KIND:
            raise ValueError(f"engine.prompt_breaks.kind must be {KIND!r}, got {d.get('kind')!r}")
        return PromptBreaks(int(d.get("head", 1)), int(d.get("tail", 4)), int(d.get("ubatch", 512)))

    def to_engine(self) -> dict[str, Any]:
        return {"kind": KIND, "head": self.head, "tail": self.tail, "ubatch": self.ubatch}

    def room(self, done: int, n: int) -> int:
        """Tokens a prompt of `n` with `done` computed may take in this iteration: up to its next break."""
        stop = n
        for b in (self.head, n - self.tail - self.ubatch, n - self.tail):
            if done < b < stop:
                stop = b
        return stop - done


def parse_prompt_breaks(text: str) -> dict[str, Any] | None:
    """`calibrate records --prompt-breaks`: "none", or "llama" / "llama:UBATCH" (llama-server's context
    checkpoints with -ub UBATCH, 512 by default), as a profile's `engine.prompt_breaks`."""
    if text == "none":
        return None
    name, _, ub = text.partition(":")
    if name == "llama":
        try:
            return PromptBreaks(ubatch=int(ub) if ub else 512).to_engine()
        except ValueError:
            pass
    raise ValueError(f"--prompt-breaks must be none, llama or llama:UBATCH (a positive integer), got {text!r}")
