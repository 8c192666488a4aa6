"""The one door to torch and pyiqa: imported lazily, once, by one thread at a time.

Two threads importing torch at once in a fresh process can see it half-initialized (`module 'torch' has no
attribute 'hub'`, `KeyError: 'torch'`, even a crash at exit): Python's per-module import locks do not cover
torch's own nested imports. Every import of torch or pyiqa in this project goes through here.
"""
from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Optional

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
        __import__(name)
        _done[name] = sys.modules[name]


def torch() -> ModuleType:
    """`import torch`, safely from any thread."""
    return _load("torch")


def pyiqa() -> ModuleType:
    """`import pyiqa` (and torch first), safely from any thread."""
    return _load("pyiqa")


def torch_if_loaded() -> Optional[ModuleType]:
    """torch if some code has finished importing it, else None (never imports, never waits)."""
    if "torch" in _done:
        return _done["torch"]
    module = sys.modules.get("torch")
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None  # absent, or being imported by another thread right now
    return module
