"""DSPy signatures (one per spec prompt) and the Pydantic types they produce.

Depends on dspy, pydantic and iqa_tools.records only; nothing here imports agentic_iqa.

Names are loaded lazily (PEP 562) so that `import signatures.models` (state models only, used by the
CLI and the graph's state) does not pay for importing DSPy.
"""
from __future__ import annotations

import importlib
import os
import typing

# LiteLLM (behind dspy) otherwise downloads a model price list on first use.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

#: Bump when any signature's fields (names, order, types, output schemas) change: compiled programs
#: saved under another version are refused. tests/test_signatures.py pins the fingerprint of each
#: version, so a field change without a bump fails there. Instruction wording is not part of it.
SIGNATURE_VERSION = "1"

_EXPORTS = {
    "signatures.planner": ["PlanSignature"],
    "signatures.executor": ["DetectDistortionsSignature", "AnalyzeDistortionsSignature", "SelectToolsSignature"],
    "signatures.summarizer": ["ExplainSignature", "ScoreSignature", "format_evidence"],
    "signatures.image": ["vlm_image", "with_reference", "REFERENCE_FIELD"],
    "signatures.logprobs": ["LevelReading", "level_logprobs", "read_level_logprobs", "token_logprobs"],
    "signatures.vocabulary": ["SEVERITY_RANK", "SCORE_LEVELS", "normalize_level", "normalize_severity"],
    "signatures.models": [
        "DISTORTION_CATEGORIES", "SEVERITIES", "QUALITY_LEVELS", "LEVEL_NAMES", "LEVEL_SCORES",
        "PlanControlFlags", "PlannerDecision", "PlannerOutput", "DistortionAnalysis", "DistortionSet",
        "DistortionAnalysisMap", "ToolAssignment", "ExecutorOutput", "SummarizerOutput",
    ],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["SIGNATURE_VERSION", "SIGNATURES", "signatures_by_name", "signature_fingerprint", *_WHERE]


def __getattr__(name: str) -> typing.Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name == "SIGNATURES":
        return signatures_by_name()
    raise AttributeError(f"module 'signatures' has no attribute {name!r}")


def signatures_by_name() -> dict[str, type]:
    """Every signature, by the short name compiled programs and canned LMs use for it."""
    from signatures.executor import AnalyzeDistortionsSignature, DetectDistortionsSignature, SelectToolsSignature
    from signatures.planner import PlanSignature
    from signatures.summarizer import ExplainSignature, ScoreSignature

    return {
        "plan": PlanSignature,
        "detect": DetectDistortionsSignature,
        "analyze": AnalyzeDistortionsSignature,
        "select": SelectToolsSignature,
        "explain": ExplainSignature,
        "score": ScoreSignature,
    }


def _describe_type(annotation: typing.Any) -> typing.Any:
    import dspy
    import pydantic

    if isinstance(annotation, type) and issubclass(annotation, dspy.Type):
        return annotation.__name__  # DSPy's own media types: their internals are DSPy's business
    return _structure(pydantic.TypeAdapter(annotation).json_schema())


def _structure(schema: typing.Any) -> typing.Any:
    """A JSON schema without its prose (titles, descriptions): wording is not a field change."""
    if isinstance(schema, dict):
        return {k: _structure(v) for k, v in schema.items() if k not in ("title", "description")}
    if isinstance(schema, list):
        return [_structure(v) for v in schema]
    return schema


def signature_fingerprint() -> str:
    """A short hash of every signature's fields (name, role, order, type schema); no instructions."""
    import hashlib
    import json

    desc = {
        name: [
            [field, "input" if field in sig.input_fields else "output", _describe_type(info.annotation)]
            for field, info in sig.fields.items()
        ]
        for name, sig in signatures_by_name().items()
    }
    blob = json.dumps(desc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
