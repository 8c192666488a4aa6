"""The tool registry: look tools up, say what can run here, score images, cache, fall back.

    reg = ToolRegistry()
    reg.score("PSNR", "img.png", reference="ref.png")          # ToolScore, or raises ToolError / ImageError
    reg.run("TOPIQ_FR", "img.png", reference="ref.png")        # [ToolExecutionLog, ...]; never raises for
                                                               # tool failures: logs them and falls back
Each pyiqa metric is created lazily, once per (tool, device), and reused; a per-metric lock serializes
its use, so one registry can be shared by threads. Importing this module does not import torch or pyiqa,
and running only tools with a torch-free kernel on the CPU (BRISQUE, NIQE, PIQE, NLPD, GMSD, PSNR,
FSIM, VIF: iqa_tools.kernels) never does.
"""
from __future__ import annotations

import contextlib
import difflib
import logging
import math
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict

from iqa_tools import backend, kernels, weights
from iqa_tools.cache import ToolCache, cache_key
from iqa_tools.errors import (
    DependencyMissingError,
    ImageError,
    ImageSizeMismatchError,
    ImageTooSmallError,
    ToolError,
    ToolModeError,
    ToolRunError,
    UnknownToolError,
    WeightsMissingError,
)
from iqa_tools.images import ImageSource, LoadedImage, decode, fit_pixels, max_pixels_default, read_source
from iqa_tools.normalize import Normalization, normalize_score
from iqa_tools.records import ToolExecutionLog
from iqa_tools.table import ToolSpec, ToolTable, load_table

log = logging.getLogger("iqa_tools")

AVAILABILITY_TTL = 5.0  # seconds an availability answer is reused (see ToolRegistry.availability)

Mode = Literal["FR", "NR"]


class ToolScore(BaseModel):
    """One successful score."""

    model_config = ConfigDict(frozen=True)

    tool: str
    raw_score: float
    normalized_score: float  # on [1, 5]
    normalization: Normalization
    seconds: float  # wall time of this call without one-time metric creation; a cache hit is just the lookup
    cached: bool = False
    device: Optional[str] = None
    notes: list[str] = []  # image conversions applied (alpha, 16-bit, downscaling to the working size, …)
    working_size: Optional[tuple[int, int]] = None  # (width, height) the tool scored; None on a cache hit

    def to_log(
        self,
        *,
        object_name: str = "Global",
        distortion: str = "Overall",
        fallback: bool = False,
        fallback_for: Optional[str] = None,
    ) -> ToolExecutionLog:
        return ToolExecutionLog(
            tool_name=self.tool,
            object_name=object_name,
            distortion=distortion,
            raw_score=self.raw_score,
            normalized_score=self.normalized_score,
            execution_time=self.seconds,
            fallback=fallback,
            fallback_for=fallback_for,
            cached=self.cached,
            normalization=self.normalization,
            device=self.device,
            working_size=self.working_size,
        )


_stdout_swap_lock = threading.Lock()


def _alias_key(name: str) -> str:
    return re.sub(r"[\s_\-+.]", "", name).lower()


def _resolve_device(requested: str) -> str:
    torch = backend.torch()

    if requested in ("", "auto"):
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
    try:
        dev = torch.device(requested)
    except (RuntimeError, ValueError):
        raise ToolError(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ToolError(f"device {requested!r} requested but CUDA is not available here; use --device cpu or auto")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ToolError(f"device {requested!r} requested but MPS is not available here; use --device cpu or auto")
    return requested


class ToolRegistry:
    """Tool table + pyiqa metrics + score cache. See the module docstring."""

    def __init__(
        self,
        table_paths: Optional[Iterable[Path | str]] = None,
        device: Optional[str] = None,
        cache: ToolCache | Literal[False] | None = None,
        weights_dir: Optional[Path | str] = None,
        offline: Optional[bool] = None,
        *,
        max_pixels: Optional[int] = None,
        batch_size: int = 8,
    ):
        """
        Values come as arguments only (agentic_iqa's `Settings.build_registry()` reads the
        configuration and environment). table_paths: user tool files merged over the bundled table.
        device: "auto"/None → CUDA, then MPS, then CPU, or "cpu", "cuda:0", … cache: None → persistent
        cache in the user cache dir, False → none, or a ToolCache. weights_dir: extra folder holding
        tools' main pyiqa checkpoints. offline: when true, a tool whose files are missing fails at
        once instead of downloading (None: downloads allowed).
        """
        self.table: ToolTable = load_table(list(table_paths or []))
        self.requested_device = device or "auto"
        self._device: Optional[str] = None
        self.cache: Optional[ToolCache] = ToolCache() if cache is None else (cache or None)
        self.weights_dir: Optional[Path] = Path(weights_dir).expanduser() if weights_dir else None
        self.offline = bool(offline)
        self.max_pixels = max_pixels or max_pixels_default()
        self.batch_size = max(1, batch_size)

        self._lock = threading.Lock()
        self._metrics: dict[tuple[str, str], Any] = {}
        self._availability: dict[str, tuple[float, tuple[bool, str]]] = {}  # name -> (when, answer)
        self._metric_locks: dict[tuple[str, str], threading.Lock] = {}
        self._aliases: dict[str, str] = {}
        for spec in self.table.tools.values():  # canonical names win over pyiqa metric names
            self._aliases.setdefault(_alias_key(spec.name), spec.name)
        for spec in self.table.tools.values():
            self._aliases.setdefault(_alias_key(spec.metric), spec.name)

    # ------------------------------------------------------------------ lookup
    def names(self) -> list[str]:
        return list(self.table.tools)

    def resolve_name(self, name: str) -> Optional[str]:
        """Canonical name for `name`, tolerant of case, '-', '_' and pyiqa metric names; None if unknown."""
        if name in self.table.tools:
            return name
        return self._aliases.get(_alias_key(name or ""))

    def spec(self, name: str) -> ToolSpec:
        canonical = self.resolve_name(name)
        if canonical is None:
            lowered = {n.lower(): n for n in self.table.tools}
            close = [lowered[c] for c in difflib.get_close_matches(str(name).lower(), list(lowered), n=3, cutoff=0.5)]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownToolError(f"unknown tool {name!r}{hint} (`agentic-iqa tools list` shows all tools)", tool=name)
        return self.table.tools[canonical]

    @property
    def device(self) -> str:
        """The device metrics run on (resolving it imports torch)."""
        if self._device is None:
            self._device = _resolve_device(self.requested_device)
        return self._device

    # ------------------------------------------------------------------ what can run here
    def availability(self, name: str) -> tuple[bool, str]:
        """(runs here?, why / why not). Checks packages and files on disk only; no network, no torch.

        Every tool-selection prompt asks this for all tools (~0.1 ms of file-system checks each), so
        answers are kept for AVAILABILITY_TTL seconds: weights added meanwhile are seen after that."""
        spec = self.spec(name)
        now = time.monotonic()
        hit = self._availability.get(spec.name)
        if hit is not None and now - hit[0] < AVAILABILITY_TTL:
            return hit[1]
        answer = self._check_availability(spec)
        self._availability[spec.name] = (now, answer)
        return answer

    def _check_availability(self, spec: ToolSpec) -> tuple[bool, str]:
        found = weights.check(spec, self.weights_dir)
        if found.ok:
            if spec.model_path:
                return True, "parameter file present"
            return True, "weights present" if spec.needs_weights else "weight-free"
        why = weights.describe_missing(spec, found, self.weights_dir)
        if found.missing_files and not found.missing_modules and not found.model_file_missing and not self.offline:
            why += "; pyiqa downloads it on first use when online"
        return False, why

    def available_tools(self, mode: Optional[Mode] = None) -> list[ToolSpec]:
        return [s for s in self.table.tools.values() if (mode is None or s.mode == mode) and self.availability(s.name)[0]]

    def describe_tools(self, mode: Optional[Mode] = None, available_only: bool = True) -> str:
        """Compact tool list for the tool-selection prompt: name, FR/NR, strengths, description."""
        specs = self.available_tools(mode) if available_only else [
            s for s in self.table.tools.values() if mode is None or s.mode == mode
        ]
        lines = []
        for s in specs:
            strengths = ", ".join(s.strengths) if s.strengths else "no known strengths"
            lines.append(f"- {s.name} ({s.mode}; strengths: {strengths}): {s.description}")
        return "\n".join(lines)

    def normalize(self, name: str, raw: float) -> tuple[float, Normalization]:
        spec = self.spec(name)
        return normalize_score(raw, beta=spec.beta, score_range=spec.score_range, lower_better=spec.lower_better)

    # ------------------------------------------------------------------ metrics
    def _metric(self, spec: ToolSpec) -> tuple[Any, threading.Lock, str]:
        """The shared pyiqa metric for `spec` on this registry's device, created on first use."""
        if self._device is not None:
            metric = self._metrics.get((spec.name, self._device))
            if metric is not None:
                return metric, self._metric_locks[(spec.name, self._device)], self._device
        found = self._preflight(spec)  # before the device check, which imports torch (~2 s)
        device = self._tool_device(spec)
        key = (spec.name, device)
        with self._lock:
            lock = self._metric_locks.setdefault(key, threading.Lock())
        with lock:
            metric = self._metrics.get(key)
            if metric is None:
                metric = self._create(spec, device, found)
                self._metrics[key] = metric
                self._availability.pop(spec.name, None)  # it may have just downloaded its weights
        return metric, lock, device

    def _tool_device(self, spec: ToolSpec) -> str:
        """The device, resolved without torch when `spec` has a torch-free kernel and the answer is the CPU
        ("cpu" requested, or "auto" on a machine with no GPU device at all), so that torch stays unloaded."""
        if self._device is None and kernels.numpy_kernel_applies(spec.metric, spec.metric_kwargs):
            requested = self.requested_device
            if requested == "cpu" or (requested in ("", "auto") and not backend.accelerator_possible()):
                self._device = "cpu"  # what _resolve_device would answer, without importing torch
        return self.device

    def _preflight(self, spec: ToolSpec) -> weights.WeightCheck:
        """Fail fast, without network or torch, when the tool's packages or files are missing."""
        found = weights.check(spec, self.weights_dir)
        if found.missing_modules:
            raise DependencyMissingError(f"{spec.name}: {weights.describe_missing(spec, found, self.weights_dir)}", tool=spec.name)
        if found.missing_files:
            what = weights.describe_missing(spec, found, self.weights_dir)
            if found.model_file_missing:
                raise WeightsMissingError(f"{spec.name}: {what}", tool=spec.name)
            if self.offline:
                raise WeightsMissingError(f"{spec.name}: {what}; offline mode is on, so nothing is downloaded", tool=spec.name)
            if not weights.can_reach_download_host():
                host = weights.download_host()[0]
                raise WeightsMissingError(
                    f"{spec.name}: {what}; cannot reach {host} to download it (copy the file there, or set HF_ENDPOINT to a mirror)",
                    tool=spec.name,
                )
            log.info("%s: downloading missing weights via pyiqa", spec.name)
        return found

    def _create(self, spec: ToolSpec, device: str, found: weights.WeightCheck) -> Any:
        kwargs = dict(spec.metric_kwargs)
        if spec.model_path:
            kwargs["pretrained_model_path"] = spec.model_path
        elif found.model_path is not None:
            kwargs["pretrained_model_path"] = str(found.model_path)

        try:
            fast = kernels.numpy_kernel_for(spec.metric, spec.metric_kwargs, device, kwargs.get("pretrained_model_path"))
        except (OSError, ValueError, KeyError, RuntimeError) as exc:  # an unreadable model file (ModelFileError, a .mat without the keys)
            raise ToolRunError(f"{spec.name}: {exc}", tool=spec.name) from exc
        if fast is not None:  # pyiqa's score without torch (iqa_tools.nss)
            return fast

        pyiqa, torch = backend.pyiqa(), backend.torch()
        kernel = kernels.kernel_for(spec.metric, spec.metric_kwargs, torch.device(device).type)
        if kernel is not None:  # the same score, faster (iqa_tools.kernels)
            return kernel

        path = kwargs.get("pretrained_model_path")
        if path and Path(path).suffix.lower() in (".pt", ".pth"):
            try:  # pyiqa itself loads some checkpoints with weights_only=False: refuse anything but data first
                torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:
                raise ToolRunError(f"{spec.name}: model file {path} is not a plain tensor file ({type(exc).__name__}); "
                                   "replace it (model files are data, never code)", tool=spec.name) from None

        try:
            # pyiqa prints progress ("Loading pretrained model …") to stdout; keep stdout for results.
            # redirect_stdout swaps the process-wide sys.stdout: two overlapping swaps on two threads
            # would leave it pointing at stderr for good, hence one creation at a time.
            with _stdout_swap_lock, contextlib.redirect_stdout(sys.stderr):
                return pyiqa.create_metric(spec.metric, device=torch.device(device), **kwargs)
        except Exception as exc:  # pyiqa raises anything from AssertionError to URLError
            raise ToolRunError(f"{spec.name}: pyiqa could not create metric {spec.metric!r}: {type(exc).__name__}: {exc}", tool=spec.name) from exc

    @staticmethod
    def _forward(metric: Any, lock: threading.Lock, spec: ToolSpec, x: Any, ref: Any) -> list[float]:
        """Raw scores of a batch: tensors for pyiqa metrics, lists of LoadedImages (and references) for a NumpyKernel."""
        if isinstance(metric, kernels.NumpyKernel):
            with lock:
                return [float(metric(img.pixels, None if r is None else r.pixels)) for img, r in zip(x, ref or [None] * len(x))]
        torch = backend.torch()
        with lock, torch.inference_mode():  # no autograd bookkeeping at all (pyiqa only turns grad off)
            out = metric(x, ref) if spec.mode == "FR" else metric(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return [float(v) for v in out.detach().reshape(-1).double().cpu().tolist()]

    @staticmethod
    def _inputs(metric: Any, imgs: list[LoadedImage], refs: Optional[list[LoadedImage]]) -> tuple[Any, Any]:
        """What `_forward` passes on: the images themselves for a NumpyKernel (it reads their pixels, so no
        tensor and no torch), else batched tensors."""
        if isinstance(metric, kernels.NumpyKernel):
            return imgs, refs
        torch = backend.torch()
        x = imgs[0].tensor if len(imgs) == 1 else torch.cat([im.tensor for im in imgs])
        r = None if refs is None else (refs[0].tensor if len(refs) == 1 else torch.cat([im.tensor for im in refs]))
        return x, r

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_mode(spec: ToolSpec, reference: Any) -> None:
        if spec.mode == "FR" and reference is None:
            raise ToolModeError(f"{spec.name} is a full-reference tool: it needs a reference image (reference= / --reference)", tool=spec.name)
        if spec.mode == "NR" and reference is not None:
            raise ToolModeError(f"{spec.name} is a no-reference tool: it takes no reference image; drop the reference or pick an FR tool", tool=spec.name)

    @staticmethod
    def _check_sizes(spec: ToolSpec, img: LoadedImage, ref: Optional[LoadedImage]) -> None:
        if ref is not None and ref.size != img.size:
            raise ImageSizeMismatchError(
                f"{img.label} is {img.width}×{img.height} but the reference {ref.label} is {ref.width}×{ref.height}; "
                "full-reference tools compare pixel by pixel: resize or crop them to the same size"
            )
        if min(img.size) < spec.min_side:
            raise ImageTooSmallError(
                f"{img.label} is {img.width}×{img.height}, too small for {spec.name}, which needs at least {spec.min_side} px on each side"
            )

    @staticmethod
    def _working(spec: ToolSpec, img: LoadedImage, ref: Optional[LoadedImage]) -> tuple[LoadedImage, Optional[LoadedImage]]:
        """The image (and reference) at the tool's working size: downscaled alike when larger."""
        small = fit_pixels(img, spec.working_pixels)
        if small is not img and min(small.size) < spec.min_side:
            return img, ref  # a very long thin image: keep it rather than shrink below the tool's minimum
        return small, (fit_pixels(ref, spec.working_pixels) if ref is not None else None)

    def _key(self, spec: ToolSpec, src: ImageSource, ref: Optional[ImageSource]) -> str:
        version = f"{spec.version}|w{spec.working_pixels}"  # the working size changes scores of large images
        return cache_key(src.sha256, spec.name, spec.metric, ref.sha256 if ref else None, version)

    def _finish(self, spec: ToolSpec, raw: float, img: LoadedImage, seconds: float, device: str, key: Optional[str]) -> ToolScore:
        label, notes = img.label, img.notes
        if not math.isfinite(raw):
            raise ToolRunError(f"{spec.name} returned a non-finite score ({raw}) for {label}", tool=spec.name)
        norm, how = self.normalize(spec.name, raw)
        if key is not None and self.cache is not None:
            self.cache.put(key, spec.name, raw, seconds, device)
        return ToolScore(tool=spec.name, raw_score=raw, normalized_score=norm, normalization=how, seconds=seconds, device=device,
                         notes=notes, working_size=img.size)

    def _cached(self, spec: ToolSpec, key: str, t0: float) -> Optional[ToolScore]:
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is None:
            return None
        norm, how = self.normalize(spec.name, hit.raw)
        return ToolScore(
            tool=spec.name, raw_score=hit.raw, normalized_score=norm, normalization=how,
            seconds=time.perf_counter() - t0, cached=True, device=hit.device,
        )  # fmt: skip

    # ------------------------------------------------------------------ scoring
    def score(self, name: str, image: Any, reference: Any = None, *, use_cache: bool = True) -> ToolScore:
        """Score one image (and reference, for FR tools). Raises ToolError subclasses or ImageError."""
        t0 = time.perf_counter()
        spec = self.spec(name)
        self._check_mode(spec, reference)
        src = read_source(image)
        ref_src = read_source(reference) if reference is not None else None
        use_cache = use_cache and self.cache is not None
        key = self._key(spec, src, ref_src) if use_cache else None  # hashing only when caching
        if key is not None:
            hit = self._cached(spec, key, t0)
            if hit is not None:
                return hit
        t_create = time.perf_counter()
        metric, lock, device = self._metric(spec)
        t0 += time.perf_counter() - t_create  # one-time creation (imports, weights) is not the tool's time
        img = decode(src, self.max_pixels)
        ref = decode(ref_src, self.max_pixels) if ref_src is not None else None
        self._check_sizes(spec, img, ref)
        img, ref = self._working(spec, img, ref)
        try:
            raw = self._forward(metric, lock, spec, *self._inputs(metric, [img], [ref] if ref else None))[0]
        except Exception as exc:
            raise ToolRunError(f"{spec.name} failed on {img.label}: {type(exc).__name__}: {exc}", tool=spec.name) from exc
        return self._finish(spec, raw, img, time.perf_counter() - t0, device, key)

    def score_many(
        self,
        name: str,
        images: Sequence[Any],
        references: Optional[Sequence[Any]] = None,
        *,
        use_cache: bool = True,
    ) -> list[ToolScore | ToolError | ImageError]:
        """Score many images; same-sized ones go through the metric in batches of `batch_size`.

        The result list is parallel to `images`: a ToolScore, or the exception for that item (bad image,
        missing reference, non-finite score). Problems of the tool itself (unknown, not installed, weights
        missing, NR tool given references) raise, since no item could succeed.
        """
        spec = self.spec(name)
        images = list(images)
        refs = list(references) if references is not None else [None] * len(images)
        if len(refs) != len(images):
            raise ValueError(f"{len(images)} images but {len(refs)} references")
        if spec.mode == "NR" and any(r is not None for r in refs):
            self._check_mode(spec, "given")
        use_cache = use_cache and self.cache is not None
        results: list[Any] = [None] * len(images)
        pending: list[tuple[int, ImageSource, Optional[ImageSource], Optional[str], float]] = []
        for i, (image, reference) in enumerate(zip(images, refs)):
            t0 = time.perf_counter()
            try:
                self._check_mode(spec, reference)
                src = read_source(image)
                ref_src = read_source(reference) if reference is not None else None
                key = self._key(spec, src, ref_src) if use_cache else None
                hit = self._cached(spec, key, t0) if key is not None else None
                if hit is not None:
                    results[i] = hit
                else:
                    pending.append((i, src, ref_src, key, time.perf_counter() - t0))
            except (ImageError, ToolError) as exc:
                results[i] = exc
        if not pending:
            return results

        metric, lock, device = self._metric(spec)
        for start in range(0, len(pending), self.batch_size):
            chunk = pending[start : start + self.batch_size]
            groups: dict[tuple, list[tuple[int, LoadedImage, Optional[LoadedImage], str, float]]] = {}
            for i, src, ref_src, key, spent in chunk:
                t0 = time.perf_counter()
                try:
                    img = decode(src, self.max_pixels)
                    ref = decode(ref_src, self.max_pixels) if ref_src is not None else None
                    self._check_sizes(spec, img, ref)
                    img, ref = self._working(spec, img, ref)
                except ImageError as exc:
                    results[i] = exc
                    continue
                groups.setdefault((img.size, ref.size if ref else None), []).append((i, img, ref, key, spent + time.perf_counter() - t0))
            for items in groups.values():
                t0 = time.perf_counter()
                try:
                    x, r = self._inputs(metric, [it[1] for it in items], [it[2] for it in items] if spec.mode == "FR" else None)
                    raws = self._forward(metric, lock, spec, x, r)
                    if len(raws) != len(items):
                        raise ToolRunError(f"{spec.name} returned {len(raws)} scores for a batch of {len(items)}")
                    share = (time.perf_counter() - t0) / len(items)
                    per_item = [(raw, share) for raw in raws]
                except Exception:
                    per_item = []  # isolate the failing item(s): run one by one
                    for _, img, ref, _, _ in items:
                        t1 = time.perf_counter()
                        try:
                            per_item.append((self._forward(metric, lock, spec, *self._inputs(metric, [img], [ref] if ref else None))[0], time.perf_counter() - t1))
                        except Exception as exc:
                            per_item.append((ToolRunError(f"{spec.name} failed on {img.label}: {type(exc).__name__}: {exc}", tool=spec.name), 0.0))
                for (i, img, _, key, spent), (raw, secs) in zip(items, per_item):
                    if isinstance(raw, Exception):
                        results[i] = raw
                        continue
                    try:
                        results[i] = self._finish(spec, raw, img, spent + secs, device, key)
                    except ToolError as exc:
                        results[i] = exc
        return results

    # ------------------------------------------------------------------ agent-facing run with fallbacks
    def fallback_candidates(self, exclude: Iterable[str] = ()) -> Iterator[str]:
        """DESIGN §4 order: the generic NR tools (NIQE, BRISQUE) always; then each NR tool of the
        table's `best_of` list that can run here, best first."""
        tried = set(exclude)
        for name in self.table.fallback.generic:
            if name not in tried:
                tried.add(name)
                yield name
        for name in self.table.fallback.best_of:
            if name not in tried and self.availability(name)[0]:
                tried.add(name)
                yield name

    def run(
        self,
        name: str,
        image: Any,
        reference: Any = None,
        *,
        object_name: str = "Global",
        distortion: str = "Overall",
        use_cache: bool = True,
        fallback: bool = True,
    ) -> list[ToolExecutionLog]:
        """Run a tool for the agents: one log per attempt; the last log with no error holds the score.

        Tool problems (unknown name, FR without reference, missing weights or packages, a crash, NaN,
        an image below the tool's minimum size) are logged with `error` and, if `fallback`, the
        fallback chain runs, each attempt logged with fallback=True and fallback_for=`name`.
        Bad input images (missing, corrupt, FR size mismatch) raise ImageError: no fallback can help.
        An NR tool given a reference just scores the image (the agents may pass one along regardless).
        """
        logs: list[ToolExecutionLog] = []

        def attempt(tool: str, ref: Any, is_fallback: bool) -> bool:
            t0 = time.perf_counter()
            try:
                s = self.score(tool, image, ref, use_cache=use_cache)
                logs.append(
                    s.to_log(object_name=object_name, distortion=distortion, fallback=is_fallback,
                             fallback_for=name if is_fallback else None)
                )  # fmt: skip
                return True
            except ImageTooSmallError as exc:  # another tool may accept a smaller image
                err: Exception = exc
            except ImageError:
                raise
            except ToolError as exc:
                err = exc
            except Exception as exc:  # a bug in a metric must not take the pipeline down
                err = ToolRunError(f"{tool}: unexpected {type(exc).__name__}: {exc}", tool=tool)
            log.info("tool %s failed%s: %s", tool, f" (fallback for {name})" if is_fallback else "", err)
            logs.append(
                ToolExecutionLog(
                    tool_name=tool, object_name=object_name, distortion=distortion,
                    execution_time=time.perf_counter() - t0, fallback=is_fallback,
                    fallback_for=name if is_fallback else None, error=str(err),
                )
            )  # fmt: skip
            return False

        name = self.resolve_name(name) or name
        primary_ref = reference
        if name in self.table.tools and self.table.tools[name].mode == "NR":
            primary_ref = None
        if attempt(name, primary_ref, False) or not fallback:
            return logs
        for candidate in self.fallback_candidates(exclude=[name]):
            if attempt(candidate, None, True):
                break
        return logs

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


_shared: dict[tuple, ToolRegistry] = {}
_shared_lock = threading.Lock()


def default_registry(
    table_paths: Optional[Iterable[Path | str]] = None,
    device: Optional[str] = None,
    cache: ToolCache | Literal[False] | None = None,
    weights_dir: Optional[Path | str] = None,
    offline: Optional[bool] = None,
    **kw: Any,
) -> ToolRegistry:
    """The process-wide registry for these settings, so metrics are created once and reused."""
    key = (
        tuple(str(p) for p in table_paths) if table_paths is not None else None,
        device,
        cache if cache is None or cache is False else id(cache),
        str(weights_dir) if weights_dir else None,
        offline,
        tuple(sorted(kw.items())),
    )
    with _shared_lock:
        reg = _shared.get(key)
        if reg is None:
            reg = _shared[key] = ToolRegistry(table_paths, device, cache, weights_dir, offline, **kw)
        return reg
