"""Fixture files: labelled examples, one JSONL file per compilable module (format in fixtures/README.md).

A fixture line holds a module's inputs and the answer it should give, spelled as the module's
signature spells its output fields, so the same line serves three purposes: a validation example
for the metric, a labelled few-shot demo (LabeledFewShot copies it into the prompt), and a training
example for the optimizers. Image paths are relative to the JSONL file.

Loading validates every line (unknown keys, bad labels, missing images) and reports all problems
with their line numbers at once, so a hand-edited file can be fixed in one pass.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from agentic_iqa.agents.modules import AGENT_MODULES
# The pipeline's default pixel limit (max_image_pixels): a fixture image is sent to the model like any other.
from iqa_tools.images import DEFAULT_MAX_PIXELS
from signatures.models import (
    DISTORTION_CATEGORIES,
    SEVERITIES,
    DistortionAnalysisMap,
    DistortionSet,
    ExecutorOutput,
    PlannerDecision,
    QualityLevel,
    ToolAssignment,
    normalize_reference_mode,
)

#: Where the shipped fixtures live.
FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures"
#: One file per module, named after the module (`agentic-iqa compile --module`).
FIXTURE_FILES = {name: spec.fixtures for name, spec in AGENT_MODULES.items()}
CATALOG_FILE = "tool_catalog.json"
#: A fixture file is read whole and every line becomes an example (and a validation line an LM call): the
#: shipped files are ~100 KB; 16 MiB is ~10,000 lines, far more than few-shot compiling can use.
MAX_FIXTURE_BYTES = 16 * 1024 * 1024

ReferenceModeName = Literal["Full-Reference", "No-Reference"]


class FixtureError(ValueError):
    """A fixture file cannot be used; the message lists every bad line."""


# ── line formats ────────────────────────────────────────────────────────────────────────────────


class _Line(BaseModel):
    """Keys every fixture line may carry."""

    # extra="forbid": a misspelt key ("distortion_sets") would otherwise be silently ignored and the
    # line would train on a default instead of the intended label.
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    split: Literal["train", "val"] = "train"
    source: Optional[str] = None          # where the line came from: paper, synthetic:…, recorded:…
    label_source: Optional[str] = None    # who decided the label: rules, synthetic, recorded, user
    notes: Optional[str] = None
    meta: dict[str, Any] = {}             # free-form facts (distortion type, level, reference image…)


class PlannerLine(_Line):
    query: str = Field(min_length=1)
    image: str
    has_reference: bool = False
    replan_reason: Optional[str] = None
    planner_output: PlannerDecision

    @model_validator(mode="before")
    @classmethod
    def _paper_reference_mode(cls, data: Any) -> Any:
        # The paper's figures put reference_mode inside the plan ("No-reference"); code decides it from
        # whether a reference is given, so a line may carry it only if it agrees with has_reference.
        if isinstance(data, dict) and isinstance(data.get("planner_output"), dict):
            mode = data["planner_output"].get("reference_mode")
            if mode is not None:
                full = normalize_reference_mode(mode) == "Full-Reference"
                if full != bool(data.get("has_reference", False)):
                    raise ValueError(f"planner_output.reference_mode {mode!r} contradicts has_reference")
        return data


class DetectLine(_Line):
    image: str
    query: str = Field(min_length=1)
    query_scope: list[str] = ["Global"]
    distortion_set: DistortionSet


class AnalyzeLine(_Line):
    image: str
    query: str = Field(min_length=1)
    distortion_set: DistortionSet
    distortion_analysis: DistortionAnalysisMap

    @model_validator(mode="after")
    def _covers_the_set(self) -> "AnalyzeLine":
        # The label must analyse exactly the listed types (the analyzer's own validator demands it).
        want = {(o, t) for o, ts in self.distortion_set.root.items() for t in ts}
        have = {(o, a.type) for o, items in self.distortion_analysis.root.items() for a in items}
        if want != have:
            raise ValueError(
                f"distortion_analysis must cover exactly the distortion_set; missing {sorted(want - have)}, "
                f"extra {sorted(have - want)}"
            )
        return self


class SelectLine(_Line):
    reference_mode: ReferenceModeName
    distortion_set: DistortionSet
    selected_tools: ToolAssignment
    acceptable: dict[str, dict[str, list[str]]]
    tool_description: Optional[str] = None  # default: the catalog's description for reference_mode

    @field_validator("reference_mode", mode="before")
    @classmethod
    def _mode(cls, v: Any) -> Any:
        return normalize_reference_mode(v)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "SelectLine":
        known = (info.context or {}).get("known_tools") if isinstance(info.context, dict) else None
        if known is not None:
            unknown = sorted({t for by in self.acceptable.values() for ts in by.values() for t in ts} - set(known))
            if unknown:
                raise ValueError(f"acceptable names unknown tools {unknown}")
        for obj, types in self.distortion_set.root.items():
            for dist in types:
                tools = self.acceptable.get(obj, {}).get(dist)
                if not tools:
                    raise ValueError(f"acceptable has no tools for {obj!r} / {dist!r}")
                chosen = self.selected_tools.root.get(obj, {}).get(dist)
                if chosen not in tools:
                    raise ValueError(f"selected_tools[{obj!r}][{dist!r}] = {chosen!r} is not among acceptable {tools}")
        return self


class SummarizeLine(_Line):
    mode: Literal["explain", "score"]
    image: str
    query: str = Field(min_length=1)
    evidence: Optional[ExecutorOutput] = None  # None: the Executor found nothing (the prompt says so)
    final_answer: Optional[str] = None  # explain mode: the option letter, or a short answer
    level: Optional[QualityLevel] = None  # score mode: A (excellent) … E (bad)
    quality_reasoning: str = Field(min_length=1)
    need_replan: bool = False
    replan_reason: Optional[str] = None

    @model_validator(mode="after")
    def _mode_label(self) -> "SummarizeLine":
        if self.mode == "explain" and not (self.final_answer and self.final_answer.strip()):
            raise ValueError("explain lines need final_answer")
        if self.mode == "score" and self.level is None:
            raise ValueError("score lines need level (A-E)")
        if self.need_replan and not self.replan_reason:
            raise ValueError("need_replan lines need replan_reason")
        return self


LINE_MODELS: dict[str, type[_Line]] = {
    "planner": PlannerLine,
    "detect": DetectLine,
    "analyze": AnalyzeLine,
    "select": SelectLine,
    "summarize": SummarizeLine,
}
AnyLine = Union[PlannerLine, DetectLine, AnalyzeLine, SelectLine, SummarizeLine]


# ── the tool catalog ────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ToolCatalog:
    """The tool table as the selection fixtures were labelled against (tool_catalog.json).

    Frozen in the fixture folder rather than read from the live registry: labels ("QAlign is right
    for blur") must not change meaning when a machine lacks some weights or a user adds tools.
    """

    modes: dict[str, str]                  # tool name -> "FR" | "NR"
    strengths: dict[str, list[str]]        # tool name -> categories it is known to be good at
    descriptions: dict[str, str]           # reference mode -> tool_description text for the selector

    @property
    def names(self) -> list[str]:
        return list(self.modes)

    @classmethod
    def load(cls, path: str | Path) -> "ToolCatalog":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(modes=data["modes"], strengths=data["strengths"], descriptions=data["descriptions"])
        except FileNotFoundError:
            raise FixtureError(f"tool catalog {path} does not exist") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FixtureError(f"tool catalog {path} is not valid ({type(exc).__name__}: {exc})") from None


def default_catalog() -> ToolCatalog:
    return ToolCatalog.load(FIXTURE_DIR / CATALOG_FILE)


# ── files ───────────────────────────────────────────────────────────────────────────────────────


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class FixtureFile:
    """One loaded fixture file: its validated lines and what identifies its content."""

    module: str
    path: Path
    lines: list[AnyLine]
    catalog: ToolCatalog

    @cached_property
    def sha256(self) -> str:
        return sha256_file(self.path)

    @cached_property
    def images_sha256(self) -> Optional[str]:
        """One hash over the images the lines use (path and bytes), so a program header pins them too."""
        images = sorted({line.image for line in self.lines if hasattr(line, "image")})
        if not images:
            return None
        h = hashlib.sha256()
        for rel in images:
            h.update(rel.encode() + b"\0" + sha256_file(self.resolve(rel)).encode() + b"\n")
        return h.hexdigest()

    def resolve(self, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else self.path.parent / p

    def split(self, name: str) -> list[AnyLine]:
        return [line for line in self.lines if line.split == name]

    def describe(self) -> dict[str, Any]:
        """What a program header records about this file."""
        out: dict[str, Any] = {"path": str(self.path), "sha256": self.sha256, "lines": len(self.lines)}
        if self.images_sha256:
            out["images_sha256"] = self.images_sha256
        return out


def fixture_path(module: str, directory: str | Path | None = None) -> Path:
    if module not in FIXTURE_FILES:
        raise FixtureError(f"unknown module {module!r}; use one of {sorted(FIXTURE_FILES)}")
    return Path(directory or FIXTURE_DIR) / FIXTURE_FILES[module]


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def _image_problem(img_path: Path, image: str, max_pixels: int) -> Optional[str]:
    """Why the image cannot be a fixture (missing, not an image, truncated, over the pixel limit), or None.
    Decoded here, not when the first LM call sends it (a bomb then failed the compile naming no line)."""
    from iqa_tools.images import ImageError, load_image

    if not os.path.lexists(img_path):  # a loop or a broken link is named by load_image
        return f"image {image} does not exist"
    try:
        load_image(img_path, label=f"image {image}", max_pixels=max_pixels)
    except ImageError as exc:
        return str(exc)
    return None


def load_fixture_file(
    module: str, path: str | Path | None = None, *, catalog: Optional[ToolCatalog] = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> FixtureFile:
    """Read and validate a fixture file (default: the shipped one for `module`).

    Raises FixtureError naming every bad line (JSON errors, schema errors, duplicate ids, images
    that do not exist or do not decode within `max_pixels`). Blank lines and lines starting with '#'
    are skipped. Only a regular file of at most MAX_FIXTURE_BYTES is read.
    """
    from iqa_tools.files import FileTooLarge, read_regular_file

    if module not in LINE_MODELS:
        raise FixtureError(f"unknown module {module!r}; use one of {sorted(LINE_MODELS)}")
    path = Path(path) if path is not None else fixture_path(module)
    catalog = catalog or default_catalog()
    if not path.exists() and not path.is_symlink():
        raise FixtureError(f"fixture file {path} does not exist")
    try:
        text = read_regular_file(path, f"fixture file {path}", MAX_FIXTURE_BYTES, "a fixture file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FixtureError(f"fixture file {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except ValueError as exc:  # not a regular file, too big, unreadable: read_regular_file's one line
        hint = ("; split it (compile uses every line: a few hundred are plenty for few-shot demos)"
                if isinstance(exc, FileTooLarge) else "")
        raise FixtureError(f"{exc}{hint}") from None
    model = LINE_MODELS[module]
    lines: list[AnyLine] = []
    problems: list[str] = []
    seen: set[str] = set()
    context = {"known_tools": catalog.names}
    checked: dict[Path, Optional[str]] = {}  # lines share images: each is decoded once
    unfit: list[Any] = []  # JSON lines that are not lines of this module: maybe another module's file
    for lineno, raw in enumerate(text.splitlines(), start=1):
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append(f"line {lineno}: bad JSON ({exc.msg} at column {exc.colno})")
            continue
        try:
            line = model.model_validate(data, context=context)
        except ValidationError as exc:
            who = f" ({data.get('id')})" if isinstance(data, dict) and data.get("id") else ""
            problems.append(f"line {lineno}{who}: {_first_error(exc)}")
            unfit.append(data)
            continue
        if line.id in seen:
            problems.append(f"line {lineno}: duplicate id {line.id!r}")
            continue
        image = getattr(line, "image", None)
        if image is not None:
            img_path = Path(image) if Path(image).is_absolute() else path.parent / image
            if img_path not in checked:
                checked[img_path] = _image_problem(img_path, image, max_pixels)
            if checked[img_path]:
                problems.append(f"line {lineno} ({line.id}): {checked[img_path]}")
                continue
        seen.add(line.id)
        lines.append(line)
    if problems and not lines and unfit:
        other = _module_of(unfit, module, context)
        if other is not None:  # said once, instead of "planner_output: Field required" on every line
            raise FixtureError(f"{path} looks like a fixture file for the {other!r} module, not {module!r} (its lines "
                               f"validate as {other} lines): pass it with --module {other}, or give a {module} file "
                               f"({FIXTURE_FILES[module]} in a fixture folder)")
    if problems:
        shown = "; ".join(problems[:10]) + (f"; … and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise FixtureError(f"{path}: {len(problems)} bad line(s): {shown}")
    if not lines:
        raise FixtureError(f"{path} holds no fixture lines")
    return FixtureFile(module=module, path=path, lines=lines, catalog=catalog)


def _module_of(rows: list[Any], module: str, context: dict) -> Optional[str]:
    """The other module whose line format most of `rows` (at most the first 20) fit, or None."""
    sample = rows[:20]
    best, best_n = None, 0
    for name, model in LINE_MODELS.items():
        if name == module:
            continue
        n = 0
        for row in sample:
            try:
                model.model_validate(row, context=context)
                n += 1
            except ValidationError:
                pass
        if n > best_n:
            best, best_n = name, n
    return best if best_n * 2 > len(sample) else None


@dataclass
class Dataset:
    """The train and validation examples of one compile run, and the files they came from."""

    module: str
    train: list  # dspy.Example
    val: list
    files: dict[str, FixtureFile] = field(default_factory=dict)  # "train" / "val" -> file

    def describe(self) -> dict[str, Any]:
        return {
            role: {**f.describe(), "used": len(self.train if role == "train" else self.val)}
            for role, f in self.files.items()
        }


def load_dataset(
    module: str,
    trainset: str | Path | None = None,
    valset: str | Path | None = None,
    *,
    catalog: Optional[ToolCatalog] = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Dataset:
    """Train/validation examples for `module`.

    Default: the shipped file, split by each line's `split`. A file given with --trainset supplies
    all of its lines for training (their `split` is ignored), likewise --valset for validation; a
    side not given comes from the shipped file's split.
    """
    from optimizers.examples import to_example  # dspy is imported only when examples are built

    catalog = catalog or default_catalog()
    shipped = None

    def side(path, split_name: str) -> tuple[list, FixtureFile]:
        nonlocal shipped
        if path is not None:
            f = load_fixture_file(module, path, catalog=catalog, max_pixels=max_pixels)
            return [to_example(module, line, f) for line in f.lines], f
        if shipped is None:
            shipped = load_fixture_file(module, catalog=catalog, max_pixels=max_pixels)
        return [to_example(module, line, shipped) for line in shipped.split(split_name)], shipped

    train, train_file = side(trainset, "train")
    val, val_file = side(valset, "val")
    if not train:
        raise FixtureError(f"no training examples for {module} in {train_file.path}")
    if not val:
        raise FixtureError(f"no validation examples for {module} in {val_file.path}")
    return Dataset(module, train, val, {"train": train_file, "val": val_file})


__all__ = [
    "FIXTURE_DIR",
    "FIXTURE_FILES",
    "CATALOG_FILE",
    "DISTORTION_CATEGORIES",
    "SEVERITIES",
    "FixtureError",
    "FixtureFile",
    "Dataset",
    "ToolCatalog",
    "LINE_MODELS",
    "PlannerLine",
    "DetectLine",
    "AnalyzeLine",
    "SelectLine",
    "SummarizeLine",
    "default_catalog",
    "fixture_path",
    "load_fixture_file",
    "load_dataset",
    "sha256_file",
]
