"""LLMServeEnv: an OpenEnv RL environment for learning LLM inference-serving policies.

`from llmserve_env import LLMServeEnv` works as before, but the client (and httpx behind it) and
the models load on first use: a simulator worker that imports `llmserve_env.sim` pays for neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmserve_env.client import LLMServeEnv, LLMServeError  # noqa: F401
    from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState  # noqa: F401

_LAZY = {
    "LLMServeEnv": "llmserve_env.client",
    "LLMServeError": "llmserve_env.client",
    "ServeAction": "llmserve_env.shared.models",
    "ServeObservation": "llmserve_env.shared.models",
    "ServeState": "llmserve_env.shared.models",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'llmserve_env' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
