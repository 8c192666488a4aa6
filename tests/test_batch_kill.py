"""The kill test (issue 6): a 40-image batch in a real `agentic-iqa` process is SIGKILLed mid-run and
resumed; every image ends with exactly one complete result line. The scenario and its checks live in
benchmarks/kill_test.py (also runnable by hand); this runs it against the local fake server."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from kill_test import run_kill_test  # noqa: E402


@pytest.mark.slow
def test_sigkill_mid_batch_then_resume_leaves_one_complete_line_per_item(tmp_path):
    report = run_kill_test(tmp_path, n=40, kill_after=8, concurrency=4)
    assert report["exit_on_kill"] == -9  # really killed, not finished
    assert report["lines_at_kill"] < 40
    assert report["lines_final"] == 40 and not report["missing"] and not report["duplicated"]
    assert report["statuses"] == ["ok"]
    assert report["resume"]["ran"] + report["resume"]["already_done"] == 40
    assert report["resume"]["repaired_bytes"] == report["torn_bytes"] > 0
