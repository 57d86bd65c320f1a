"""The tier table: which model each `quantization_tier` maps to on a remote API, its price, its quality.

A remote API cannot change a model's weight precision, so in real mode the quantization tier
picks a cheaper, smaller model instead: the same trade-off (cost and speed against quality).

Default table (OpenAI's GPT-4.1 family, announced 2025-04-14; list prices per 1M tokens, and
quality = the model's MMLU score relative to GPT-4.1's, as OpenAI published them: 90.2, 87.5, 80.1):

    tier  model          input $/1M  output $/1M  quality
    FP16  gpt-4.1        2.00        8.00         1.000
    INT8  gpt-4.1-mini   0.40        1.60         0.970
    INT4  gpt-4.1-nano   0.10        0.40         0.888

Prices change and other endpoints have other models: point LLMSERVE_REAL_TIERS at a JSON file
of the same shape to override it, e.g.

    {"FP16": {"model": "llama-3.1-8b-fp16", "input_usd_per_1m": 0, "output_usd_per_1m": 0, "quality": 1.0},
     "INT8": {...}, "INT4": {...}}

LLMSERVE_REAL_MODEL pins one model for every tier; its price and quality come from the table
entry naming that model, or are unknown (reported as cost 0 with `price_known` false).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llmserve_env.gateway.config import GatewayConfigError
from llmserve_env.shared.models import QUANTIZATION_TIERS
from pydantic import BaseModel, ConfigDict, Field, ValidationError


@dataclass(frozen=True, slots=True)
class TierPrice:
    model: str
    input_usd_per_1m: float
    output_usd_per_1m: float
    quality: float
    price_known: bool = True

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        return (prompt_tokens * self.input_usd_per_1m + output_tokens * self.output_usd_per_1m) / 1e6


@dataclass(frozen=True, slots=True)
class TierTable:
    tiers: dict[str, TierPrice]
    source: str

    def for_tier(self, tier: str) -> TierPrice:
        return self.tiers[tier]

    @property
    def distinct_models(self) -> bool:
        """True when the tier actually changes the model used (the knob is honoured)."""
        return len({t.model for t in self.tiers.values()}) > 1


DEFAULT_TIERS = TierTable(
    tiers={
        "FP16": TierPrice("gpt-4.1", 2.00, 8.00, 1.000),
        "INT8": TierPrice("gpt-4.1-mini", 0.40, 1.60, round(87.5 / 90.2, 3)),
        "INT4": TierPrice("gpt-4.1-nano", 0.10, 0.40, round(80.1 / 90.2, 3)),
    },
    source="built-in (OpenAI GPT-4.1 family list prices; quality = MMLU relative to gpt-4.1)",
)


class _TierEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    input_usd_per_1m: float = Field(ge=0)
    output_usd_per_1m: float = Field(ge=0)
    quality: float = Field(gt=0, le=1)


class _TierFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    FP16: _TierEntry
    INT8: _TierEntry
    INT4: _TierEntry


def load_tier_table(path: str | None = None, pinned_model: str | None = None) -> TierTable:
    """The default table, or the one in `path`; then every tier pinned to `pinned_model` if given."""
    table = DEFAULT_TIERS
    if path:
        try:
            parsed = _TierFile.model_validate(json.loads(Path(path).read_text("utf-8")))
        except (OSError, json.JSONDecodeError, ValidationError) as exc:
            raise GatewayConfigError(f"LLMSERVE_REAL_TIERS={path}: not a valid tier table: {exc}") from None
        table = TierTable(
            tiers={
                tier: TierPrice(e.model, e.input_usd_per_1m, e.output_usd_per_1m, e.quality)
                for tier, e in ((t, getattr(parsed, t)) for t in QUANTIZATION_TIERS)
            },
            source=f"file {path}",
        )
    if pinned_model:
        known = [t for t in table.tiers.values() if t.model == pinned_model]
        price = known[0] if known else TierPrice(pinned_model, 0.0, 0.0, 1.0, price_known=False)
        table = TierTable(
            tiers=dict.fromkeys(QUANTIZATION_TIERS, price),
            source=f"{table.source}; every tier pinned to {pinned_model} by LLMSERVE_REAL_MODEL",
        )
    return table
