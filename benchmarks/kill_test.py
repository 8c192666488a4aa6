"""Kill test: a batch of 40 images is SIGKILLed mid-run, then resumed; every image must end with
exactly one complete result line.

Run:  .venv/bin/python benchmarks/kill_test.py [--n 40] [--kill-after 8] [--concurrency 4] [--keep DIR]

The batch is the real CLI (`agentic-iqa assess FOLDER --out results.jsonl`) in a subprocess, talking
to the local fake OpenAI-compatible server run by this script (every call answered after `latency`).
Once `kill_after` result lines are on disk the process gets SIGKILL — no handler runs, nothing is
flushed. A kill rarely lands inside the one `write` of a line, so the torn tail such a kill can leave
is then also produced on purpose (half of a record appended without its newline); `--resume` must
cut it off. The resumed run must assess exactly the images that had no line, and the file must end
with one complete, parseable line per image. `tests/test_batch_kill.py` runs this.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from canned import valid_reply, write_test_image  # noqa: E402
from fake_openai import FakeOpenAIServer, scripted  # noqa: E402

ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"), "_logprobs": {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0},
}


def complete_lines(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    data = path.read_bytes()
    return data.split(b"\n")[:-1]  # the part after the last newline is not a complete line


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from agentic_iqa.cli import main; main()", *args]


def run_kill_test(workdir: str | Path, *, n: int = 40, kill_after: int = 8, concurrency: int = 4,
                  latency: float = 0.05, timeout: float = 300.0) -> dict:
    """Run the whole scenario in `workdir`; returns a report (see the module docstring). Raises
    AssertionError with the evidence when an invariant does not hold."""
    work = Path(workdir)
    images = work / "images"
    images.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_test_image(images / f"item_{i:03d}.jpg", size=(96, 72), seed=i, quality=40 + i)
    out = work / "results.jsonl"
    config = work / "config"  # empty: built-in defaults, whatever the caller's ./configs holds
    config.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "AGENTIC_IQA_LM", "AGENTIC_IQA_API_BASE", "AGENTIC_IQA_BACKEND")}
    env.update(AGENTIC_IQA_CACHE_DIR=str(work / "cache"), HF_HUB_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True")
    report: dict = {"n": n, "kill_after": kill_after}
    with FakeOpenAIServer(scripted(ROUTES), latency=latency) as srv:
        # The killed client drops its connections mid-request; that is expected, not worth a traceback.
        srv._httpd.handle_error = lambda request, client_address: None
        args = ["assess", str(images), "--out", str(out), "--lm", "openai/fake-vlm", "--api-base", srv.base_url,
                "--config", str(config), "--concurrency", str(concurrency), "--no-progress", "--json"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(_cli(*args), env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            while len(complete_lines(out)) < kill_after:
                if proc.poll() is not None:
                    raise AssertionError(f"the batch ended before it could be killed (exit {proc.returncode}): "
                                         f"{proc.stderr.read().decode(errors='replace')[-2000:]}")
                if time.perf_counter() - t0 > timeout:
                    raise AssertionError(f"no {kill_after} result lines within {timeout:.0f} s")
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        report["killed_after_s"] = round(time.perf_counter() - t0, 2)
        report["exit_on_kill"] = proc.returncode
        before = complete_lines(out)
        report["lines_at_kill"] = len(before)
        data = out.read_bytes()
        tail = data[data.rfind(b"\n") + 1:]
        if not tail:
            # Leave what a kill inside the write of a line would leave: a record's first half.
            torn = before[-1][: len(before[-1]) // 2]
            with out.open("ab") as fh:
                fh.write(torn)
            tail = torn
            report["torn_tail"] = "simulated"
        else:
            report["torn_tail"] = "from the kill"
        report["torn_bytes"] = len(tail)

        resumed = subprocess.run(_cli(*args, "--resume"), env=env, cwd=work, capture_output=True, timeout=timeout)
        if resumed.returncode != 0:
            raise AssertionError(f"resume exited {resumed.returncode}: {resumed.stderr.decode(errors='replace')[-2000:]}")
        summary = json.loads(resumed.stdout)
    report["resume"] = {k: summary[k] for k in ("ran", "ok", "failed", "already_done", "repaired_bytes")}

    # The invariants.
    raw = out.read_bytes()
    assert raw.endswith(b"\n"), "the results file must end with a complete line"
    records = [json.loads(line) for line in raw.split(b"\n")[:-1]]  # every line parses
    by_image: dict[str, int] = {}
    for rec in records:
        by_image[Path(rec["image"]).name] = by_image.get(Path(rec["image"]).name, 0) + 1
    expected = {f"item_{i:03d}.jpg" for i in range(n)}
    missing = sorted(expected - set(by_image))
    doubled = sorted(k for k, c in by_image.items() if c != 1)
    report.update(lines_final=len(records), missing=missing, duplicated=doubled,
                  statuses=sorted({rec["status"] for rec in records}))
    assert not missing and not doubled and len(records) == n, f"lost or duplicated items: {report}"
    assert len({rec["key"] for rec in records}) == n, "keys must be unique"
    assert summary["repaired_bytes"] == report["torn_bytes"], f"the torn tail must be cut off: {report}"
    assert summary["already_done"] == report["lines_at_kill"], f"resume must skip exactly the finished items: {report}"
    assert summary["ran"] == n - report["lines_at_kill"], f"resume must run exactly the unfinished items: {report}"
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--kill-after", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="aiqa-kill-"))
    report = run_kill_test(work, n=args.n, kill_after=args.kill_after, concurrency=args.concurrency, latency=args.latency)
    print(json.dumps(report, indent=2))
    print(f"OK: {report['n']} items, killed with {report['lines_at_kill']} lines on disk, resumed; one complete line per item")


if __name__ == "__main__":
    main()
