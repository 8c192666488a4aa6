"""The one door to torch and pyiqa: imported lazily, once, by one thread at a time.

Two threads importing torch at once in a fresh process can see it half-initialized (`module 'torch' has no
attribute 'hub'`, `KeyError: 'torch'`, even a crash at exit): Python's per-module import locks do not cover
torch's own nested imports. Every import of torch or pyiqa in this project goes through here, so this is also where the process is
set up for tool runs, once: torch's intra-op threads from the cores this process may really use
(affinity and cgroup quota), and glibc's malloc thresholds (see `tune_malloc`).
"""
from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Optional

log = logging.getLogger("iqa_tools")

_import_lock = threading.Lock()
_done: dict[str, ModuleType] = {}


def _load(name: str) -> ModuleType:
    module = _done.get(name)
    if module is None:
        with _import_lock:
            if name not in _done:
                if name == "pyiqa":
                    _load_unlocked("torch")
                _load_unlocked(name)
            module = _done[name]
    return module


def _load_unlocked(name: str) -> None:
    if name not in _done:
        if name == "torch":
            tune_malloc()
        __import__(name)
        if name == "torch":
            _set_threads(sys.modules["torch"])
        _done[name] = sys.modules[name]


def torch() -> ModuleType:
    """`import torch`, safely from any thread."""
    return _load("torch")


def pyiqa() -> ModuleType:
    """`import pyiqa` (and torch first), safely from any thread."""
    return _load("pyiqa")


def pyiqa_module(name: str) -> ModuleType:
    """A submodule of pyiqa (e.g. "pyiqa.archs.func_util"), imported after pyiqa itself, under the lock."""
    if not name.startswith("pyiqa."):
        raise ValueError(f"{name!r} is not a pyiqa module")
    pyiqa()
    return _load(name)


def torch_if_loaded() -> Optional[ModuleType]:
    """torch if some code has finished importing it, else None (never imports, never waits)."""
    if "torch" in _done:
        return _done["torch"]
    module = sys.modules.get("torch")
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None  # absent, or being imported by another thread right now
    return module


def accelerator_possible() -> bool:
    """Whether torch could find a GPU here, answered without importing torch: False only on Linux with no
    NVIDIA (/dev/nvidia*), ROCm (/dev/kfd) or WSL (/dev/dxg) device node, where CUDA, ROCm and MPS all report
    unavailable. Elsewhere (macOS: MPS; Windows) only torch can tell, so True."""
    if not sys.platform.startswith("linux"):
        return True
    dev = Path("/dev")
    return any(dev.glob("nvidia*")) or (dev / "kfd").exists() or (dev / "dxg").exists()


# ── cores and threads ───────────────────────────────────────────────────────────────────────────


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def cgroup_cpu_limit(root: Path | str = "/sys/fs/cgroup", proc_cgroup: Path | str = "/proc/self/cgroup") -> Optional[float]:
    """CPUs this process's cgroup may use (quota / period), or None when unlimited or unknown.

    cgroup v2 (`cpu.max`: "max 100000" or "150000 100000") and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`,
    -1 = unlimited) are both read, for the process's own group and each of its ancestors (a parent's
    quota binds its children too); the smallest quota wins."""
    root, text = Path(root), _read(Path(proc_cgroup)) or ""
    limits: list[float] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        parts = [p for p in group.strip("/").split("/") if p and p not in (".", "..")]
        if hierarchy == "0" and controllers == "":  # v2: one unified tree
            bases = [root]
        elif "cpu" in controllers.split(","):
            bases = [root / controllers, root / "cpu", root / "cpu,cpuacct"]
        else:
            continue
        for base in dict.fromkeys(bases):
            for depth in range(len(parts), -1, -1):
                folder = base.joinpath(*parts[:depth])
                quota = period = None
                cpu_max = _read(folder / "cpu.max")
                if cpu_max:
                    fields = cpu_max.split()
                    if len(fields) == 2 and fields[0] != "max":
                        quota, period = fields
                else:
                    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                try:
                    q, p = float(quota), float(period)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    continue
                if q > 0 and p > 0:
                    limits.append(q / p)
    return min(limits) if limits else None


def available_cores(root: Path | str = "/sys/fs/cgroup", proc_cgroup: Path | str = "/proc/self/cgroup") -> int:
    """Cores this process may really use: its CPU affinity, capped by its cgroup's quota (rounded up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        cores = min(cores, math.ceil(limit - 1e-9))
    return max(1, cores)


THREADS_ENV = "AGENTIC_IQA_TORCH_THREADS"


def tool_threads() -> int:
    """torch intra-op threads for tool runs: AGENTIC_IQA_TORCH_THREADS, else OMP_NUM_THREADS, else 1.

    One thread by measurement (benchmarks/RESULTS.md, "Speed (issue 14)", threads_bench.py): on the
    shared 2-core machine 2 threads were slower for PIQE and NIQE with 8 images in flight, and much
    slower per item under load in the Ray measurements. Never more than `available_cores()`."""
    for var in (THREADS_ENV, "OMP_NUM_THREADS"):
        try:
            wanted = int(os.environ.get(var, ""))
        except ValueError:
            continue
        if wanted >= 1:
            return min(wanted, available_cores())
    return 1


def _set_threads(torch: ModuleType) -> None:
    try:
        torch.set_num_threads(tool_threads())
    except RuntimeError as exc:  # pragma: no cover - set after parallel work started elsewhere
        log.debug("torch threads left at %s: %s", torch.get_num_threads(), exc)


# ── glibc malloc ────────────────────────────────────────────────────────────────────────────────

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD = 256 * 1024 * 1024
MALLOC_ENV = "AGENTIC_IQA_MALLOC_TUNING"
_malloc_tuned: Optional[bool] = None


def tune_malloc() -> bool:
    """Keep tool-sized scratch buffers in the heap instead of mmap-ing and unmapping them per call.

    pyiqa's weight-free metrics allocate float buffers of a few MB per op, call after call. glibc serves
    blocks above its mmap threshold (128 KB at start) with a fresh mmap, so every call pays the kernel to
    map and zero pages again; most of SSIM's time went there. Raising the mmap threshold to 32 MB and the
    trim threshold to 256 MB lets freed buffers be reused. Cost: freed memory up to 256 MB above the live
    set may stay mapped (see RESULTS.md). Once per process; AGENTIC_IQA_MALLOC_TUNING=0 turns it off.
    Returns whether the thresholds were set (False off glibc)."""
    global _malloc_tuned
    if _malloc_tuned is None:
        _malloc_tuned = False
        if os.environ.get(MALLOC_ENV, "1").strip().lower() not in ("0", "false", "no", "off") and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None)
                mallopt = libc.mallopt
                mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                _malloc_tuned = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            except (OSError, AttributeError):  # musl and others: no mallopt
                pass
    return _malloc_tuned
