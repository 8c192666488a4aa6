"""Python API: `assess(...)`, `assess_async(...)` and the reusable `Assessor`.

An `Assessor` holds what is expensive to build — the tool registry (metrics created once), the LMs
(one HTTP client each), the compiled graph — and reuses it for every assessment. `assess()` keeps one
per configuration, so repeated calls in a process pay the set-up once. DSPy's global settings are
never changed: each role's LM is applied with `dspy.context`.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel

from agentic_iqa.config import ROLES, ConfigError, Settings, load_settings
from agentic_iqa.redact import redact_data
from agentic_iqa.state import ExecutorOutput, PlannerOutput, SummarizerOutput, TraceEvent

UNREACHABLE_BACKEND = "offline analyst (LM unreachable: "
UNUSABLE_BACKEND = "offline analyst (no usable model reply: "
DEFAULT_SCORING_QUERY = "Rate the overall quality of this image."
# The smallest side an image to assess may have; smaller ones are refused as bad input. The offline
# statistics need whole 8×8 blocks clear of the border (offline.stats.MIN_SIDE, 24 px), and their frequency
# bands and block grid need more than that to mean anything: clean photos downscaled to 40 px on the short
# side all read as severe damage (E: "extreme motion blur", "JPEG blocking"), while from 48 px (six 8×8
# blocks) the colour photos tried read clean (A/B). BRISQUE, the offline default tool, needs 32 px.
MIN_IMAGE_SIDE = 48


class AssessmentResult(BaseModel):
    """The answer plus everything needed to explain and audit it."""

    query: str
    image: str
    reference: Optional[str] = None
    mode: Literal["score", "answer"]
    backend: str                         # who answered: "vlm (openai/gpt-4o)", "offline analyst", ...
    result: SummarizerOutput
    plan: Optional[PlannerOutput] = None
    evidence: Optional[ExecutorOutput] = None
    replans: int = 0
    timings: dict[str, float] = {}
    total_seconds: float = 0.0
    lm_calls: int = 0
    retries: int = 0
    image_bytes_sent: int = 0           # image data in the VLM requests made (image_transport decides how much)
    fallbacks: list[str] = []
    notes: list[str] = []
    trace: list[TraceEvent] = []

    # Shortcuts for the common questions.
    @property
    def score(self) -> Optional[float]:
        return self.result.score

    @property
    def level(self) -> Optional[str]:
        return self.result.level

    @property
    def answer(self) -> str:
        return self.result.final_answer

    @property
    def lm_unreachable(self) -> bool:
        """True when the LM service failed during this assessment and the offline analyst answered."""
        return self.backend.startswith(UNREACHABLE_BACKEND)


def decide_mode(query: str) -> Literal["score", "answer"]:
    """Scoring (level A–E + fused score) for rating requests; explanation/QA for questions and options."""
    from agentic_iqa.agents.planner_rules import RATING_WORDS, WH_QUESTION, YES_NO_QUESTION, mcq_options

    if mcq_options(query):
        return "answer"
    if RATING_WORDS.search(query) and not (YES_NO_QUESTION.match(query) or WH_QUESTION.match(query)):
        return "score"
    return "answer"


def prepare_query(query: Optional[str], max_chars: int) -> tuple[str, list[str]]:
    notes = []
    text = (query or "").strip()
    if not text:
        notes.append(f"no query given: using the scoring query {DEFAULT_SCORING_QUERY!r}")
        text = DEFAULT_SCORING_QUERY
    if len(text) > max_chars:
        notes.append(f"query truncated from {len(text)} to {max_chars} characters (pipeline.max_query_chars)")
        text = text[:max_chars]
    return text, notes


class Assessor:
    """Reusable assessment engine for one configuration."""

    def __init__(self, settings: Optional[Settings] = None, *, registry: Any = None, roles: Any = None,
                 make_lm: Optional[Callable] = None):
        """`make_lm(role_settings, role_name)` builds each role's LM (default `agentic_iqa.lm.build_lm`)."""
        self.settings = settings or load_settings()
        self._make_lm = make_lm
        self._registry = registry
        self._roles = roles
        self._graph = None
        self._agraph = None
        self._lock = threading.Lock()

    # Built lazily: `Assessor()` is cheap; the first assessment pays for torch/pyiqa/DSPy imports.
    @property
    def registry(self):
        if self._registry is None:
            self._registry = self.settings.build_registry()
        return self._registry

    @property
    def roles(self):
        with self._lock:
            if self._roles is None:
                self._roles = make_roles(self.settings, self._make_lm)
            return self._roles

    @property
    def graph(self):
        with self._lock:
            if self._graph is None:
                from agentic_iqa.graph import build_graph

                self._graph = build_graph()
            return self._graph

    @property
    def agraph(self):
        """The same graph with async nodes, for `assess_async` (`ainvoke`)."""
        with self._lock:
            if self._agraph is None:
                from agentic_iqa.graph import build_graph

                self._agraph = build_graph(asynchronous=True)
            return self._agraph

    def assess(
        self,
        image: Any,  # a path, or in memory: see ACCEPTED_INPUTS
        query: Optional[str] = None,
        reference: Any = None,
        *,
        mode: Literal["auto", "score", "answer"] = "auto",
        use_cache: bool = True,
        on_event: Optional[Callable[[dict], None]] = None,
        resize_reference: bool = False,
    ) -> AssessmentResult:
        """`resize_reference`: a reference of another size is resized to the image's size (bicubic,
        written losslessly to a temporary file) instead of being refused."""
        t0 = time.perf_counter()
        run = self._prepare(image, query, reference, mode, use_cache, resize_reference)
        try:
            graph, state, config, deps = self.graph, run.state, {"recursion_limit": 50}, self._deps()
            if on_event is None:
                final = graph.invoke(state, config=config, context=deps)
            else:  # progress: the nodes' stream-writer events, then the final state
                final = state
                for stream, chunk in graph.stream(state, config=config, context=deps, stream_mode=["custom", "values"]):
                    if stream == "custom":
                        on_event(chunk)
                    else:
                        final = chunk
        finally:
            run.cleanup()
        return run.result(final, t0)

    __call__ = assess  # an Assessor is the callable `create_assessor` returns: `assessor("photo.jpg")`

    async def assess_async(
        self,
        image: Any,  # a path, or in memory: see ACCEPTED_INPUTS
        query: Optional[str] = None,
        reference: Any = None,
        *,
        mode: Literal["auto", "score", "answer"] = "auto",
        use_cache: bool = True,
        on_event: Optional[Callable[[dict], None]] = None,
        resize_reference: bool = False,
    ) -> AssessmentResult:
        """`assess` for asyncio code: the graph runs with `ainvoke` and the model calls with DSPy's `acall`
        on the event loop (no thread waits on the model); decoding, statistics and tools run in worker
        threads. Many assessments can be awaited together (`asyncio.gather`)."""
        t0 = time.perf_counter()
        run = await asyncio.to_thread(self._prepare, image, query, reference, mode, use_cache, resize_reference)
        try:
            graph, state, config = self.agraph, run.state, {"recursion_limit": 50}
            deps = await asyncio.to_thread(self._deps)  # the first call builds the registry and LMs
            if on_event is None:
                final = await graph.ainvoke(state, config=config, context=deps)
            else:
                final = state
                async for stream, chunk in graph.astream(state, config=config, context=deps,
                                                         stream_mode=["custom", "values"]):
                    if stream == "custom":
                        on_event(chunk)
                    else:
                        final = chunk
        finally:
            run.cleanup()
        return run.result(final, t0)

    def _deps(self):
        from agentic_iqa.agents.context import GraphContext

        return GraphContext(registry=self.registry, settings=self.settings, roles=self.roles)

    def _prepare(self, image, query, reference, mode, use_cache, resize_reference) -> "_Run":
        """Check the inputs before any LM call is spent, and build the graph's initial state."""
        folders: list = []  # temporary copies (in-memory inputs, a resized reference), removed after the run
        try:
            return self._prepare_in(folders, image, query, reference, mode, use_cache, resize_reference)
        except BaseException:
            for folder in folders:
                folder.cleanup()
            raise

    def _prepare_in(self, folders, image, query, reference, mode, use_cache, resize_reference) -> "_Run":
        from iqa_tools import ImageSizeMismatchError, load_image
        from iqa_tools.examples import resolve_example

        self.registry  # a device that does not exist here is a configuration error before any work
        if mode not in ("auto", "score", "answer"):  # "SCORE" or a typo ran answer mode silently (no score)
            raise ValueError(f"mode must be 'auto', 'score' or 'answer' (got {mode!r})")
        if query is not None and not isinstance(query, str):
            raise TypeError(f"query must be a string or None (got {type(query).__name__}: {query!r:.80})")
        _check_input_type(image, "image")
        if reference is not None:
            _check_input_type(reference, "reference")
        image, reference = resolve_example(image), resolve_example(reference)  # "example:chelsea", as in the CLI
        p = self.settings.pipeline
        text, notes = prepare_query(query, p.max_query_chars)
        if self.settings.config_files:
            notes.append("configuration read from " + ", ".join(map(str, self.settings.config_files)))
        shown: dict[str, str] = {}  # what the result reports for inputs that were copied to a temporary file
        # Strings go to the loader as given, so that a URL gets its "download it first" hint instead of
        # "file not found".
        loaded = load_image(image if isinstance(image, str) else _as_path(image), max_pixels=p.max_image_pixels,
                            min_side=MIN_IMAGE_SIDE)
        notes += list(getattr(loaded, "notes", []) or [])
        if _in_memory(image):  # tools and roles read files: a copy in a temporary folder of our own
            image_path = _temporary_copy(loaded, "image", folders, notes)
            shown["image"] = loaded.label
        else:
            image_path = Path(image)
        label, (width, height) = loaded.label, loaded.size
        image_sha = loaded.sha256 if reference is not None else None
        # The same picture in another file (re-saved, another format) is no reference either: its pixels are compared.
        image_pixels_sha = loaded.pixels_sha256 if reference is not None else None
        # The decoded pixels are not needed any more (tools and roles read the file themselves): freed before
        # the reference is decoded, so a large pair is never held twice here.
        del loaded
        reference_path = None
        if reference is not None:
            ref = load_image(reference if isinstance(reference, str) else _as_path(reference), max_pixels=p.max_image_pixels)
            notes += [f"reference: {n}" for n in (getattr(ref, "notes", []) or [])]
            reference_path = Path(reference) if not _in_memory(reference) else None
            if ref.size != (width, height):
                # Full-reference tools compare pixel by pixel: refuse now rather than after the LM calls.
                if not resize_reference:
                    raise ImageSizeMismatchError(
                        f"{label} is {width}×{height} but the reference {ref.label} is "
                        f"{ref.width}×{ref.height}; full-reference tools compare pixel by pixel: crop or resize them "
                        "to the same size, or pass --resize-reference (resize_reference=True) to resize the reference"
                    )
                folder, resized = _resized_reference(ref, (width, height))
                folders.append(folder)
                shown["reference"] = str(reference_path) if reference_path is not None else ref.label
                reference_path = resized
                notes.append(f"reference resized from {ref.width}×{ref.height} to {width}×{height} (bicubic) for full-reference tools")
            else:
                if reference_path is None:
                    reference_path = _temporary_copy(ref, "reference", folders, notes)
                    shown["reference"] = ref.label
                if ref.sha256 == image_sha:
                    notes.append("the reference is the same file content as the image: full-reference tools will report perfect quality")
                elif ref.pixels_sha256 == image_pixels_sha:
                    notes.append("the reference has the same pixels as the image (another file of the same picture): "
                                 "full-reference tools will report perfect quality")
            del ref
        state = {
            "query": text,
            "image_path": str(image_path),
            "reference_path": str(reference_path) if reference_path else None,
            "scoring": (decide_mode(text) if mode == "auto" else mode) == "score",
            "use_cache": use_cache,
            "backend": self.roles.name,
            "trace": [TraceEvent(stage="input", kind="note", message=n) for n in notes],
            "lm_calls": 0,
            "retries": 0,
            "image_bytes": 0,
        }
        return _Run(state, folders, shown)


#: What `assess` takes as an image (or reference): a file, or the image in memory.
ACCEPTED_INPUTS = ("a file path (str or pathlib.Path, or 'example:NAME'), a PIL image, a numpy array "
                   "(H×W, H×W×3 or H×W×4; uint8, uint16 or float in [0, 1]), a torch tensor (3×H×W) or encoded image bytes")


def _in_memory(src: Any) -> bool:
    return not isinstance(src, (str, os.PathLike))


def _as_path(src: Any) -> Any:
    return Path(src) if isinstance(src, os.PathLike) else src


def _check_input_type(src: Any, what: str) -> None:
    """A clear TypeError for what no loader takes (before: os.fspath's "expected str, bytes or os.PathLike")."""
    from iqa_tools.images import is_image_input

    if is_image_input(src):
        return
    raise TypeError(f"{what}: cannot assess a {type(src).__module__}.{type(src).__qualname__}; pass {ACCEPTED_INPUTS}")


def _temporary_copy(loaded, role: str, folders: list, notes: list[str]) -> Path:
    """An in-memory input as a file the tools and roles can read, in a temporary folder removed after the
    run: encoded bytes as they are, pixels as a PNG (lossless at 8 bits; deeper ones are rounded to 8 bits,
    as Pillow reads 16-bit colour PNGs anyway)."""
    import tempfile

    import numpy as np
    from PIL import Image

    folder = tempfile.TemporaryDirectory(prefix="agentic-iqa-input-")
    folders.append(folder)
    if loaded.source.data is not None:  # encoded bytes: the file is exactly what was given
        ext = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif"}.get(loaded.format or "", ".img")
        path = Path(folder.name) / f"{role}{ext}"
        path.write_bytes(loaded.source.data)
        return path
    pixels = loaded.pixels
    if pixels.dtype != np.uint8:
        pixels = (pixels * 255.0 + 0.5).clip(0, 255).astype(np.uint8)
        notes.append(f"{'reference: ' if role == 'reference' else ''}{loaded.label}: pixels rounded to 8 bits for the tools")
    path = Path(folder.name) / f"{role}.png"
    Image.fromarray(np.ascontiguousarray(pixels), "RGB").save(path, format="PNG")
    return path


class _Run:
    """One prepared assessment: its initial state, the temporary copies to remove after, and what the
    result reports instead of a temporary copy's path (the user's reference, an in-memory input's label)."""

    def __init__(self, state: dict, folders: list, shown: dict[str, str]):
        self.state, self._folders, self._shown = state, folders, shown

    def cleanup(self) -> None:
        for folder in self._folders:
            folder.cleanup()

    def result(self, final: dict, t0: float) -> AssessmentResult:
        result = result_from_state(final, total_seconds=time.perf_counter() - t0)
        if self._shown:
            result = result.model_copy(update=self._shown)
        return result


def _resized_reference(ref, size: tuple[int, int]):
    """The reference resized to `size` as a lossless PNG in a temporary folder: (folder, path)."""
    import tempfile

    import numpy as np
    from PIL import Image

    arr = ref.pixels if ref.pixels.dtype == np.uint8 else (ref.pixels * 255.0 + 0.5).clip(0, 255).astype(np.uint8)
    folder = tempfile.TemporaryDirectory(prefix="agentic-iqa-ref-")
    path = Path(folder.name) / "reference_resized.png"
    Image.fromarray(arr, "RGB").resize(size, Image.BICUBIC).save(path, format="PNG")
    return folder, path


def result_from_state(final: dict, total_seconds: float = 0.0) -> AssessmentResult:
    """The result of one assessment, from the graph's final state alone."""
    from agentic_iqa.state import fallbacks, notes, timings

    events = final.get("trace") or []
    unreachable = final.get("lm_unreachable")
    backend = final["backend"] if not unreachable else f"{UNREACHABLE_BACKEND}{unreachable})"
    called = {ev.stage for ev in events if ev.kind == "lm_call"}
    fell_back = {ev.stage: ev.message for ev in events if ev.kind == "fallback"}
    if not unreachable and called and called <= fell_back.keys():
        # Every stage that asked the model fell back: the answer is the analyst's, not the model's (a server
        # answering 200 with a body that is no chat completion, or a model that never writes the format).
        why = fell_back[next(ev.stage for ev in events if ev.kind == "lm_call")].split(" → ")[0]
        backend = f"{UNUSABLE_BACKEND}{why})"
    result = AssessmentResult(
        query=final["query"],
        image=final["image_path"],
        reference=final.get("reference_path"),
        mode="score" if final["scoring"] else "answer",
        backend=backend,
        result=final["summarizer_result"],
        plan=final.get("plan"),
        evidence=final.get("executor_evidence"),
        replans=final.get("replans", 0),
        timings={k: round(v, 4) for k, v in timings(events).items()},
        total_seconds=round(total_seconds, 4),
        lm_calls=final.get("lm_calls", 0),
        retries=final.get("retries", 0),
        image_bytes_sent=final.get("image_bytes", 0),
        fallbacks=fallbacks(events),
        notes=notes(events),
        trace=events,
    )
    # Everything in a result is printed, saved or cached: the model's own text (which may repeat a key it
    # saw) and the error messages of servers that echo keys included. One pass masks them all.
    return AssessmentResult.model_validate(redact_data(result.model_dump()))


def make_roles(settings: Settings, make_lm: Optional[Callable] = None):
    """VLM roles when a model is configured (with the offline analyst as their fallback), else the analyst."""
    from agentic_iqa.offline.analyst import OfflineRoles

    if not settings.uses_model and settings.pipeline.backend != "vlm":
        return OfflineRoles()
    if not settings.uses_model:
        raise ConfigError("backend is 'vlm' but no model is configured: pass --lm MODEL or set configs/model_backends.yaml")
    missing = [r for r in ROLES if not settings.backends.role(r).model]
    if missing:  # each such role's every call failed with "no LM configured" and fell back, under a "vlm" label
        given = ", ".join(f"{r} ({settings.backends.role(r).model})" for r in ROLES if r not in missing)
        raise ConfigError(
            f"a model is set for {given} but not for {', '.join(missing)} (model_backends.yaml): the three roles share "
            "one VLM, so set `model` for every role, or pass --lm MODEL (AGENTIC_IQA_LM) for all of them")
    from agentic_iqa.agents.vlm import VLMRoles

    from agentic_iqa.lm import build_role_lms

    lms = build_role_lms(settings.backends, make=make_lm) if make_lm is not None else None
    return VLMRoles(settings, offline=OfflineRoles(), lms=lms)


_assessors: dict[str, Assessor] = {}
_assessors_lock = threading.Lock()


def get_assessor(config: Optional[str | Path] = None, lm: Optional[str] = None, **overrides) -> Assessor:
    """The shared Assessor for this configuration (built once per process)."""
    settings = load_settings(config, lm=lm, **overrides)
    key = settings.model_dump_json()
    with _assessors_lock:
        if key not in _assessors:
            _assessors[key] = Assessor(settings)
        return _assessors[key]


def create_assessor(
    lm: Optional[str] = None,
    *,
    device: Optional[str] = None,
    offline: bool = False,
    api_base: Optional[str] = None,
    config: Optional[str | Path] = None,
) -> Assessor:
    """A reusable assessor, in the shape of pyiqa's `create_metric`: build once, call per image.

    >>> iqa = create_assessor(lm="openai/gpt-4o", device="cpu")   # doctest: +SKIP
    >>> iqa("photo.jpg").score                                    # doctest: +SKIP

    `lm`: a DSPy model string for all roles (None: the configured LM, else the offline analyst);
    `device`: where the tools run (auto | cpu | cuda | cuda:1 | mps); `offline`: the offline analyst
    even when an LM is configured. Settings come from the configuration in its documented order."""
    settings = load_settings(config, lm=lm, api_base=api_base, backend="offline" if offline else None)
    if device is not None:
        tools = settings.pipeline.tools.model_copy(update={"device": device})
        settings.pipeline = settings.pipeline.model_copy(update={"tools": tools})
    return Assessor(settings)


def assess(
    image: Any,
    query: Optional[str] = None,
    reference: Any = None,
    lm: Optional[str] = None,
    config: Optional[str | Path] = None,
    **kw,
) -> AssessmentResult:
    """Assess one image. `lm` is a DSPy model string for all roles (None: configured LM, else offline).
    `image` / `reference`: a file path, or the image in memory (see ACCEPTED_INPUTS; a PIL image or an
    array is written to a temporary PNG that is removed afterwards, and the result names it by its label).

    >>> r = assess("photo.jpg")                       # doctest: +SKIP
    >>> r.score, r.level, r.answer                    # doctest: +SKIP
    """
    settings_kw = {k: kw.pop(k) for k in ("api_base", "backend") if k in kw}
    return get_assessor(config, lm, **settings_kw).assess(image, query, reference, **kw)


async def assess_async(image, query=None, reference=None, lm=None, config=None, **kw) -> AssessmentResult:
    settings_kw = {k: kw.pop(k) for k in ("api_base", "backend") if k in kw}
    return await get_assessor(config, lm, **settings_kw).assess_async(image, query, reference, **kw)
