"""A reader that closes the CLI's output early (`agentic-iqa tools list | head -1`) is not an error of the CLI: the
command ends quietly with exit 0 (the reason for 0 rather than 141 is in `agentic_iqa.cli.output.GuardedApp`), no traceback, no
"Exception ignored … BrokenPipeError"; and a batch whose progress lines go into the closed pipe (`2>&1 | head`)
still assesses and saves every image. Real processes, real pipes. Before, each of these exited 1 (typer and rich
turn a closed stdout into exit 1), and the batch stopped at its first progress line.

An output that cannot be written for another reason (`> /dev/full`, a full disk) is a failure: one line on stderr
naming standard output and the reason, exit 1, no traceback; a batch's results file is still complete. Before,
a traceback (OSError 28) and exit 1. A stderr that cannot be written (`2>/dev/full`) does not stop a batch either;
before, it saved none of its images."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from canned import write_test_image

EXIT_READER_GONE = 0
EXIT_OUTPUT_FAILED = 1  # EXIT_FAILED: as for a --save-trace that cannot be written
DEV_FULL = "/dev/full"
needs_dev_full = pytest.mark.skipif(not os.path.exists(DEV_FULL), reason="needs /dev/full")
TIMEOUT = 300  # seconds; an offline assessment takes a few, on a busy machine more


def _cli_command(module: bool) -> list[str]:
    if module:
        return [sys.executable, "-m", "agentic_iqa"]
    return [sys.executable, "-c", "from agentic_iqa.cli import main; main()"]  # what the console script runs


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "AGENTIC_IQA_LM"):
        env.pop(key, None)  # offline: no model, no network
    return env


def _into_a_closed_pipe(args, *, module: bool = False, stderr_too: bool = False, cwd=None):
    """Run the CLI with stdout (and with `stderr_too` stderr as well, like `2>&1`) a pipe whose reader has
    already gone: every write to it fails, whatever the timing. Returns (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([*_cli_command(module), *args], stdout=write_end,
                                stderr=write_end if stderr_too else subprocess.PIPE, env=_env(), cwd=cwd)
    finally:
        os.close(write_end)
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, (err or b"").decode("utf-8", "replace")


def _into_dev_full(args, *, stderr_too: bool = False):
    """Run the CLI with stdout (with `stderr_too` stderr instead) on /dev/full: every write fails with ENOSPC,
    like a full disk. Returns (exit code, stdout, stderr); the one not on /dev/full is captured."""
    with open(DEV_FULL, "wb") as full:
        proc = subprocess.run([*_cli_command(False), *args], stdout=subprocess.PIPE if stderr_too else full,
                              stderr=full if stderr_too else subprocess.PIPE, env=_env(), timeout=TIMEOUT)
    out, err = (x.decode("utf-8", "replace") if x else "" for x in (proc.stdout, proc.stderr))
    return proc.returncode, out, err


def _one_line_naming_stdout(err: str) -> None:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], err  # one error line, the last
    assert "standard output" in lines[-1] and "No space left on device" in lines[-1], err


def _first_line_then_close(args):
    """`… | head -1`: read the first line of stdout, close the pipe, wait. The pipe holds one page, so output
    longer than that cannot all be in it before the reader leaves. Returns (exit code, first line, stderr)."""
    proc = subprocess.Popen([*_cli_command(False), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), bufsize=0)  # unbuffered: readline takes the first line only
    try:
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        first = proc.stdout.readline()
        proc.stdout.close()
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, first.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _quiet(err: str) -> None:
    assert "Traceback" not in err, err
    assert "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert "error:" not in err, err


@pytest.mark.parametrize("args, module", [
    (["assess", "example:chelsea", "--offline", "--no-cache"], False),
    (["tools", "list"], False),
    (["tools", "list"], True),  # python -m agentic_iqa: the same app, the same rule
], ids=["assess", "tools-list", "python-m-tools-list"])
def test_a_reader_gone_before_the_output_is_no_error(args, module):
    code, err = _into_a_closed_pipe(args, module=module)
    assert code == EXIT_READER_GONE, err
    _quiet(err)


@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="needs Linux's F_SETPIPE_SZ to make the pipe small")
def test_tools_list_into_head_1_is_no_error():
    code, first, err = _first_line_then_close(["tools", "list"])
    assert "IQA tools" in first
    assert code == EXIT_READER_GONE, err
    _quiet(err)


def test_a_batch_into_a_closed_pipe_still_assesses_and_saves_every_image(tmp_path):
    # `agentic-iqa assess … --out results.jsonl 2>&1 | head -1`: the progress lines (stderr) and the summary
    # (stdout) have no reader; the work they report on must not stop for that.
    images = [str(write_test_image(tmp_path / f"img{i}.jpg", size=(96, 64), seed=i)) for i in range(3)]
    out = tmp_path / "results.jsonl"
    code, _ = _into_a_closed_pipe(["assess", *images, "--offline", "--no-cache", "-j", "1", "--out", str(out)],
                                  stderr_too=True)
    assert code == EXIT_READER_GONE
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows), rows


def test_eval_into_a_closed_pipe_is_no_error(tmp_path):
    for i in range(2):
        write_test_image(tmp_path / f"i{i}.png", size=(96, 64), fmt="PNG", seed=i)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"r{i}", "image": f"i{i}.png", "mos": 2.0 + i}) + "\n"
                                for i in range(2)))
    code, err = _into_a_closed_pipe(["eval", str(manifest), "--offline", "--mode", "nr", "--split", "all",
                                     "--no-progress"])
    assert code == EXIT_READER_GONE, err
    _quiet(err)


@needs_dev_full
@pytest.mark.parametrize("args", [
    ["tools", "list", "--json"],
    ["assess", "example:chelsea", "--offline", "--no-cache"],
], ids=["tools-list-json", "assess"])
def test_a_full_stdout_is_one_line_and_exit_1(args):
    code, _, err = _into_dev_full(args)
    assert code == EXIT_OUTPUT_FAILED, err
    _one_line_naming_stdout(err)
    assert len(err.strip().splitlines()) == 1, err


@needs_dev_full
def test_a_batch_whose_summary_cannot_be_written_saves_every_image(tmp_path):
    images = [str(write_test_image(tmp_path / f"img{i}.jpg", size=(96, 64), seed=i)) for i in range(3)]
    out = tmp_path / "results.jsonl"
    code, _, err = _into_dev_full(["assess", *images, "--offline", "--no-cache", "-j", "1", "--out", str(out)])
    assert code == EXIT_OUTPUT_FAILED, err
    _one_line_naming_stdout(err)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows), rows


@needs_dev_full
def test_a_batch_with_a_full_stderr_still_assesses_and_saves_every_image(tmp_path):
    # progress lines (stderr) that cannot be written must not stop the work, as with a closed pipe
    images = [str(write_test_image(tmp_path / f"img{i}.jpg", size=(96, 64), seed=i)) for i in range(3)]
    out = tmp_path / "results.jsonl"
    code, stdout, _ = _into_dev_full(["assess", *images, "--offline", "--no-cache", "-j", "1", "--out", str(out)],
                                     stderr_too=True)
    assert code == 0 and "Batch" in stdout, stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows), rows


@needs_dev_full
def test_a_result_that_cannot_be_shown_is_still_saved_as_its_trace(tmp_path):
    trace = tmp_path / "trace.json"
    code, _, err = _into_dev_full(["assess", "example:chelsea", "--offline", "--no-cache", "--save-trace", str(trace)])
    assert code == EXIT_OUTPUT_FAILED, err
    _one_line_naming_stdout(err)
    assert 1 <= json.loads(trace.read_text())["result"]["score"] <= 5  # written after the output failed
