"""The benchmark manifest: one JSON object per line, describing one image to assess.

Fields (``ManifestRow``):

``id``         unique row id (string).
``image``      path of the image to assess, relative to the manifest file (absolute paths also work).
``reference``  path of its pristine reference, relative to the manifest, or null (NR-only datasets).
``type``       distortion type, a KADID-10k style name (``KNOWN_TYPES``), or null when a dataset has
               no types (authentic or AI-generated images).
``category``   spec distortion category of ``type`` (one of ``iqa_tools.categories.DISTORTION_CATEGORIES``), or null when the type has
               none (KADID's "spatial" family). Filled in from ``type`` when omitted.
``level``      1..5, higher = stronger distortion (worse), or null for MOS-only datasets.
``mos``        a subjective score when the dataset has one (null for the synthetic set).
``mos_higher_better``  direction of ``mos`` (true for MOS, false for DMOS-as-difference scales).
``split``      "train" or "test" (fixed by reference image; see ``agentic_iqa.bench.synth``).
``source``     name of the reference/content the row derives from; rows with the same source and type
               form one intra-group (level-vs-score) group.
``question``, ``options`` (letter -> text), ``answer`` (a letter): an optional question. With ``answer``
               (the answer key) it is scored (MCQ accuracy); without one it is still asked, and `eval`
               reports the model's answer as unscored (for per-image questions nobody has answered yet).

Every row needs something to assess: a level, a MOS, or a question.

How public datasets map onto it (converted on the user's machine; nothing is downloaded here):

* KADID-10k: ``dmos.csv`` (dist_img, ref_img, dmos, var); ``I01_03_05.png`` = reference 01, type 3
  (motion blur), level 5. ``kadid_to_manifest`` converts it; ``dmos`` goes to ``mos`` (it is a MOS-like
  1-5 scale, higher is better despite the name).
* TID2013: ``mos_with_names.txt`` lines "5.51 i01_08_3.bmp" = reference 01, type 8, level 3; the 24 TID
  types map to KADID-style names (e.g. 8 "gaussian blur", 10 "jpeg", 11 "jpeg2000"), ``mos`` = MOS.
* BID (blurred image database): one row per image, ``reference`` null, ``type`` null, ``category``
  "Blurs", ``mos`` = the MOS; no level, so only SRCC/KRCC/PLCC apply.
* AGIQA-3K: one row per generated image, ``reference``/``type``/``category``/``level`` null,
  ``mos`` = ``mos_quality``.
* LIVE In the Wild Image Quality Challenge (CLIVE, "ChallengeDB_release"): 1,162 photos from phone cameras
  with authentic distortions and their MOS (0-100, higher is better) in ``Data/AllMOS_release.mat``, the
  file names in ``Data/AllImages_release.mat``. ``clive_to_manifest`` converts it: one row per rated photo,
  no reference, type or level, so only SRCC/KRCC/PLCC apply.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, model_validator

from iqa_tools.categories import CategoryName

# KADID-10k's 25 types in its own numbering (type index = position + 1), with the spec category each
# belongs to. KADID's "spatial distortions" family has no spec category, so those map to None.
KADID_TYPES: dict[str, Optional[str]] = {
    "gaussian blur": "Blurs", "lens blur": "Blurs", "motion blur": "Blurs",
    "color diffusion": "Color distortions", "color shift": "Color distortions",
    "color quantization": "Color distortions", "color saturation 1": "Color distortions",
    "color saturation 2": "Color distortions",
    "jpeg2000": "Compression", "jpeg": "Compression",
    "white noise": "Noise", "white noise in color component": "Noise", "impulse noise": "Noise",
    "multiplicative noise": "Noise", "denoise": "Noise",
    "brighten": "Brightness change", "darken": "Brightness change", "mean shift": "Brightness change",
    "jitter": None, "non-eccentricity patch": None, "pixelate": None, "quantization": None,
    "color block": None,
    "high sharpen": "Sharpness", "contrast change": "Contrast",
}
# Types of ours that KADID lacks: a monotone version of "contrast change" (KADID's goes both ways), a camera's
# over-exposure (KADID's "brighten" is a tone curve that clips almost nothing), and noise with no colour in it:
# KADID's white and impulse noise are independent per RGB channel, so always coloured, while a camera's processed
# grain is mostly luminance and a gray scan's specks are gray.
EXTRA_TYPES: dict[str, Optional[str]] = {"contrast decrease": "Contrast", "overexposure": "Brightness change",
                                         "luminance noise": "Noise", "gray impulse noise": "Noise"}
KNOWN_TYPES: dict[str, Optional[str]] = {**KADID_TYPES, **EXTRA_TYPES}

# KADID puts the unchanged image at level 3 of these two, so quality is not monotone in level
# (DESIGN §7): intra-group SRCC must skip them.
NON_MONOTONE_TYPES = frozenset({"mean shift", "contrast change"})


class ManifestRow(BaseModel):
    """One benchmark item; see the module docstring for the meaning of each field."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    image: str = Field(min_length=1)
    reference: Optional[str] = None
    type: Optional[str] = None
    category: Optional[CategoryName] = None
    level: Optional[int] = Field(None, ge=1, le=5)
    mos: Optional[float] = None
    mos_higher_better: bool = True
    split: Literal["train", "test"] = "test"
    source: Optional[str] = None
    question: Optional[str] = None
    options: Optional[dict[str, str]] = None
    answer: Optional[str] = None

    _base: Path = PrivateAttr(default_factory=Path)

    @model_validator(mode="before")
    @classmethod
    def _default_id(cls, data, info: ValidationInfo):
        # Batch assessment (`require_target=False`) accepts rows without an id: the image path names them.
        if isinstance(data, dict) and not (info.context or {}).get("require_target", True) and not data.get("id") and isinstance(data.get("image"), str):
            data = {**data, "id": data["image"]}
        return data

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "ManifestRow":
        if self.type is not None:
            if self.type not in KNOWN_TYPES:
                raise ValueError(f"unknown distortion type {self.type!r}")
            expected = KNOWN_TYPES[self.type]
            if self.category is None:
                self.category = expected
            elif expected is not None and self.category != expected:
                raise ValueError(f"type {self.type!r} belongs to {expected!r}, not {self.category!r}")
        if self.answer is not None and self.question is None:
            raise ValueError("an answer needs its question (a question alone is fine: it is asked, unscored)")
        if self.answer is not None and self.options is not None and self.answer not in self.options:
            raise ValueError(f"answer {self.answer!r} is not one of the options {sorted(self.options)}")
        require_target = (info.context or {}).get("require_target", True)
        if require_target and self.level is None and self.mos is None and self.question is None:
            raise ValueError("row has nothing to assess (needs level, mos or a question)")
        return self

    @property
    def image_path(self) -> Path:
        return self._base / self.image

    @property
    def reference_path(self) -> Optional[Path]:
        return None if self.reference is None else self._base / self.reference

    @property
    def group(self) -> tuple:
        """Intra-group key: same content and same distortion type."""
        return (self.source or self.reference or self.id, self.type)


@dataclass(frozen=True)
class ManifestProblem:
    line: int
    message: str
    row_id: Optional[str] = None

    def __str__(self) -> str:
        who = f" ({self.row_id})" if self.row_id else ""
        return f"line {self.line}{who}: {self.message}"


def _errors_text(exc: ValidationError, most: int = 3) -> str:
    """Every problem of a row (up to `most`), field first: `{"image": 42}` said only "id: Field required", since a row
    with no id is named by its image, and left the image's own problem unsaid."""
    parts = []
    for err in exc.errors()[:most]:
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    more = len(exc.errors()) - most
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


MAX_MANIFEST_BYTES = 256 << 20  # 256 MiB: about a million rows


def read_manifest(path: str | Path, check_files: bool = True, require_target: bool = True,
                  allow_outside: bool = True) -> tuple[list[ManifestRow], list[ManifestProblem]]:
    """Parse a JSONL manifest. Broken rows are skipped and reported with their 1-based line number,
    so one bad line never stops a run. Blank lines and lines starting with '#' are ignored.

    `require_target=False` (batch assessment, not evaluation): rows need no level/mos/answer, and a
    row without an id is named by its image path.

    `allow_outside=False`: a row whose image or reference resolves outside the manifest's folder is
    skipped with the reason (`path_problem`), as `eval` needs before anything is sent to a model.

    Only a regular file of at most MAX_MANIFEST_BYTES is read (a FIFO or /dev/zero is refused at once);
    an unreadable or non-UTF-8 manifest raises ValueError with one line naming it."""
    from iqa_tools.files import read_regular_file

    path = Path(path)
    base = path.parent
    rows: list[ManifestRow] = []
    problems: list[ManifestProblem] = []
    seen: set[str] = set()
    objects = 0  # lines that are JSON objects
    raw = read_regular_file(path, f"manifest {path}", MAX_MANIFEST_BYTES, "a manifest")
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise ValueError(f"manifest {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    for lineno, text in enumerate(lines, start=1):
        text = text.strip()
        if not text or text.startswith("#"):
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            # json's own text may end in "at" ("Unterminated string starting at"): the column follows it once
            problems.append(ManifestProblem(lineno, f"bad JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}"))
            continue
        row_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(data, dict):
            problems.append(ManifestProblem(lineno, "a row must be a JSON object"))
            continue
        objects += 1
        try:
            row = ManifestRow.model_validate(data, context={"require_target": require_target})
        except ValidationError as exc:
            problems.append(ManifestProblem(lineno, _errors_text(exc), row_id))
            continue
        row._base = base
        problem = None if allow_outside else "; ".join(
            filter(None, (path_problem(base, label, value) for label, value in (("image", row.image), ("reference", row.reference)))))
        if check_files and not problem:
            problem = _file_problem(row)
        if row.id in seen:
            problem = f"duplicate id {row.id!r}"
        if problem:
            problems.append(ManifestProblem(lineno, problem, row.id))
            continue
        seen.add(row.id)
        rows.append(row)
    if problems and not objects:
        # Not a manifest at all (e.g. a plain list of paths): one line, not one problem per line.
        raise ValueError(
            f"manifest {path}: no line is a JSON object ({problems[0]}); a manifest is JSONL, one object per line "
            'such as {"image": "photos/a.jpg"}; to assess a plain list of images, pass the image paths as arguments')
    return rows, problems


def path_problem(manifest_dir: Path, label: str, value: Optional[str], allow_outside: bool = False) -> Optional[str]:
    """Why the manifest path `value` (relative to `manifest_dir`) may not be used, or None.

    A path that resolves outside the manifest's folder (absolute, `..`, or a symlink pointing out) is
    refused unless `allow_outside`: a manifest from elsewhere must not be able to send arbitrary files of
    this machine to a remote model. `assess --manifest` and `eval` both check rows here."""
    import errno

    if value is None:
        return None
    try:
        target = (manifest_dir / value).resolve()
    except (RuntimeError, OSError) as exc:  # Python < 3.13 raises RuntimeError("Symlink loop from ...")
        loop = isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
        return f"{label} {value!r}: " + ("symlink loop (too many levels of symbolic links); fix or remove the link"
                                         if loop else f"cannot be resolved ({getattr(exc, 'strerror', None) or exc})")
    base = manifest_dir.resolve()
    if not allow_outside and not target.is_relative_to(base):
        return (f"{label} {value!r} resolves outside the manifest's folder {base}; "
                "refused (pass --allow-absolute to allow paths outside it)")
    return None


def _file_problem(row: ManifestRow) -> Optional[str]:
    if not row.image_path.is_file():
        return _why_not_a_file(row.image_path, "image", row.image)
    if row.reference_path is not None and not row.reference_path.is_file():
        return _why_not_a_file(row.reference_path, "reference", row.reference)
    return None


def _why_not_a_file(path: Path, what: str, name: str) -> str:
    """"missing …", unless the path exists as something else (a symlink loop is not a missing file)."""
    import errno

    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{what} {name}: symlink loop (too many levels of symbolic links); fix or remove the link"
        return f"missing {what} file {name}"
    return f"{what} {name} is not a regular file"


def write_manifest(rows: Iterable[ManifestRow], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(row.model_dump_json(exclude_none=True) + "\n")
    return path


_KADID_NAME = re.compile(r"^I(\d+)_(\d+)_(\d+)\.\w+$", re.IGNORECASE)


def kadid_to_manifest(csv_path: str | Path, out_path: str | Path | None = None,
                      image_dir: str = "images", test_refs: Iterable[int] = range(62, 82)) -> Path:
    """Convert KADID-10k's ``dmos.csv`` into a manifest next to it (default ``manifest.jsonl``).

    Image paths are ``image_dir/<file>`` relative to the CSV's folder (KADID ships them in ``images/``).
    KADID's 81 references are split by index: ``test_refs`` (default 62..81) → "test", others "train".
    """
    csv_path = Path(csv_path)
    out_path = Path(out_path) if out_path else csv_path.with_name("manifest.jsonl")
    names = list(KADID_TYPES)
    test = set(test_refs)
    image_root = csv_path.parent.resolve() / image_dir

    def rel(name: str) -> str:  # image paths are stored relative to the manifest's folder
        return os.path.relpath(image_root / name, out_path.parent.resolve())

    rows = []
    with csv_path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = {"dist_img", "ref_img", "dmos"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{csv_path}: no column {', '.join(sorted(missing))}; is this KADID-10k's dmos.csv?")
        for rec in reader:
            where = f"{csv_path}, line {reader.line_num}"  # a bad row is named, as a manifest's are
            match = _KADID_NAME.match((rec["dist_img"] or "").strip())
            if not match or not 1 <= int(match.group(2)) <= len(names):
                raise ValueError(f"{where}: unexpected KADID image name {rec['dist_img']!r} (expected like I01_03_05.png)")
            try:
                dmos = float(rec["dmos"])
            except (TypeError, ValueError):  # TypeError: the row has fewer cells than the header
                dmos = math.nan
            if not math.isfinite(dmos):
                what = "has no dmos value" if rec["dmos"] is None else f"dmos {rec['dmos']!r} is not a number"
                raise ValueError(f"{where}: {what}; fix or remove the row")
            ref, typ, level = (int(g) for g in match.groups())
            rows.append(ManifestRow(
                id=Path(rec["dist_img"]).stem, image=rel(rec["dist_img"].strip()),
                reference=rel((rec["ref_img"] or "").strip()), type=names[typ - 1], level=level,
                mos=dmos, split="test" if ref in test else "train", source=f"I{ref:02d}"))
    return write_manifest(rows, out_path)


MAX_MAT_BYTES = 16 << 20  # CLIVE's score files are a few kB; anything this large is not one of them
CLIVE_PRACTICE_IMAGES = 7  # AllImages_release starts with the 7 practice images (Images/trainingImages/t1-t7)


def _mat_variable(path: Path, name: str):
    """One variable of a MATLAB (v5) .mat file: plain data, read from a regular file under MAX_MAT_BYTES."""
    from scipy.io import loadmat

    if not path.is_file():
        raise ValueError(f"{path}: not found (or not a regular file); point at the ChallengeDB_release folder")
    if path.stat().st_size > MAX_MAT_BYTES:
        raise ValueError(f"{path}: {path.stat().st_size:,} bytes, over {MAX_MAT_BYTES:,}: not a CLIVE score file")
    try:
        data = loadmat(path, variable_names=[name])
    except Exception as exc:  # noqa: BLE001 - scipy raises several types for a damaged or foreign file
        raise ValueError(f"{path}: not a readable MATLAB .mat file ({type(exc).__name__}: {exc})") from None
    if name not in data:
        raise ValueError(f"{path}: has no variable {name!r}; is this CLIVE's {path.name}?")
    return data[name]


def clive_to_manifest(release_dir: str | Path, out_path: str | Path | None = None) -> Path:
    """Convert the LIVE In the Wild Image Quality Challenge database (the ``ChallengeDB_release`` folder:
    ``Images/``, ``Data/AllImages_release.mat``, ``Data/AllMOS_release.mat``) into a manifest (default
    ``manifest.jsonl`` in that folder): one row per rated photo with its MOS, ``source`` "clive".

    The seven practice images raters saw first (``Images/trainingImages/``) are left out, as the
    published figures on this set leave them out: 1,162 rows. Only file names are taken from the .mat
    file; a name with a folder in it is refused.
    """
    root = Path(release_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder; pass the ChallengeDB_release folder (it holds Images/ and Data/)")
    names = _mat_variable(root / "Data" / "AllImages_release.mat", "AllImages_release").ravel()
    mos = _mat_variable(root / "Data" / "AllMOS_release.mat", "AllMOS_release").ravel()
    if len(names) != len(mos) or len(names) <= CLIVE_PRACTICE_IMAGES:
        raise ValueError(f"{root / 'Data'}: {len(names)} image names but {len(mos)} scores; the two files do not match")
    out_path = Path(out_path) if out_path else root / "manifest.jsonl"
    image_root = (root / "Images").resolve()
    rows = []
    for cell, score in list(zip(names, mos))[CLIVE_PRACTICE_IMAGES:]:
        flat = cell.ravel() if hasattr(cell, "ravel") else [cell]  # a MATLAB cell holds a 1-element char array
        name = str(flat[0]).strip() if len(flat) else ""
        if not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"{root / 'Data' / 'AllImages_release.mat'}: {name!r} is not a plain file name")
        if not math.isfinite(float(score)):
            raise ValueError(f"{root / 'Data' / 'AllMOS_release.mat'}: the score of {name} is {score}, not a number")
        rows.append(ManifestRow(id=name, image=os.path.relpath(image_root / name, out_path.parent.resolve()),
                                mos=float(score), source="clive"))
    return write_manifest(rows, out_path)
