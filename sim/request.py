"""One request's state inside the simulator (the entity; the engine and scheduler move it around).

Decode progress is kept lazily: a decoding request emits `e` tokens per decode iteration, so its
progress at decode iteration `it` is `progress + (it - sync_iter) * e` and its finish iteration is
known when it starts decoding. Nothing is touched per iteration; runs of iterations cost O(1).
"""

from __future__ import annotations

from llmserve_env.shared.backend import RequestRecord

WAITING, PREFILL, TRANSFER, DECODE, DONE = 0, 1, 2, 3, 4


class SimRequest:
    __slots__ = ("rid", "tenant", "priority", "arrival", "prompt", "target", "rec", "accept", "e", "state",
                 "prefill_target", "prefilled", "blocks", "progress", "sync_iter", "finish_iter", "gen",
                 "last_emit_s", "reported", "wkey", "snap", "snap_key", "admitted_seq", "queued_clean",
                 "pkeys", "phold", "pshared", "skeys", "pslot", "routed_hit")
    # the snapshot is handed out read-only and replaced, never changed: a fork shares it (sim/fork.py)
    __fork_shared__ = ("snap",)

    def __init__(self, rec: RequestRecord, accept: float):
        self.rec = rec
        self.rid = rec.request_id
        self.tenant = rec.tenant
        self.priority = rec.priority
        self.arrival = rec.arrival_s
        self.prompt = rec.prompt_tokens
        self.target = rec.target_output_tokens
        self.accept = accept          # speculative acceptance rate of this request's tokens
        self.e = 1.0                  # tokens emitted per decode iteration at the current depth
        self.state = WAITING
        self.prefill_target = self.prompt  # tokens to (re)compute before emitting
        self.prefilled = 0
        self.blocks = 0               # KV blocks held while prefilling / in transfer
        self.progress = 0.0           # output tokens emitted as of sync_iter
        self.sync_iter = 0
        self.finish_iter = 0
        self.gen = 0                  # bumped when a heap entry for this request goes stale
        self.last_emit_s = 0.0
        self.reported = 0             # output tokens already counted in a window report
        self.wkey: tuple = ()
        self.admitted_seq = 0         # the engine's admission count when this request last started running
        self.snap: RequestRecord | None = None  # last pending snapshot, reused while nothing changed
        self.snap_key: tuple = ()
        # True while the request waits in the queue unchanged since its last pending snapshot (set by
        # the engine's report, cleared by every push into the queue): its snapshot and reported tokens
        # still hold, so the report reuses them without rebuilding the key (queues of thousands)
        self.queued_clean = False
        # prefix caching (sim/prefix_cache.py): the chain keys of the prompt's full units (None: the
        # request carries no prefix ids and never touches the cache), how many leading units it
        # references, and their KV blocks (counted once, in the pool's in-use blocks, not in its own)
        self.pkeys: tuple[int, ...] | None = None
        self.phold = 0
        self.pshared = 0
        # a slot-cache engine (sim/slot_cache.py) instead: the chain keys (pkeys stays None, so the block
        # cache is never touched), and the slot the request runs in (-1: none)
        self.skeys: tuple[int, ...] | None = None
        self.pslot = -1
        # prompt tokens the cluster's tracked router counted as cached when it routed the request (sim/cluster.py):
        # left out of its outstanding work, as the gateway leaves out its routed hit; 0 otherwise
        self.routed_hit = 0

    def progress_at(self, it: int) -> float:
        if self.state == DECODE:
            p = self.progress + (it - self.sync_iter) * self.e
            return p if p < self.target else float(self.target)
        return self.progress

    def snapshot_tokens(self, tokens: int) -> RequestRecord:
        """A copy of the record as it stands with `tokens` output tokens emitted so far (read-only;
        reused across windows while unchanged)."""
        r = self.rec
        key = (self.state == WAITING, tokens, r.preemptions, r.dispatch_s, r.first_token_s)
        if key == self.snap_key and self.snap is not None:
            return self.snap
        snap = RequestRecord(r.request_id, r.tenant, r.priority, r.arrival_s, r.prompt_tokens,
                             r.target_output_tokens, "queued" if key[0] else "running", r.dispatch_s,
                             r.first_token_s, None, tokens, [], r.preemptions, r.attempts, 0.0, None)
        self.snap, self.snap_key = snap, key
        return snap
