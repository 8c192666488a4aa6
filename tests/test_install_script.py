"""scripts/install.sh on a full disk: a one-line reason and a non-zero exit before pip starts, not pip's
"No space left on device" halfway through torch (the CI failure of 2026-11-26)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fake_df(folder: Path, free_kb: int) -> None:
    # `df -Pk DIR` as POSIX prints it; only the "Available" column (4th) is read.
    df = folder / "df"
    df.write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                  f"echo '/dev/fake 100000000 99000000 {free_kb} 99% /'\n")
    df.chmod(0o755)


def test_install_stops_with_a_reason_when_the_disk_is_full(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_df(bin_dir, free_kb=2 * 1024 * 1024)  # 2 GB free
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VENV": str(tmp_path / "venv"),
           "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    env.pop("SKIP_TORCH", None)
    out = subprocess.run(["bash", str(ROOT / "scripts/install.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "only 2 GB free under" in out.stderr and "about 7 GB" in out.stderr and "SKIP_TORCH=1" in out.stderr
    assert "Traceback" not in out.stderr and "No space left" not in out.stderr
    # it stopped before installing anything into the new venv
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/torch"))
