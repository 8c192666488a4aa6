"""The graph's state and the run trace.

The Pydantic state models themselves are defined beside the signatures that produce them
(`signatures/models.py`) and the tool registry (`iqa_tools/records.py`); they are re-exported here so
users have one place to import them from.
"""
from __future__ import annotations

import operator
import threading
import time
from typing import Annotated, Any, Optional

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


def keep_first(old: Any, new: Any) -> Any:
    """Reducer for values computed once per assessment: the first non-None value stays (parallel
    branches may both offer one)."""
    return old if old is not None else new


class AgenticIQAState(TypedDict):
    """Everything one assessment knows, as LangGraph state: the request, each node's result, the values
    computed once (the VLM's copy of the image, the offline statistics), the append-only trace and the
    LM call counts. The result is built from the final state alone (`api.result_from_state`)."""

    # The request.
    query: str
    image_path: str
    reference_path: Optional[str]
    scoring: bool                        # scoring mode (level A-E + fused score) vs explanation/QA mode
    use_cache: bool
    backend: str                         # the roles' name ("vlm (...)" or "offline analyst")
    # Node results.
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
    # Computed once per assessment, on first use.
    vlm_image: NotRequired[Annotated[Optional[Any], keep_first]]          # dspy.Image sent to the VLM
    vlm_reference: NotRequired[Annotated[Optional[Any], keep_first]]      # the reference's, in FR mode
    offline_analyses: NotRequired[Annotated[Optional[dict], keep_first]]  # offline severity statistics
    lm_unreachable: NotRequired[Annotated[Optional[str], keep_first]]     # why the LM was given up on
    # Bookkeeping, appended to by every node.
    trace: Annotated[list["TraceEvent"], operator.add]
    lm_calls: Annotated[int, operator.add]
    retries: Annotated[int, operator.add]
    image_bytes: NotRequired[Annotated[int, operator.add]]  # image data sent to the VLM, over every request


#: The state keys a role may fill once per assessment (`AssessmentContext.once`).
ONCE_KEYS = frozenset({"vlm_image", "vlm_reference", "offline_analyses"})


class TraceEvent(BaseModel):
    """One thing that happened during an assessment, in order."""

    stage: str                      # planner, detect, analyze, select, execute, summarizer, ...
    kind: str                       # start | end | lm_call | retry | fallback | note | error
    message: str = ""
    seconds: Optional[float] = None
    at: float = Field(default_factory=time.time)
    data: dict[str, Any] = {}


class Trace:
    """One node's trace events and LM counts, returned into the state's append-only `trace` (thread-safe:
    the tool step records from its workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[TraceEvent] = []
        self.lm_calls = 0
        self.retries = 0
        self.image_bytes = 0

    def add(self, stage: str, kind: str, message: str = "", seconds: float | None = None, **data) -> None:
        with self._lock:
            self.events.append(TraceEvent(stage=stage, kind=kind, message=message, seconds=seconds, data=data))

    def count_lm(self, calls: int, retries: int = 0, image_bytes: int = 0) -> None:
        with self._lock:
            self.lm_calls += calls
            self.retries += retries
            self.image_bytes += image_bytes


def timings(events: list[TraceEvent]) -> dict[str, float]:
    """Seconds per stage (summed over replans)."""
    out: dict[str, float] = {}
    for ev in events:
        if ev.kind == "end" and ev.seconds is not None:
            out[ev.stage] = out.get(ev.stage, 0.0) + ev.seconds
    return out


def fallbacks(events: list[TraceEvent]) -> list[str]:
    return [f"{ev.stage}: {ev.message}" for ev in events if ev.kind == "fallback"]


def notes(events: list[TraceEvent]) -> list[str]:
    return [ev.message for ev in events if ev.kind == "note"]
