"""Graded metrics, one per module part: a score in [0, 1] and feedback text saying what was wrong.

Graded rather than exact match, so an optimizer can tell "one flag off" from "nothing right":

- plan: weighted per-field agreement; the four plan flags carry 40 % and their feedback names the
  DESIGN §3 rule that decides them, so a reflective optimizer (GEPA) can learn the rule.
- detect: F1 over (object, category) pairs.
- analyze: 1 − |severity steps off| / 4 per listed distortion (none < slight < … < extreme), averaged.
- select: per distortion, 1 for an acceptable tool, 0.4 for an unacceptable tool of the right kind
  (NR without a reference; FR with one), 0 otherwise; averaged.
- explain: 0.9 for the right answer (the option letter, or the short answer) + 0.1 for the replan flag.
- score: 0.9 × (1 − |level error| / 4) + 0.1 for the replan flag.

A prediction the module could not produce at all (every retry rejected) scores 0.

`ModuleMetric` adapts a grader to what DSPy's optimizers call: `metric(example, prediction, trace)`
returns the float; GEPA's five-argument call also gets the feedback (`dspy.Prediction(score, feedback)`).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import dspy

from signatures.models import (
    LEVEL_SCORES,
    SEVERITIES,
    PlanControlFlags,
    PlannerDecision,
    normalize_category,
    normalize_level,
)

PLANNER_WEIGHTS = {
    "query_type": 0.15,
    "query_scope": 0.15,
    "distortion_source": 0.10,
    "distortions": 0.10,
    "required_tool": 0.10,
    "plan.distortion_detection": 0.10,
    "plan.distortion_analysis": 0.10,
    "plan.tool_selection": 0.10,
    "plan.tool_execution": 0.10,
}
SELECT_WRONG_TOOL_RIGHT_KIND = 0.4
ANSWER_WEIGHT = 0.9  # the rest is for agreeing on need_replan


@dataclass(frozen=True)
class Grade:
    score: float
    feedback: str


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _failed(pred: Any) -> Optional[Grade]:
    if pred is None or _get(pred, "failed"):
        errors = _get(pred, "errors") or []
        last = errors[-1][:400] if errors else "no reply"
        return Grade(0.0, f"No valid output was produced (every attempt was rejected). Last problem: {last}")
    return None


def _fold(name: str) -> str:
    return " ".join(name.strip().lower().split())


def _jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


# ── planner ─────────────────────────────────────────────────────────────────────────────────────


def _why_flags(gold: PlannerDecision) -> dict[str, str]:
    """The DESIGN §3 rule behind each of the gold plan's flags, for feedback."""
    if gold.query_type == "Other":
        reason = "the query is not about technical quality (Other), so every step is off"
        return {f: reason for f in PlanControlFlags.model_fields}
    out = {
        "distortion_detection": (
            "the query names the distortions (Explicit), so there is nothing to detect"
            if gold.distortion_source == "Explicit"
            else "the query names no distortion (Inferred), so they must be detected"
        ),
        "distortion_analysis": "every IQA query analyses its distortions",
    }
    if gold.required_tool:
        tools = "a tool is named, so it runs without selection"
        out["tool_selection"] = out["tool_execution"] = tools
    elif gold.region_named:
        region = "a region is named without a tool, so it is inspected visually: no tool selection or execution"
        out["tool_selection"] = out["tool_execution"] = region
    else:
        neither = "neither a tool nor a region is named, so tools are selected and run"
        out["tool_selection"] = out["tool_execution"] = neither
    return out


def grade_plan(gold: Any, pred: Any) -> Grade:
    failed = _failed(pred)
    if failed:
        return failed
    g: PlannerDecision = gold.planner_output
    p = _get(pred, "planner_output")
    if not isinstance(p, PlannerDecision):
        try:
            p = PlannerDecision.model_validate(p if isinstance(p, dict) else p.model_dump())
        except Exception as exc:  # noqa: BLE001 - an unreadable plan is simply wrong
            return Grade(0.0, f"The plan could not be read: {exc}")
    parts: dict[str, float] = {}
    notes: list[str] = []
    parts["query_type"] = float(g.query_type == p.query_type)
    if not parts["query_type"]:
        notes.append(f"query_type should be {g.query_type!r}, not {p.query_type!r}")
    parts["query_scope"] = _jaccard({_fold(s) for s in g.query_scope}, {_fold(s) for s in p.query_scope})
    if parts["query_scope"] < 1:
        notes.append(f"query_scope should be {g.query_scope}, not {p.query_scope}")
    parts["distortion_source"] = float(g.distortion_source == p.distortion_source)
    if not parts["distortion_source"]:
        notes.append(f"distortion_source should be {g.distortion_source!r}, not {p.distortion_source!r}")
    gd = {(_fold(o), c) for o, cs in (g.distortions or {}).items() for c in cs}
    pd = {(_fold(o), c) for o, cs in (p.distortions or {}).items() for c in cs}
    parts["distortions"] = _jaccard(gd, pd)
    if parts["distortions"] < 1:
        notes.append(f"distortions should be {g.distortions}, not {p.distortions}")
    gt = {_fold(t) for t in g.required_tool or []}
    pt = {_fold(t) for t in p.required_tool or []}
    parts["required_tool"] = _jaccard(gt, pt)
    if parts["required_tool"] < 1:
        notes.append(f"required_tool should be {g.required_tool}, not {p.required_tool}")
    why = _why_flags(g)
    for flag in PlanControlFlags.model_fields:
        want, got = getattr(g.plan, flag), getattr(p.plan, flag)
        parts[f"plan.{flag}"] = float(want == got)
        if want != got:
            notes.append(f"plan.{flag} should be {str(want).lower()}: {why[flag]}")
    score = sum(PLANNER_WEIGHTS[k] * v for k, v in parts.items())
    return Grade(round(score, 6), "Correct plan." if not notes else "Plan errors: " + "; ".join(notes) + ".")


# ── executor parts ──────────────────────────────────────────────────────────────────────────────


def _pairs(mapping: Any) -> set[tuple[str, str]]:
    out = set()
    for obj, types in (mapping or {}).items():
        for t in types or []:
            try:
                out.add((_fold(obj), normalize_category(t)))
            except ValueError:
                out.add((_fold(obj), str(t)))
    return out


def _root(value: Any) -> Any:
    return getattr(value, "root", value)


def grade_detect(gold: Any, pred: Any) -> Grade:
    failed = _failed(pred)
    if failed:
        return failed
    want, got = _pairs(gold.distortion_set), _pairs(_root(_get(pred, "distortion_set")))
    if not want and not got:
        return Grade(1.0, "Correct: no distortions.")
    tp = len(want & got)
    precision = tp / len(got) if got else 0.0
    recall = tp / len(want) if want else 0.0
    f1 = 0.0 if tp == 0 else 2 * precision * recall / (precision + recall)
    notes = []
    if want - got:
        notes.append("missed " + ", ".join(f"{o}/{c}" for o, c in sorted(want - got)))
    if got - want:
        notes.append("named distortions that are not there: " + ", ".join(f"{o}/{c}" for o, c in sorted(got - want)))
    return Grade(round(f1, 6), "Correct distortion set." if not notes else "; ".join(notes).capitalize() + ".")


def _severity_index(value: Any) -> Optional[int]:
    value = {"mild": "slight", "heavy": "severe"}.get(str(value).strip().lower(), str(value).strip().lower())
    return SEVERITIES.index(value) if value in SEVERITIES else None


def grade_analyze(gold: Any, pred: Any) -> Grade:
    failed = _failed(pred)
    if failed:
        return failed
    got: dict[tuple[str, str], Any] = {}
    for obj, items in (_root(_get(pred, "distortion_analysis")) or {}).items():
        for item in items:
            t, s = _get(item, "type"), _get(item, "severity")
            try:
                t = normalize_category(t)
            except ValueError:
                pass
            got[(_fold(obj), t)] = s
    scores, notes = [], []
    for obj, items in gold.distortion_analysis.items():
        for item in items:
            key = (_fold(obj), item["type"])
            want = _severity_index(item["severity"])
            have = _severity_index(got[key]) if key in got else None
            if have is None:
                scores.append(0.0)
                notes.append(f"{obj}/{item['type']}: not analysed (expected {item['severity']})")
                continue
            scores.append(1 - abs(want - have) / (len(SEVERITIES) - 1))
            if have != want:
                notes.append(f"{obj}/{item['type']}: severity should be {item['severity']}, not {SEVERITIES[have]}")
    score = sum(scores) / len(scores) if scores else 1.0
    return Grade(round(score, 6), "Correct severities." if not notes else "; ".join(notes) + ".")


def grade_select(gold: Any, pred: Any, tool_modes: dict[str, str]) -> Grade:
    failed = _failed(pred)
    if failed:
        return failed
    chosen = {_fold(o): {normalize_category(d, allow_overall=True): t for d, t in by.items()}
              for o, by in (_root(_get(pred, "selected_tools")) or {}).items()}
    want_kind = "FR" if gold.reference_mode == "Full-Reference" else "NR"
    folded_modes = {_fold(k): v for k, v in tool_modes.items()}
    scores, notes = [], []
    for obj, types in gold.distortion_set.items():
        for dist in types:
            ok = gold.acceptable[obj][dist]
            tool = chosen.get(_fold(obj), {}).get(dist)
            if tool is None:
                scores.append(0.0)
                notes.append(f"{obj}/{dist}: no tool chosen (good: {', '.join(ok)})")
            elif _fold(tool) in {_fold(t) for t in ok}:
                scores.append(1.0)
            elif folded_modes.get(_fold(tool)) == want_kind:
                scores.append(SELECT_WRONG_TOOL_RIGHT_KIND)
                notes.append(f"{obj}/{dist}: {tool} has no known strength for {dist} (good: {', '.join(ok)})")
            else:
                scores.append(0.0)
                kind = folded_modes.get(_fold(tool), "unknown")
                notes.append(f"{obj}/{dist}: {tool} is a {kind} tool; with {gold.reference_mode} use {want_kind} "
                             f"tools (good: {', '.join(ok)})")
    score = sum(scores) / len(scores) if scores else 1.0
    return Grade(round(score, 6), "Good tool choices." if not notes else "; ".join(notes) + ".")


# ── summarizer parts ────────────────────────────────────────────────────────────────────────────

_LETTER = re.compile(r"^\(?([A-Fa-f])(?:[.):]|\s|$)")


def _answer_letter(text: str) -> Optional[str]:
    m = _LETTER.match(text.strip())
    return m.group(1).upper() if m else None


def _norm_text(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _replan_part(gold: Any, pred: Any, notes: list[str]) -> float:
    want, got = bool(gold.need_replan), bool(_get(pred, "need_replan"))
    if want != got:
        notes.append(f"need_replan should be {str(want).lower()}")
    return float(want == got)


def grade_explain(gold: Any, pred: Any) -> Grade:
    failed = _failed(pred)
    if failed:
        return failed
    want, got = str(gold.final_answer), str(_get(pred, "final_answer") or "")
    notes: list[str] = []
    gold_letter = _answer_letter(want) if len(want.strip()) <= 3 else None
    if gold_letter:
        right = _answer_letter(got) == gold_letter
        if not right:
            notes.append(f"the answer is option {gold_letter}, not {got.strip()[:40]!r}")
    else:
        w, g = _norm_text(want), _norm_text(got)
        right = bool(w) and (w == g or w in g)
        if not right:
            notes.append(f"the answer should be {want!r}, not {got[:80]!r}")
    score = ANSWER_WEIGHT * right + (1 - ANSWER_WEIGHT) * _replan_part(gold, pred, notes)
    return Grade(round(score, 6), "Correct answer." if not notes else "; ".join(notes).capitalize() + ".")


def grade_score(gold: Any, pred: Any) -> Grade:
    failed = _failed(pred)
    if failed:
        return failed
    want = LEVEL_SCORES[gold.level]
    got_letter = normalize_level(_get(pred, "level"))
    notes: list[str] = []
    if got_letter not in LEVEL_SCORES:
        level_part = 0.0
        notes.append(f"level should be {gold.level}, got {got_letter!r}")
    else:
        err = abs(LEVEL_SCORES[got_letter] - want)
        level_part = 1 - err / 4
        if err:
            notes.append(f"level should be {gold.level}, not {got_letter} ({err} level(s) off)")
    score = ANSWER_WEIGHT * level_part + (1 - ANSWER_WEIGHT) * _replan_part(gold, pred, notes)
    return Grade(round(score, 6), "Correct level." if not notes else "; ".join(notes).capitalize() + ".")


GRADERS: dict[str, Callable[..., Grade]] = {
    "plan": grade_plan,
    "detect": grade_detect,
    "analyze": grade_analyze,
    "explain": grade_explain,
    "score": grade_score,
}


def grade(gold: Any, pred: Any, tool_modes: Optional[dict[str, str]] = None) -> Grade:
    """Grade one prediction against its fixture example (the part comes from `gold.part`)."""
    part = gold.part
    if part == "select":
        return grade_select(gold, pred, tool_modes or {})
    return GRADERS[part](gold, pred)


class ModuleMetric:
    """The metric DSPy optimizers call, with a count of calls for progress reporting.

    `on_call(score)` (optional) is invoked after each grading, from whichever thread graded.
    """

    def __init__(self, tool_modes: Optional[dict[str, str]] = None, on_call: Optional[Callable[[float], None]] = None):
        self.tool_modes = tool_modes or {}
        self.on_call = on_call
        self.calls = 0
        self._lock = threading.Lock()

    def grade(self, gold: Any, pred: Any) -> Grade:
        result = grade(gold, pred, self.tool_modes)
        with self._lock:
            self.calls += 1
        if self.on_call is not None:
            self.on_call(result.score)
        return result

    def __call__(self, gold, pred, trace=None, pred_name=None, pred_trace=None):
        result = self.grade(gold, pred)
        if pred_name is None and pred_trace is None:
            return result.score
        # GEPA asks per predictor; the feedback is what its reflection LM reads.
        return dspy.Prediction(score=result.score, feedback=result.feedback)
