"""The graph's state and the run trace.

The Pydantic state models themselves are defined beside the signatures that produce them
(`signatures/models.py`) and the tool registry (`iqa_tools/records.py`); they are re-exported here so
users have one place to import them from.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

from pydantic import BaseModel, Field
from typing_extensions import NotRequired, TypedDict

from iqa_tools.records import ToolExecutionLog
from signatures.models import (  # noqa: F401  (re-exports)
    DistortionAnalysis,
    ExecutorOutput,
    PlanControlFlags,
    PlannerOutput,
    SummarizerOutput,
)

__all__ = [
    "AgenticIQAState",
    "DistortionAnalysis",
    "ExecutorOutput",
    "PlanControlFlags",
    "PlannerOutput",
    "SummarizerOutput",
    "ToolExecutionLog",
    "Trace",
    "TraceEvent",
]


class AgenticIQAState(TypedDict):
    """What flows through the LangGraph graph for one assessment."""

    query: str
    image_path: str
    reference_path: Optional[str]
    plan: NotRequired[PlannerOutput]
    # Executor sub-results, written by its parallel branches and joined into executor_evidence.
    distortion_set: NotRequired[Optional[dict[str, list[str]]]]
    distortion_analysis: NotRequired[Optional[dict[str, list[DistortionAnalysis]]]]
    selected_tools: NotRequired[Optional[dict[str, dict[str, str]]]]
    tool_logs: NotRequired[list[ToolExecutionLog]]
    executor_evidence: NotRequired[ExecutorOutput]
    summarizer_result: NotRequired[SummarizerOutput]
    replans: NotRequired[int]            # Planner re-runs so far
    replan_requested: NotRequired[bool]  # the last Summarizer pass sends the flow back to the Planner
    replan_reason: NotRequired[Optional[str]]


class TraceEvent(BaseModel):
    """One thing that happened during an assessment, in order."""

    stage: str                      # planner, detect, analyze, select, execute, summarizer, ...
    kind: str                       # start | end | lm_call | retry | fallback | note | error
    message: str = ""
    seconds: Optional[float] = None
    at: float = Field(default_factory=time.time)
    data: dict[str, Any] = {}


class Trace:
    """Thread-safe recorder shared by the nodes of one assessment (parallel branches write to it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[TraceEvent] = []
        self.timings: dict[str, float] = {}
        self.lm_calls = 0
        self.retries = 0
        self.fallbacks: list[str] = []
        self.notes: list[str] = []

    def add(self, stage: str, kind: str, message: str = "", seconds: float | None = None, **data) -> None:
        with self._lock:
            self.events.append(TraceEvent(stage=stage, kind=kind, message=message, seconds=seconds, data=data))
            if kind == "end" and seconds is not None:
                self.timings[stage] = self.timings.get(stage, 0.0) + seconds
            elif kind == "fallback":
                self.fallbacks.append(f"{stage}: {message}")
            elif kind == "note":
                self.notes.append(message)

    def count_lm(self, calls: int, retries: int = 0) -> None:
        with self._lock:
            self.lm_calls += calls
            self.retries += retries
