"""When the stand-in's tokens are ready: online continuous batching priced by the simulator's
step-time model, or exact fixed timings."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmserve_env.shared.admission import KV_BLOCK_TOKENS, blocks_for
from llmserve_env.sim.measured_step import measured_models
from llmserve_env.sim.profiles import GIB, load_profile
from llmserve_env.sim.step_time import step_model

# How far behind its schedule the batching loop may run and still catch up (tokens of a late iteration
# go out together, the mean rate stays the profile's). Measured at batch 1, 200 tokens, on a 2-core host
# at load 6.5-9 (issue 29), mean / median ITL over the priced step: no catching up (the old loop)
# +12..+32 % / +12 %; 5 ms -0.1..+11 % / -3 %; 100 ms -0.3..+0.1 % / -2..-3 %.
RESYNC_S = 0.1


@dataclass(slots=True, eq=False)
class Completion:
    """One completion being served: the batcher pushes token times into `out`; None marks the end."""

    prompt_tokens: int
    max_tokens: int
    prefilled: int = 0
    generated: int = 0
    cancelled: bool = False
    out: asyncio.Queue[float | None] = field(default_factory=asyncio.Queue)

    @property
    def blocks(self) -> int:
        return blocks_for(self.prompt_tokens + self.max_tokens)


class ContinuousBatcher:
    """Online continuous batching of (profile, tier), each iteration really waited for as long as
    the step-time model prices it."""

    def __init__(self, profile_id: str, tier: str, max_num_seqs: int):
        p = load_profile(profile_id)
        # a profile fitted to another engine's records (sim/measured_step.py) is timed by its own model
        self.model = measured_models(p).get((tier, "unified")) or step_model(profile_id, tier)
        self.token_budget = p.token_budget
        self.max_num_seqs = max_num_seqs
        kv_tokens = p.kv_capacity_gib(tier, False) * GIB / p.kv_bytes_per_token(False)
        self.blocks_total = max(1, int(kv_tokens // KV_BLOCK_TOKENS))
        self.blocks_used = 0
        self.waiting: deque[Completion] = deque()
        self.running: list[Completion] = []
        self.iterations = 0
        self.resyncs = 0  # iterations that started late by more than RESYNC_S (an overloaded loop)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, seq: Completion) -> None:
        if seq.blocks > self.blocks_total:
            raise ValueError(f"prompt + max_tokens ({seq.prompt_tokens + seq.max_tokens} tokens) exceeds the KV cache")
        self.waiting.append(seq)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="standin-batcher")
        self._wake.set()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            if head.cancelled:
                self.waiting.popleft()
                continue
            if self.blocks_used + head.blocks > self.blocks_total:
                break
            self.waiting.popleft()
            self.blocks_used += head.blocks
            self.running.append(head)

    def _retire(self, seq: Completion) -> None:
        self.running.remove(seq)
        self.blocks_used -= seq.blocks

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due: float | None = None  # when the last iteration was due to end
        while True:
            for s in [s for s in self.running if s.cancelled]:
                self._retire(s)
            self._admit()
            if not self.running:
                due = None
                self._wake.clear()
                await self._wake.wait()
                continue
            # Back-to-back iterations keep an absolute schedule: each starts when the last was due to end,
            # so the loop's wake-up lateness (epoll waits in whole milliseconds, a busy host) does not add
            # up step after step (it made batch-1 ITL 15 % long: 7.43 ms served for 6.46 ms priced, issue
            # 29). A loop more than RESYNC_S behind starts afresh: that time stays lost.
            now = loop.time()
            start = now if due is None or now - due > RESYNC_S else due
            self.resyncs += due is not None and start == now
            # vLLM's order: every decoding sequence first, then prefill chunks in the token budget left.
            decode = [s for s in self.running if s.prefilled == s.prompt_tokens]
            budget = self.token_budget - len(decode)
            chunks: list[tuple[Completion, int]] = []
            for s in self.running:
                if s.prefilled < s.prompt_tokens and budget > 0:
                    c = min(s.prompt_tokens - s.prefilled, budget)
                    chunks.append((s, c))
                    budget -= c
            ctx = float(sum(s.prompt_tokens + s.generated for s in decode))
            finishing = sum(1 for s, c in chunks if s.prefilled + c == s.prompt_tokens)
            t = self.model.iteration_s(len(decode), ctx, 0, [(c, s.prefilled) for s, c in chunks],
                                       sum(c for _, c in chunks), finishing)
            due = start + t
            await asyncio.sleep(max(0.0, due - loop.time()))
            self.iterations += 1
            now = loop.time()
            for s, c in chunks:
                s.prefilled += c
                if s.prefilled == s.prompt_tokens:
                    decode.append(s)  # its prefill sampled the first token
            for s in decode:
                if s.cancelled:
                    continue
                s.generated += 1
                s.out.put_nowait(now)
                if s.generated >= s.max_tokens:
                    s.out.put_nowait(None)
                    self._retire(s)


async def batched_tokens(seq: Completion) -> AsyncIterator[float]:
    """Token times as the batcher produces them."""
    while (t := await seq.out.get()) is not None:
        yield t


async def fixed_tokens(seq: Completion, received: float, ttft_s: float, itl_s: float) -> AsyncIterator[float]:
    """Exact timings: token k (k = 0..) at received + ttft + k * itl, on an absolute schedule.

    The response task sleeps itself (no producer task, no queue): the cheapest way to keep hundreds
    of streams on time."""
    loop = asyncio.get_running_loop()
    for k in range(seq.max_tokens):
        await asyncio.sleep(max(0.0, received + ttft_s + k * itl_s - loop.time()))
        yield loop.time()
