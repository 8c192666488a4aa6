"""Batch assessment (issue 6): inputs, resume keys, the results file, the runner, the CLI.

Assessments use a canned VLM (scripted replies through DSPy's real adapter) on real PIQE runs, or the
offline backend through the real CLI; no network.
"""
from __future__ import annotations

import base64
import io
import json
import os
import threading
import time
from pathlib import Path

import dspy
import pytest
from typer.testing import CliRunner

from canned import CannedVLM, Reply, disable_dspy_cache, valid_reply, write_test_image

from agentic_iqa.agents.vlm import VLMRoles
from agentic_iqa.api import UNUSABLE_BACKEND, Assessor
from agentic_iqa.batch import (
    BatchError,
    BatchItem,
    ResultsFile,
    assess_many,
    config_fingerprint,
    items_from_manifest,
    items_from_paths,
    plan_resume,
    prepare_item,
    run_batch,
    scan_directory,
)
from agentic_iqa.cli import app
from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_PARTIAL
from agentic_iqa.config import load_settings
from iqa_tools import ToolRegistry

SELECT_PIQE = {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}}
LOGPROBS = {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0}
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def _no_dspy_cache():
    disable_dspy_cache()


@pytest.fixture(scope="module")
def registry():
    return ToolRegistry(cache=False)


@pytest.fixture()
def settings(tmp_path):
    return load_settings(tmp_path, cache={"enabled": False})


def canned_assessor(settings, registry, latency_hook=None):
    """An Assessor whose VLM answers every call validly (PIQE as the tool); `latency_hook(call)` may
    run inside each LM call (to watch concurrency)."""
    def answer(reply):
        def respond(call):
            if latency_hook is not None:
                latency_hook(call)
            return reply
        return respond

    routes = {
        "plan": answer(valid_reply("plan")), "detect": answer(valid_reply("detect")),
        "analyze": answer(valid_reply("analyze")), "select": answer(SELECT_PIQE),
        "score": answer(Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS)),
    }
    vlm = CannedVLM(routes, logprobs=True, repeat_last=True)
    roles = VLMRoles(settings, lms={"planner": vlm.lm, "executor": vlm.lm, "summarizer": vlm.lm})
    return Assessor(settings, registry=registry, roles=roles), vlm


def images(folder: Path, n: int, prefix: str = "img") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [write_test_image(folder / f"{prefix}{i:02d}.jpg", size=(64, 48), seed=i, quality=40 + i) for i in range(n)]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ── inputs ──────────────────────────────────────────────────────────────────────────────────────


def test_directory_scan_takes_image_extensions_only(tmp_path):
    for name in ("b.JPG", "a.png", "c.webp", "notes.txt", "d.jpeg.bak", ".hidden.png", "e.TIFF"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.gif").write_bytes(b"x")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "skip.png").write_bytes(b"x")
    os.symlink(tmp_path, tmp_path / "sub" / "loop")  # a symlinked folder is not followed (no loops)
    names = lambda paths: [str(p.relative_to(tmp_path)) for p in paths]  # noqa: E731
    assert names(scan_directory(tmp_path)) == ["a.png", "b.JPG", "c.webp", "e.TIFF"]
    assert names(scan_directory(tmp_path, recursive=True)) == ["a.png", "b.JPG", "c.webp", "e.TIFF", "sub/deep.gif"]


def test_recursive_scan_follows_symlinked_folders_once_and_says_what_it_skips(tmp_path):
    # Audit: --recursive skipped symlinked subfolders, and a symlink loop, without a word.
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere" / "e.png").write_bytes(b"x")
    (tmp_path / "elsewhere" / "deep" / "f.png").write_bytes(b"x")
    top = tmp_path / "top"
    (top / "real").mkdir(parents=True)
    (top / "real" / "r.png").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", top / "linked")     # followed
    os.symlink(top / "real", top / "again")                # the same folder twice: scanned once
    os.symlink(top, top / "real" / "loop")                 # a loop: not followed
    notes: list[str] = []
    names = [str(p.relative_to(top)) for p in scan_directory(top, recursive=True, notes=notes)]
    assert names == ["linked/deep/f.png", "linked/e.png", "real/r.png"]
    assert len(notes) == 2, notes
    assert any(n.startswith(str(top / "again")) and "already scanned" in n for n in notes), notes
    assert any(n.startswith(str(top / "real" / "loop")) and "(a loop)" in n for n in notes), notes
    items, item_notes = items_from_paths([str(top)], recursive=True)
    assert len(items) == 3 and item_notes == notes  # the CLI prints them under the batch summary


def test_paths_take_named_files_as_given_and_scan_folders(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "x.png").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    items, notes = items_from_paths([str(tmp_path / "photo.raw"), str(tmp_path / "imgs"), str(tmp_path / "empty")],
                                    query="Is it sharp?", reference="ref.png")
    assert [Path(i.image).name for i in items] == ["photo.raw", "x.png"]  # a named file is taken whatever its name
    assert all(i.query == "Is it sharp?" and i.reference == "ref.png" for i in items)
    assert notes == [f"{tmp_path / 'empty'}: no image files found (pass --recursive to include subfolders)"]


def write_manifest(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_manifest_rows_become_items_with_their_question_and_metadata(tmp_path):
    data = tmp_path / "data"
    images(data / "imgs", 2)
    m = write_manifest(data / "manifest.jsonl", [
        {"id": "r1", "image": "imgs/img00.jpg", "reference": "imgs/img01.jpg", "type": "jpeg", "level": 3},
        {"id": "r2", "image": "imgs/img01.jpg", "question": "Is it blurry?", "options": {"A": "Yes", "B": "No"}, "answer": "B"},
        {"image": "imgs/img00.jpg"},            # batch manifests need no id and no target
        "{not json",
        {"id": "r4", "image": "imgs/img00.jpg", "level": 9},
    ])
    items, problems = items_from_manifest(m, query="Rate it")
    assert [i.id for i in items] == ["r1", "r2", "imgs/img00.jpg"]
    assert items[0].image == str(data / "imgs/img00.jpg") and items[0].reference == str(data / "imgs/img01.jpg")
    assert items[0].query == "Rate it" and items[0].meta["level"] == 3 and items[0].meta["category"] == "Compression"
    assert items[1].query == "Is it blurry? A. Yes B. No" and items[1].meta["answer"] == "B"
    assert all(i.problem is None for i in items)
    assert [p.split(":")[0] for p in problems] == ["line 4", "line 5 (r4)"]


def test_manifest_paths_cannot_leave_the_manifest_folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    secret = write_test_image(tmp_path / "outside.jpg", size=(16, 16))
    os.symlink(secret, data / "link.jpg")  # a symlink inside that points out counts as outside
    m = write_manifest(data / "m.jsonl", [
        {"id": "abs", "image": str(secret)},
        {"id": "up", "image": "../outside.jpg"},
        {"id": "link", "image": "link.jpg"},
        {"id": "ref", "image": "ok.jpg", "reference": "../outside.jpg"},
        {"id": "fine", "image": "sub/../ok.jpg"},
    ])
    items, _ = items_from_manifest(m)
    problems = {i.id: i.problem for i in items}
    for key in ("abs", "up", "link", "ref"):
        assert problems[key] and "outside the manifest's folder" in problems[key] and "--allow-absolute" in problems[key]
    assert problems["fine"] is None
    allowed, _ = items_from_manifest(m, allow_outside=True)
    assert all(i.problem is None for i in allowed)


def test_manifest_path_escape_is_a_failed_line_not_a_lost_row(tmp_path, settings, registry):
    data = tmp_path / "data"
    images(data, 1)
    write_test_image(tmp_path / "secret.jpg", size=(16, 16))
    m = write_manifest(data / "m.jsonl", [{"id": "in", "image": "img00.jpg"}, {"id": "out", "image": "../secret.jpg"}])
    items, _ = items_from_manifest(m)
    assessor, vlm = canned_assessor(settings, registry)
    summary = run_batch(items, tmp_path / "r.jsonl", assessor, concurrency=2)
    recs = {r["id"]: r for r in lines(tmp_path / "r.jsonl")}
    assert recs["in"]["status"] == "ok" and recs["out"]["status"] == "failed"
    assert recs["out"]["error_type"] == "bad_input" and "outside the manifest's folder" in recs["out"]["error"]
    assert recs["out"]["image_sha256"] is None  # the refused file was not even read
    assert vlm.count() == 5 and summary.status == "partial"  # only the allowed image reached the model


# ── keys ────────────────────────────────────────────────────────────────────────────────────────


def test_keys_follow_content_query_and_configuration(tmp_path, settings):
    img = write_test_image(tmp_path / "a.jpg", size=(32, 32))
    fp = config_fingerprint(settings)
    base = prepare_item(0, BatchItem(image=str(img)), settings, fp)
    assert prepare_item(5, BatchItem(image=str(tmp_path / "." / "a.jpg")), settings, fp).key == base.key
    # An empty query and the default query are the same request.
    assert prepare_item(0, BatchItem(image=str(img), query="Rate the overall quality of this image."), settings, fp).key == base.key
    asked = prepare_item(0, BatchItem(image=str(img), query="Is it blurry?"), settings, fp)
    assert asked.identity != base.identity and asked.key != base.key
    write_test_image(img, size=(32, 32), seed=9)  # same path, new content: same item, new result
    changed = prepare_item(0, BatchItem(image=str(img)), settings, fp)
    assert changed.identity == base.identity and changed.key != base.key
    missing = prepare_item(0, BatchItem(image=str(tmp_path / "gone.jpg")), settings, fp)
    assert missing.image_sha256 is None


def test_fingerprint_counts_what_changes_answers_only(tmp_path):
    base = load_settings(tmp_path)
    fp = config_fingerprint(base)
    assert config_fingerprint(load_settings(tmp_path, lm="openai/gpt-4o")) != fp
    assert config_fingerprint(load_settings(tmp_path, fusion={"prob_mode": "uniform"})) != fp
    assert config_fingerprint(load_settings(tmp_path, cache={"dir": str(tmp_path / "elsewhere")})) == fp
    slow = load_settings(tmp_path)
    slow.backends.planner.timeout, slow.backends.planner.num_retries = 600, 9
    assert config_fingerprint(slow) == fp  # resuming with a longer timeout must not redo finished items
    # The other transport settings alike: "raise call_budget or timeout" is what a budget error says to do,
    # and resuming after that re-ran (and duplicated) every finished item; lm_history is for debugging.
    for role in ("planner", "executor", "summarizer"):
        r = slow.backends.role(role)
        r.call_budget, r.max_retry_after, r.max_reply_bytes, r.api_key_env = 900, 120, 16 << 20, "MY_KEY"
    slow.pipeline.lm_history = True
    assert config_fingerprint(slow) == fp
    prog = tmp_path / "planner.json"
    prog.write_text('{"a": 1}')
    with_prog = load_settings(tmp_path, lm="openai/gpt-4o", programs={"planner": str(prog)})  # programs matter with a model only
    before = config_fingerprint(with_prog)
    prog.write_text('{"a": 2}')  # same path, recompiled program
    assert config_fingerprint(with_prog) != before


def test_fingerprint_leaves_out_limits_and_unused_model_settings(tmp_path):
    # Audit: raising AGENTIC_IQA_MAX_PIXELS, or adding --offline with no model configured, changed the
    # fingerprint, so --resume re-ran every finished item and left its old lines beside the new ones.
    fp = config_fingerprint(load_settings(tmp_path))
    assert config_fingerprint(load_settings(tmp_path, max_image_pixels=200_000)) == fp
    assert config_fingerprint(load_settings(tmp_path, max_query_chars=50_000)) == fp
    assert config_fingerprint(load_settings(tmp_path, backend="offline")) == fp  # no model: the same analyst
    # With a model, forcing the offline analyst does change who answers.
    model = load_settings(tmp_path, lm="openai/gpt-4o")
    assert config_fingerprint(load_settings(tmp_path, lm="openai/gpt-4o", backend="offline")) != config_fingerprint(model)
    assert config_fingerprint(load_settings(tmp_path, lm="openai/gpt-4o", image_transport="jpeg:80")) != config_fingerprint(model)


def test_retry_failed_after_raising_the_pixel_limit_replaces_only_the_failed_line(tmp_path, registry):
    small, big = images(tmp_path / "in", 1)[0], write_test_image(tmp_path / "in" / "big.png", size=(400, 300))
    out = tmp_path / "r.jsonl"
    items = [BatchItem(image=str(small)), BatchItem(image=str(big))]

    def offline(limit):
        return Assessor(load_settings(tmp_path, backend="offline", cache={"enabled": False}, max_image_pixels=limit),
                        registry=registry)

    first = run_batch(items, out, offline(100_000))
    assert (first.ok, first.failed) == (1, 1)
    again = run_batch(items, out, offline(200_000), retry_failed=True)
    assert (again.ran, again.already_done, again.replaced_lines) == (1, 1, 1)
    recs = lines(out)
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)


# ── the results file ────────────────────────────────────────────────────────────────────────────


def rec(key: str, status: str = "ok", identity: str | None = None) -> dict:
    return {"key": key, "identity": identity or f"id-{key}", "status": status}


def test_results_file_appends_whole_lines_and_refuses_to_clobber(tmp_path):
    path = tmp_path / "out" / "r.jsonl"
    with ResultsFile(path) as rf:
        assert rf.open().records == []
        rf.append(rec("a"))
        with pytest.raises(ValueError):  # never a bare NaN in the file (records come through _finite)
            rf.append({**rec("x"), "score": float("nan")})
        rf.append(rec("b"))
    assert [r["key"] for r in lines(path)] == ["a", "b"]
    with pytest.raises(BatchError, match="already holds results; pass --resume"):
        ResultsFile(path).open()
    with ResultsFile(path) as rf:
        assert [r["key"] for r in rf.open(resume=True).records] == ["a", "b"]
    with ResultsFile(path) as rf:
        rf.open(overwrite=True)
    assert path.read_bytes() == b""
    with pytest.raises(BatchError, match="is a directory"):
        ResultsFile(tmp_path).open()


def test_a_second_writer_is_locked_out(tmp_path):
    path = tmp_path / "r.jsonl"
    first = ResultsFile(path)
    first.open()
    try:
        with pytest.raises(BatchError, match="another agentic-iqa batch is writing"):
            ResultsFile(path).open(resume=True)
        first.append(rec("a"))
        first.append(rec("b", "failed"))
        # After a rewrite the file is a new inode; it must still be locked.
        assert first.rewrite(lambda r: r["status"] == "ok") == 1
        with pytest.raises(BatchError, match="another agentic-iqa batch"):
            ResultsFile(path).open(resume=True)
        first.append(rec("c"))
    finally:
        first.close()
    assert [r["key"] for r in lines(path)] == ["a", "c"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_partial_trailing_line_is_cut_off(tmp_path):
    path = tmp_path / "r.jsonl"
    good = json.dumps(rec("a")) + "\n"
    path.write_text(good + '{"key": "b", "status": "o', encoding="utf-8")
    with ResultsFile(path) as rf:
        state = rf.open(resume=True)
        assert state.repaired_bytes == len('{"key": "b", "status": "o') and [r["key"] for r in state.records] == ["a"]
        rf.append(rec("c"))
    assert [r["key"] for r in lines(path)] == ["a", "c"]


def test_a_whole_record_missing_its_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec("a")) + "\n" + json.dumps(rec("b")), encoding="utf-8")
    with ResultsFile(path) as rf:
        state = rf.open(resume=True)
        assert state.completed_partial and state.repaired_bytes == 0
        rf.append(rec("c"))
    assert [r["key"] for r in lines(path)] == ["a", "b", "c"]


def test_a_file_that_is_not_ours_is_refused(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text('{"hello": "world"}\n{"x": 1}\n')
    with pytest.raises(BatchError, match="does not look like an agentic-iqa results file"):
        ResultsFile(path).open(resume=True)
    assert path.read_text() == '{"hello": "world"}\n{"x": 1}\n'  # untouched


def test_a_file_that_is_not_a_results_file_is_never_overwritten(tmp_path):
    # `assess a.jpg b.jpg --out c.jpg` (a slip for c.jsonl): the refusal advised --overwrite, and
    # --overwrite then truncated the photo. A file with no result lines is refused either way.
    photo = tmp_path / "c.jpg"
    write_test_image(photo, size=(64, 48))
    before = photo.read_bytes()
    with pytest.raises(BatchError) as err:
        ResultsFile(photo).open()
    assert "--overwrite to start over" not in str(err.value) and "not an agentic-iqa results file" in str(err.value)
    with pytest.raises(BatchError, match="not an agentic-iqa results file"):
        ResultsFile(photo).open(overwrite=True)
    assert photo.read_bytes() == before
    with pytest.raises(BatchError, match="not look like an agentic-iqa results file"):
        ResultsFile(photo).open(resume=True)
    assert photo.read_bytes() == before  # before, --resume cut the photo's tail off (a "partial last line") first
    first_write_cut = tmp_path / "r.jsonl"  # a crash inside the very first write: still ours, repaired
    first_write_cut.write_bytes(b'{"key":"abc","identity":"x","sta')
    with ResultsFile(first_write_cut) as rf:
        assert rf.open(resume=True).repaired_bytes == 32
    assert first_write_cut.read_bytes() == b""
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"hello": "world"}\n')
    with pytest.raises(BatchError, match="not an agentic-iqa results file"):
        ResultsFile(notes).open(overwrite=True)
    assert notes.read_text() == '{"hello": "world"}\n'


@pytest.mark.parametrize("special", ["/dev/null", "/dev/full"])
def test_a_device_as_the_results_file_is_refused(special):
    # Before: "batch failed: OSError: [Errno 22] Invalid argument" (/dev/null) or "[Errno 28] No space
    # left on device" (/dev/full), exit 1, after the batch had started.
    with pytest.raises(BatchError, match=f"--out {special} is not a regular file"):
        ResultsFile(special).open()


def test_records_are_strict_json(tmp_path, settings, registry):
    """Failed tool logs carry NaN scores; the line must still be strict JSON (no bare NaN)."""
    img = write_test_image(tmp_path / "a.jpg", size=(64, 48))
    assessor, _ = canned_assessor(settings, registry)
    (res,) = list(assess_many([img], assessor=assessor, concurrency=1))
    line = json.dumps(res.record(with_trace=True), allow_nan=False)
    assert '"trace"' in line and json.loads(line)["result"]["trace"]
    assert "trace" not in res.record()["result"]


# ── resume planning ─────────────────────────────────────────────────────────────────────────────


def test_plan_resume_decides_per_item(tmp_path, settings):
    from agentic_iqa.batch import PreparedItem, ResumeState

    def prep(identity, key, sha="s"):
        return PreparedItem(0, BatchItem(image=identity), "q", sha, None, identity, key)

    failed = lambda key, identity, sha: {**rec(key, "failed", identity), "image_sha256": sha, "reference_sha256": None}  # noqa: E731
    state = ResumeState(records=[rec("k1", "ok", "done"), failed("k2", "broken", "s"), rec("old", "ok", "changed"),
                                 rec("k4", "ok", "vanished"), failed("k5", "fixed", "truncated"),
                                 failed("k6", "appeared", None), failed("k7", "still-missing", None)])
    items = [prep("done", "k1"), prep("broken", "k2x"), prep("changed", "new"), prep("fresh", "k9"),
             prep("vanished", "k4-now", sha=None), prep("fixed", "k5-now"), prep("appeared", "k6-now"),
             prep("still-missing", "k7-now", sha=None)]
    to_run, replace, counts = plan_resume(items, state, retry_failed=False)
    # A failed item whose file changed since (replaced by a good one, or appeared) runs again, as a changed image does.
    assert [p.identity for p in to_run] == ["changed", "fresh", "fixed", "appeared"]
    assert replace == {"changed", "fixed", "appeared"}
    assert counts == {"already_done": 2, "failed_before": 2}  # "vanished": unreadable now, kept as done
    to_run, replace, counts = plan_resume(items, state, retry_failed=True)
    assert [p.identity for p in to_run] == ["broken", "changed", "fresh", "fixed", "appeared", "still-missing"]


# ── the runner ──────────────────────────────────────────────────────────────────────────────────


def test_assess_many_yields_every_item_once_bad_ones_as_failures(tmp_path, settings, registry):
    good = images(tmp_path, 3)
    (tmp_path / "bad.jpg").write_text("not an image")
    inputs = [good[0], str(tmp_path / "bad.jpg"), {"image": good[1], "query": "Is it blurry? A. Yes B. No", "id": "q"},
              (good[2], None), str(tmp_path / "missing.png")]
    assessor, _ = canned_assessor(settings, registry)
    results = list(assess_many(inputs, assessor=assessor, concurrency=3))
    assert sorted(r.index for r in results) == [0, 1, 2, 3, 4]
    by = {r.index: r for r in results}
    assert [by[i].status for i in range(5)] == ["ok", "failed", "ok", "ok", "failed"]
    assert by[1].error_type == "bad_input" and "not an image" in by[1].error
    assert "file not found" in by[4].error
    assert by[2].item.id == "q" and by[0].result.score is not None


def test_an_unexpected_crash_is_one_failed_item(tmp_path, settings, registry):
    imgs = images(tmp_path, 3)
    assessor, _ = canned_assessor(settings, registry)
    real = Assessor.assess

    def flaky(self, image, *args, **kwargs):
        if str(image).endswith("img01.jpg"):
            raise RuntimeError("boom")
        return real(self, image, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Assessor, "assess", flaky)
        results = {r.index: r for r in assess_many(imgs, assessor=assessor, concurrency=2)}
    assert results[1].status == "failed" and results[1].error == "RuntimeError: boom" and results[1].error_type == "error"
    assert results[0].ok and results[2].ok


def test_items_are_pulled_lazily(tmp_path, settings, registry):
    """At most `concurrency` items are taken ahead of the results handed out: a long (or endless)
    input never piles up in memory."""
    imgs = images(tmp_path, 2)
    pulled = 0

    def source():
        nonlocal pulled
        for i in range(10):
            pulled += 1
            yield imgs[i % 2]

    assessor, _ = canned_assessor(settings, registry)
    seen = 0
    for _ in assess_many(source(), assessor=assessor, concurrency=3):
        seen += 1
        assert pulled <= seen + 3
    assert seen == 10


def test_lm_calls_overlap_while_tool_runs_take_turns(tmp_path, settings, registry):
    active = peak = 0
    lock = threading.Lock()

    def slow_call(call):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1

    from agentic_iqa.batch import BatchRunner

    assessor, _ = canned_assessor(settings, registry, latency_hook=slow_call)
    batch = BatchRunner(assessor, concurrency=4)
    results = list(batch.run((i, BatchItem(image=str(p))) for i, p in enumerate(images(tmp_path, 8))))
    assert all(r.ok for r in results)
    assert peak >= 2          # assessments really ran at the same time
    assert batch.gate.peak == 1  # but never two tool runs at once


def test_dspy_history_and_trace_stay_empty(tmp_path, settings, registry):
    from dspy.clients import base_lm

    imgs = images(tmp_path, 3)
    assessor, vlm = canned_assessor(settings, registry)
    global_before, trace_before = len(base_lm.GLOBAL_HISTORY), len(dspy.settings.trace)
    assert all(r.ok for r in assess_many(imgs, assessor=assessor, concurrency=2))
    assert vlm.count() == 15
    assert vlm.lm.history == [] and len(base_lm.GLOBAL_HISTORY) == global_before
    assert len(dspy.settings.trace) == trace_before
    assessor.assess(imgs[0])  # a single assessment keeps nothing either
    assert vlm.lm.history == [] and len(base_lm.GLOBAL_HISTORY) == global_before
    # Asked for (lm_history: true), DSPy keeps them, images included: this test would see a leak.
    keeping = settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"lm_history": True})})
    assessor, vlm = canned_assessor(keeping, registry)
    assessor.assess(imgs[0])
    assert len(vlm.lm.history) == 5


def test_finished_items_images_are_not_held(tmp_path, settings, registry):
    """DSPy memoizes Image.format (32 entries, each the image as a base64 data URL, twice); a batch
    clears it as items finish, so no finished item's image stays alive."""
    import gc

    imgs = images(tmp_path, 3)
    assessor, _ = canned_assessor(settings, registry)
    assessor.assess(imgs[0])  # a plain assessment leaves its image in DSPy's cache …
    assert dspy.Image.format.cache_info().currsize > 0
    assert all(r.ok for r in assess_many(imgs, assessor=assessor, concurrency=2))
    assert dspy.Image.format.cache_info().currsize == 0  # … a batch does not
    gc.collect()
    batch_only = {base64.b64encode(p.read_bytes()).decode() for p in imgs[1:]}  # imgs[0] also ran outside
    alive = [o for o in gc.get_objects() if type(o) is dspy.Image and o.url.split(",", 1)[-1] in batch_only]
    assert alive == []


# ── whole batches ───────────────────────────────────────────────────────────────────────────────


def test_resume_runs_only_what_is_missing_and_replaces_changed_files(tmp_path, settings, registry):
    imgs = images(tmp_path / "in", 4)
    out = tmp_path / "r.jsonl"
    assessor, vlm = canned_assessor(settings, registry)
    items = [BatchItem(image=str(p)) for p in imgs] + [BatchItem(image=str(tmp_path / "in" / "missing.jpg"))]
    first = run_batch(items, out, assessor, concurrency=2)
    assert (first.ok, first.failed, first.status) == (4, 1, "partial")
    assert vlm.count() == 20

    again = run_batch(items, out, assessor, resume=True)
    assert (again.ran, again.already_done, again.failed_before) == (0, 4, 1) and vlm.count() == 20

    write_test_image(imgs[2], size=(64, 48), seed=99)        # one image changed on disk
    write_test_image(tmp_path / "in" / "missing.jpg", size=(64, 48), seed=7)  # the missing one appears
    third = run_batch(items, out, assessor, retry_failed=True)
    assert (third.ran, third.ok, third.already_done, third.replaced_lines) == (2, 2, 3, 2)
    recs = lines(out)
    assert len(recs) == 5 and len({r["identity"] for r in recs}) == 5 and all(r["status"] == "ok" for r in recs)
    assert third.status == "ok"


def test_resume_retries_a_failed_image_that_was_fixed(tmp_path, settings, registry):
    # Audit: a truncated image replaced by a good one was reported "failed before (not retried)".
    (good,) = images(tmp_path / "in", 1)
    broken = tmp_path / "in" / "x.jpg"
    broken.write_bytes(good.read_bytes()[:200])
    out = tmp_path / "r.jsonl"
    items = [BatchItem(image=str(good)), BatchItem(image=str(broken))]
    assessor, _ = canned_assessor(settings, registry)
    assert run_batch(items, out, assessor).failed == 1
    assert run_batch(items, out, assessor, resume=True).failed_before == 1  # unchanged: settled
    write_test_image(broken, size=(64, 48), seed=5)
    fixed = run_batch(items, out, assessor, resume=True)
    assert (fixed.ran, fixed.ok, fixed.failed_before, fixed.replaced_lines) == (1, 1, 0, 1)
    assert [r["status"] for r in lines(out)] == ["ok", "ok"]


def test_retry_failed_redoes_answers_the_offline_analyst_gave_during_an_outage(tmp_path, registry):
    # Audit: during an LM outage (HTTP 500) items were answered by the offline analyst (ok, degraded), and the
    # documented recovery, --resume --retry-failed, skipped them: the results file mixed models.
    from fake_openai import FakeOpenAIServer, Reply, scripted

    from agentic_iqa.batch.runner import UNREACHABLE_STREAK

    imgs = images(tmp_path / "in", UNREACHABLE_STREAK + 1)
    items = [BatchItem(image=str(p)) for p in imgs]
    out = tmp_path / "r.jsonl"
    down = [True]
    good = scripted({"plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
                     "select": SELECT_PIQE, "score": valid_reply("score", level="B"), "explain": valid_reply("explain")})
    outage = Reply(status=500, error_body={"error": {"message": "down"}})
    with FakeOpenAIServer(lambda body: outage if down[0] else good(body)) as srv:
        cfg = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        for role in ("planner", "executor", "summarizer"):
            cfg.backends.role(role).num_retries = 0
        first = run_batch(items, out, Assessor(cfg, registry=registry), concurrency=1)
        assert first.stopped and first.degraded == UNREACHABLE_STREAK and first.not_attempted == 1
        assert "--retry-failed" in first.stopped  # the circuit breaker names the recovery
        down[0] = False
        kept = run_batch(items, out, Assessor(cfg, registry=registry), resume=True)
        assert kept.ran == 1 and kept.already_done == UNREACHABLE_STREAK
        assert any("LM was unreachable" in n and "--retry-failed" in n for n in kept.notes), kept.notes
        redone = run_batch(items, out, Assessor(cfg, registry=registry), retry_failed=True)
    assert (redone.ran, redone.degraded, redone.already_done, redone.replaced_lines) == (UNREACHABLE_STREAK, 0, 1,
                                                                                         UNREACHABLE_STREAK)
    recs = lines(out)
    assert len(recs) == len(imgs) and all(r["backend"].startswith("vlm") for r in recs), [r["backend"] for r in recs]


def test_retry_failed_redoes_answers_the_offline_analyst_gave_for_unusable_replies(tmp_path, registry):
    # A server that answered 200 with no usable reply (here: prose where JSON was asked, every time) made every item
    # "offline analyst (no usable model reply: ...)". Once the server is fixed, --retry-failed redid only the
    # unreachable ones: these stayed, and the results file mixed the analyst's answers with the model's.
    from fake_openai import FakeOpenAIServer, Reply, scripted

    imgs = images(tmp_path / "in", 2)
    items = [BatchItem(image=str(p)) for p in imgs]
    out = tmp_path / "r.jsonl"
    broken = [True]
    good = scripted({"plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
                     "select": SELECT_PIQE, "score": valid_reply("score", level="B"), "explain": valid_reply("explain")})
    prose = Reply("I think the image looks fine overall.")
    with FakeOpenAIServer(lambda body: prose if broken[0] else good(body)) as srv:
        cfg = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        first = run_batch(items, out, Assessor(cfg, registry=registry), concurrency=1)
        assert first.ok == 2 and all(r["backend"].startswith(UNUSABLE_BACKEND) for r in lines(out)), lines(out)
        broken[0] = False
        kept = run_batch(items, out, Assessor(cfg, registry=registry), resume=True)
        assert kept.ran == 0 and kept.already_done == 2
        assert any("no usable reply" in n and "--retry-failed" in n for n in kept.notes), kept.notes
        redone = run_batch(items, out, Assessor(cfg, registry=registry), retry_failed=True)
    assert (redone.ran, redone.already_done, redone.replaced_lines) == (2, 0, 2)
    recs = lines(out)
    assert len(recs) == 2 and all(r["backend"].startswith("vlm") for r in recs), [r["backend"] for r in recs]


def test_resume_with_another_configuration_says_why_nothing_was_skipped(tmp_path, settings, registry):
    # Results are keyed by configuration: resuming with another model, server or fusion setting runs
    # every item again beside the old lines. Before, nothing said so: the user saw a full re-run and a
    # results file with two lines per image.
    imgs = images(tmp_path / "in", 2)
    out = tmp_path / "r.jsonl"
    items = [BatchItem(image=str(p)) for p in imgs]
    assessor, _ = canned_assessor(settings, registry)
    run_batch(items, out, assessor)
    same = run_batch(items, out, assessor, resume=True)
    assert same.already_done == 2 and not any("another configuration" in n for n in same.notes)

    other_settings = load_settings(tmp_path, cache={"enabled": False}, fusion={"prob_mode": "uniform"})
    other, _ = canned_assessor(other_settings, registry)
    again = run_batch(items, out, other, resume=True)
    assert again.already_done == 0 and again.ran == 2
    note = next(n for n in again.notes if "another configuration" in n)
    assert "2 earlier result line(s)" in note and "--out" in note, note
    assert len(lines(out)) == 4


def test_duplicates_in_the_input_are_assessed_once(tmp_path, settings, registry):
    (img,) = images(tmp_path, 1)
    assessor, vlm = canned_assessor(settings, registry)
    summary = run_batch([BatchItem(image=str(img)), BatchItem(image=str(tmp_path / "." / img.name))],
                        tmp_path / "r.jsonl", assessor)
    assert summary.duplicates == 1 and summary.ran == 1 and len(lines(tmp_path / "r.jsonl")) == 1


def test_interrupted_batch_keeps_finished_items_and_resumes(tmp_path, settings, registry):
    imgs = images(tmp_path / "in", 6)
    out = tmp_path / "r.jsonl"
    assessor, _ = canned_assessor(settings, registry)
    items = [BatchItem(image=str(p)) for p in imgs]

    def ctrl_c_after_two(res, summary):
        if summary.ran == 2:
            raise KeyboardInterrupt

    stopped = run_batch(items, out, assessor, concurrency=2, on_result=ctrl_c_after_two)
    assert stopped.interrupted and stopped.status == "interrupted" and len(lines(out)) == 2
    assert stopped.not_attempted == 4  # was 0: the summary said nothing was left to do
    done = run_batch(items, out, assessor, concurrency=2, resume=True)
    assert (done.already_done, done.ran) == (2, 4)
    assert sorted(r["image"] for r in lines(out)) == sorted(map(str, imgs))


# ── the CLI ─────────────────────────────────────────────────────────────────────────────────────


def cli(*args: str):
    result = runner.invoke(app, ["assess", *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def test_cli_folder_batch_json_summary_and_resume(tmp_path):
    folder = tmp_path / "shots"
    images(folder, 2)
    images(folder / "sub", 1, prefix="deep")
    out = tmp_path / "results.jsonl"
    r = cli(str(folder), "--out", str(out), "--offline", "--no-cache", "--json", "--concurrency", "2")
    assert r.exit_code == EXIT_OK, r.output
    summary = json.loads(r.stdout)
    assert (summary["total"], summary["ok"], summary["failed"]) == (2, 2, 0)
    recs = lines(out)
    assert {Path(x["image"]).name for x in recs} == {"img00.jpg", "img01.jpg"}
    assert all(x["backend"] == "offline analyst" and x["config"] == summary["config"] for x in recs)

    r = cli(str(folder), "--out", str(out), "--offline", "--no-cache", "--json", "--recursive", "--resume")
    summary = json.loads(r.stdout)
    assert r.exit_code == EXIT_OK and (summary["already_done"], summary["ran"]) == (2, 1)
    assert len(lines(out)) == 3

    r = cli(str(folder), "--out", str(out), "--offline")
    assert r.exit_code == EXIT_BAD_INPUT and "--resume" in r.stderr and "--overwrite" in r.stderr


def test_cli_manifest_batch_with_text_summary(tmp_path):
    data = tmp_path / "data"
    images(data, 2)
    m = write_manifest(data / "m.jsonl", [{"id": "a", "image": "img00.jpg", "level": 2},
                                          {"id": "b", "image": "img01.jpg", "question": "Is it noisy?", "options": {"A": "Yes", "B": "No"}, "answer": "A"},
                                          {"id": "c", "image": "gone.jpg"}, "oops"])
    out = tmp_path / "r.jsonl"
    r = cli("--manifest", str(m), "--out", str(out), "--offline", "--no-cache")
    assert r.exit_code == EXIT_PARTIAL, r.output
    text = " ".join(r.stdout.split())
    assert "items │ 4" in text and "ok 2" in text and "failed 1" in text
    assert "failed: " in text and "gone.jpg: file not found" in text and "manifest: line 4: bad JSON" in text
    recs = {x["id"]: x for x in lines(out)}
    # The row's question (with its options) was asked, and the row's truth travels with the result.
    assert recs["b"]["query"] == "Is it noisy? A. Yes B. No" and recs["b"]["mode"] == "answer" and recs["b"]["answer"]
    assert recs["b"]["meta"] == {"answer": "A", "question": "Is it noisy?", "options": {"A": "Yes", "B": "No"},
                                 "mos_higher_better": True, "split": "test"}
    assert recs["a"]["meta"]["level"] == 2 and recs["c"]["status"] == "failed"
    # The unusable row is recorded too ("printed and recorded"; before, only printed), once across resumes,
    # and dropped once the row is fixed.
    assert recs[None]["status"] == "failed" and recs[None]["error"].startswith("manifest line 4: bad JSON")
    assert recs[None]["manifest_row"] and len(lines(out)) == 4
    cli("--manifest", str(m), "--out", str(out), "--offline", "--no-cache", "--resume")
    assert len(lines(out)) == 4
    write_manifest(m, [{"id": "a", "image": "img00.jpg", "level": 2},
                       {"id": "b", "image": "img01.jpg", "question": "Is it noisy?", "options": {"A": "Yes", "B": "No"}, "answer": "A"},
                       {"id": "c", "image": "gone.jpg"}, {"id": "d", "image": "img00.jpg", "question": "Is it sharp?"}])
    r = cli("--manifest", str(m), "--out", str(out), "--offline", "--no-cache", "--resume", "--json")
    assert json.loads(r.stdout)["replaced_lines"] == 1
    assert sorted(x["id"] for x in lines(out)) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("args,message", [
    (["A", "B"], "pass --out results.jsonl"),
    (["A", "--resume"], "--resume is for batches"),
    (["A", "B", "--out", "OUT", "--save-trace", "t.json"], "--with-trace"),
    (["A", "--manifest", "M", "--out", "OUT"], "either images/folders or --manifest"),
    (["--manifest", "NOPE", "--out", "OUT"], "does not exist"),
    (["EMPTY", "--out", "OUT"], "no images to assess"),
    (["A", "B", "--out", "DIR"], "is a directory"),
    (["A", "B", "--out", "OUT", "--resume", "--overwrite"], "contradict"),
    ([], "nothing to assess"),
    # One image: the Ray engine and its sizes are for batches (before: silently ignored, run locally).
    (["A", "--engine", "ray"], "--engine ray is for batches"),
    (["A", "--actors", "2"], "--actors: only with --engine ray"),
    (["A", "--engine", "foo"], "--engine must be local or ray"),
])
def test_cli_batch_usage_errors_are_one_line(tmp_path, args, message):
    a, b = images(tmp_path, 2)
    (tmp_path / "empty").mkdir()
    (tmp_path / "M").write_text("")
    names = {"A": str(a), "B": str(b), "OUT": str(tmp_path / "o.jsonl"), "DIR": str(tmp_path), "M": str(tmp_path / "M"),
             "NOPE": str(tmp_path / "nope.jsonl"), "EMPTY": str(tmp_path / "empty")}
    r = cli(*[names.get(x, x) for x in args], "--offline")
    assert r.exit_code == EXIT_BAD_INPUT
    assert message in " ".join(r.stderr.split()) and r.stderr.startswith("error: ")


def test_cli_refuses_a_results_file_in_use(tmp_path):
    imgs = images(tmp_path, 2)
    out = tmp_path / "r.jsonl"
    holder = ResultsFile(out)
    holder.open()
    try:
        r = cli(*map(str, imgs), "--out", str(out), "--offline")
    finally:
        holder.close()
    assert r.exit_code == EXIT_BAD_INPUT and "another agentic-iqa batch is writing" in r.stderr


def test_progress_bar_shows_rate_and_failures():
    from types import SimpleNamespace

    from rich.console import Console

    from agentic_iqa.cli.assess import _Progress

    buf = io.StringIO()
    progress = _Progress(enabled=True, console=Console(file=buf, force_terminal=True, width=200))
    summary = SimpleNamespace(ran=0, failed=0, degraded=0)
    with progress:
        progress.start(summary, 3)
        for failed in (0, 1, 1):
            time.sleep(0.01)
            summary.ran += 1
            summary.failed, summary.degraded = failed, 1
            progress.update(None, summary)
    text = buf.getvalue()
    assert "3/3" in text and "img/s" in text and "1 failed" in text and "1 degraded" in text


def test_public_assess_many_builds_its_own_assessor(tmp_path):
    import agentic_iqa

    assert agentic_iqa.assess_many is assess_many  # exported lazily, like assess
    imgs = images(tmp_path, 2)
    results = list(agentic_iqa.assess_many([str(p) for p in imgs], config=tmp_path, backend="offline", concurrency=2,
                                           use_cache=False))
    assert sorted(r.index for r in results) == [0, 1]
    assert all(r.ok and r.result.backend == "offline analyst" for r in results)


@pytest.mark.parametrize("bare", ["photo.jpg", Path("photo.jpg"), {"image": "photo.jpg"}, BatchItem(image="photo.jpg")])
def test_assess_many_refuses_one_bare_item_at_the_call(bare):
    # Audit: assess_many("photo.jpg") assessed "p", "h", "o", … ("p: file not found" for each character).
    with pytest.raises(TypeError, match=r"not one .*pass \[.*assess\(\) for one image"):
        assess_many(bare)  # no iteration needed: the mistake is reported where it is made
