"""Batch items: what to assess (`BatchItem`), built from paths, a directory scan or an eval manifest,
and the resume keys that identify an item's result (`prepare_item`, `config_fingerprint`).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from agentic_iqa.config import Settings


#: Bumped when the meaning of a results line changes; part of every key, so old lines are not reused.
RESULTS_FORMAT = 1

#: What a directory scan picks up (case-insensitive). Explicitly named files are taken whatever their name.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif"})


class BatchError(ValueError):
    """The batch cannot start (bad manifest, results file in use or not ours, …); the message says why."""



# ── items ───────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class BatchItem:
    """One assessment to run. `problem` marks an item refused before running (it still gets a line)."""

    image: str
    query: Optional[str] = None
    reference: Optional[str] = None
    mode: str = "auto"
    id: Optional[str] = None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    problem: Optional[str] = None


def as_item(value: Any) -> BatchItem:
    """Accept a BatchItem, a path, a dict with `image` (and query/reference/mode/id/meta), or a tuple
    (image, query[, reference])."""
    if isinstance(value, BatchItem):
        return value
    if isinstance(value, (str, os.PathLike)):
        return BatchItem(image=str(value))
    if isinstance(value, Mapping):
        if "image" not in value:
            raise TypeError(f"a batch item dict needs an 'image' key: {dict(value)!r}")
        known = {k: value[k] for k in ("query", "reference", "mode", "id", "meta") if value.get(k) is not None}
        if "reference" in known:
            known["reference"] = str(known["reference"])
        return BatchItem(image=str(value["image"]), **known)
    if isinstance(value, tuple) and 1 <= len(value) <= 3:
        image, query, reference = (*value, None, None)[:3]
        return BatchItem(image=str(image), query=query, reference=None if reference is None else str(reference))
    raise TypeError(f"cannot make a batch item from {type(value).__name__}: pass a path, a dict or a BatchItem")


def scan_directory(folder: str | Path, recursive: bool = False, notes: Optional[list[str]] = None) -> list[Path]:
    """Image files in `folder` (by extension), sorted; hidden files and folders are skipped. Symlinked files
    are taken and symlinked folders followed, each real folder once: a link to a folder that contains it (a
    loop) or to one already scanned is not followed, and a subfolder that cannot be read is not scanned;
    each such skip is appended to `notes` with the reason, never silent."""
    root = Path(folder)
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()  # (device, inode) of every folder scanned or about to be

    def skipped(path: str, why: str) -> None:
        if notes is not None:
            notes.append(f"{path}: {why}")

    def unreadable(exc: OSError) -> None:
        skipped(exc.filename or str(root), f"folder not scanned ({exc.strerror or exc})")

    try:
        st = root.stat()
        seen.add((st.st_dev, st.st_ino))
    except OSError:
        pass  # os.walk reports it through `unreadable`
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=unreadable):
        if not recursive:
            dirnames[:] = []
        else:
            here = os.path.realpath(dirpath)
            # Real subfolders first, so a link to one of them is the duplicate, not the folder itself.
            subs = sorted((d for d in dirnames if not d.startswith(".")), key=lambda d: (os.path.islink(os.path.join(dirpath, d)), d))
            keep = []
            for d in subs:
                full = os.path.join(dirpath, d)
                try:
                    st = os.stat(full)
                except OSError as exc:
                    skipped(full, f"folder not scanned ({exc.strerror or exc})")
                    continue
                if os.path.islink(full):
                    target = os.path.realpath(full)
                    if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
                        skipped(full, f"a symlink to {target}, a folder that contains it (a loop): not followed")
                        continue
                    if (st.st_dev, st.st_ino) in seen:
                        skipped(full, f"a symlink to {target}, a folder already scanned: not followed again")
                        continue
                elif (st.st_dev, st.st_ino) in seen:  # reached earlier through a symlink
                    skipped(full, "already scanned through a symlink to it: not scanned again")
                    continue
                seen.add((st.st_dev, st.st_ino))
                keep.append(d)
            dirnames[:] = sorted(keep)
        for name in filenames:
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS:
                found.append(Path(dirpath) / name)
    return sorted(found)


def items_from_paths(
    paths: Iterable[str | Path],
    *,
    recursive: bool = False,
    query: Optional[str] = None,
    reference: Optional[str] = None,
    mode: str = "auto",
) -> tuple[list[BatchItem], list[str]]:
    """Items for files and folders given on the command line, and notes (e.g. an empty folder).

    Files are taken as named, whatever their extension (a missing one becomes a failed item with the
    reason); folders are scanned for image files."""
    items: list[BatchItem] = []
    notes: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = scan_directory(p, recursive, notes)
            if not found:
                hint = "" if recursive else " (pass --recursive to include subfolders)"
                notes.append(f"{raw}: no image files found{hint}")
            items.extend(BatchItem(image=str(f), query=query, reference=reference, mode=mode) for f in found)
        else:
            items.append(BatchItem(image=str(raw), query=query, reference=reference, mode=mode))
    return items, notes


def manifest_query(question: Optional[str], options: Optional[Mapping[str, str]]) -> Optional[str]:
    """A manifest row's question with its options appended the way the planner reads them ("A. Yes B. No")."""
    if not question:
        return None
    if not options:
        return question
    return question.rstrip() + " " + " ".join(f"{k}. {v}" for k, v in options.items())


def items_from_manifest(
    path: str | Path,
    *,
    query: Optional[str] = None,
    mode: str = "auto",
    allow_outside: bool = False,
) -> tuple[list[BatchItem], list[str]]:
    """Items for an eval manifest (JSONL; `agentic_iqa.bench.manifest`), and its unusable rows.

    Paths are relative to the manifest. A path that resolves outside the manifest's folder (absolute,
    `..`, or a symlink pointing out) is refused unless `allow_outside`: a manifest from elsewhere must
    not be able to send arbitrary files of this machine to a remote model. Refused rows still become
    items (failed, with the reason), so the results file accounts for every row. A row's question
    (with options) overrides `query`; its other fields are kept as `meta` in the results line."""
    from agentic_iqa.bench.manifest import path_problem, read_manifest

    path = Path(path)
    if not os.path.lexists(path):
        raise BatchError(f"manifest {path} does not exist")
    try:
        rows, problems = read_manifest(path, check_files=False, require_target=False)
    except ValueError as exc:  # missing, not a regular file, too big, not UTF-8: one line naming it
        raise BatchError(str(exc)) from None
    items: list[BatchItem] = []
    for row in rows:
        refused = [p for p in (path_problem(path.parent, label, value, allow_outside)
                               for label, value in (("image", row.image), ("reference", row.reference))) if p]
        meta = row.model_dump(exclude_none=True, exclude={"image", "reference", "question", "options", "id"})
        if row.question is not None:
            meta["question"] = row.question
            if row.options:
                meta["options"] = row.options
        items.append(BatchItem(
            image=str(path.parent / row.image),
            reference=None if row.reference is None else str(path.parent / row.reference),
            query=manifest_query(row.question, row.options) or query,
            mode=mode,
            id=row.id,
            meta=meta,
            problem="; ".join(refused) or None,
        ))
    return items, [str(p) for p in problems]


# ── keys ────────────────────────────────────────────────────────────────────────────────────────


def _sha256_file(path: Path) -> Optional[str]:
    """The file's SHA-256, or None when it is not a readable regular file. Opened non-blocking and checked
    on the open descriptor, so a FIFO or a device in a folder or manifest never blocks the batch: its
    item fails with the image reader's one-line reason instead."""
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return h.hexdigest()


#: Role settings that change how a model is reached, not what it answers (left out of the fingerprint).
_TRANSPORT_KEYS = ("num_retries", "timeout", "call_budget", "max_retry_after", "max_reply_bytes", "api_key_env")

#: Pipeline settings that cannot change an answer: where the cache lives (and whether it is used: a cached
#: tool score is the score), DSPy's debugging history, the pixel limit (it only decides which images can
#: be read: an image read under one limit is answered the same under another, and one refused is a failed
#: line, keyed without content, that --retry-failed replaces), and the query length cap (the truncated
#: query itself is part of every key).
_PIPELINE_IGNORED = {"cache", "lm_history", "max_image_pixels", "max_query_chars"}

#: Pipeline settings that only shape the model's requests: meaningless when no model answers.
_PIPELINE_MODEL_ONLY = ("image_transport", "vlm_image_max_side", "programs")


def config_fingerprint(settings: Settings) -> str:
    """A short hash of everything in the configuration that can change an answer, and nothing else:
    a change outside it must not make `--resume` redo finished items (nor leave their old lines beside
    the new ones).

    In it: who answers (the models and servers of the roles, or "offline" when no model is used: no model
    configured and `--offline` are the same offline analyst), sampling (temperature, max_tokens, logprobs),
    fusion, replans and retries, how images reach the model, the tools (device, weights, extra tables by
    content) and compiled programs (by content). Left out: where settings came from, the cache, DSPy's
    history, how a model is reached (retries, timeouts, the call budget, Retry-After cap, reply-size cap,
    which variable holds the key), and the limits in `_PIPELINE_IGNORED`."""
    data = settings.model_dump(mode="json", exclude={"config_dir": True, "config_files": True, "sources": True,
                                                      "pipeline": _PIPELINE_IGNORED})
    if settings.uses_model:
        for role in data["backends"].values():
            for transport in _TRANSPORT_KEYS:
                role.pop(transport, None)
        tables_and_programs = [*settings.pipeline.programs.values(), *settings.pipeline.tools.extra_tables]
    else:  # the offline analyst answers: the roles' models, servers and request shaping are never used
        data.pop("backends")
        data["pipeline"]["backend"] = "offline"
        for name in _PIPELINE_MODEL_ONLY:
            data["pipeline"].pop(name, None)
        tables_and_programs = list(settings.pipeline.tools.extra_tables)
    files = {str(p): _sha256_file(Path(p)) or "missing" for p in tables_and_programs}
    blob = json.dumps({"format": RESULTS_FORMAT, "settings": data, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _abs(path: str) -> str:
    """Absolute, normalized, symlinks kept: the same file named the same way keys the same."""
    if "://" in path[:12]:
        return path  # a URL: refused later with a hint, but keyed as given
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode("utf-8", "surrogateescape")).hexdigest()


@dataclass
class PreparedItem:
    """An item with its resume keys. `identity` ignores file contents (it names the item); `key`
    includes them (it names the result). An item only identified (`identify_item`: no file read) has
    `hashed` False and no key yet; `done_keys` then carries the keys of its earlier `ok` results, for
    whoever hashes it later (a Ray worker) to decide whether it is done."""

    index: int
    item: BatchItem
    query: str
    image_sha256: Optional[str]
    reference_sha256: Optional[str]
    identity: str
    key: str
    hashed: bool = True
    done_keys: tuple[str, ...] = ()


def identify_item(index: int, item: BatchItem, settings: Settings, fingerprint: str) -> PreparedItem:
    """The item's identity without reading its files (a path, query, mode and configuration digest):
    what a driver listing millions of files can afford. `prepare_item` adds the content key."""
    from agentic_iqa.api import prepare_query

    query, _ = prepare_query(item.query, settings.pipeline.max_query_chars)
    image = _abs(item.image)
    reference = _abs(item.reference) if item.reference else None
    identity = digest(RESULTS_FORMAT, image, reference, query, item.mode, item.id, fingerprint)
    return PreparedItem(index, item, query, None, None, identity, "", hashed=False)


def prepare_item(index: int, item: BatchItem, settings: Settings, fingerprint: str) -> PreparedItem:
    """Hash the item's files (cheap next to an assessment) and derive its keys. Never raises for a bad
    file: an unreadable one hashes to None and the assessment reports why."""
    prep = identify_item(index, item, settings, fingerprint)
    image = _abs(item.image)
    reference = _abs(item.reference) if item.reference else None
    image_sha = None if item.problem else _sha256_file(Path(image))
    ref_sha = None if (item.problem or reference is None) else _sha256_file(Path(reference))
    return PreparedItem(index, item, prep.query, image_sha, ref_sha, prep.identity, digest(prep.identity, image_sha, ref_sha))


def is_done(prep: PreparedItem, done_keys: Iterable[str]) -> bool:
    """Whether a hashed item is settled by earlier `ok` results of its identity (their keys): its key is
    among them, or its file cannot be read now (moved, deleted) but was assessed before — that result
    is kept rather than replaced by a failure."""
    done = set(done_keys)
    return bool(done) and (prep.key in done or prep.image_sha256 is None)
