"""Tools started on several threads in a fresh process: every one scores (torch imported once, under a lock).

Before iqa_tools.backend, 2 of 3 fresh runs of this script failed an item with "module 'torch' has no
attribute 'hub'" (another thread saw torch half-imported), and Ray workers crashed at exit. The script
prints its outcome on stdout after the threads end: concurrent metric creation must leave sys.stdout as it was."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, threading
import numpy as np
from iqa_tools import ToolRegistry

registry = ToolRegistry()
image = (np.random.default_rng(0).random((96, 96, 3)) * 255).astype("uint8")
outcomes = {}

def run(i, name):
    try:
        outcomes[f"{i}:{name}"] = registry.score(name, image, use_cache=False).raw_score
    except Exception as exc:
        outcomes[f"{i}:{name}"] = f"{type(exc).__name__}: {exc}"

threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate(["piqe", "niqe", "brisque", "piqe", "niqe"])]
for t in threads: t.start()
for t in threads: t.join(timeout=600)
print(json.dumps(outcomes))
"""


def test_concurrent_first_runs_in_fresh_processes_all_score():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for attempt in range(3):
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
        assert proc.returncode == 0, f"run {attempt}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert proc.stdout.strip(), f"run {attempt}: no output\n{proc.stderr[-2000:]}"
        outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
        failed = {k: v for k, v in outcomes.items() if not isinstance(v, float)}
        assert len(outcomes) == 5 and not failed, f"run {attempt}: {failed}"
