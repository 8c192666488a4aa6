"""Progress when the output is not a terminal (issue 12): `eval` and batches print plain lines with
done/total, rate and ETA (one per N items or per few seconds) instead of nothing."""
from __future__ import annotations

import io
import json
import re

from typer.testing import CliRunner

from canned import write_test_image

from agentic_iqa.cli import app
from agentic_iqa.cli.progress import LineProgress

LINE = re.compile(r"^(eval|assess): (\d+)/(\d+) \(\d+%\) · [\d.]+ items/s · elapsed \S+( · ETA \S+)?( · \d+ failed)?$")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_line_progress_prints_per_n_items_or_per_interval_with_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    p = LineProgress("eval", stream=out, every_items=10, every_seconds=30, clock=clock)
    p.start(40)
    for i in range(1, 41):
        clock.t = i * 2.0  # 0.5 items/s
        p.advance(failed=(i == 3))
        if i == 25:
            clock.t += 60  # a slow item: a line after the interval even between the N-item lines
            p.advance()
            break
    lines = out.getvalue().splitlines()
    assert lines[0] == "eval: 40 item(s) to assess"
    assert lines[1] == "eval: 10/40 (25%) · 0.50 items/s · elapsed 20s · ETA 1m00s · 1 failed"
    assert lines[2] == "eval: 20/40 (50%) · 0.50 items/s · elapsed 40s · ETA 40s · 1 failed"
    # 26 done in 110 s: 0.24 items/s, 14 to go ≈ 59 s.
    assert lines[3] == "eval: 26/40 (65%) · 0.24 items/s · elapsed 1m50s · ETA 59s · 1 failed"
    assert len(lines) == 4
    p.finish()  # nothing new since the last line: no repeat
    assert len(out.getvalue().splitlines()) == 4


def test_eval_prints_progress_lines_when_not_a_terminal(tmp_path):
    images = [write_test_image(tmp_path / f"i{k}.png", size=(96, 96), fmt="PNG", seed=k) for k in range(3)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"r{k}", "image": p.name, "level": k + 1, "type": "white noise",
                                            "split": "test"}) + "\n" for k, p in enumerate(images)))
    res = CliRunner().invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("eval:")]
    assert lines[0] == "eval: 3 item(s) to assess"
    done = [LINE.match(ln) for ln in lines[1:]]
    assert all(done), lines
    assert [int(m.group(2)) for m in done] == [1, 2, 3] and {m.group(3) for m in done} == {"3"}
    assert "━" not in res.stderr  # no bar drawn into a log


def test_batch_prints_progress_lines_when_not_a_terminal(tmp_path):
    images = [write_test_image(tmp_path / f"b{k}.png", size=(96, 96), fmt="PNG", seed=k) for k in range(2)]
    res = CliRunner().invoke(app, ["assess", *map(str, images), "--offline", "--no-cache", "--out", str(tmp_path / "r.jsonl")])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("assess:")]
    assert lines[0] == "assess: 2 item(s) to assess" and all(LINE.match(ln) for ln in lines[1:]), lines
    assert lines[-1].startswith("assess: 2/2 (100%)")
    quiet = CliRunner().invoke(app, ["assess", *map(str, images), "--offline", "--no-cache", "--no-progress",
                                     "--out", str(tmp_path / "q.jsonl")])
    assert quiet.exit_code == 0 and "assess:" not in quiet.stderr


def test_eval_takes_no_progress_like_assess(tmp_path):
    import typer

    images = [write_test_image(tmp_path / f"i{k}.png", size=(96, 96), fmt="PNG", seed=k) for k in range(2)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"r{k}", "image": p.name, "level": k + 1, "type": "white noise",
                                            "split": "test"}) + "\n" for k, p in enumerate(images)))
    res = CliRunner().invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "eval:" not in res.stderr and "━" not in res.stderr
    assert "SRCC" in res.stdout  # the report itself is still printed
    # The same option: name, flag-ness and help (assess adds what it means with --engine ray).
    options = {name: next(p for p in typer.main.get_command(app).commands[name].params if p.name == "no_progress")
               for name in ("assess", "eval")}
    assert options["eval"].opts == options["assess"].opts == ["--no-progress"]
    assert options["eval"].is_flag and options["assess"].is_flag
    assert options["assess"].help.startswith(options["eval"].help.rstrip(")."))
