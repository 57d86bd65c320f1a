"""An LLM as the serving policy, through the official OpenAI client.

Each window the model gets the task, the action schema, the last action it chose and the new
observation as JSON, and must answer with one JSON object holding the six knobs. The reply is
validated as a `ServeAction`; a reply that is not JSON, misses a field or has a value out of
range is counted as invalid and replaced by `SAFE_ACTION` (so one bad reply never ends an
episode). API failures are counted separately and also fall back to `SAFE_ACTION`.

Credentials and endpoint come from OPENAI_API_KEY / OPENAI_BASE_URL (the SDK reads them), so
the same policy drives OpenAI, vLLM, SGLang or Ollama.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from llmserve_env.agents.static import VLLM_DEFAULT
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TaskSpec, get_task

# vLLM's own defaults: a configuration that serves anything reasonably, used when a reply is unusable.
SAFE_ACTION: ServeAction = VLLM_DEFAULT
DEFAULT_MODEL = "gpt-4.1-mini"

_SYSTEM = """You control an LLM inference server. Every {window_s:g} s window you choose its serving policy.
Task: {task_id} ({difficulty}). {description}
Tenants and SLOs: {tenants}
Goal: maximise goodput (requests meeting their tenant's TTFT and TPOT SLOs) while avoiding KV-cache
evictions, cost above {budget} USD per 1k output tokens, and quality loss from low-precision weights.

Answer with ONE JSON object and nothing else, with exactly these keys:
  "batch_cap": integer 1..512 (most sequences running at once; larger = more throughput, slower tokens)
  "kv_budget_fraction": number 0.1..1.0 (share of free GPU memory for the KV cache)
  "speculation_depth": integer 0..8 (draft tokens per step; helps at low load, hurts at high load)
  "quantization_tier": "FP16" | "INT8" | "INT4" (faster and more KV room, but lower quality)
  "prefill_decode_split": true | false (separate prefill and decode capacity)
  "priority_routing": true | false (serve the priority-0 tenant first)"""


@dataclass
class LLMPolicyStats:
    """How the model behaved over the policy's lifetime."""

    calls: int = 0
    invalid: int = 0
    api_errors: int = 0
    last_error: str | None = None
    invalid_examples: list[str] = field(default_factory=list)

    @property
    def invalid_share(self) -> float:
        """Share of calls whose reply was not a valid action (0 before any call)."""
        return self.invalid / self.calls if self.calls else 0.0

    @property
    def fallback_share(self) -> float:
        """Share of windows the model did not decide: invalid replies and API errors, each of which
        played `SAFE_ACTION` instead. Near 1, the score is the fallback's, not the model's."""
        return (self.invalid + self.api_errors) / self.calls if self.calls else 0.0

    def merge(self, other: LLMPolicyStats) -> None:
        self.calls += other.calls
        self.invalid += other.invalid
        self.api_errors += other.api_errors
        self.last_error = other.last_error or self.last_error

    def summary(self) -> str:
        """One line for a table: 'invalid 3/64 (4.7 %), API errors 0'."""
        return (f"invalid {self.invalid}/{self.calls} ({100 * self.invalid_share:.1f} %), "
                f"API errors {self.api_errors}")

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "invalid": self.invalid, "api_errors": self.api_errors,
                "invalid_share": round(self.invalid_share, 4), "fallback_share": round(self.fallback_share, 4),
                "last_error": self.last_error, "invalid_examples": list(self.invalid_examples)}


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_action(text: str | None) -> ServeAction:
    """The `ServeAction` in a model reply (bare JSON or one ```json fenced block).

    Raises ValueError (or pydantic's ValidationError, a ValueError) when there is none.
    """
    if not text:
        raise ValueError("empty reply")
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in reply")
    data = json.loads(body[start : end + 1])
    if not isinstance(data, dict):
        raise ValueError("reply is not a JSON object")
    data.pop("metadata", None)
    return ServeAction.model_validate(data)


def _describe_tenants(task: TaskSpec) -> str:
    return "; ".join(
        f"{t.name} (priority {t.priority}, {t.share:.0%} of traffic, TTFT <= {t.ttft_slo_ms:g} ms, "
        f"TPOT <= {t.tpot_slo_ms:g} ms)"
        for t in task.tenants
    )


def _observation_json(obs: ServeObservation) -> str:
    fields = obs.model_dump(exclude={"metadata", "episode_id", "done"})
    rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in fields.items()}
    return json.dumps(rounded, separators=(",", ":"))


class LLMPolicy:
    """Asks a chat model for each window's action.

    client       an `openai.OpenAI` to use as is (tests, custom set-ups); otherwise one is built
    http_client  passed to the SDK (an `httpx.Client` lets respx mock the API in tests)
    json_mode    request `response_format={"type": "json_object"}` (set False for endpoints without it)
    """

    def __init__(
        self,
        task_id: str,
        model: str = DEFAULT_MODEL,
        client: openai.OpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.Client | None = None,
        temperature: float = 0.0,
        json_mode: bool = True,
        timeout_s: float = 60.0,
    ):
        self.name = "llm"
        self.model = model
        self.task = get_task(task_id)
        self.temperature = temperature
        self.json_mode = json_mode
        self.stats = LLMPolicyStats()
        self.client = client or openai.OpenAI(
            api_key=api_key, base_url=base_url, http_client=http_client, timeout=timeout_s, max_retries=2
        )
        self._system = _SYSTEM.format(
            window_s=self.task.window_s,
            task_id=self.task.task_id,
            difficulty=self.task.difficulty,
            description=self.task.description,
            tenants=_describe_tenants(self.task),
            budget=self.task.cost_budget_per_1k,
        )
        self._last: ServeAction | None = None

    def reset(self) -> None:
        self._last = None

    def messages(self, obs: ServeObservation) -> list[dict[str, str]]:
        last = json.dumps(self._last.knobs()) if self._last else "none yet"
        user = f"Your last action: {last}\nObservation of the window just served: {_observation_json(obs)}"
        return [{"role": "system", "content": self._system}, {"role": "user", "content": user}]

    def act(self, obs: ServeObservation) -> ServeAction:
        self.stats.calls += 1
        kwargs: dict[str, Any] = {"model": self.model, "messages": self.messages(obs),
                                  "temperature": self.temperature, "max_tokens": 200}
        if self.json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        try:
            reply = self.client.chat.completions.create(**kwargs)
        except openai.OpenAIError as exc:
            self.stats.api_errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
            action = SAFE_ACTION
        else:
            text = reply.choices[0].message.content if reply.choices else None
            try:
                action = parse_action(text)
            except ValueError as exc:
                self.stats.invalid += 1
                self.stats.last_error = f"invalid reply: {exc}"[:300]
                if len(self.stats.invalid_examples) < 5:
                    self.stats.invalid_examples.append((text or "")[:200])
                action = SAFE_ACTION
        self._last = action
        return action
