"""The tool table: a validated model of `tools.yaml` plus any user tool files merged over it."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from iqa_tools.categories import STRENGTHS, StrengthName
from iqa_tools.errors import ToolTableError
from iqa_tools.files import MAX_TOOL_FILE_BYTES, read_regular_file, yaml_error_line

BUNDLED_TABLE = Path(__file__).with_name("tools.yaml")



class ToolSpec(BaseModel):
    """One tool: what pyiqa metric it is, how to read its score, and what it needs to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    metric: str = Field(min_length=1)
    mode: Literal["FR", "NR"]
    lower_better: bool
    score_range: tuple[float, float]
    description: str = Field(min_length=10)
    strengths: list[StrengthName] = []
    beta: Optional[tuple[float, float, float, float, float]] = None
    needs_weights: bool = False  # derived from weight_files when not given
    weight_files: list[str] = []
    requires: dict[str, str] = {}
    accepts_model_path: bool = False
    model_path: Optional[str] = None
    metric_kwargs: dict[str, Any] = {}
    min_side: int = Field(32, ge=1)
    # Larger images are scored on a downscaled copy (aspect kept) of at most this many pixels: IQA tools are
    # defined at a scale, and memory grows with pixels (MS-SSIM takes 4.8 GB at 4 MP). See benchmarks/memory_bench.py.
    working_pixels: int = Field(2_000_000, ge=4096)
    version: str = "1"
    notes: str = ""
    source: Optional[str] = None  # the file the entry came from (set by the loader)

    @field_validator("score_range")
    @classmethod
    def _range_ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        lo, hi = v
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"must be [low, high] with low < high, got {list(v)}")
        return v

    @field_validator("beta", mode="before")
    @classmethod
    def _beta_five(cls, v):
        if v is not None and (not isinstance(v, (list, tuple)) or len(v) != 5):
            raise ValueError(f"must be the five logistic parameters [β1, β2, β3, β4, β5] or null, got {v!r}")
        return v

    @field_validator("beta")
    @classmethod
    def _beta_finite(cls, v):
        if v is not None and not all(math.isfinite(b) for b in v):
            raise ValueError("all five β must be finite numbers")
        return v

    @field_validator("weight_files")
    @classmethod
    def _weight_file_kinds(cls, v: list[str]) -> list[str]:
        for w in v:
            if not (w.startswith("hf:") and "/" in w) and "/" not in w:
                raise ValueError(f"{w!r}: use pyiqa/<file>, checkpoints/<file>, clip/<file> or hf:<org>/<repo>")
        return v

    @model_validator(mode="before")
    @classmethod
    def _derive_needs_weights(cls, data: Any) -> Any:
        if isinstance(data, dict) and "needs_weights" not in data:
            data = {**data, "needs_weights": bool(data.get("weight_files"))}
        return data

    def main_weight_file(self) -> Optional[str]:
        """The pyiqa checkpoint a configured weights directory may provide (passed as pretrained_model_path)."""
        for w in self.weight_files:
            if w.startswith("pyiqa/"):
                return w.split("/", 1)[1]
        return None


class FallbackOrder(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generic: list[str] = ["NIQE", "BRISQUE"]
    best_of: list[str] = ["PIQE"]


class ToolTable(BaseModel):
    """All tools by canonical name, in table order, and the fallback order."""

    tools: dict[str, ToolSpec]
    fallback: FallbackOrder = FallbackOrder()
    files: list[str] = []


def _read(path: Path) -> dict:
    try:
        text = read_regular_file(path, f"tool file {path}", MAX_TOOL_FILE_BYTES, "a tool file").decode("utf-8")
    except ValueError as exc:  # includes UnicodeDecodeError
        msg = f"tool file {path}: not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise ToolTableError(msg) from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ToolTableError(f"tool file {path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} "
                             f"({yaml_error_line(exc)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tools", []), list):
        raise ToolTableError(f"tool file {path}: expected a mapping with a `tools:` list of tool entries")
    unknown = set(data) - {"schema", "tools", "fallback"}
    if unknown:
        raise ToolTableError(f"tool file {path}: unknown top-level key(s) {sorted(unknown)}; expected tools, fallback")
    return data


def _describe_error(path: Path, index: int, name: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        field = ".".join(str(p) for p in err["loc"]) or "(entry)"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"field `{field}`: {msg}")
    return f"tool file {path}: tool #{index + 1} ({name}): " + "; ".join(parts)


def load_table(extra_paths: Iterable[Path | str] = ()) -> ToolTable:
    """The bundled table with each user file merged over it, validated. Raises ToolTableError."""
    raw: dict[str, dict] = {}
    origin: dict[str, tuple[Path, int]] = {}
    fallback: dict = {}
    files = [BUNDLED_TABLE, *(Path(p).expanduser() for p in extra_paths)]
    for path in files:
        data = _read(path)
        seen: set[str] = set()
        for i, entry in enumerate(data.get("tools") or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"].strip():
                raise ToolTableError(f"tool file {path}: tool #{i + 1}: each entry needs a `name` (a non-empty string)")
            name = entry["name"]
            if name in seen:
                raise ToolTableError(f"tool file {path}: tool #{i + 1} ({name}): name appears twice in this file")
            seen.add(name)
            entry = dict(entry)
            if isinstance(entry.get("model_path"), str):  # relative to the file that names it
                mp = Path(entry["model_path"]).expanduser()
                entry["model_path"] = str(mp if mp.is_absolute() else (path.parent / mp).resolve())
            merged = {**raw.get(name, {}), **entry, "source": str(path)}
            if "weight_files" in entry and "needs_weights" not in entry:
                merged.pop("needs_weights", None)  # re-derive from the new file list
            raw[name] = merged
            origin[name] = (path, i)
        if isinstance(data.get("fallback"), dict):
            fallback.update(data["fallback"])

    tools: dict[str, ToolSpec] = {}
    for name, entry in raw.items():
        path, i = origin[name]
        try:
            tools[name] = ToolSpec.model_validate(entry)
        except ValidationError as exc:
            raise ToolTableError(_describe_error(path, i, name, exc)) from None
    try:
        order = FallbackOrder.model_validate(fallback)
    except ValidationError as exc:
        raise ToolTableError(f"tool files: `fallback`: {exc.errors()[0]['msg']}") from None
    for name in [*order.generic, *order.best_of]:
        if name not in tools:
            raise ToolTableError(f"tool files: `fallback` names {name!r}, which is not a tool in the table")
    return ToolTable(tools=tools, fallback=order, files=[str(p) for p in files])
