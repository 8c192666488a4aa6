"""The Planner's decision made by rules from the query text (DESIGN §3), without a language model.

Used by the offline analyst as its Planner, as the fallback when the VLM planner gives no valid plan,
and as the reference the planner fixtures and metrics are checked against.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from signatures.models import (
    GLOBAL,
    PlanControlFlags,
    PlannerDecision,
    PlannerOutput,
    normalize_category,
)

# Words that name a distortion (or a quality attribute tied to one) -> spec category.
# Words for blur and for its opposite, sharpness: both are asked of the blur evidence (`asks_sharpness` tells them apart).
_BLUR_TERMS = r"blur\w*|out[- ]of[- ]focus|defocus\w*|motion[- ]blur|smear\w*|fuzzy|soft(?:ness)?|unsharp"
_SHARP_TERMS = r"(?<!over-)(?<!over)sharp(?:ness|ly|er|est)?|crisp\w*|in[- ]focus"

_DISTORTION_WORDS: list[tuple[str, str]] = [
    # Sharpness is the opposite of blur: "is it sharp / crisp / in focus?" is asked of the blur evidence;
    # only over-sharpening (sharpened, halos) is the spec's "Sharpness" distortion.
    (rf"{_BLUR_TERMS}|{_SHARP_TERMS}|focus(?:ed|ing)?|detail\w*|pixelat\w*", "Blurs"),  # pixelation: the Blurs category's pixelate detector
    (r"nois\w*|grain\w*|speckle\w*|salt[- ]and[- ]pepper", "Noise"),
    (r"jpe?g\w*|compress\w*|block\w*|artifact\w*|artefact\w*|mosquito", "Compression"),
    (r"bright\w*|dark\w*|(?:over-?|under-?)?expos(?:ed|ure)|dim|illuminat\w*|lighting|(?:well|under|over|poorly|dimly)[- ]?lit|"
     r"enough light|low[- ]light|blown(?:[- ]out)?|clipped|burn(?:ed|t)[- ]out", "Brightness change"),
    (r"contrast\w*|washed[- ]out|flat", "Contrast"),
    # Banding is colour quantization: the Color distortions category's "quantized" detector. White balance, like a
    # cast or tint, is the whole image's colour.
    (r"colou?r\w*|saturat\w*|desaturat\w*|hue|tint\w*|cast|white[- ]balance|banding|posteri[sz]\w*|quanti[sz]\w*",
     "Color distortions"),
    (r"over-?sharp\w*|sharpen\w*|halo\w*", "Sharpness"),
]

# Aesthetic / semantic questions the paper routes to "Other" (no distortion tools apply).
_OTHER_WORDS = re.compile(
    r"\b(aesthetic\w*|beaut\w*|pretty|cute|lovely|funny|happy|sad|emotion\w*|feel\w*|mood|style|artistic|composition|"
    r"creative|interesting|memorable|appeal\w*|what (?:is|are) (?:in|shown)|describe the scene|"
    r"how many|who|caption)\b",
    re.I,
)

# A rating request or a question about the quality itself ("Rate this photo", "How is the quality?").
RATING_WORDS = re.compile(r"\b(rate|rating|score|grade|assess|evaluate|quality|how good|how bad)\b", re.I)
# A question that asks yes or no ("Is it…?", "Would you…?", "Isn't it…?"), and one that asks which, what, where, why
# or how ("How good…?" and "How bad…?" ask for a rating, so they are not here).
YES_NO_QUESTION = re.compile(r"^\s*(?:(?:is|are|was|were|does|do|did|has|have|had|can|could|will|would|should)\b|"
                             r"(?:isn|aren|wasn|weren|doesn|don|didn|hasn|haven|hadn|can|couldn|won|wouldn|shouldn)['’]t\b)",
                             re.I)
WH_QUESTION = re.compile(r"^\s*(?:which|what|where|why|how (?!good|bad))\b", re.I)

# Nouns that mean "the picture itself", not a region of it.
_NOT_REGIONS = {
    "image", "photo", "photograph", "picture", "pic", "shot", "frame", "quality", "overall", "whole",
    "entire", "scene", "result", "output", "distortion", "distortions", "main", "most", "level",
    "following", "options", "reference", "original", "tool", "metric", "score", "answer", "question",
    "best", "worst", "one", "image's", "photo's", "it",
    "highlights", "shadows", "tones", "midtones",  # tonal ranges: the exposure measures cover them whole
} | {w for pat, _ in _DISTORTION_WORDS for w in re.findall(r"[a-z]+", pat)}

_REGION = re.compile(r"\b(?:the|this|that|his|her|their|its|my|our)\s+([a-z][a-z\-]*)(?:'s\s+([a-z][a-z\-]*))?", re.I)
# Words right after a determiner that are not objects (verbs, prepositions, adverbs, position words; quality and
# colour adjectives are in _ADJECTIVES, which may start a region: "the white car").
_NOT_OBJECTS = {
    "is", "are", "a", "an", "any", "this", "that", "there", "with", "look", "looks", "same", "very", "more",
    "less", "left", "right", "top", "bottom", "first", "second", "other", "given", "above", "below", "way",
    "visual", "perceived", "perceptual", "general", "technical", "amount", "degree", "severity", "level",
    "on", "in", "at", "to", "for", "of", "as", "by", "from", "into", "onto", "online",  # "post this on Instagram"
    "enough",  # "Is this good enough to print?"
}
# Adjectives after a determiner: not objects themselves ("Is this good enough?"), but the noun after one is, with it
# ("the white car").
_ADJECTIVES = {
    "good", "bad", "fine", "ok", "okay", "great", "nice", "decent", "acceptable", "usable", "suitable", "poor",
    "excellent", "clean", "clear", "high", "low", "big", "small", "large", "old", "new",
    "white", "black", "grey", "gray", "red", "green", "blue", "yellow", "orange", "purple", "pink", "brown",
}
_NEXT_WORD = re.compile(r"\s+([a-z][a-z\-]*)", re.I)
# Nouns for the picture: the word before one describes the picture ("the distorted image", "this old photo").
_PICTURE_NOUNS = re.compile(r"\s+(?:image|photo|photograph|picture|pic|shot|frame|version|one|copy)\b", re.I)
# Option labels as people write them: "A. Yes", "A) Yes", "(A) Yes", "[A] Yes", "A: Yes", one per line or inline, in
# capitals, small letters ("a. yes b. no") or numbers ("1. Yes 2. No", "(1) sharp (2) blurry"). Small letters and
# numbers need a space after the label ("1.5 stops" is no option).
_LABEL_KINDS = ("ABCDEF", "abcdef", "123456")
_MCQ_OPTIONS = tuple(
    re.compile(rf"(?:^|\s)[(\[]?([{kind}])(?:[.):\]]|\]:?)\s{'*' if kind.isupper() else '+'}([^\n]+?)"
               rf"(?=\s+[(\[]?[{kind}](?:[.):\]]|\]:?)\s|$)", re.S | re.M)
    for kind in _LABEL_KINDS)


def _option_matches(query: str) -> list[re.Match]:
    """The options' matches: at least two capitals (the spec's MCQs), else small letters or numbers that run in
    order from "a" or "1" (so that "a." or "2." in a sentence is not read as a label); else none."""
    for kind, pattern in zip(_LABEL_KINDS, _MCQ_OPTIONS):
        found = list(pattern.finditer(query))
        labels = [m.group(1) for m in found]
        if len(found) >= 2 and (labels == list(kind[: len(found)]) or kind.isupper()):
            return found
    return []


def mcq_options(query: str) -> dict[str, str]:
    """{'A': 'Yes', 'B': 'No'} for 'Is it blurry? A. Yes B. No' ({'1': 'Yes', '2': 'No'} for '1. Yes 2. No');
    {} when the query has no options."""
    return {m.group(1): m.group(2).strip().rstrip(",;") for m in _option_matches(query)}


def question_part(query: str) -> str:
    """The question without its options."""
    opts = _option_matches(query)
    return query[: opts[0].start()] if opts else query


def named_distortions(text: str, in_text_order: bool = False) -> list[str]:
    """Spec categories the text names, in the vocabulary's order, or in the order the text names them first
    ("Is the noise worse than the blur?" -> Noise, Blurs)."""
    first: dict[str, int] = {}
    for pattern, category in _DISTORTION_WORDS:
        m = re.search(rf"\b(?:{pattern})\b", text, re.I)
        if m and category not in first:
            first[category] = m.start()
    return sorted(first, key=first.get) if in_text_order else list(first)


def distortion_mentions(text: str) -> list[tuple[str, re.Match]]:
    """Every word of the text naming a distortion, with its category, in text order."""
    found = [(category, m) for pattern, category in _DISTORTION_WORDS for m in re.finditer(rf"\b(?:{pattern})\b", text, re.I)]
    return sorted(found, key=lambda f: f[1].start())


def _is_distortion_word(word: str) -> bool:
    return any(re.fullmatch(pattern, word, re.I) for pattern, _ in _DISTORTION_WORDS)


# Position words, and the words for a part of the frame they qualify ("the bottom half", "the top-left corner").
_POSITION_WORDS = r"top|bottom|upper|lower|left|right|left-hand|right-hand|centre|center|middle|far"
_PART_NOUNS = r"half|part|side|corner|edge|third|quarter|area|region|portion|section|border"
# A location phrase that belongs to the object before it: "the tree [in the center]", "the boat [on the left]",
# "the sign [in the top left corner]".
_LOCATION = re.compile(
    r"\s+((?:in|on|at|near|behind|under|above|below|beside|by|along)\s+(?:the|this|that)\s+"
    rf"((?:(?:{_POSITION_WORDS})[- ])+(?:{_PART_NOUNS})\b|[a-z][a-z\-]*))", re.I)


def _object_word(word: str, excluded: set) -> bool:
    return not (word in excluded or word in _NOT_REGIONS or word in _NOT_OBJECTS or word in _ADJECTIVES
                or _OTHER_WORDS.fullmatch(word) or _is_distortion_word(word) or word.endswith("ly"))


# A part of the frame: "the bottom half", "the top-left corner", "the left side" ("bottom", "left" alone are not
# objects: "on the left" places the object before it).
_PART = re.compile(rf"(?:the|this|that|its)\s+((?:(?:{_POSITION_WORDS})[- ])+(?:{_PART_NOUNS}))\b", re.I)


# Two parts of the frame in one phrase: "the top and bottom halves", "the left or the right side", and a
# question choosing between two: "Which half is blurrier, the top or the bottom?".
_PLURAL_PART_NOUNS = {"halves": "half", "sides": "side", "parts": "part", "corners": "corner", "edges": "edge",
                      "thirds": "third", "quarters": "quarter", "areas": "area", "regions": "region",
                      "portions": "portion", "sections": "section", "borders": "border"}
_POSITIONS = rf"(?:(?:{_POSITION_WORDS})[- ])*(?:{_POSITION_WORDS})"
_TWO_PARTS = re.compile(
    rf"\b(?:the|both(?:\s+the)?)\s+({_POSITIONS})\s+(?:and|or)\s+(?:the\s+)?({_POSITIONS})\s+"
    rf"({'|'.join(_PLURAL_PART_NOUNS)}|{_PART_NOUNS})\b", re.I)
_WHICH_PART = re.compile(
    rf"\bwhich\s+({_PART_NOUNS})\b.*?\bthe\s+({_POSITIONS})(?:\s+(?:one|{_PART_NOUNS}))?\s*,?\s+or\s+"
    rf"(?:the\s+)?({_POSITIONS})\b", re.I | re.S)


def _paired_parts(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """Parts of the frame named two at a time, as single parts ((where, "top half"), (where, "bottom half")), and
    the spans they take."""
    found, spans = [], []
    for m in _TWO_PARTS.finditer(text):
        noun = _PLURAL_PART_NOUNS.get(m.group(3).lower(), m.group(3).lower())
        found += [(m.start(1), f"{m.group(1).lower()} {noun}"), (m.start(2), f"{m.group(2).lower()} {noun}")]
        spans.append(m.span())
    for m in _WHICH_PART.finditer(text):
        noun = m.group(1).lower()
        found += [(m.start(2), f"{m.group(2).lower()} {noun}"), (m.start(3), f"{m.group(3).lower()} {noun}")]
        spans.append(m.span())
    return found, spans


def named_regions(text: str, exclude: Iterable[str] = ()) -> list[str]:
    """Objects/regions the query is about, each as a whole phrase: 'Is the sky blurry?' -> ['sky'];
    'the man's face' -> ['face']; 'the tree in the center' -> ['tree in the center'] (one object);
    'Is the bottom half blurry?' -> ['bottom half'] (a part of the frame); 'the top and bottom halves' and 'Which
    half is blurrier, the top or the bottom?' -> ['top half', 'bottom half']."""
    found, spans = _paired_parts(text)  # (where in the text, phrase): the regions are listed in the text's order
    excluded = {e.lower() for e in exclude}
    taken = 0  # end of the last phrase: a location phrase's own noun is not a second object
    for m in _REGION.finditer(text):
        if m.start() < taken or any(a <= m.start() < b for a, b in spans):
            continue
        part = _PART.match(text, m.start())
        if part:
            phrase, taken = " ".join(part.group(1).lower().split()), part.end()
            found.append((m.start(), phrase))
            continue
        if any(at < m.start() for at, _ in found) and re.search(r"\bof\s*$", text[: m.start()], re.I):
            continue  # "the face of the man": the region is the face (but "the quality of the sky": the sky)
        word, end, adjective = (m.group(2) or m.group(1)).lower(), m.end(), ""
        if not m.group(2) and word in _ADJECTIVES and not _PICTURE_NOUNS.match(text, end):
            noun = _NEXT_WORD.match(text, end)
            if noun is None:
                continue
            adjective, word, end = word + " ", noun.group(1).lower(), noun.end()
        if not _object_word(word, excluded) or (not m.group(2) and _PICTURE_NOUNS.match(text, end)):
            continue
        phrase, taken = adjective + word, end
        loc = _LOCATION.match(text, end)
        if loc and loc.group(2).lower() not in _NOT_REGIONS:
            phrase, taken = f"{phrase} {' '.join(loc.group(1).lower().split())}", loc.end()
        found.append((m.start(), phrase))
    return list(dict.fromkeys(phrase for _, phrase in sorted(found, key=lambda f: f[0])))


@dataclass(frozen=True)
class FramePart:
    """A part of the frame as fractions of its height (rows ``top``..``bottom``) and width (columns
    ``left``..``right``), how an answer names it ("bottom half": "the bottom half of the frame") and the object the
    question places there, if any ("boat" in "the boat on the left")."""
    top: float
    left: float
    bottom: float
    right: float
    name: str
    subject: Optional[str] = None

    def slices(self, height: int, width: int) -> tuple[slice, slice]:
        """The rows and columns of this part in a ``height`` x ``width`` image."""
        return (slice(round(self.top * height), round(self.bottom * height)),
                slice(round(self.left * width), round(self.right * width)))


# How far a part reaches from its side of the frame (a fraction of the height or width).
_PART_EXTENT = {"third": 1 / 3, "quarter": 0.25, "corner": 1 / 3, "edge": 0.25, "border": 0.25}
# Location words that place an object in the frame ("on the left"); others ("behind the house") do not.
_PLACING = re.compile(r"\b(?:in|on|at|near|along)\s+(?:the|this|that)\s+(.+)$", re.I)


def frame_part(region: str) -> Optional[FramePart]:
    """Where in the frame a region of ``named_regions`` lies, when its words say so: 'bottom half', 'top-left
    corner', 'left third', 'boat on the left' (the left half: the object itself cannot be found without a model),
    'tree in the center' (the middle half of each side); None for an object alone ('sky') or a place that is not a
    part of the frame ('tree near the house')."""
    words, subject = region.lower(), None
    placed = _PLACING.search(words)
    if placed:
        words, subject = placed.group(1), words[: placed.start()].strip() or None
    tokens = [t for t in re.split(r"[\s-]+", words) if t and t != "hand"]
    noun = tokens[-1] if tokens and re.fullmatch(_PART_NOUNS, tokens[-1]) else None
    position = tokens[:-1] if noun else tokens
    if not position or not all(re.fullmatch(_POSITION_WORDS, t) for t in position):
        return None
    said = set(position)
    rows = "top" if said & {"top", "upper"} else "bottom" if said & {"bottom", "lower"} else None
    cols = "left" if "left" in said else "right" if "right" in said else None
    centred = bool(said & {"centre", "center", "middle"})
    if (rows is None and cols is None and not centred) or (noun == "corner" and (rows is None or cols is None)):
        return None  # "the far side", "the left corner": no one part of the frame
    extent = _PART_EXTENT.get(noun, 0.5)
    if noun == "quarter" and rows and cols:
        extent = 0.5  # "the top-left quarter": a quadrant
    if "far" in position:
        extent /= 2  # "the far left": the outer part of that side

    def span(side: Optional[str], start: str) -> tuple[float, float]:
        if side is not None:
            return (0.0, extent) if side == start else (1.0 - extent, 1.0)
        return (0.5 - extent / 2, 0.5 + extent / 2) if centred else (0.0, 1.0)  # "the top center": the middle

    (top, bottom), (left, right) = span(rows, "top"), span(cols, "left")
    return FramePart(top, left, bottom, right, " ".join(words.split()), subject)


def place_words(part_name: str) -> list[str]:
    """The words of a part's name that say where it lies ('top-left corner' -> ['top', 'left']), which an answer
    option naming that part must say ("A. The top left"); 'far' says how far it reaches, not where."""
    return [t for t in re.split(r"[\s-]+", part_name.lower()) if re.fullmatch(_POSITION_WORDS, t) and t != "far"]


_SHARP_WORDS = re.compile(rf"\b(?:{_SHARP_TERMS})\b", re.I)
_BLUR_WORDS = re.compile(rf"\b(?:{_BLUR_TERMS})\b", re.I)


def asks_sharpness(query: str) -> bool:
    """True when the question asks whether the image is sharp (answered as "not blurred"), not whether
    it is blurry or over-sharpened: 'Is the image sharp?', 'Is the face in focus?'."""
    question = question_part(query)
    return bool(_SHARP_WORDS.search(question)) and not _BLUR_WORDS.search(question)


def named_tools(text: str, tool_names: Iterable[str]) -> list[str]:
    """Registry tool names that appear in the query as words ('use TOPIQ_FR', 'with psnr')."""
    norm = lambda s: re.sub(r"[\W_]+", "", s).lower()  # noqa: E731
    words = {norm(w) for w in re.findall(r"[A-Za-z0-9][\w\-]*", text)}
    return [t for t in tool_names if norm(t) in words]


def rule_decision(query: str, tool_names: Iterable[str] = ()) -> PlannerDecision:
    """DESIGN §3's planner, applied to the words of the query."""
    tool_names = list(tool_names)
    question = question_part(query)
    options = mcq_options(query)
    distortions = named_distortions(question) + [
        c for text in options.values() for c in named_distortions(text)
    ]
    distortions = list(dict.fromkeys(distortions))
    tools = named_tools(query, tool_names)
    regions = named_regions(question, exclude=[t.lower() for t in tool_names])
    is_other = bool(_OTHER_WORDS.search(question)) and not distortions and not tools
    query_type = "Other" if is_other else "IQA"
    scope = regions or [GLOBAL]
    source = "Explicit" if distortions else "Inferred"
    flags = PlanControlFlags.from_rules(
        query_type=query_type, distortion_source=source, region_named=bool(regions), tool_named=bool(tools)
    )
    return PlannerDecision(
        query_type=query_type,
        query_scope=scope,
        distortion_source=source,
        distortions={obj: [normalize_category(d) for d in distortions] for obj in scope} if distortions else None,
        required_tool=tools or None,
        plan=flags,
    )


def rule_plan(
    query: str, *, has_reference: bool, tool_names: Iterable[str] = (), context: Optional[dict] = None
) -> PlannerOutput:
    return PlannerOutput.from_decision(
        rule_decision(query, tool_names), has_reference=has_reference, context=context
    )
