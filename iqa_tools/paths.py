"""Where things live on disk: our cache directory, torch hub's and Hugging Face's caches.

Computed from environment variables the same way torch and huggingface_hub do, so that checking for
weight files never imports torch (`agentic-iqa tools list` stays fast).
"""
from __future__ import annotations

import os
from pathlib import Path

from iqa_tools import backend


def user_cache_dir() -> Path:
    """The platform's per-user cache folder for agentic-iqa (platformdirs: ~/.cache/agentic-iqa on Linux,
    honouring XDG_CACHE_HOME). `AGENTIC_IQA_CACHE_DIR` is a setting (`pipeline.cache.dir`), read by
    agentic_iqa's Settings, which passes the folder in."""
    from platformdirs import user_cache_dir as _user_cache_dir

    return Path(_user_cache_dir("agentic-iqa", appauthor=False))


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
