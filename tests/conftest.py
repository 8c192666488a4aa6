"""Shared test setup. Keep it small; fixtures used by one test file belong in that file."""
from __future__ import annotations

import os

import pytest

# Several tests hold our numpy kernels to pyiqa's torch results at rel 1e-5. MKL picks its code path by CPU: on
# an AVX-512 host torch's float32 reductions differ by up to ~2e-4 relative (NIQE 5.98380 vs 5.98448 on one
# image; ours is the same on every host). MKL's reproducible mode makes the reference the same on every CPU.
# Set before anything imports torch; subprocesses the tests start inherit it.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")


@pytest.fixture(autouse=True, scope="session")
def _hermetic_env(tmp_path_factory):
    """No test touches the user's cache or the network: our cache dir is a temp dir, the HF hub is offline."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path_factory.mktemp("agentic-iqa-cache")))
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))  # example images, default cache
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))  # no user config dir leaks in
    mp.delenv("AGENTIC_IQA_CONFIG", raising=False)
    mp.delenv("AGENTIC_IQA_OFFLINE", raising=False)
    mp.delenv("AGENTIC_IQA_TOOL_FILES", raising=False)
    mp.delenv("AGENTIC_IQA_WEIGHTS_DIR", raising=False)
    mp.delenv("AGENTIC_IQA_DEVICE", raising=False)
    yield
    mp.undo()
