"""LLMServeEnv: an OpenEnv RL environment for learning LLM inference-serving policies."""

from llmserve_env.client import LLMServeEnv, LLMServeError
from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState

__all__ = ["LLMServeEnv", "LLMServeError", "ServeAction", "ServeObservation", "ServeState"]
