"""`agentic-iqa bench make` and `agentic-iqa eval` end to end on a tiny generated benchmark (offline analyst)."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from agentic_iqa.cli import app


def test_bench_make_then_eval_reports_metrics_and_skips_broken_rows(tmp_path):
    runner = CliRunner()
    out = tmp_path / "bench"
    made = runner.invoke(app, ["bench", "make", str(out), "--ref", "coffee", "--ref", "rocket", "--type", "gaussian blur", "--no-mcq"])
    assert made.exit_code == 0, made.output
    manifest = out / "manifest.jsonl"
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(rows) == 10 and {r["split"] for r in rows} == {"test"}
    with manifest.open("a") as f:
        f.write("{not json\n")
        f.write(json.dumps({**rows[0], "id": "ghost", "image": "images/missing.png"}) + "\n")
    res = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "both", "--json", "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 3, res.output  # partial: two broken rows were skipped
    report = json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])
    assert [s["line"] for s in report["skipped_rows"]] == [11, 12]
    for mode in ("nr", "fr"):
        part = report[mode]
        assert part["items"] == 10 and part["failed"] == 0
        assert part["intra_group"]["groups"] == 2
        # Gaussian blur from σ 0.1 to 5: the score must fall with the level within each image.
        assert part["intra_group"]["srcc"] > 0.8
        assert part["detection_levels_3_5"]["n"] == 6
    assert report["fr"]["detection_levels_3_5"]["top1"] >= 0.5
    assert (tmp_path / "p.png").stat().st_size > 1000
