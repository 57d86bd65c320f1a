"""Fixed configurations: the same action every window, whatever the traffic does.

`vllm_default` mirrors vLLM's out-of-the-box engine (max_num_seqs=256,
gpu_memory_utilization=0.9, no speculation, FP16 weights, no disaggregation, FCFS).
`starve` (batch cap 1) is a deliberately bad floor: one sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmserve_env.agents.base import make_action
from llmserve_env.shared.models import ServeAction, ServeObservation

VLLM_DEFAULT: ServeAction = make_action(256, 0.9, 0, "FP16", False, False)
STARVE: ServeAction = make_action(1, 0.9, 0, "FP16", False, False)


@dataclass
class StaticPolicy:
    """Plays `action` on every window."""

    action: ServeAction
    name: str = "static"

    def reset(self) -> None:
        """Nothing to forget: the action never changes."""

    def act(self, obs: ServeObservation) -> ServeAction:
        return self.action


def vllm_default() -> StaticPolicy:
    return StaticPolicy(VLLM_DEFAULT, name="vllm_default")


def starve() -> StaticPolicy:
    return StaticPolicy(STARVE, name="starve")
