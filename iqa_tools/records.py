"""The record every tool run leaves behind (spec 001 ``ToolExecutionLog``).

It lives here, beside the registry that writes it, so ``iqa_tools`` needs nothing from the
agent layers; ``agentic_iqa.state`` re-exports it with the other state models.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _now() -> datetime:
    return datetime.now(timezone.utc)


class ToolExecutionLog(BaseModel):
    """One run of one IQA tool: what ran, on what, with what result (or why it failed)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")  # NaN survives JSON

    tool_name: str
    object_name: str = "Global"
    distortion: str = "Overall"
    raw_score: float = float("nan")
    normalized_score: float = float("nan")
    execution_time: float = Field(0.0, ge=0.0)
    fallback: bool = False
    error: Optional[str] = None
    timestamp: datetime = Field(default_factory=_now)
    # Beyond the spec: enough to explain a number without re-running it.
    cached: bool = False
    fallback_for: Optional[str] = None  # the tool this run stands in for
    normalization: Optional[Literal["logistic", "linear"]] = None
    device: Optional[str] = None
    working_size: Optional[tuple[int, int]] = None  # (width, height) the tool scored, after any downscaling

    @field_validator("normalized_score")
    @classmethod
    def _score_in_range(cls, v: float) -> float:
        # NaN marks a failed run (spec 001 allows it); any real score must be on the 1..5 scale.
        if not math.isnan(v) and not (1.0 <= v <= 5.0):
            raise ValueError(f"normalized_score {v} is outside [1, 5]")
        return v

    @model_validator(mode="after")
    def _failure_has_reason(self) -> "ToolExecutionLog":
        if math.isnan(self.normalized_score) and not self.error:
            raise ValueError("a run without a score must say why in `error`")
        return self

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.normalized_score)
