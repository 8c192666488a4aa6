"""`agentic-iqa bench make` and `agentic-iqa eval` end to end on a tiny generated benchmark (offline analyst)."""
from __future__ import annotations

import json

import pytest

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


def test_questions_without_an_answer_key_are_answered_unscored_and_exit_0(tmp_path):
    from canned import write_test_image

    for k in range(2):
        write_test_image(tmp_path / f"i{k}.png", size=(96, 96), fmt="PNG", seed=k)
    rows = [{"id": "open", "image": "i0.png", "question": "What is the main distortion?"},
            {"id": "mcq", "image": "i1.png", "question": "Is it noisy?", "options": {"A": "Yes", "B": "No"}},
            {"id": "keyed", "image": "i1.png", "question": "Is it blurry?", "options": {"A": "Yes", "B": "No"},
             "answer": "B"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr", "--json"])
    assert res.exit_code == 0, res.output  # nothing skipped, nothing failed: unscored answers are not errors
    report = json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])
    assert report["errors"] == [] and report["skipped_rows"] == []
    unscored = {a["id"]: a for a in report["nr"]["unscored_answers"]}
    assert sorted(unscored) == ["mcq", "open"]
    assert unscored["mcq"]["answer"] in ("A", "B") and len(unscored["open"]["answer"]) > 1  # open: text, not a letter
    assert report["nr"]["mcq"]["n"] == 1  # only the keyed question is scored
    human = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr"])
    assert human.exit_code == 0 and "questions without an answer key: 2 answered, not scored" in human.stdout
    assert "open: What is the main distortion? →" in human.stdout

    # An unusable row (an answer without its question) is skipped, said, and makes the run exit 3.
    with manifest.open("a") as f:
        f.write(json.dumps({"id": "bad", "image": "i0.png", "answer": "A"}) + "\n")
    res = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr", "--json"])
    assert res.exit_code == 3 and "an answer needs its question" in res.stderr

    # `assess --manifest` takes the same rows: each question answered, one result line per row, exit 3 for the bad row.
    out = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["assess", "--manifest", str(manifest), "--offline", "--out", str(out), "--no-progress"])
    assert res.exit_code == 3, res.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["status"] for r in lines if r["status"] == "ok") == ["ok"] * 3 and all(r["answer"] for r in lines if r["status"] == "ok")


def test_eval_scores_the_main_distortion_the_pipeline_names_not_a_severity_resort():
    """Top-1 is the analysis's first category (the offline category model's or a VLM's choice), even when a
    later one is graded more severe: eval measures the ranking the answer gives."""
    from types import SimpleNamespace

    from agentic_iqa.bench.evaluate import detected_categories
    from signatures.models import DistortionAnalysis, ExecutorOutput

    ev = ExecutorOutput(distortion_analysis={"Global": [
        DistortionAnalysis(type="Blurs", severity="slight", explanation="soft edges"),
        DistortionAnalysis(type="Noise", severity="none", explanation="clean"),
        DistortionAnalysis(type="Compression", severity="moderate", explanation="blocking"),
    ]})
    assert detected_categories(SimpleNamespace(evidence=ev)) == ["Blurs", "Compression"]


def test_eval_of_a_split_with_no_rows_says_which_splits_exist_and_fails(tmp_path):
    """`bench make DIR --ref chelsea` writes train rows only; `eval` (default --split test) printed
    "0 item(s) to assess" and exited 0."""
    runner = CliRunner()
    out = tmp_path / "bench"
    made = runner.invoke(app, ["bench", "make", str(out), "--ref", "chelsea", "--type", "gaussian blur", "--no-mcq"])
    assert made.exit_code == 0, made.output
    manifest = out / "manifest.jsonl"
    res = runner.invoke(app, ["eval", str(manifest), "--offline"])
    assert res.exit_code == 2, res.output
    msg = " ".join(res.stderr.split())
    assert msg.startswith("error: manifest ") and "no rows in split 'test'" in msg and "5 row(s) are in split 'train'" in msg
    assert "--split all" in msg and "--split train" in msg and "Traceback" not in res.output


def test_bench_make_unknown_type_lists_the_valid_names(tmp_path):
    from agentic_iqa.bench.synth import REFERENCES, TYPES

    res = CliRunner().invoke(app, ["bench", "make", str(tmp_path / "b"), "--type", "gaussian_blur", "--ref", "kitty"])
    assert res.exit_code == 2, res.output
    msg = " ".join(res.stderr.split())
    assert "unknown distortion type 'gaussian_blur' (did you mean 'gaussian blur'?)" in msg
    assert all(repr(t) in msg for t in TYPES) and "unknown reference 'kitty'" in msg and all(repr(r) in msg for r in REFERENCES)
    assert not (tmp_path / "b").exists()  # refused before anything is written


def test_bench_make_into_a_file_says_it_wants_a_folder(tmp_path):
    # Before: "error: [Errno 20] Not a directory: 'notes.txt/references'".
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    res = CliRunner().invoke(app, ["bench", "make", str(notes), "--ref", "chelsea", "--type", "jpeg"])
    assert res.exit_code == 2 and "notes.txt is a file, not a folder" in " ".join(res.output.split()), res.output
    assert notes.read_text() == "mine"
    # A folder below a file cannot be made either: one line naming it, exit 2, no traceback.
    res = CliRunner().invoke(app, ["bench", "make", str(notes / "bench"), "--ref", "chelsea", "--type", "jpeg"])
    assert res.exit_code == 2 and "Not a directory" in res.output and "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_bench_convert_clive_then_eval_reports_the_correlation_with_mos(tmp_path):
    """A user with LIVE In the Wild on disk: convert its MATLAB score files, then `eval` correlates with MOS.
    The photos here are scikit-image's coffee blurred more and more, with MOS falling as the blur grows."""
    import numpy as np
    from PIL import Image, ImageFilter
    from scipy.io import savemat
    from skimage import data

    root = tmp_path / "ChallengeDB_release"
    (root / "Images").mkdir(parents=True)
    (root / "Data").mkdir()
    names = [f"t{i}.bmp" for i in range(1, 8)] + [f"{k}.bmp" for k in range(1, 6)]
    photo = Image.fromarray(data.coffee())
    for k, sigma in enumerate((0, 1, 2, 4, 8), 1):
        (photo.filter(ImageFilter.GaussianBlur(sigma)) if sigma else photo).save(root / "Images" / f"{k}.bmp")
    cells = np.empty((len(names), 1), dtype=object)
    for i, n in enumerate(names):
        cells[i, 0] = np.array([n])
    savemat(root / "Data" / "AllImages_release.mat", {"AllImages_release": cells})
    savemat(root / "Data" / "AllMOS_release.mat", {"AllMOS_release": np.array([[50.0] * 7 + [80, 65, 50, 30, 10]])})
    runner = CliRunner()
    made = runner.invoke(app, ["bench", "convert", "clive", str(root)])
    assert made.exit_code == 0, made.output
    assert f"wrote 5 rows to {root / 'manifest.jsonl'}" in made.stdout
    res = runner.invoke(app, ["eval", str(root / "manifest.jsonl"), "--offline", "--mode", "nr", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])
    vs_mos = report["nr"]["vs_mos"]
    assert vs_mos["n"] == 5 and vs_mos["srcc"] >= 0.9  # the analyst ranks the blur as the raters did
    # The benchmark script scores the same photos as `eval` does (its --check-cli runs the real Assessor and
    # fails on any difference), the NR tools beside it, and leaves the data set's MOS out of its report.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import mos_correlation

    out = tmp_path / "mos.json"
    assert mos_correlation.main([str(root / "manifest.jsonl"), "--workers", "1", "--check-cli", "2", "--json", str(out),
                                 "--cache", str(tmp_path / "cache")]) == 0
    bench = json.loads(out.read_text())
    assert bench["n"] == 5 and set(bench["predictors"]) == {
        "analyst", "pipeline", "without_look", "look_alone", "BRISQUE", "NIQE", "PIQE"}
    assert abs(bench["predictors"]["pipeline"]["srcc"] - vs_mos["srcc"]) < 1e-9
    assert [c["cli"] for c in bench["cli_check"]] == [c["benchmark"] for c in bench["cli_check"]]
    assert "mos" not in bench["image_columns"] and len(bench["images"]) == 5
    # Bad input: one line naming it and what to pass, exit 2
    for argv, says in ((["clve", str(root)], "unknown data set 'clve' (did you mean 'clive'?)"),
                       (["clive", str(tmp_path / "nope")], "nope: not found; pass the ChallengeDB_release folder"),
                       (["clive", str(root / "Images")], "AllImages_release.mat: not found"),
                       (["kadid", str(root / "manifest.jsonl")], "no column dist_img, dmos, ref_img")):
        bad = runner.invoke(app, ["bench", "convert", *argv])
        assert bad.exit_code == 2 and says in bad.output and "Traceback" not in bad.output, (argv, bad.output)


def _report(res) -> dict:
    return json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])


def test_eval_keeps_manifest_paths_inside_its_folder_like_assess(tmp_path):
    """Before, eval assessed rows with an absolute path or '../x.jpg' (with --lm they went to the model) while
    `assess --manifest` refused them; now both refuse through the same check, and eval skips the row (exit 3)."""
    from canned import write_test_image

    data = tmp_path / "data"
    data.mkdir()
    write_test_image(data / "in.png", size=(96, 96), fmt="PNG")
    outside = write_test_image(tmp_path / "secret.png", size=(96, 96), fmt="PNG", seed=1)
    manifest = data / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "in", "image": "in.png", "mos": 3},
        {"id": "up", "image": "../secret.png", "mos": 4},
        {"id": "abs", "image": str(outside), "mos": 2},
        {"id": "ref", "image": "in.png", "reference": "../secret.png", "mos": 1},
    ]))
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr", "--json", "--no-progress"])
    assert res.exit_code == 3, res.output
    report = _report(res)
    assert report["nr"]["items"] == 1
    skipped = {s["id"]: s["reason"] for s in report["skipped_rows"]}
    assert sorted(skipped) == ["abs", "ref", "up"]
    assert skipped["up"] == (f"image '../secret.png' resolves outside the manifest's folder {data.resolve()}; "
                             "refused (pass --allow-absolute to allow paths outside it)")
    assert skipped["ref"].startswith("reference '../secret.png' resolves outside")
    assert "skipped manifest line 2 (up): image '../secret.png' resolves outside" in " ".join(res.stderr.split())
    # assess --manifest says the same words (one check, two commands)
    out = tmp_path / "r.jsonl"
    runner.invoke(app, ["assess", "--manifest", str(manifest), "--out", str(out), "--offline", "--no-progress"])
    errors = {json.loads(ln)["id"]: json.loads(ln).get("error") for ln in out.read_text().splitlines()}
    assert errors["up"] == skipped["up"]
    allowed = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr", "--json", "--no-progress",
                                  "--allow-absolute"])
    assert allowed.exit_code == 0, allowed.output
    assert _report(allowed)["nr"]["items"] == 4


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_eval_limit_must_be_at_least_one(tmp_path, limit):
    """--limit 0 evaluated every row and --limit -3 silently dropped the last three."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "image": "a.png", "mos": 3}\n')
    res = CliRunner().invoke(app, ["eval", str(manifest), "--offline", "--limit", limit])
    assert res.exit_code == 2, res.output
    assert "Invalid value for '--limit'" in res.output and "greater than or equal to 1" in res.output


def test_bad_json_line_is_reported_once_with_its_column(tmp_path):
    """json's message "Unterminated string starting at" was followed by "at column 8": "at at"."""
    from canned import write_test_image

    write_test_image(tmp_path / "a.png", size=(96, 96), fmt="PNG")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "x\n{"id": "a", "image": "a.png", "mos": 3}\n')
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(manifest), "--offline", "--mode", "nr", "--no-progress"])
    assert res.exit_code == 3, res.output
    assert "skipped manifest line 1: bad JSON: Unterminated string starting at column 8" in res.stderr
    out = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["assess", "--manifest", str(manifest), "--out", str(out), "--offline", "--no-progress"])
    assert res.exit_code == 3, res.output
    text = " ".join(res.stdout.split())
    assert "line 1: bad JSON: Unterminated string starting at column 8" in text and "at at" not in text


@pytest.mark.parametrize("line, said", [
    ("I01_01_02.png,I01.png,abc,0.1", "line 3: dmos 'abc' is not a number; fix or remove the row"),
    ("I01_01_02.png,I01.png,nan,0.1", "line 3: dmos 'nan' is not a number"),
    ("I01_01_02.png,I01.png", "line 3: has no dmos value"),
    ("I01_99_02.png,I01.png,3.1,0.1", "line 3: unexpected KADID image name 'I01_99_02.png'"),
])
def test_bench_convert_kadid_names_the_file_and_line_of_a_bad_row(tmp_path, line, said):
    """A non-numeric dmos said only "could not convert string to float: 'abc'" (no file, no line)."""
    csv = tmp_path / "dmos.csv"
    csv.write_text(f"dist_img,ref_img,dmos,var\nI01_01_01.png,I01.png,4.5,0.1\n{line}\n")
    res = CliRunner().invoke(app, ["bench", "convert", "kadid", str(csv)], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {csv}, {said}"), res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "manifest.jsonl").exists()


@pytest.mark.parametrize("limit", [0, -3])
def test_evaluate_in_python_refuses_a_limit_below_one(tmp_path, limit):
    """The CLI refuses these; called from Python, limit=0 ran every row and -3 dropped the last three."""
    from agentic_iqa.bench.evaluate import evaluate

    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "image": "a.png", "mos": 3}\n')
    with pytest.raises(ValueError, match="limit must be at least 1"):
        evaluate(manifest, assessor=None, modes=["nr"], limit=limit)
