"""Where things live on disk: our cache directory, torch hub's and Hugging Face's caches.

Computed from environment variables the same way torch and huggingface_hub do, so that checking for
weight files never imports torch (`agentic-iqa tools list` stays fast).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from iqa_tools import backend


def user_cache_dir() -> Path:
    """Our cache folder: `AGENTIC_IQA_CACHE_DIR`, else the platform's user cache + `agentic-iqa`."""
    env = os.environ.get("AGENTIC_IQA_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "agentic-iqa"


def torch_hub_dir() -> Path:
    """`torch.hub.get_dir()`: pyiqa keeps its files in `<this>/pyiqa`, torchvision in `<this>/checkpoints`."""
    torch = backend.torch_if_loaded()
    if torch is not None:  # honour torch.hub.set_dir() if someone called it
        return Path(torch.hub.get_dir())
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    torch_home = os.environ.get("TORCH_HOME") or os.path.join(xdg, "torch")
    return Path(os.path.expanduser(torch_home)) / "hub"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache (timm and transformers weights)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expanduser(xdg)) / "huggingface" / "hub"
