"""The offline analyst: the three roles played without a language model.

- Planner: DESIGN §3's rules applied to the query text (`planner_rules`).
- Detection / analysis: measured image statistics per spec category (`offline.stats`, `offline.severity`,
  thresholds fitted on real photos from several sources (benchmarks/fit_corpus.py)), each with a one-line measured reason.
- Tool selection: per mode (NR / FR) and detected category, the tool of `fusion_choice.json`, chosen on
  held-out sources by benchmarks/choose_fusion.py; a tool that cannot run here falls back to the
  registry's metadata (strengths; FR tools when a reference exists).
- Summarizer: the analyst's own distribution over quality levels (derived from the measured
  severities) stands in for the VLM's level probabilities and is fused with the tools' scores by the
  spec's formula (probability mode "analyst") with the η of `fusion_choice.json` for the mode; questions
  are answered from the severities.

Same state models, graph, registry and fusion as the VLM roles; only the judgement differs.
"""
from __future__ import annotations

import functools
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from agentic_iqa.agents.context import AssessmentContext
from agentic_iqa.agents.planner_rules import (
    RATING_WORDS,
    FramePart,
    WH_QUESTION,
    YES_NO_QUESTION,
    asks_sharpness,
    distortion_mentions,
    frame_part,
    mcq_options,
    named_distortions,
    place_words,
    question_part,
    rule_plan,
)
from agentic_iqa.agents.tool_execution import unique_tool_scores
from agentic_iqa.fusion import ScoreFusion, level_letter
from signatures.models import (
    GLOBAL,
    LEVEL_NAMES,
    LEVEL_SCORES,
    OVERALL,
    QUALITY_LEVELS,
    DistortionAnalysis,
    ExecutorOutput,
    PlannerOutput,
    SummarizerOutput,
)
from signatures.vocabulary import SEVERITY_RANK

FUSION_CHOICE_FILE = Path(__file__).with_name("fusion_choice.json")
_YES = re.compile(r"^\s*(yes|true|present|there is)\b", re.I)
_NO = re.compile(r"^\s*(no|false|absent|there is no)\b", re.I)
# "How much quality was lost?", "How far is it from the original?": an amount asked for.
_HOW_MUCH = re.compile(r"\s*how\s+(?:much|far)\b", re.I)


def _option_texts(query: str) -> dict[str, str]:
    """{label: option text} without trailing punctuation ("A. Yes." → {"A": "Yes"}); {} without options."""
    return {k: v.strip().rstrip(".?") for k, v in mcq_options(query).items()}


def _yes_no_labels(texts: dict[str, str]) -> tuple[Optional[str], Optional[str]]:
    """The labels of the Yes and the No option (None for one not offered)."""
    return (next((k for k, v in texts.items() if _YES.match(v)), None),
            next((k for k, v in texts.items() if _NO.match(v)), None))


class OfflineRoles:
    """Roles played by measurements and rules; see the module docstring."""

    name = "offline analyst"

    def __init__(self, eta: Optional[float] = None):
        """`eta`: one η for both modes instead of the chosen ones (for ablations)."""
        self.eta = eta

    def eta_for(self, mode: str) -> float:
        return self.eta if self.eta is not None else fusion_choice()[mode]["eta"]

    def fuse(self, dist: Sequence[float], scores: Sequence[float], mode: str, prob_note: Optional[str] = None):
        """The spec's fusion of the analyst's level distribution with normalized tool scores, with the η
        chosen for `mode` ("NR" / "FR") unless one was given."""
        return ScoreFusion(eta=self.eta_for(mode), prob_mode="analyst").fuse(
            scores, probabilities={str(c): p for c, p in zip(range(1, 6), dist)}, prob_mode="analyst",
            prob_note=prob_note)

    # ── measurements, once per assessment ───────────────────────────────────────────────────────

    def _analyses(self, ctx: AssessmentContext, plan: PlannerOutput) -> dict:
        """{FramePart: that part's analyses} for every part of the frame the plan's regions name ("the bottom half",
        "the boat on the left"), and {WHOLE: the whole image's} when anything needs them; measured once per
        assessment."""
        def measure() -> dict:
            from agentic_iqa.offline import severity

            size, image, _ = _working_pixels(ctx, ctx.image_path)
            ref_size, reference, ref_hash = (_working_pixels(ctx, ctx.reference_path) if ctx.reference_path
                                             else (None, None, None))
            if reference is not None and ref_size != size:
                ctx.trace.add("analyze", "note", "reference size differs from the image: no-reference statistics used")
                reference = None
            if reference is not None and (similarity := scene_similarity(image, reference)) < SAME_SCENE_MIN:
                ctx.trace.add("analyze", "note", (
                    f"the reference does not look like the same scene as the image (their layouts of edges correlate "
                    f"{similarity:.2f}; damaged copies of a photo measured 0.33 or more): the full-reference verdict "
                    "compares two different pictures; check the reference file"))
            placed = _frame_parts(plan)
            by_part = {}
            for part in dict.fromkeys(placed.values()):
                crop = _crop(image, part)
                if crop is not None:  # else too small to measure alone: the whole image's analyses stand in
                    by_part[part] = severity.analyze(crop, _crop(reference, part) if reference is not None else None)
            # The whole image is measured unless every region is a part measured alone and no reference needs
            # checking (its swapped-files note compares the whole image with the whole reference).
            if reference is not None or any(placed.get(r) not in by_part for r in plan.query_scope):
                by_part[WHOLE] = self._whole(ctx, image, reference, ref_hash)
            return by_part

        return ctx.once("offline_analyses", measure)

    @staticmethod
    def _whole(ctx: AssessmentContext, image, reference, ref_hash) -> dict:
        from agentic_iqa.offline import severity

        if reference is None:
            return severity.analyze(image, look=True)
        from agentic_iqa.offline.stats import measure

        ref_stats, image_stats = _reference_stats(ref_hash, reference), measure(image)
        swapped = looks_swapped(image_stats, ref_stats)
        if swapped:
            image_q, ref_q = swapped
            worst = severity.ranked(severity.analyze_stats(ref_stats))[0]
            ctx.trace.add("analyze", "note", (
                f"the reference itself measures worse than the image when each is judged alone (quality "
                f"{ref_q:.2f} against {image_q:.2f}; the reference shows {worst.severity} "
                f"{damage_name(worst.detector)}): the full-reference verdict takes the reference as the undamaged "
                "original, so check that the two files are not swapped"))
        return severity.analyze(image, reference, reference_stats=ref_stats, image_stats=image_stats)

    def _region_analyses(self, ctx: AssessmentContext, plan: PlannerOutput, region: str) -> dict:
        """The analyses a region's row is built from: its part of the frame's when it names one that was measured,
        else the whole image's."""
        by_part, part = self._analyses(ctx, plan), _frame_parts(plan).get(region)
        return by_part[part] if part in by_part else by_part[WHOLE]

    def _measured_parts(self, ctx: AssessmentContext, plan: PlannerOutput) -> list[tuple[str, dict]]:
        """(name, analyses) of each region that is a part of the frame measured alone, in the plan's order."""
        by_part = self._analyses(ctx, plan)
        return [(part.name, by_part[part]) for part in _frame_parts(plan).values() if part in by_part]

    def _answer_analyses(self, ctx: AssessmentContext, plan: PlannerOutput) -> dict:
        """What the answer and the score are judged from: the part of the frame the question asks about; with
        several ("Are the left and right sides sharp?"), each category at its worst among them; the whole image
        when the question is about the image, or about anything the analyst cannot place (the sky)."""
        regions = [r for r in plan.query_scope if r != GLOBAL]
        measured = [analyses for _, analyses in self._measured_parts(ctx, plan)]
        if not regions or len(measured) < len(regions):
            return self._analyses(ctx, plan)[WHOLE]
        return {c: max((m[c] for m in measured), key=lambda a: a.level_raw) for c in measured[0]}

    # ── roles ───────────────────────────────────────────────────────────────────────────────────

    def plan(self, ctx: AssessmentContext, replan_reason: Optional[str]) -> PlannerOutput:
        return rule_plan(
            ctx.query, has_reference=ctx.has_reference, tool_names=ctx.known_tools(),
            context={"known_tools": ctx.known_tools()},
        )

    def detect(self, ctx: AssessmentContext, plan: PlannerOutput) -> dict[str, list[str]]:
        # A region gets its part of the frame's findings, or the whole image's when it names no part.
        return {obj: [a.category for a in _ranked(self._region_analyses(ctx, plan, obj)) if a.severity != "none"]
                for obj in plan.query_scope}

    def analyze(self, ctx: AssessmentContext, plan: PlannerOutput, distortion_set) -> dict[str, list[DistortionAnalysis]]:
        asked = bool(plan.distortions)  # categories named in the query are judged as the query means them
        parts, by_part = _frame_parts(plan), self._analyses(ctx, plan)
        out: dict[str, list[DistortionAnalysis]] = {}
        for obj in (distortion_set or {obj: None for obj in plan.query_scope}):
            analyses = self._region_analyses(ctx, plan, obj)
            categories = (distortion_set[obj] if distortion_set
                          else [a.category for a in _ranked(analyses) if a.severity != "none"])
            where = _where_measured(obj, parts.get(obj), parts.get(obj) in by_part)
            items = []
            for cat in categories:
                a = analyses.get(cat)
                if a is None:
                    continue
                meant = asked_detectors(cat, ctx.query) if asked else None
                if meant:  # "too bright?" asks about over-exposure, "pixelated?" about pixelation
                    which = strongest(a, meant[0])
                    items.append(DistortionAnalysis(type=cat, severity=a.severity_of(which),
                                                    explanation=a.explanations.get(which, a.explanation) + where))
                else:
                    items.append(DistortionAnalysis(type=cat, severity=a.severity, explanation=a.explanation + where))
            out[obj] = items
        return out

    def select(self, ctx: AssessmentContext, plan: PlannerOutput, distortion_set) -> dict[str, dict[str, str]]:
        mode, tools = _mode_tools(ctx)
        if not tools:
            return {}
        targets = distortion_set or {GLOBAL: [OVERALL]}
        return {obj: {cat: tool_for(mode, cat, tools) for cat in categories or [OVERALL]} for obj, categories in targets.items()}

    def summarize(self, ctx: AssessmentContext, plan: PlannerOutput, evidence: ExecutorOutput) -> SummarizerOutput:
        from agentic_iqa.offline import severity

        analyses = self._answer_analyses(ctx, plan)
        dist = severity.level_distribution(analyses)
        expected = severity.expected_level(dist)
        scores = unique_tool_scores(evidence)
        mode = _mode_tools(ctx)[0]
        weighted = self.eta_for(mode) > 0
        fused = self.fuse(dist, scores, mode,
                          prob_note=f"analyst distribution from measured severities (expected level {expected:.2f})"
                          + ("" if weighted or not scores else "; tools shown, not weighted (η 0, chosen on held-out photos)"))
        reasoning = _scope_note(plan, self._analyses(ctx, plan)) + _reasoning(analyses, evidence, fused, expected, weighted, plan)
        if ctx.scoring:
            return SummarizerOutput.from_fusion(
                fused, reasoning,
                fused.prob_note + (f"; tool mean {fused.qbar:.2f} from {len(scores)} score(s)" if fused.qbar is not None else "; no tool scores"),
                prob_mode="analyst", query=ctx.query,
            )
        answer = answer_question(ctx.query, plan, analyses, fused.level, parts=self._measured_parts(ctx, plan))
        if not asks_about_quality(ctx.query, plan):  # "What animal is in the picture?": say what it can't answer
            reasoning = "The offline analyst cannot see what the picture shows; a VLM (--lm) can. " + reasoning
        return SummarizerOutput(final_answer=answer, quality_reasoning=reasoning)


@functools.lru_cache(maxsize=1)
def fusion_choice() -> dict:
    """{"NR"/"FR": {"eta": η, "tools": {category or "Overall": tool}}} from fusion_choice.json: which tool
    the offline path fuses per detected category and how strongly (the spec's η), chosen by
    benchmarks/choose_fusion.py on held-out sources."""
    try:
        data = json.loads(FUSION_CHOICE_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # missing, unreadable, not UTF-8, not JSON: say which file
        raise ValueError(f"{FUSION_CHOICE_FILE}: cannot read the offline fusion choice ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{FUSION_CHOICE_FILE}: expected a JSON object with NR and FR entries")
    out = {}
    for mode in ("NR", "FR"):
        entry = data.get(mode)
        if not isinstance(entry, dict) or not isinstance(entry.get("tools"), dict) or OVERALL not in entry["tools"]:
            raise ValueError(f"{FUSION_CHOICE_FILE}: {mode} needs a tools map with an {OVERALL!r} entry")
        eta = entry.get("eta")
        if not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
            raise ValueError(f"{FUSION_CHOICE_FILE}: {mode} eta must be a finite number >= 0, got {eta!r}")
        out[mode] = {"eta": float(eta), "tools": {str(k): str(v) for k, v in entry["tools"].items()}}
    return out


def tool_for(mode: str, category: str, tools: Sequence, chosen: Optional[dict] = None) -> str:
    """The tool the offline analyst runs for one detected category: the chosen one when it can run here
    (`tools`: the registry's available ToolSpecs for the mode), else the first tool whose strengths name
    the category, else the first available. `chosen`: a tools map to use instead of the shipped one
    (benchmarks/choose_fusion.py tries candidates through this same code)."""
    chosen = chosen if chosen is not None else fusion_choice()[mode]["tools"]
    name = chosen.get(category, chosen[OVERALL])
    if any(t.name == name for t in tools):
        return name
    strong = [t for t in tools if category in t.strengths]
    return (strong or list(tools))[0].name


def offline_tool_names(mode: str, categories: Sequence[str], tools: Sequence, chosen: Optional[dict] = None) -> list[str]:
    """The distinct tools an offline assessment runs for these detected categories (Overall when none):
    their normalized scores are what `OfflineRoles.fuse` averages into q̄."""
    return list(dict.fromkeys(tool_for(mode, c, tools, chosen) for c in (list(categories) or [OVERALL])))


def _mode_tools(ctx: AssessmentContext) -> tuple[str, list]:
    """("FR", FR tools) with a reference and FR tools available, else ("NR", NR tools)."""
    fr = ctx.registry.available_tools("FR") if ctx.has_reference else []
    return ("FR", fr) if fr else ("NR", ctx.registry.available_tools("NR"))


def _working_pixels(ctx: AssessmentContext, path) -> tuple[tuple[int, int], "object", str]:
    """(full size, float RGB H×W×3 at the statistics' working size, the file's content hash), through the
    registry's loader (its decode cache has the hash already; 16-bit,
    RGBA, CMYK handled). Only the working-size copy is kept: the full-size float copy of a 48 MP photo is
    576 MB, held for the whole assessment when it was kept (the analyses are computed once anyway)."""
    from agentic_iqa.offline.stats import at_working_size
    from iqa_tools import load_image

    loaded = load_image(path, max_pixels=ctx.settings.pipeline.max_image_pixels)
    return loaded.size, at_working_size(loaded.float_pixels()), loaded.sha256


# A reference of another scene makes every full-reference figure meaningless, so the answer says so. Measured on the
# accuracy corpus' 88 working copies (benchmarks/RESULTS.md, issue 10 follow-up 19): every photo damaged by any of the
# 17 types at levels 4-5 keeps a coarse edge-layout correlation with its original of 0.33 or more (3,162 pairs); two
# different photos of the same size fall below 0.25 in 627 of 636 pairs (the rest, similar layouts, pass unnoticed).
SAME_SCENE_MIN = 0.25
# A reference whose own no-reference quality is this much (one level) below the image's is likely the damaged one
# of the two: a note, never a change of the verdict. No-reference levels of clean photos spread about a level
# (benchmarks/RESULTS.md: 7.6 % of held-out clean photos read below 3.5), so a smaller gap would flag clean pairs.
SWAPPED_MARGIN = 1.0


def looks_swapped(image_stats: dict, reference_stats: dict) -> Optional[tuple[float, float]]:
    """(the image's, the reference's no-reference quality) when the reference, judged alone, measures
    ``SWAPPED_MARGIN`` or more below the image (the pair looks swapped), else None."""
    from agentic_iqa.offline import severity

    image_q, ref_q = severity.no_reference_quality(image_stats), severity.no_reference_quality(reference_stats)
    return (image_q, ref_q) if ref_q <= image_q - SWAPPED_MARGIN else None


def scene_similarity(image, reference) -> float:
    """Correlation of the two images' gradient magnitude at 32 px on the long side: where the edges are, which
    tone, colour, blur, noise and compression damage keep and another scene does not."""
    import cv2
    import numpy as np

    def edges(x) -> "np.ndarray":
        h, w = x.shape[:2]
        scale = 32 / max(h, w)
        small = cv2.resize(np.asarray(x, np.float32).mean(axis=2), (max(round(w * scale), 4), max(round(h * scale), 4)),
                           interpolation=cv2.INTER_AREA)
        g = np.hypot(*np.gradient(small))
        return g - g.mean()

    a, b = edges(image), edges(reference)
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else 1.0  # two flat frames: nothing says they differ


_REFERENCE_STATS: "OrderedDict[tuple, dict]" = OrderedDict()
_REFERENCE_STATS_MAX = 8
_REFERENCE_STATS_LOCK = threading.Lock()


def _reference_stats(content_hash: str, pixels) -> dict:
    """The reference's no-reference statistics, measured once per file content: a batch that compares many
    images with one reference measured it again for every item (~45 ms at 512×384, ~180 ms at 1024×768).
    Keyed by the loader's content hash (a rewritten file is measured again) and the working-size shape; a
    few are kept (bounded), shared by the batch's threads."""
    from agentic_iqa.offline.stats import measure

    key = (content_hash, tuple(pixels.shape))
    with _REFERENCE_STATS_LOCK:
        if key in _REFERENCE_STATS:
            _REFERENCE_STATS.move_to_end(key)
            return _REFERENCE_STATS[key]
    stats = measure(pixels)  # outside the lock: two threads may measure one file once each, never wrongly
    with _REFERENCE_STATS_LOCK:
        _REFERENCE_STATS[key] = stats
        while len(_REFERENCE_STATS) > _REFERENCE_STATS_MAX:
            _REFERENCE_STATS.popitem(last=False)
    return stats


def _ranked(analyses: dict) -> list:
    from agentic_iqa.offline import severity

    return severity.ranked(analyses)


WHOLE = "whole image"  # the key of the whole image's analyses beside its parts
# A part of the frame narrower than this (working-size pixels) is not measured alone: the statistics' patches and
# band filters need room (a 512 x 384 photo's corner third is 170 x 128).
MIN_PART_SIDE = 64


def _frame_parts(plan: PlannerOutput) -> dict:
    """{region: FramePart} for the plan's regions that name a part of the frame."""
    return {r: part for r in plan.query_scope if r != GLOBAL and (part := frame_part(r)) is not None}


def _crop(pixels, part: FramePart):
    """The part of an H x W x 3 image, or None when it is smaller than MIN_PART_SIDE on a side. It is cut from
    the working-size copy, so a part is measured at the same scale as the whole image."""
    import numpy as np

    rows, cols = part.slices(*pixels.shape[:2])
    if min(rows.stop - rows.start, cols.stop - cols.start) < MIN_PART_SIDE:
        return None
    return np.ascontiguousarray(pixels[rows, cols])


def _part_words(part: FramePart) -> str:
    return f"the {part.name} of the frame"


def _where_measured(region: str, part: Optional[FramePart], measured: bool) -> str:
    """The end of a region's explanation: what its measurements are of."""
    if region == GLOBAL:
        return ""
    if part is None:
        return f" Measured on the whole image, not the {region}."
    if not measured:
        return f" Measured on the whole image: {_part_words(part)} is too small to measure alone."
    return f" Measured on {_part_words(part)}."


def _scope_note(plan: PlannerOutput, by_part: dict) -> str:
    """Sentences for a question about a region: a part of the frame ("Is the bottom half blurry?") is measured
    alone; an object placed in one ("the boat on the left") is measured through that part, since the analyst
    cannot find the object itself; any other region ("Is the sky noisy?") gets the whole image's measurements,
    and the note says so."""
    notes, unplaced, alone = [], [], []
    placed = _frame_parts(plan)
    for region in (r for r in plan.query_scope if r != GLOBAL):
        part = placed.get(region)
        if part is None:
            unplaced.append(region)
        elif part not in by_part:
            notes.append(f"The {part.name} of the frame is too small to measure alone, so the offline analyst "
                         "measured the whole image.")
        elif part.subject:
            notes.append(f"The offline analyst cannot find the {part.subject}; it measured {_part_words(part)}, where "
                         "the question places it.")
        else:
            alone.append(part.name)
    if alone:
        notes.insert(0, f"Measured on the {' and the '.join(alone)} of the frame{', each' if len(alone) > 1 else ''} alone.")
    if unplaced:
        named = " or ".join(f"the {r}" for r in unplaced)
        notes.append(f"The offline analyst measured the whole image, not {named} alone; a VLM (--lm) can look at "
                     f"{'it' if len(unplaced) == 1 else 'them'}.")
    return "".join(n + " " for n in notes)


def _why_no_tool(evidence: ExecutorOutput, plan: Optional[PlannerOutput]) -> str:
    if evidence.tool_logs:
        return "every tool that ran failed"
    if plan is not None and not plan.plan.tool_execution:
        if plan.query_type == "Other":
            return "no tool ran (the question is not about quality)"
        if plan.region_named:
            return "no tool ran (tools score the whole image, so none runs for a question about a region)"
        return "no tool ran (the plan runs none)"
    return "no tool ran"


def _reasoning(analyses: dict, evidence: ExecutorOutput, fused, expected: float, weighted: bool = True,
               plan: Optional[PlannerOutput] = None) -> str:
    found = [a for a in _ranked(analyses) if a.severity != "none"]
    parts = list(dict.fromkeys(a.explanation for a in found[:3])) or ["No distortion measured above the clean-photo range."]
    tools = [
        f"{lg.tool_name} {lg.raw_score:.3g} → {lg.normalized_score:.2f}/5" + (" (fallback)" if lg.fallback else "")
        for lg in evidence.tool_logs if lg.ok
    ]
    tools = list(dict.fromkeys(tools))
    damage_note, look_note = _damage_note(analyses), _look_note(analyses)
    text = " ".join(parts) + damage_note + look_note
    overall = [w for w, note in (("the overall damage level", damage_note), ("the overall look", look_note)) if note]
    said = ["Measured severities", *overall]
    basis = f"{', '.join(said[:-1])} and {said[-1]}" if overall else said[0]
    if tools:
        text += " Tools: " + "; ".join(tools) + "."
    if not found and (plan is None or plan.reference_mode != "Full-Reference"):  # with one, the reference is the bar
        text += _tool_disagrees(evidence)
    stated = f"{expected:.2f}" + ("" if f"{expected:.2f}" == f"{fused.score:.2f}" else f", scored {fused.score:.2f}")
    if not tools:  # nothing to fuse or show: say so, and why, instead of "fused with the tools"
        text += (f" {basis} put the expected level at {stated} ({fused.level}), with no tool score to fuse:"
                 f" {_why_no_tool(evidence, plan)}.")
    elif weighted:
        text += f" {basis} put the expected level at {expected:.2f}; fused with the tools: {fused.score:.2f} ({fused.level})."
    else:  # η 0: on held-out photos the tools made this answer worse (benchmarks/choose_fusion.py)
        # Unweighted, the fused score is the expected level itself: said once ("at 4.84: 4.84 (A)" read as a typo).
        text += f" {basis} put the expected level at {stated} ({fused.level}); the tools are shown, not weighted."
    return text


LOOK_NOTE_MIN = 0.05  # a look (or overall damage level) that moves the score less is not worth a sentence


def _damage_note(analyses: dict) -> str:
    """A sentence when the overall damage level (``severity.Analyses.damage_level``) moved the score away from what
    the named distortions alone give."""
    level = getattr(analyses, "damage_level", None)
    if level is None:
        return ""
    from agentic_iqa.offline.damage import load_model
    from agentic_iqa.offline.severity import overall_badness, quality_from_badness

    named = overall_badness(list(analyses.values()))  # a plain list: the detectors' level alone
    shift = quality_from_badness(overall_badness(analyses)) - quality_from_badness(named)
    if abs(shift) < LOOK_NOTE_MIN:
        return ""
    counted = max(0.0, level - load_model().offset)  # the level the blend counts (``damage.blend``)
    return (f" All its statistics together read like damage of level {counted:.1f} on a 0–5 scale (a model fitted on"
            f" damaged photos; the distortions named read like {named:.1f}): the score "
            f"{'rises' if shift > 0 else 'falls'} by {abs(shift):.2f}.")


def _look_note(analyses: dict) -> str:
    """A sentence when the photo's overall look (``severity.Analyses``) moved the score."""
    shift = getattr(analyses, "look_shift", 0.0)
    if abs(shift) < LOOK_NOTE_MIN:
        return ""
    from agentic_iqa.offline.look import load_model

    photos = load_model().about.get("photos")
    return (f" Overall, photos that measure like this one are rated about {1 + 4 * analyses.look:.1f} of 5 by people"
            f" (a model fitted on {f'{photos:,} ' if isinstance(photos, int) else ''}rated photos): the score "
            f"{'rises' if shift > 0 else 'falls'} by {abs(shift):.2f}.")


# A no-reference tool's normalized score that clean photos stay above. BRISQUE: clean scikit-image training photos
# 3.18-3.33, with grain of sigma 10 in all three channels 2.52-3.07 (3.1 between). Such grain was damage the analyst
# did not measure until it was fitted on (benchmarks/RESULTS.md follow-ups 36, 39); held out on 86 evaluation-only
# photos (CBSD68, McMaster; benchmarks/grain_note.py) clean photos read 3.21-3.33 (0 of 86 below), and of the grain
# the analyst then missed, 59 of 73 at sigma 10 and 68 of 68 at sigma 20 read below (follow-up 38).
_CLEAN_TOOL_FLOOR = {"BRISQUE": 3.1}


def _tool_disagrees(evidence: ExecutorOutput) -> str:
    """A sentence when a no-reference tool reads below what clean photos reach although the analyst measured
    nothing: the tool is still shown, not weighted, but the reader learns that the two disagree."""
    for lg in evidence.tool_logs:
        floor = _CLEAN_TOOL_FLOOR.get(lg.tool_name)
        if lg.ok and floor is not None and lg.normalized_score < floor:
            return (f" {lg.tool_name}, though, reads {lg.normalized_score:.2f}/5, below the {floor:g} clean photos reach:"
                    " there may be damage the analyst does not measure, or content that misleads the tool.")
    return ""


def answer_question(query: str, plan: PlannerOutput, analyses: dict, fused_level: str,
                    parts: Sequence[tuple[str, dict]] = ()) -> str:
    """Answer a multiple-choice, yes/no or open question about distortions from the measured severities,
    and a yes/no question about the quality itself ("Is it of good quality?") from the fused level.
    ``parts``: (name, analyses) of each part of the frame the question names, in its order, for a question that
    compares two ("Is the left half noisier than the right half?")."""
    compared = _parts_compared(query, plan, parts)
    if compared is not None and (answer := _answer_parts_compared(query, parts[0][0], *compared)) is not None:
        return answer
    if len(parts) > 1 and compared is None and (each := _answer_each_part(query, plan, parts)):
        return each
    if not asks_about_quality(query, plan):  # "What animal is this? A. Dog B. Cat": no letter is a guess it can stand by
        main = _main_distortion(analyses)
        return (f"The offline analyst answers quality questions only: quality {LEVEL_NAMES[fused_level].lower()}"
                f" ({fused_level}); {main[0].lower()}{main[1:]}")
    options = mcq_options(query)
    asked = [c for dists in (plan.distortions or {}).values() for c in dists] or named_distortions(query)
    against = _against_reference(query, plan)
    if against is not None and not asked and (answer := _answer_against_reference(query, *against, analyses)):
        return answer
    polarity = _quality_polarity(query)
    negated = _negated(query)
    if options:
        texts = _option_texts(query)
        yes, no = _yes_no_labels(texts)
        if yes and no and asked:
            compared = _comparison(query, analyses)
            if compared is not None and compared[0] is not None:
                return yes if compared[0] != negated else no
            severities = {c: _severity(analyses, c, query) for c in asked if c in analyses}
            return yes if _claims_hold(severities, query) else no
        if yes and no and polarity is not None:
            return yes if (_good(fused_level) == polarity) != negated else no
        by_level = {k: LEVEL_SCORES[letter] for k, v in texts.items() for letter, name in LEVEL_NAMES.items()
                    if re.search(rf"\b{name}\b", v, re.I)}
        if by_level and asked and len(by_level) == len(texts):
            # "How sharp is it? A. Excellent … E. Bad": the asked attribute's grade, from its damage's severity.
            worst = max(SEVERITY_RANK[_severity(analyses, c, query)] for c in asked if c in analyses) if any(
                c in analyses for c in asked) else 0
            target = LEVEL_SCORES[QUALITY_LEVELS[worst]]  # severity rank 0 (none) → A … 4 (extreme) → E
            return min(by_level, key=lambda k: abs(by_level[k] - target))
        by_category = {k: named_distortions(v) for k, v in texts.items()}
        graded = {k: _option_grade(v) for k, v in texts.items()}
        if any(by_category.values()) or (asked and any(g is not None for g in graded.values())):
            return _best_distortion_option(texts, by_category, graded, asked, analyses,
                                           weaker=_comparative(query) == "weaker")
        if by_level:
            target = LEVEL_SCORES[fused_level]
            return min(by_level, key=lambda k: abs(by_level[k] - target))
        return next(iter(texts))  # no option the measurements can speak to; the reasoning says what was measured
    yes_no = bool(YES_NO_QUESTION.match(question_part(query)))
    if asked:
        # One case for every name in the list (the question's own word "blur" beside the category "Noise" read as a
        # typo); a capital only where the answer starts with the list.
        severities = {c: _severity(analyses, c, query) for c in asked if c in analyses}
        found = "; ".join(f"{_name(c, query).lower()}: {sev}" for c, sev in severities.items())
        compared = _comparison(query, analyses, severities)
        if compared is not None and (compared[0] is not None or not yes_no):
            verdict, sentence = compared
            return (("Yes — " if verdict != negated else "No — ") if yes_no else sentence + " — ") + found
        if not yes_no:
            if RATING_WORDS.search(question_part(query)) and severities:  # "How would you rate the colours?"
                letter = QUALITY_LEVELS[max(SEVERITY_RANK[sev] for sev in severities.values())]
                return f"{LEVEL_NAMES[letter]} ({letter}) — {found}"
            return found[:1].upper() + found[1:]
        return ("Yes — " if _claims_hold(severities, query) else "No — ") + found
    if yes_no and polarity is not None:
        good = (_good(fused_level) == polarity) != negated
        return f"{'Yes' if good else 'No'} — quality {LEVEL_NAMES[fused_level].lower()} ({fused_level})"
    if _asks_for_list(question_part(query)):
        return _distortion_list(analyses)
    main = _main_distortion(analyses)
    if RATING_WORDS.search(question_part(query)) or re.match(r"\s*how\b", query, re.I):
        # "How is the quality of the face?", "How similar is it to the reference?" ask for the quality first
        return f"Quality {LEVEL_NAMES[fused_level].lower()} ({fused_level}); {main[0].lower()}{main[1:]}"
    return main


# "Is the left half sharper / noisier than the right half?": the comparative before "than"; words for less damage
# turn the comparison round ("Which half is sharper, the top or the bottom?" too).
_COMPARATIVE_THAN = re.compile(r"\b(\w+er|more|less|worse)\s+(?:\w+\s+)?than\b", re.I)
_LESS_DAMAGE = re.compile(r"\b(?:sharp|crisp|clear|clean|fine)(?:er|est)\b|\b(?:better|best|less|least)\b", re.I)
_WHICH = re.compile(r"\s*which\b", re.I)


def _parts_compared(query: str, plan: PlannerOutput, parts: Sequence[tuple[str, dict]]
                    ) -> Optional[tuple[Optional[str], str]]:
    """For a question setting two parts of the frame against each other on a named distortion ("Is the left half
    noisier than the right half?", "Which half is blurrier, the top or the bottom?"): (the part with more of it, or
    less when asked so, None when both measure the same; the severities found), else None. Severities are compared,
    so two in the same band are not told apart."""
    question = question_part(query)
    asked = [c for dists in (plan.distortions or {}).values() for c in dists]
    if len(parts) != 2 or not asked or any(asked[0] not in analyses for _, analyses in parts):
        return None
    comparative = _COMPARATIVE_THAN.search(question)
    which = bool(_WHICH.match(question))
    if not which and (comparative is None or not (YES_NO_QUESTION.match(question) or mcq_options(query))):
        return None
    category = asked[0]
    (first, a), (second, b) = parts
    sev_a, sev_b = _severity(a, category, query), _severity(b, category, query)
    fewer = bool(_LESS_DAMAGE.search(comparative.group(1) if comparative else question)) or (
        which and asks_sharpness(query))
    found = f"{_name(category, query).lower()}: {sev_a} in the {first}, {sev_b} in the {second}"
    if SEVERITY_RANK[sev_a] == SEVERITY_RANK[sev_b]:
        return None, found
    return (first if (SEVERITY_RANK[sev_a] > SEVERITY_RANK[sev_b]) != fewer else second), found


def _answer_each_part(query: str, plan: PlannerOutput, parts: Sequence[tuple[str, dict]]) -> Optional[str]:
    """A yes/no question about several parts of the frame ("Are the top and bottom halves sharp?", "Is the left or
    the right side noisy?"), answered for each part and joined as the question joins them: "or" / "either" needs
    one part, otherwise every part must hold. None for other questions."""
    question = question_part(query)
    options = mcq_options(query)
    yes, no = _yes_no_labels(_option_texts(query)) if options else (None, None)
    if not (YES_NO_QUESTION.match(question) if not options else yes and no):
        return None
    from agentic_iqa.offline import severity

    # Each part at its own level ("Are the top and bottom halves of good quality?"), the analyst's alone.
    answers = {name: answer_question(query, plan, analyses,
                                     level_letter(severity.expected_level(severity.level_distribution(analyses))))
               for name, analyses in parts}
    said_yes = {name: a == yes if options else a.startswith("Yes") for name, a in answers.items()}
    any_part = bool(re.search(r"\b(?:or|either)\b", question, re.I)) and not re.search(r"\b(?:and|both)\b", question, re.I)
    holds = any(said_yes.values()) if any_part else all(said_yes.values())
    if options:
        return yes if holds else no
    return ("Yes — " if holds else "No — ") + "; ".join(
        f"{name}: {a.split(' — ', 1)[-1]}" for name, a in answers.items())


def _answer_parts_compared(query: str, first: str, winner: Optional[str], found: str) -> Optional[str]:
    """The answer to a comparison of two parts: a letter when the options say yes / no or name the parts (by their
    position words: "A. The top B. The bottom"), else a sentence; None when options name neither."""
    options = mcq_options(query)
    if not options:
        if _WHICH.match(question_part(query)):
            return (f"The {winner} — " if winner else "They measure the same — ") + found
        return ("Yes — " if winner == first else "No — ") + found
    texts = _option_texts(query)
    yes, no = _yes_no_labels(texts)
    if yes and no:
        return yes if winner == first else no
    if winner is None:
        same = [k for k, v in texts.items() if re.search(r"\b(?:same|equal|neither|both|no difference)\b", v, re.I)]
        return same[0] if len(same) == 1 else None
    named = [k for k, v in texts.items() if all(re.search(rf"\b{w}\b", v, re.I) for w in place_words(winner))]
    return named[0] if len(named) == 1 else None


# A negation in the question ("Is there no blur?", "Is it not blurry?", "Does it lack detail?"), not "… or not?",
# "yes or no", "if not" nor a contracted "Isn't it blurry?", which asks whether it is.
_NEGATION = re.compile(r"\b(?:not|no|never|lacks?|lacking|without)\b", re.I)
_NOT_A_NEGATION = re.compile(r"\b(?:or|if|whether)\s+(?:not|no)\b|\bnot\s+only\b|\bno\s+matter\b", re.I)
# "free of noise", "noise-free": absence claimed of the one distortion named there.
_FREE_OF = re.compile(r"\bfree\s+of\b", re.I)
_FREE_AFTER = re.compile(r"-?free\b", re.I)


def _negated(query: str) -> bool:
    return bool(_NEGATION.search(_NOT_A_NEGATION.sub(" ", question_part(query))))


def _absence_claims(query: str) -> dict[str, bool]:
    """For each distortion the question names, whether Yes means its damage is absent. Asked the positive way, it
    does: "Is it sharp?" = "is it free of blur?", "Is the contrast good?" = "is there no contrast loss?". A negation or
    "free of" in the three words before the distortion's word says so for that one ("Is there no blur?", "Is it
    blurry and free of noise?", "noise-free"), and turns a sharp word round ("Is it not sharp?", "Does it lack
    sharpness?"); a distortion joined to the one before by "and", "or" or a comma keeps its claim ("no blur or
    noise"). A distortion asked only through the options or the plan takes the question's own negation, if any."""
    question = _NOT_A_NEGATION.sub(" ", question_part(query))
    good = _quality_polarity(_FREE_OF.sub(" ", re.sub(r"-free\b", " ", question))) is True  # "free" is said locally
    claims: dict[str, bool] = {"": good != _negated(query) or bool(_FREE_OF.search(question))}
    previous, marker = None, None  # the last mention and its local marker ("negation" / "free" / None)
    for category, mention in distortion_mentions(question):
        before = " ".join(question[previous.end() if previous else 0: mention.start()].split()[-3:])
        coordinated = previous is not None and re.fullmatch(r"\s*(?:,|and|or|nor)?\s*(?:,|and|or|nor)?\s*",
                                                            question[previous.end(): mention.start()], re.I)
        if not coordinated:  # else the marker of the one before carries over
            marker = "free" if _FREE_OF.search(before) else "negation" if _NEGATION.search(before) else None
        if _FREE_AFTER.match(question, mention.end()):
            marker = "free"
        sharp = category == "Blurs" and asks_sharpness(mention.group())
        claim = True if marker == "free" else (not sharp) if marker == "negation" else good or sharp
        claims.setdefault(category, claim)
        previous = mention
    return claims


def _claims_hold(severities: dict, query: str) -> bool:
    """Whether the yes/no question's claims about the named distortions hold, each claim its presence or (asked that
    way) its absence. Claims of absence must all hold ("Is it free of noise and blur?", "no blur or noise": neither),
    so must claims joined by "and" ("Is it noisy and blurry?"); claims of presence otherwise need one ("noisy or
    blurry?")."""
    question = question_part(query)
    said = _absence_claims(query)
    claims = {c: said.get(c, said[""]) for c in severities}
    holds = [(sev != "none") != claims[c] for c, sev in severities.items()]
    if any(claims.values()) or (re.search(r"\band\b", question, re.I) and not re.search(r"\bor\b", question, re.I)):
        return all(holds)
    return any(holds)


# A question comparing distortions: "Which is worse, the blur or the noise?", "Is there less noise than blur?".
_STRONGER_WORDS = re.compile(r"\b(?:worse|worst|more|most|stronger|strongest|bigger|biggest|greater|greatest|heavier|"
                             r"heaviest|dominant|dominates?|prominent)\b", re.I)
# Not "better" / "best": "Which option best describes it? A. Blurry B. Noisy" asks for the measured damage.
_WEAKER_WORDS = re.compile(r"\b(?:less|least|milder|mildest|weaker|weakest|smaller|smallest|lighter|lightest|fewer)\b",
                           re.I)
# A comparison asks "which" or sets one against the other ("than"): "Is the noise more visible in the dark areas?" is
# not one.
_COMPARING = re.compile(r"\b(?:than|which|what)\b", re.I)


def _comparative(query: str) -> Optional[str]:
    """"stronger" or "weaker" when the question asks which damage is worse or milder, else None."""
    question = question_part(query)
    if not _COMPARING.search(question):
        return None
    stronger, weaker = bool(_STRONGER_WORDS.search(question)), bool(_WEAKER_WORDS.search(question))
    return None if stronger == weaker else ("stronger" if stronger else "weaker")


def _comparison(query: str, analyses: dict, severities: Optional[dict] = None) -> Optional[tuple[Optional[bool], str]]:
    """For a question comparing distortions it names, (for two of them: whether the first named is the worse one, or
    the milder one when asked so; a sentence naming which), else None. Severities are compared (``severities``: those
    already read, by category), so two measured in the same band are not told apart: their levels are estimates."""
    direction = _comparative(query)
    named = [c for c in named_distortions(question_part(query), in_text_order=True) if c in analyses]
    if direction is None or len(named) < 2:
        return None
    severities = severities or {}
    rank = {c: SEVERITY_RANK[severities.get(c) or _severity(analyses, c, query)] for c in named}
    best = (max if direction == "stronger" else min)(rank.values())
    top = [_name(c, query).lower() for c in named if rank[c] == best]
    if len(set(rank.values())) == 1 and best == 0:
        sentence = "Neither is present" if len(named) == 2 else "None is present"
    elif len(top) > 1:
        sentence = f"{', '.join(top[:-1])} and {top[-1]} {'are absent' if best == 0 else 'measure the same'}"
    else:
        word = {("stronger", True): "worse", ("stronger", False): "the worst",
                ("weaker", True): "milder", ("weaker", False): "the mildest"}[direction, len(named) == 2]
        sentence = f"{top[0]} is {word}"
    verdict = rank[named[0]] == best and len(top) == 1 if len(named) == 2 else None
    return verdict, sentence[:1].upper() + sentence[1:]


# "List all distortions", "What distortions are there?": every one measured, not only the most visible ("Any
# defects?" and "What is the main distortion?" still get the main one).
_LIST_WORDS = re.compile(r"\b(?:list|enumerate)\b", re.I)
_PLURAL_DAMAGE = re.compile(r"\b(?:distortions|artifacts|artefacts|defects|flaws|issues|problems)\b", re.I)


def _asks_for_list(question: str) -> bool:
    if RATING_WORDS.search(question):  # "How would you rate the distortions?" asks for a rating
        return False
    return bool(_LIST_WORDS.search(question) or (WH_QUESTION.match(question) and _PLURAL_DAMAGE.search(question)))


def _measured_worst_first(analyses: dict) -> list:
    """The categories measured at slight or worse, worst severity first (then the higher level)."""
    return sorted((a for a in analyses.values() if a.severity != "none"),
                  key=lambda a: (SEVERITY_RANK[a.severity], a.level_raw), reverse=True)


def _distortion_list(analyses: dict) -> str:
    found = _measured_worst_first(analyses)
    if not found:
        return "None: no distortion measured above the clean-photo range."
    return "Distortions measured, worst first: " + ", ".join(f"{damage_name(a.detector)} ({a.severity})" for a in found) + "."


# A question setting the image against its reference, asked with one ("Which image is better?", "Is it identical to the
# reference?", "How much quality was lost compared to the reference?"). The full-reference measures find what the image
# lost against the reference, taken as the undamaged original: nothing measured means they measure the same, and they
# never find the image better.
_REFERENCE_NAMED = re.compile(r"\b(?:reference|original|pristine|undistorted)\b", re.I)
_WHICH_IMAGE = re.compile(r"\bwhich\s+(?:image|photo|picture|one|version|is)\b|\b(?:two|both)\s+(?:images|photos|pictures)\b",
                          re.I)
_AGAINST_KINDS = (
    ("same", re.compile(r"\b(?:identical|same|equal|equivalent|unchanged|indistinguishable|as good as)\b", re.I)),
    ("better", re.compile(r"\b(?:better|best|superior|higher[- ]quality|prefer\w*)\b", re.I)),
    ("worse", re.compile(r"\b(?:worse|worst|inferior|lower[- ]quality|poorer)\b", re.I)),
    ("changed", re.compile(r"\b(?:differ\w*|chang\w*|altered|modified|lost|loss|degrad\w*|compar\w*)\b", re.I)),
)
# What was lost or changed, asked of the pair without naming the reference ("What changed?", "How much was lost?").
_CHANGE_ASKED = re.compile(r"^\s*(?:what|how\s+(?:much|far))\b.*\b(?:chang\w*|lost|loss|differ\w*|altered|degraded)\b", re.I)
# Options naming one of the two images, or neither ("A. The distorted image B. The reference image C. Equal").
_EQUAL_OPTION = re.compile(r"\b(?:same|equal(?:ly)?|both|neither|identical|no difference|tie)\b", re.I)
_IMAGE_OPTION = re.compile(r"\b(?:image|photo|picture|version|one|copy|distorted|test|this|it)\b", re.I)


def _against_reference(query: str, plan: PlannerOutput) -> Optional[tuple[str, bool]]:
    """(what the question asks of the pair: "same", "better", "worse" or "changed"; whether its claim is about the
    reference: "Is the reference better than this image?") for a question comparing the image with its reference, else
    None."""
    question = question_part(query)
    if plan.reference_mode != "Full-Reference":
        return None
    # With a reference given, "What changed?" and "How much quality was lost?" ask about the pair without naming it;
    # "better", "worse" and "same" need the reference (or "which image") named, as "Is it better?" may ask another thing.
    if not (_REFERENCE_NAMED.search(query) or _WHICH_IMAGE.search(question) or _CHANGE_ASKED.search(question)):
        return None
    if _CONTENT_WH.match(question):  # "Which animal differs from the original?": content, not quality
        return None
    if (RATING_WORDS.search(question) and not YES_NO_QUESTION.match(question)
            and not _HOW_MUCH.match(question)):
        return None  # "How is the quality compared to the reference?" asks for the quality first (the rating rules)
    for kind, pattern in _AGAINST_KINDS:
        if m := pattern.search(question):
            named = _REFERENCE_NAMED.search(question)
            return kind, bool(named and named.start() < m.start())
    return None


# "What object …", "Which animal …": a wh-question about a thing in the picture, not about the picture or its quality.
_CONTENT_WH = re.compile(r"^\s*(?:what|which)\s+(?!(?:image|photo|picture|one|version|copy|quality|distortions?|"
                         r"changes?|differences?|damage|is|are|was|were|has|have|had|did|does|do|changed|differs?)\b)"
                         r"[a-z]+\s+(?:is|are|was|were|has|have|did|does|do|differs?|changed|appears?|got)\b", re.I)


def _readable_against_reference(query: str, plan: PlannerOutput) -> bool:
    """Whether a comparison with the reference is one ``_answer_against_reference`` can answer: with options, only
    Yes/No, options naming the two images (or neither), or graded amounts ("A. None B. A little C. A lot"); options
    it cannot read ("A. A dog B. A cat") make it a content question, answered with no guessed letter."""
    if _against_reference(query, plan) is None:
        return False
    texts = _option_texts(query)
    return (not texts or all(_yes_no_labels(texts)) or all(_option_side(v) for v in texts.values())
            or sum(_option_grade(v) is not None for v in texts.values()) >= 2)


def _option_side(text: str) -> Optional[str]:
    if _EQUAL_OPTION.search(text):
        return "equal"
    return "reference" if _REFERENCE_NAMED.search(text) else "image" if _IMAGE_OPTION.search(text) else None


# An amount of loss for "How much quality was lost?": slight and moderate are a little, severe and extreme a lot.
_LOSS_AMOUNTS = {"none": "None", "slight": "A little", "moderate": "A little", "severe": "A lot", "extreme": "A lot"}


def _answer_against_reference(query: str, kind: str, about_reference: bool, analyses: dict) -> Optional[str]:
    """The answer to a question comparing the image with its reference (``_against_reference``) from what the
    full-reference measures found lost, or None for options it cannot read (left to the other rules)."""
    found = _measured_worst_first(analyses)
    worst = found[0].severity if found else "none"
    lost = ", ".join(f"{damage_name(a.detector)} ({a.severity})" for a in found)
    detail = f"compared with the reference the image shows {lost}" if found else "no distortion measured against the reference"
    holds = {"same": not found, "changed": bool(found), "better": bool(found) and about_reference,
             "worse": bool(found) and not about_reference}[kind] != _negated(query)
    texts = _option_texts(query)
    if texts:
        equal = next((k for k, v in texts.items() if _EQUAL_OPTION.search(v)), None)
        if kind in ("better", "worse") and not found and equal:  # "A. Yes B. No C. Same" on an unchanged pair: C
            return equal
        yes, no = _yes_no_labels(texts)
        if yes and no:
            return yes if holds else no
        sides = {k: _option_side(v) for k, v in texts.items()}
        if kind in ("better", "worse") and all(sides.values()):
            # Something lost: the reference is the better one, the image the worse. Else the equal option, or, without
            # one, the option that does not say the image lost quality.
            if not found and "equal" not in sides.values():  # neither option is right: no letter, the measurement
                return f"They measure the same: {detail} (no option says so)."
            wanted = ["reference" if kind == "better" else "image"] if found else ["equal"]
            return next((k for side in wanted for k, v in sides.items() if v == side), None)
        graded = {k: g for k, v in texts.items() if (g := _option_grade(v)) is not None}
        if kind in ("changed", "worse") and len(graded) >= 2:  # "A. None B. A little C. A lot", in any order
            # Nearest to the worst severity; between two as near, the milder (moderate is "a little" beside "a lot").
            return min(graded, key=lambda k: (abs(SEVERITY_RANK[graded[k]] - SEVERITY_RANK[worst]),
                                              SEVERITY_RANK[graded[k]]))
        return None
    question = question_part(query)
    if YES_NO_QUESTION.match(question):
        return ("Yes — " if holds else "No — ") + detail
    if _HOW_MUCH.match(question):
        return f"{_LOSS_AMOUNTS[worst]} — {detail}"
    if kind in ("better", "worse", "same"):
        if not found:
            return f"They measure the same: {detail}."
        return (f"The reference is better: the image shows {lost} against it." if kind == "better"
                else f"The image is worse: it shows {lost} against the reference.")
    return (detail[:1].upper() + detail[1:] + ".") if found else f"Nothing measured changed: {detail}."


def _main_distortion(analyses: dict) -> str:
    worst = _ranked(analyses)[0]
    if worst.severity == "none":
        return "No distortion stands out; the image measures within the clean-photo range."
    return f"The most visible distortion is {damage_name(worst.detector)} ({worst.severity})."


# Words of a question about quality that name no distortion category. Damage words ("What is the main distortion?",
# "Any artifacts?") make any question one; the others ("What's wrong?" is a bad word) unless the planner files it as
# "Other" (aesthetics, content: "Is the composition better?").
_DAMAGE_TALK = re.compile(r"\b(?:distort\w*|artifact\w*|artefact\w*|defect\w*|damage\w*|degrad\w*|flaw\w*)", re.I)
_QUALITY_TALK = re.compile(r"\b(?:issues?|clear|clarity|resolution|fidelity|similar\w*|better|worse|best|worst|fair|"
                           r"how\b.*\blooks?)\b", re.I)


_WHAT_COLOUR = re.compile(r"^\s*(?:what|which)\s+colou?rs?\s+(?:is|are|was|were|does|do|did)\b", re.I)


def asks_about_quality(query: str, plan: PlannerOutput) -> bool:
    """Whether a question asks about the image's quality or distortions, all the offline analyst measures: one naming
    a distortion (in its words or options), a tool, a rating or quality word ("Rate this photo", "How is the
    quality?"), damage ("the main distortion") or, with a reference, what changed against it ("Is it identical to the
    reference?") does; else one the planner files as "Other" (aesthetics, content) does not, and another does when it
    has a good or bad word ("Is it OK?", "What's wrong?", options "Good / Poor") or asks how the image looks. "What animal is in the picture?" does not: the offline analyst cannot answer it."""
    if _WHAT_COLOUR.match(query):  # "What colour is the car?" names the colour of a thing, not colour damage
        return False
    if (plan.distortions or plan.required_tool or named_distortions(query) or RATING_WORDS.search(query)
            or _DAMAGE_TALK.search(query) or _readable_against_reference(query, plan)):
        return True
    if plan.query_type == "Other":
        return False
    return bool(_GOOD_WORDS.search(query) or _BAD_WORDS.search(query) or _QUALITY_TALK.search(query))


def damage_name(detector: str) -> str:
    """What a detector found, as a noun phrase for a sentence: "pixelation", "JPEG blocking", "impulse noise" (its
    explanation label without the parenthesis). The category's name ("Blurs", "Compression") is not the damage:
    "the most visible distortion is blurs" read wrongly, and named blur for a pixelation."""
    from agentic_iqa.offline import severity

    det = next((d for d in severity.DETECTORS if d.name == detector), None)
    return " ".join(re.sub(r"\([^)]*\)", " ", det.label).split()) if det else detector


# How much of a distortion an option claims ("Slightly noisy", "Very blurry", "Not noisy"); an option that names no
# distortion but a good word ("Good", "Normal", "None") claims its absence. "low" and "high" are not grades: "Low
# contrast" names a contrast loss, "high" a quality.
_OPTION_GRADES = (
    ("none", re.compile(r"\b(?:not|no|none|nothing|free of|without|normal|good|fine|correct|proper|natural|adequate|"
                        r"acceptable|ok(?:ay)?|well|clean|just right|neither)\b", re.I)),
    ("extreme", re.compile(r"\b(?:extreme(?:ly)?|complete(?:ly)?|total(?:ly)?|unusabl[ey])\b", re.I)),
    ("severe", re.compile(r"\b(?:very|severe(?:ly)?|heav(?:y|ily)|strong(?:ly)?|serious(?:ly)?|significant(?:ly)?|"
                          r"bad(?:ly)?|major|a lot)\b", re.I)),
    ("moderate", re.compile(r"\b(?:moderate(?:ly)?|noticeabl[ey]|fairly|quite|medium|average|clearly)\b", re.I)),
    ("slight", re.compile(r"\b(?:slight(?:ly)?|mild(?:ly)?|a (?:little|bit)|minor|barely|faint(?:ly)?|somewhat)\b", re.I)),
)
_GRADE_LEVEL = {"none": 0.0, "slight": 1.5, "moderate": 3.0, "severe": 4.0, "extreme": 5.0}  # mid-points of the severity bands


def _option_grade(text: str) -> Optional[str]:
    if asks_sharpness(text):  # "Sharp", "Very sharp", "In focus": no blur
        return "none"
    return next((grade for grade, pattern in _OPTION_GRADES if pattern.search(text)), None)


def _best_distortion_option(texts: dict, by_category: dict, graded: dict, asked: list, analyses: dict,
                            weaker: bool = False) -> str:
    """The option whose claim the measurements fit best. An option names distortions (else the question's, or for a
    bare "None" / "Good" every distortion the other options name) and claims a grade of them ("Slightly noisy") or,
    without one, that they are present; its measured level and severity are those of the detectors its own words
    mean ("Too dark": under-exposure). A present distortion's option beats a claim of absence, the stronger measured
    one wins among them (the milder one when the question asks for it: "Which is less visible?"), and a graded option
    wins by how close its grade is to the measured severity."""
    named_anywhere = [c for cats in by_category.values() for c in cats]
    # On a graded scale ("Sharp / Blurry / Very blurry") the plain option is the middle grade, not any presence.
    scale = any(g not in (None, "none") for g in graded.values())
    graded = {k: ("moderate" if g is None and scale else g) for k, g in graded.items()}

    def measured(key: str) -> tuple[float, str]:
        bare_none = not by_category[key] and graded[key] == "none"
        cats = by_category[key] or (asked if graded[key] not in (None, "none") else asked or named_anywhere)
        if bare_none:  # a bare "None" claims no damage at all: one the options do not name counts once it is clear
            cats = list(cats) + [c for c, a in analyses.items() if SEVERITY_RANK[a.severity] >= SEVERITY_RANK["moderate"]]
        found = []
        for c in dict.fromkeys(cats):
            if c not in analyses:
                continue
            a, meant = analyses[c], asked_detectors(c, texts[key])
            d = strongest(a, meant[0]) if meant else None
            found.append((a.detectors.get(d, 0.0), a.severity_of(d)) if d else (a.level, a.severity))
        return max(found, default=(0.0, "none"))

    def fit(key: str) -> tuple[int, float]:
        level, severity = measured(key)
        if graded[key] is None:  # claims presence: right when present, then the stronger the better
            return (0, level) if weaker else ((0 if severity != "none" else 1), -level)
        return abs(SEVERITY_RANK[severity] - SEVERITY_RANK[graded[key]]), abs(level - _GRADE_LEVEL[graded[key]])

    return min(texts, key=fit)


# Good and bad words: a yes/no question about the quality itself is answered from the level (True: Yes means good); a
# question about a distortion asked with a good word ("Is the contrast good?") means its absence.
_GOOD_WORDS = re.compile(r"\b(?:above[- ]average|better than average|good|fine|ok(?:ay)?|acceptable|decent|excellent|"
                         r"high[- ]quality|usable|suitable|clean|clear|great|correct(?:ly)?|proper(?:ly)?|natural|"
                         r"accurate|enough|free|"
                         r"well[- ](?:exposed|lit|balanced|focused))\b", re.I)
_BAD_WORDS = re.compile(r"\b(?:below[- ]average|worse than average|bad|poor|low[- ]quality|degraded|distorted|damaged|"
                        r"corrupt\w*|defective|flawed|impaired|wrong|problems?)\b", re.I)


def _good(fused_level: str) -> bool:
    return LEVEL_SCORES[fused_level] >= LEVEL_SCORES["B"]  # Excellent or Good


def _quality_polarity(query: str) -> Optional[bool]:
    """True when the question is asked with a good word only, False with a bad word only, else None."""
    question = question_part(query)
    good, bad = bool(_GOOD_WORDS.search(question)), bool(_BAD_WORDS.search(question))
    return None if good == bad else good


# What a question about a category asks, detector by detector: "Is it too bright?" asks about over-exposure, not
# about "Brightness change", which an under-exposure fills too. (category, words, detectors, name): a question
# matching none of its category's words asks about the category's entry without words, or, without one, the whole
# category. "blurry" and "sharp" ask about blur (a motion blur is a blur too), not about pixelation, which the spec
# files under Blurs.
_MEANINGS: tuple[tuple[str, Optional[re.Pattern], tuple[str, ...], str], ...] = tuple(
    (category, re.compile(words, re.I) if words else None, detectors, name) for category, words, detectors, name in (
        ("Blurs", r"\bpixelat", ("pixelate",), "pixelation"),
        ("Blurs", r"\b(?:motion|camera[- ]shake|shak(?:e|en|y|ing)|moving|movement)\b", ("motion",), "motion blur"),
        ("Blurs", None, ("blur", "motion"), "blur"),
        # "bright enough?" and "enough light?" ask whether it is too dark (an over-exposed photo is bright enough).
        ("Brightness change", r"\b(?:dark\w*|dim\w*|under-?expos\w*|bright\w*\s+enough|enough\s+(?:light|brightness)|"
                              r"under-?lit|(?:poorly|dimly)[- ]lit|low[- ]light)\b", ("dark",), "under-exposure"),
        ("Brightness change", r"\b(?:bright(?!ness)(?!\w*\s+enough)\w*|over-?expos\w*|over-?lit|blown|clipped|burn(?:ed|t)[- ]out)",
         ("bright",), "over-exposure"),
        ("Color distortions", r"\bover-?saturat|\btoo (?:vivid|saturated|colou?rful)|\bgarish", ("oversaturated",), "over-saturation"),
        ("Color distortions", r"\b(?:de-?saturat\w*|under-?saturat\w*|washed[- ]out|faded|dull|muted)", ("desaturated",),
         "colour loss"),
        ("Color distortions", r"\b(?:banding|posteri[sz]\w*|quanti[sz]\w*)", ("quantized",), "colour banding"),
        ("Noise", r"\b(?:salt[- ]and[- ]pepper|impulse|specks?)", ("impulse", "gray_impulse"), "impulse noise"),
        ("Noise", r"\b(?:colou?r(?:ed)? noise|chroma\w*)", ("chroma_noise",), "colour noise"),
        ("Compression", r"\b(?:jpe?g ?2000|j2k|wavelet)", ("j2k",), "wavelet-compression smearing"),
        ("Compression", r"\b(?:jpe?g(?! ?2000)|block\w*)", ("jpeg",), "JPEG blocking"),
    ))


def asked_detectors(category: str, query: str) -> Optional[tuple[tuple[str, ...], str]]:
    """The detectors of `category` a question means and what to call them, or None for the whole category."""
    question = question_part(query)
    entries = [e for e in _MEANINGS if e[0] == category]
    named = [e for e in entries if e[1] is not None and e[1].search(question)]
    chosen = named or [e for e in entries if e[1] is None]
    if not chosen:
        return None
    return tuple(d for e in chosen for d in e[2]), " or ".join(e[3] for e in chosen)


def strongest(analysis, detectors: Sequence[str]) -> str:
    """The detector among `detectors` that measured the most in this category's analysis."""
    return max(detectors, key=lambda d: analysis.detectors.get(d, 0.0))


def _severity(analyses: dict, category: str, query: str) -> str:
    """A category's severity as the question means it: its asked detectors' strongest verdict ("blurry" is the blur
    detectors' alone, "too bright" the over-exposure one's), else the category's."""
    a, meant = analyses[category], asked_detectors(category, query)
    if not meant:
        return a.severity
    found = strongest(a, meant[0])
    others = [level for d, level in a.detectors.items() if d not in meant[0]]
    if meant[0] == ("motion",) and a.detectors.get(found, 0.0) <= max(others, default=0.0):
        return "none"  # "Is it motion blur?": a strong plain blur (or pixelation) also reads a little as motion
    return a.severity_of(found)


def _name(category: str, query: str) -> str:
    """What a yes/no answer calls the damage asked about: the asked detector's name, else the category's in the
    answers' British spelling ("Color distortions" is the spec's key, "colour banding" the detector's words)."""
    meant = asked_detectors(category, query)
    return meant[1] if meant else category.replace("Color", "Colour")
