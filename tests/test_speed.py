"""Issue 14: cores and threads from affinity + cgroup quota, malloc tuning, the decoded-image cache, and
the working resolution of the offline statistics. (Timings are benchmarks' business, never asserted here.)"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from agentic_iqa.offline import stats as st
from iqa_tools import backend, images
from iqa_tools.images import decode, load_image, read_source

ROOT = Path(__file__).resolve().parents[1]


# ── cores from cgroup files ──────────────────────────────────────────────────────────────────────


def _cgroup(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc_file = tmp_path / "proc_self_cgroup"
    proc_file.write_text(proc)
    return root, proc_file


def test_cgroup_v2_quota_of_own_group(tmp_path):
    root, proc = _cgroup(tmp_path, "0::/job/worker\n", {"job/worker/cpu.max": "150000 100000\n", "cpu.max": "max 100000\n"})
    assert backend.cgroup_cpu_limit(root, proc) == pytest.approx(1.5)


def test_cgroup_v2_parent_quota_binds_the_child(tmp_path):
    root, proc = _cgroup(tmp_path, "0::/job/worker\n", {"job/cpu.max": "100000 100000", "job/worker/cpu.max": "max 100000"})
    assert backend.cgroup_cpu_limit(root, proc) == pytest.approx(1.0)


def test_cgroup_v2_unlimited_is_none(tmp_path):
    root, proc = _cgroup(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
    assert backend.cgroup_cpu_limit(root, proc) is None


def test_cgroup_v1_cfs_quota(tmp_path):
    proc = "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    root, proc = _cgroup(tmp_path, proc, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000",
                                          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
    assert backend.cgroup_cpu_limit(root, proc) == pytest.approx(0.5)


def test_cgroup_v1_minus_one_is_unlimited_and_garbage_is_ignored(tmp_path):
    root, proc = _cgroup(tmp_path, "1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert backend.cgroup_cpu_limit(root, proc) is None
    root, proc = _cgroup(tmp_path / "b", "0::/g\n", {"g/cpu.max": "lots of cpus"})
    assert backend.cgroup_cpu_limit(root, proc) is None
    assert backend.cgroup_cpu_limit(tmp_path / "missing", tmp_path / "missing_proc") is None


def test_available_cores_is_affinity_capped_by_quota_rounded_up(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    root, proc = _cgroup(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
    assert backend.available_cores(root, proc) == affinity
    root, proc = _cgroup(tmp_path / "q", "0::/\n", {"cpu.max": "50000 100000"})  # half a core: still one thread
    assert backend.available_cores(root, proc) == 1
    root, proc = _cgroup(tmp_path / "r", "0::/\n", {"cpu.max": f"{(affinity + 8) * 100000} 100000"})
    assert backend.available_cores(root, proc) == affinity  # a quota above the affinity does not add cores


def test_tool_threads_from_environment(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(backend.THREADS_ENV, raising=False)
    assert backend.tool_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv(backend.THREADS_ENV, "999")
    assert backend.tool_threads() == backend.available_cores()  # never more than the cores
    monkeypatch.setenv(backend.THREADS_ENV, "nonsense")
    assert backend.tool_threads() == 1  # falls through to OMP_NUM_THREADS


def test_fresh_process_sets_threads_and_malloc_once_torch_loads():
    code = ("import sys; from iqa_tools import backend; t = backend.torch(); "
            "print(t.get_num_threads(), backend.tune_malloc())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", backend.THREADS_ENV, backend.MALLOC_ENV)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, check=True, timeout=300).stdout.split()
    assert out[0] == "1"
    assert out[1] == ("True" if sys.platform.startswith("linux") else "False")
    off = subprocess.run([sys.executable, "-c", "from iqa_tools import backend; print(backend.tune_malloc())"], cwd=ROOT,
                         env=dict(env, PYTHONPATH=str(ROOT), **{backend.MALLOC_ENV: "0"}), capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert off == "False"


# ── decoded-image cache ──────────────────────────────────────────────────────────────────────────


def _jpeg(seed: int, size=(64, 48)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def test_same_content_is_decoded_once_and_shared_read_only(tmp_path, monkeypatch):
    images.clear_decoded_cache()
    calls = []
    real = images._decode
    monkeypatch.setattr(images, "_decode", lambda src, *rest: calls.append(src.label) or real(src, *rest))
    a, b = tmp_path / "a.jpg", tmp_path / "b.jpg"
    a.write_bytes(_jpeg(1))
    b.write_bytes(_jpeg(1))  # same bytes under another name
    first, second = load_image(a), load_image(b)
    assert calls == [str(a)]
    assert second.label == str(b) and second.size == first.size and second.format == "JPEG"
    assert np.shares_memory(first.pixels, second.pixels)
    with pytest.raises(ValueError):
        second.pixels[0, 0, 0] = 1  # shared: nobody may change it under another reader
    assert first.tensor.data_ptr() != second.tensor.data_ptr()  # each tensor is its own copy
    second.tensor.mul_(0)
    assert first.pixels.any()
    a.write_bytes(_jpeg(2))  # new content at the same path: decoded again
    load_image(a)
    assert calls == [str(a), str(a)]


def test_decoded_cache_is_bounded(monkeypatch):
    images.clear_decoded_cache()
    monkeypatch.setattr(images, "DECODED_CACHE_ENTRIES", 3)
    for seed in range(6):
        decode(read_source(_jpeg(seed)))
    assert len(images._decoded) == 3
    assert images._decoded_bytes == sum(v[0].nbytes for v in images._decoded.values())
    monkeypatch.setattr(images, "DECODED_CACHE_BYTES", 64 * 48 * 3 * 2)  # room for two such images
    newest = read_source(_jpeg(99))
    decode(newest)
    assert len(images._decoded) == 2 and next(reversed(images._decoded))[0] == newest.sha256
    monkeypatch.setattr(images, "DECODED_CACHE_BYTES", 64 * 48 * 3)  # one image would fill it: not kept
    decode(read_source(_jpeg(100)))
    assert images._decoded_bytes <= 64 * 48 * 3


def test_in_memory_inputs_are_not_cached():
    images.clear_decoded_cache()
    arr = np.zeros((20, 30, 3), dtype=np.uint8)
    img = load_image(arr)
    assert img.pixels.flags.writeable and not images._decoded


# ── working resolution of the offline statistics ────────────────────────────────────────────────


def test_statistics_below_the_working_size_are_unchanged(coffee_small):
    x = coffee_small
    assert st.at_working_size(x) is x


def test_large_images_are_measured_at_the_working_size(coffee_small):
    import cv2

    big = cv2.resize(coffee_small, (2400, 1800), interpolation=cv2.INTER_CUBIC).clip(0, 1)
    w, h = st.working_size(2400, 1800)
    assert w * h <= st.WORKING_PIXELS and abs(w / h - 4 / 3) < 0.01
    assert st.measure(big) == st.measure(st.at_working_size(big))
    fr = st.measure_fr(big, big)
    assert fr["fr_color_err"] == 0.0 and fr["fr_mean_shift"] == 0.0


@pytest.fixture
def coffee_small() -> np.ndarray:
    import skimage.data

    return st.as_float_rgb(Image.fromarray(skimage.data.coffee()).resize((512, 384)))
