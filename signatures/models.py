"""State models shared by the three agents (spec 001 and 003; Planner fields from DESIGN §3).

The VLM writes most of these, so every model accepts the spellings the paper and real models use
("Explict", "tool_execute", "No-reference", "mild", "blur", a bare string where a list is expected)
and normalizes them on input; anything it cannot map is a ValidationError whose message names the
field, the bad value and the accepted values, so it can be fed back to the model verbatim.

Tool names are checked against the registry without importing it: pass the known names as a
validation context, ``Model.model_validate(data, context={"known_tools": names})``. Without that
context tool names are only stripped (the models cannot know which tools exist).

Layering: this module depends on pydantic, ``iqa_tools.records`` and ``signatures.vocabulary`` only.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    ValidationInfo,
    field_validator,
    model_validator,
)

from iqa_tools.records import ToolExecutionLog
from signatures.vocabulary import (
    DISTORTION_CATEGORIES,
    LEVEL_NAMES,
    LEVEL_SCORES,
    QUALITY_LEVELS,
    SCORE_LEVELS,
    SEVERITIES,
    CategoryName,
    fold,
    normalize_level,
    normalize_severity,
)

__all__ = [
    "DISTORTION_CATEGORIES",
    "SEVERITIES",
    "QUALITY_LEVELS",
    "LEVEL_NAMES",
    "LEVEL_SCORES",
    "SCORE_LEVELS",
    "GLOBAL",
    "OVERALL",
    "PROB_MODES",
    "DistortionCategory",
    "Severity",
    "QualityLevel",
    "ReferenceMode",
    "ProbMode",
    "normalize_category",
    "normalize_severity",
    "normalize_object_name",
    "normalize_reference_mode",
    "normalize_level",
    "normalize_tool_name",
    "PlanControlFlags",
    "PlannerDecision",
    "PlannerOutput",
    "DistortionAnalysis",
    "DistortionSet",
    "DistortionAnalysisMap",
    "DistortionMap",
    "AnalysisMap",
    "ToolMap",
    "ToolAssignment",
    "ExecutorOutput",
    "SummarizerOutput",
    "ToolExecutionLog",
    "check_analysis_matches",
]

# ── vocabularies ────────────────────────────────────────────────────────────────────────────────

#: Object name for "the whole image".
GLOBAL = "Global"
#: Distortion key for a tool that rates the image as a whole (no detected distortion to attach the
#: score to, e.g. a user-named tool after detection failed). ToolExecutionLog uses the same default.
OVERALL = "Overall"
#: How a SummarizerOutput's level probabilities were obtained (see agentic_iqa.fusion).
PROB_MODES: tuple[str, ...] = ("logits", "classification", "uniform", "analyst")


_key = fold


# Synonyms real VLMs (and the paper's tool descriptions) use for the seven categories. Keys are in
# _key() form. Deliberately only unambiguous names: a wrong silent mapping is worse than a retry.
_CATEGORY_SYNONYMS: dict[str, str] = {}
for _canonical, _names in {
    "Blurs": [
        "blur", "blurs", "blurring", "blurry", "blurriness", "motion blur", "gaussian blur", "defocus",
        "defocus blur", "out of focus", "lens blur", "glass blur",
    ],
    "Color distortions": [
        "color", "colour", "color distortion", "color distortions", "colour distortion",
        "colour distortions", "color shift", "colour shift", "color cast", "colour cast",
        "color saturation", "colour saturation", "saturation", "color diffusion", "colour diffusion",
        "color quantization", "chromatic aberration",
    ],
    "Compression": [
        "compression", "compression artifact", "compression artifacts", "compression artefact",
        "compression artefacts", "jpeg", "jpeg artifacts", "jpeg artefacts", "jpeg compression",
        "jpeg2000", "jpeg 2000", "jpeg2000 compression", "jp2k", "blocking", "blocking artifacts",
        "block artifacts", "blockiness",
    ],
    "Noise": [
        "noise", "noisy", "noises", "gaussian noise", "image noise", "grain", "graininess",
        "impulse noise", "salt and pepper noise", "sensor noise",
    ],
    "Brightness change": [
        "brightness", "brightness change", "brightness changes", "exposure", "overexposure",
        "over exposure", "underexposure", "under exposure", "overexposed", "underexposed",
        "illumination", "lighting", "luminance", "too dark", "too bright", "darkness",
    ],
    "Sharpness": [
        "sharpness", "sharpening", "over sharpening", "oversharpening", "oversharpened",
        "sharpness change",
    ],
    "Contrast": ["contrast", "contrast change", "contrast changes", "low contrast", "high contrast"],
}.items():
    for _name in _names:
        _CATEGORY_SYNONYMS[_key(_name)] = _canonical
for _canonical in DISTORTION_CATEGORIES:
    _CATEGORY_SYNONYMS[_key(_canonical)] = _canonical

_GLOBAL_NAMES = {"global", "whole image", "entire image", "the whole image", "the entire image", "full image"}

_REFERENCE_SYNONYMS = {
    "full reference": "Full-Reference",
    "fullreference": "Full-Reference",
    "fr": "Full-Reference",
    "no reference": "No-Reference",
    "noreference": "No-Reference",
    "nr": "No-Reference",
}


def normalize_category(value: Any, *, allow_overall: bool = False) -> str:
    """Map a distortion name to one of DISTORTION_CATEGORIES ('blur' -> 'Blurs'), or raise ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"a distortion type must be a string, got {type(value).__name__}")
    key = _key(value)
    if allow_overall and key == "overall":
        return OVERALL
    if key in _CATEGORY_SYNONYMS:
        return _CATEGORY_SYNONYMS[key]
    valid = list(DISTORTION_CATEGORIES) + ([OVERALL] if allow_overall else [])
    raise ValueError(f"unknown distortion type {value!r}; use one of {valid}")


def normalize_object_name(value: Any) -> str:
    """An object/region name; empty or whole-image spellings become 'Global' (spec 000 fallback)."""
    if value is None:
        return GLOBAL
    if not isinstance(value, str):
        raise ValueError(f"an object name must be a string, got {type(value).__name__}")
    text = " ".join(value.split())
    if not text or _key(text) in _GLOBAL_NAMES:
        return GLOBAL
    return text


def normalize_reference_mode(value: Any) -> Any:
    """'No-reference', 'NR', 'full reference' ... -> 'No-Reference' / 'Full-Reference'."""
    if isinstance(value, str):
        return _REFERENCE_SYNONYMS.get(_key(value), value)
    return value


def _tool_key(name: str) -> str:
    return re.sub(r"[\W_]+", "", name).lower()


def normalize_tool_name(name: Any, known_tools: Iterable[str] | None) -> str:
    """The registry's spelling of a tool name ('q-align' -> 'QAlign'), or ValueError if unknown.

    Matching ignores case and punctuation. With known_tools None the name is only stripped.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a tool name must be a non-empty string, got {name!r}")
    name = name.strip()
    if known_tools is None:
        return name
    known = list(known_tools)
    if name in known:
        return name
    matches = [k for k in known if _tool_key(k) == _tool_key(name)]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(f"unknown tool {name!r}; use one of {sorted(known)}")


def _known_tools(info: ValidationInfo) -> Optional[list[str]]:
    ctx = info.context
    if isinstance(ctx, Mapping) and ctx.get("known_tools") is not None:
        return list(ctx["known_tools"])
    return None


DistortionCategory = Annotated[
    CategoryName,
    BeforeValidator(normalize_category),
]
Severity = Annotated[Literal["none", "slight", "moderate", "severe", "extreme"], BeforeValidator(normalize_severity)]
QualityLevel = Annotated[Literal["A", "B", "C", "D", "E"], BeforeValidator(normalize_level)]
ReferenceMode = Annotated[Literal["Full-Reference", "No-Reference"], BeforeValidator(normalize_reference_mode)]
ProbMode = Literal["logits", "classification", "uniform", "analyst"]


def _merge_keys(mapping: Any, merge) -> Any:
    """Normalize object-name keys; values of keys that collapse together ('global', 'Global') are merged."""
    if not isinstance(mapping, Mapping):
        return mapping  # let pydantic report the type error
    out: dict[str, Any] = {}
    for raw_key, value in mapping.items():
        key = normalize_object_name(raw_key)
        out[key] = merge(out[key], value) if key in out else value
    return out


def _listify(mapping: Any) -> Any:
    """{"sky": "blur"} -> {"sky": ["blur"]}: a bare string where a list of types belongs."""
    if isinstance(mapping, dict):
        return {k: [v] if isinstance(v, str) else v for k, v in mapping.items()}
    return mapping


def _concat(a: Any, b: Any) -> Any:
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return b


def _update(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {**a, **b}
    return b


# ── map types: object name -> ...; keys normalized (and merged when they collapse together) ─────


def _distortion_map(value: Any) -> Any:
    merged = _merge_keys(_listify(value), _concat)
    if isinstance(merged, dict):
        # A bare string for one object's list, and duplicates after synonym mapping, are tolerated.
        return {k: _categories(v) if isinstance(v, (str, list)) else v for k, v in merged.items()}
    return merged


def _tool_map(value: dict[str, dict[str, str]], info: ValidationInfo) -> dict[str, dict[str, str]]:
    return _check_tool_map(value, _known_tools(info))


#: Distortion types per object ({"sky": "blur"} -> {"sky": ["Blurs"]}).
DistortionMap = Annotated[dict[str, list[DistortionCategory]], BeforeValidator(_distortion_map)]
#: Analyses per object.
AnalysisMap = Annotated[dict[str, list["DistortionAnalysis"]], BeforeValidator(lambda v: _merge_keys(v, _concat))]
#: The tool chosen per object and distortion type (names checked with a `known_tools` context).
ToolMap = Annotated[dict[str, dict[str, str]], BeforeValidator(lambda v: _merge_keys(v, _update)), AfterValidator(_tool_map)]


def _categories(values: Any, *, allow_overall: bool = False) -> list[str]:
    if isinstance(values, str):
        values = [values]  # a bare string where a list belongs (seen in the paper's figures)
    if not isinstance(values, list):
        raise ValueError(f"expected a list of distortion types, got {type(values).__name__}")
    out: list[str] = []
    for v in values:
        c = normalize_category(v, allow_overall=allow_overall)
        if c not in out:  # "blur" and "Blurs" in one list are one distortion
            out.append(c)
    return out


# ── Planner ─────────────────────────────────────────────────────────────────────────────────────

_FLAG_ALIASES = {
    "distortion_detection": "distortion_detection",
    "distortion_detect": "distortion_detection",
    "detection": "distortion_detection",
    "distortion_analysis": "distortion_analysis",
    "distortion_analyze": "distortion_analysis",
    "analysis": "distortion_analysis",
    "tool_selection": "tool_selection",
    "tool_select": "tool_selection",
    "selection": "tool_selection",
    "tool_execution": "tool_execution",
    "tool_execute": "tool_execution",
    "execution": "tool_execution",
}


class PlanControlFlags(BaseModel):
    """Which Executor steps run for this query."""

    # The docstrings of the models a VLM fills in appear in its prompt (as JSON-schema descriptions),
    # so they are written for the VLM; notes for developers are comments like this one. Rules: DESIGN §3.

    model_config = ConfigDict(extra="ignore")  # a VLM's stray commentary key is harmless

    distortion_detection: bool
    distortion_analysis: bool
    tool_selection: bool
    tool_execution: bool

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = _FLAG_ALIASES.get(_key(str(key)).replace(" ", "_"), key)
            out[name] = value
        return out

    @classmethod
    def from_rules(
        cls,
        *,
        query_type: str,
        distortion_source: str,
        region_named: bool,
        tool_named: bool,
    ) -> "PlanControlFlags":
        """The flags DESIGN §3's rules give; useful as a reference for tests and sanity checks.

        "Other" turns everything off. Otherwise detection runs unless the query names the
        distortions, analysis always runs, and tools follow the region/tool table.
        """
        if query_type == "Other":
            return cls(distortion_detection=False, distortion_analysis=False, tool_selection=False, tool_execution=False)
        detection = distortion_source != "Explicit"
        if tool_named:  # named tool: nothing to select, run it (with or without a region)
            selection, execution = False, True
        elif region_named:  # region-scoped question without a tool: the VLM looks, tools don't
            selection, execution = False, False
        else:
            selection, execution = True, True
        return cls(
            distortion_detection=detection,
            distortion_analysis=True,
            tool_selection=selection,
            tool_execution=execution,
        )


class PlannerDecision(BaseModel):
    """The plan for answering the user's query."""

    # What the Planner's VLM decides. reference_mode is deliberately absent: code decides it from
    # whether a reference image was given (PlannerOutput.from_decision).

    model_config = ConfigDict(extra="ignore")

    query_type: Literal["IQA", "Other"]
    query_scope: list[str] = Field(min_length=1)
    distortion_source: Literal["Explicit", "Inferred"]
    distortions: Optional[DistortionMap] = None
    required_tool: Optional[list[str]] = None
    plan: PlanControlFlags

    @field_validator("query_type", mode="before")
    @classmethod
    def _query_type(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"iqa": "IQA", "other": "Other"}.get(_key(v), v)
        return v

    @field_validator("query_scope", mode="before")
    @classmethod
    def _scope(cls, v: Any) -> Any:
        if v is None:
            return [GLOBAL]
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list):
            names: list[str] = []
            for item in v:
                name = normalize_object_name(item)
                if name not in names:
                    names.append(name)
            return names or [GLOBAL]
        return v

    @field_validator("distortion_source", mode="before")
    @classmethod
    def _source(cls, v: Any) -> Any:
        if isinstance(v, str):
            # "Explict" is the paper's own spelling in its prompt figures.
            return {"explicit": "Explicit", "explict": "Explicit", "inferred": "Inferred"}.get(_key(v), v)
        return v

    @field_validator("distortions", mode="before")
    @classmethod
    def _distortions(cls, v: Any) -> Any:
        return None if v is None or v == {} or v == [] else v

    @field_validator("required_tool", mode="before")
    @classmethod
    def _tool_list(cls, v: Any) -> Any:
        if v is None or v == "" or v == []:
            return None
        if isinstance(v, str):
            if _key(v) in {"none", "null"}:
                return None
            v = [v]
        return v

    @field_validator("required_tool")
    @classmethod
    def _tools_known(cls, v: Optional[list[str]], info: ValidationInfo) -> Optional[list[str]]:
        if v is None:
            return None
        known = _known_tools(info)
        out: list[str] = []
        for name in v:
            canonical = normalize_tool_name(name, known)
            if canonical not in out:
                out.append(canonical)
        return out

    @property
    def region_named(self) -> bool:
        """True when the query is about specific objects/regions rather than the whole image."""
        return any(name != GLOBAL for name in self.query_scope)

    def expected_flags(self) -> PlanControlFlags:
        """The flags DESIGN §3's rules give for this decision's own fields."""
        return PlanControlFlags.from_rules(
            query_type=self.query_type,
            distortion_source=self.distortion_source,
            region_named=self.region_named,
            tool_named=bool(self.required_tool),
        )


class PlannerOutput(PlannerDecision):
    """The Planner's result: the VLM's decision plus the reference mode, which code sets."""

    model_config = ConfigDict(extra="forbid")

    reference_mode: ReferenceMode

    @classmethod
    def from_decision(
        cls, decision: PlannerDecision, *, has_reference: bool, context: Optional[dict] = None
    ) -> "PlannerOutput":
        """Attach the reference mode decided by whether a reference image was given."""
        data = decision.model_dump()
        data["reference_mode"] = "Full-Reference" if has_reference else "No-Reference"
        return cls.model_validate(data, context=context)


# ── Executor ────────────────────────────────────────────────────────────────────────────────────


class DistortionAnalysis(BaseModel):
    """Severity and visual impact of one distortion type."""

    # spec 001; `type` is normalized to one of DISTORTION_CATEGORIES.

    model_config = ConfigDict(extra="ignore")

    type: str
    severity: Severity
    explanation: str

    @field_validator("type", mode="before")
    @classmethod
    def _type(cls, v: Any) -> str:
        return normalize_category(v)

    @field_validator("explanation")
    @classmethod
    def _explanation(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("explanation must not be empty or whitespace")
        return v


class DistortionSet(RootModel[DistortionMap]):
    """Distortion types to examine, per object ("Global" = the whole image)."""

    # The detection subtask's output (spec 000). Wrapped in a RootModel so normalization runs when
    # DSPy parses the reply; `.root` is the plain dict.


class DistortionAnalysisMap(RootModel[AnalysisMap]):
    """Analysis of each listed distortion type, per object ("Global" = the whole image)."""

    # The analysis subtask's output (spec 000); `.root` is the plain dict.


class ToolAssignment(RootModel[ToolMap]):
    """The IQA tool chosen for each distortion type, per object ("Global" = the whole image)."""

    # The selection subtask's output (spec 000); `.root` is the plain dict. Tool names are checked
    # against the registry only with a `known_tools` validation context.


def _check_tool_map(value: dict[str, dict[str, str]], known: Optional[list[str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for obj, by_type in value.items():
        inner: dict[str, str] = {}
        for dist, tool in by_type.items():
            inner[normalize_category(dist, allow_overall=True)] = normalize_tool_name(tool, known)
        out[obj] = inner
    return out


def check_analysis_matches(
    analysis: Mapping[str, list[DistortionAnalysis]], distortion_set: Optional[Mapping[str, list[str]]]
) -> None:
    """Raise ValueError unless every analysed type is in the distortion set for its object (spec 001).

    With no distortion set there is nothing to check against.
    """
    if distortion_set is None:
        return
    problems = []
    for obj, items in analysis.items():
        if obj not in distortion_set:
            problems.append(f"object {obj!r} is not in the distortion set (objects: {sorted(distortion_set)})")
            continue
        allowed = distortion_set[obj]
        for item in items:
            if item.type not in allowed:
                problems.append(f"{obj!r}: type {item.type!r} is not among the listed distortions {allowed}")
    if problems:
        raise ValueError("distortion_analysis does not match distortion_set: " + "; ".join(problems))


class ExecutorOutput(BaseModel):
    """Everything the Executor found (spec 001). Optional fields stay None when a subtask did not run or failed."""

    # NaN in failed tool logs round-trips as "NaN" (the log's own setting; repeated for the container).
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    distortion_set: Optional[DistortionMap] = None
    distortion_analysis: Optional[AnalysisMap] = None
    selected_tools: Optional[ToolMap] = None
    quality_scores: Optional[dict[str, dict[str, tuple[str, float]]]] = None
    tool_logs: list[ToolExecutionLog] = Field(default_factory=list)

    @field_validator("quality_scores", mode="before")
    @classmethod
    def _score_keys(cls, v: Any) -> Any:
        return _merge_keys(v, _update) if v is not None else None

    @field_validator("quality_scores")
    @classmethod
    def _scores(cls, v: Optional[dict[str, dict[str, tuple[str, float]]]], info: ValidationInfo) -> Any:
        if v is None:
            return None
        known = _known_tools(info)
        out: dict[str, dict[str, tuple[str, float]]] = {}
        for obj, by_type in v.items():
            inner: dict[str, tuple[str, float]] = {}
            for dist, (tool, score) in by_type.items():
                if not math.isfinite(score) or not 1.0 <= score <= 5.0:
                    raise ValueError(f"quality_scores[{obj!r}][{dist!r}]: score {score} of {tool!r} is outside [1, 5]")
                inner[normalize_category(dist, allow_overall=True)] = (normalize_tool_name(tool, known), score)
            out[obj] = inner
        return out

    @model_validator(mode="after")
    def _analysis_matches_set(self) -> "ExecutorOutput":
        if self.distortion_analysis is not None:
            check_analysis_matches(self.distortion_analysis, self.distortion_set)
        return self

    def tool_scores(self) -> list[float]:
        """All normalized tool scores, in object/distortion order (the q̂ of the fusion)."""
        if not self.quality_scores:
            return []
        return [score for by_type in self.quality_scores.values() for _, score in by_type.values()]


# ── Summarizer ──────────────────────────────────────────────────────────────────────────────────


def _prob_key(key: Any) -> str:
    """Probability keys are the level's score as a string, "1".."5"; letters map A=5 … E=1."""
    if isinstance(key, int) and not isinstance(key, bool) and 1 <= key <= 5:
        return str(key)
    if isinstance(key, str):
        k = key.strip()
        if k in {"1", "2", "3", "4", "5"}:
            return k
        if k.upper() in LEVEL_SCORES:
            return str(LEVEL_SCORES[k.upper()])
    raise ValueError(f"probability key {key!r} is not a level; use '1'..'5' (or 'A'..'E', A = 5)")


# A rating asked on another scale: "from 1 to 10", "0-100", "out of 10", "/100", "as a percentage".
_ASKED_SCALE = re.compile(r"\b(?:from\s+)?([01])\s*(?:-|–|to)\s*(10|100)\b|(?:\bout\s+of|/)\s*(10|100)\b"
                          r"|\bpercent(?:age)?\b", re.I)


def on_asked_scale(score: float, query: str) -> str:
    """", 9.6 on the 1–10 scale asked" for a 1–5 score when the query asks for a rating on another scale (linear:
    1 → the scale's bottom, 5 → its top; "out of 10" and percentages count from 0), else ""."""
    m = _ASKED_SCALE.search(query or "")
    if not m:
        return ""
    top = int(next((g for g in m.groups()[1:] if g), "100"))
    bottom = int(m.group(1)) if m.group(1) else 0
    value = bottom + (score - 1.0) / 4.0 * (top - bottom)
    return f", {value:.{1 if top == 10 else 0}f} on the {bottom}–{top} scale asked"


class SummarizerOutput(BaseModel):
    """The final answer and, for scoring, the level, the score and how its probabilities were obtained.

    ``probabilities`` maps the level's score "1".."5" to its probability (A = "5" … E = "1"), so it
    reads directly as p_c of the fusion formula; letter keys are accepted on input and converted.
    """

    model_config = ConfigDict(extra="forbid")

    final_answer: str
    quality_reasoning: str
    need_replan: bool = False
    replan_reason: Optional[str] = None
    # Scoring only:
    level: Optional[QualityLevel] = None
    score: Optional[float] = None
    probabilities: Optional[dict[str, float]] = None
    prob_mode: Optional[ProbMode] = None
    prob_source: Optional[str] = None  # free-text note: which token, which fallback, which analyst

    @classmethod
    def from_fusion(
        cls, fused: Any, reasoning: str, prob_source: str, *, prob_mode: Optional[str] = None,
        need_replan: bool = False, replan_reason: Optional[str] = None, query: str = "",
    ) -> "SummarizerOutput":
        """The scoring answer from a score-fusion result (`agentic_iqa.fusion.FusionResult`: `level`,
        `score`, `probabilities()`, `prob_mode_used`): one wording for every backend; a rating asked on another
        scale ("from 1 to 10", "out of 100") also gets the score on it."""
        return cls(
            final_answer=f"{fused.level} ({LEVEL_NAMES[fused.level]}), score {fused.score:.2f}/5"
                         + on_asked_scale(fused.score, query),
            quality_reasoning=reasoning,
            need_replan=need_replan,
            replan_reason=replan_reason if need_replan else None,
            level=fused.level,
            score=fused.score,
            probabilities=fused.probabilities(),
            prob_mode=prob_mode or fused.prob_mode_used,
            prob_source=prob_source,
        )

    @field_validator("final_answer", "quality_reasoning")
    @classmethod
    def _non_empty(cls, v: str, info: ValidationInfo) -> str:
        if not v.strip():
            raise ValueError(f"{info.field_name} must not be empty")
        return v

    @field_validator("score")
    @classmethod
    def _score(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and (not math.isfinite(v) or not 1.0 <= v <= 5.0):
            raise ValueError(f"score {v} is outside [1, 5]")
        return v

    @field_validator("probabilities", mode="before")
    @classmethod
    def _prob_keys(cls, v: Any) -> Any:
        if v is None or not isinstance(v, Mapping):
            return v
        out: dict[str, Any] = {}
        for key, p in v.items():
            k = _prob_key(key)
            if k in out:
                raise ValueError(f"probability for level {k} given twice")
            out[k] = p
        return out

    @field_validator("probabilities")
    @classmethod
    def _probs(cls, v: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        if v is None:
            return None
        missing = [k for k in ("1", "2", "3", "4", "5") if k not in v]
        if missing:
            raise ValueError(f"probabilities must cover all five levels; missing {missing}")
        for k, p in v.items():
            if not math.isfinite(p) or not 0.0 <= p <= 1.0:
                raise ValueError(f"probability of level {k} is {p}, outside [0, 1]")
        total = sum(v.values())
        if abs(total - 1.0) > 0.01:
            raise ValueError(f"probabilities sum to {total:.4f}, not 1 (tolerance 0.01)")
        return {k: v[k] for k in ("1", "2", "3", "4", "5")}

    @model_validator(mode="after")
    def _consistency(self) -> "SummarizerOutput":
        if self.need_replan and not (self.replan_reason and self.replan_reason.strip()):
            raise ValueError("need_replan is true but replan_reason is empty; the Planner needs the reason")
        if self.probabilities is not None and self.prob_mode is None:
            raise ValueError("probabilities given without prob_mode (say how they were obtained)")
        return self
