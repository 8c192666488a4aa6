"""Scale-out on Ray Data (issue 15): `assess_dataset` and `assess … --engine ray` on a local 2-CPU Ray
started here, against the local batch runner: same answers, one row per item through kills and
interrupts, bad items as failed rows, a global cap on LM requests in flight.

Real pyiqa weight-free tools, the offline analyst, and the real HTTP path to the fake model server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (scripts/install.sh installs it)")

from canned import disable_dspy_cache, valid_reply, write_test_image  # noqa: E402
from fake_openai import FakeOpenAIServer, scripted  # noqa: E402

from agentic_iqa.batch import assess_many  # noqa: E402
from agentic_iqa.cli import app  # noqa: E402
from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL  # noqa: E402
from agentic_iqa.config import load_settings  # noqa: E402
from agentic_iqa.distributed import assess_dataset, make_coordinator, read_shards  # noqa: E402

N = 40
ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"), "_logprobs": {"A": -2.5, "B": -0.5, "C": -1.1, "D": -3.0, "E": -5.0},
}
cli = CliRunner()


@pytest.fixture(scope="module")
def cluster():
    disable_dspy_cache()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray-images")
    return [str(write_test_image(d / f"img{i:02d}.jpg", size=(128, 96), seed=i, quality=30 + i)) for i in range(N)]


@pytest.fixture(scope="module")
def slow_images(tmp_path_factory):
    """3 MP photos: each item takes long enough (~0.2 s) that the surviving actor cannot finish the run
    before Ray has restarted the killed one; with the 128×96 images a whole run took ~1 s, less than a
    restart, and the restart assertion below was flaky."""
    d = tmp_path_factory.mktemp("ray-slow-images")
    return [str(write_test_image(d / f"big{i:02d}.jpg", size=(2000, 1500), seed=i, quality=85)) for i in range(N)]


def local(images, settings) -> dict:
    from agentic_iqa.api import Assessor
    from agentic_iqa.distributed import warm_up

    assessor = Assessor(settings)
    warm_up(assessor)  # as the workers do: torch imported by one thread
    return {r.item.image: r for r in assess_many(images, assessor=assessor, concurrency=4)}


def distributed(images, settings, **kw) -> dict:
    ds = ray.data.from_items([{"image": p} for p in images])
    rows = assess_dataset(ds, settings=settings, concurrency=2, batch_size=4, **kw).take_all()
    assert len(rows) == len(images)
    return {r["image"]: r for r in rows}


def assert_same(loc: dict, dist: dict) -> None:
    assert set(loc) == set(dist)
    for image, res in loc.items():
        row = dist[image]
        assert res.ok and row["status"] == "ok", (image, row["error"])
        assert row["score"] == res.result.score and row["level"] == res.result.level
        assert row["answer"] == res.result.answer and row["backend"] == res.result.backend
        assert row["key"] == res.key  # the local batch's resume key
        tools = json.loads(row["tool_scores"])
        assert [t["score"] for t in tools] == [lg.normalized_score for lg in res.result.evidence.tool_logs]


def test_offline_results_match_the_local_batch(cluster, images, tmp_path):
    settings = load_settings(tmp_path, backend="offline", cache={"enabled": False})
    assert_same(local(images, settings), distributed(images, settings))


def test_fake_model_results_match_the_local_batch(cluster, images, tmp_path):
    with FakeOpenAIServer(scripted(ROUTES)) as srv:
        settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        loc = local(images, settings)
        dist = distributed(images, settings)
    assert all(r.result.backend.startswith("vlm") and r.result.result.prob_mode == "logits" for r in loc.values())
    assert_same(loc, dist)
    assert len(srv.requests) == 2 * 5 * N  # five calls per image, each run


def test_global_lm_cap_holds_across_actors(cluster, images, tmp_path):
    with FakeOpenAIServer(scripted(ROUTES), latency=0.03) as srv:
        settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        coordinator = make_coordinator(2)
        dist = distributed(images[:16], settings, lm_max_in_flight=2, threads_per_worker=4, coordinator=coordinator)
        state = ray.get(coordinator.state.remote())
    assert all(r["status"] == "ok" and r["backend"].startswith("vlm") for r in dist.values())
    assert len(state["workers"]) == 2  # two actors, eight threads wanting the model at once
    assert srv.peak_in_flight == 2 and state["peak_in_flight"] == 2
    assert len(srv.requests) == 5 * 16
    # Each actor's batch timings (ray_bench's per-item overhead is measured from them): every item once.
    timing = ray.get(coordinator.timings.remote())
    assert len(timing) == 2 and sum(t["items"] for t in timing.values()) == 16
    for t in timing.values():
        assert t["item_seconds"] > 0 and 0 <= t["later_busy_seconds"] <= t["last_end"] - t["first_end"] + 1e-9


def recording_coordinator(max_in_flight: int):
    """A coordinator that also records when it granted each lease and each back-off it was asked for
    (defined here, so that Ray ships the class by value)."""
    from agentic_iqa.distributed import Coordinator

    class Recording(Coordinator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.grants: list[float] = []
            self.back_offs: list[dict] = []

        async def acquire(self) -> int:
            token = await super().acquire()
            self.grants.append(time.monotonic())  # no await in between: the moment it was granted
            return token

        async def back_off(self, seconds: float) -> None:
            await super().back_off(seconds)
            self.back_offs.append({"start": self.paused_until - seconds, "until": self.paused_until,
                                   "seconds": seconds, "leases": len(self.leases)})

        async def record(self) -> dict:
            return {"grants": list(self.grants), "back_offs": list(self.back_offs)}

    return ray.remote(num_cpus=0, max_concurrency=1000)(Recording).remote(max_in_flight)


def test_a_429_backs_off_the_whole_cluster(cluster, images, tmp_path):
    """The first request is rate limited (Retry-After 1 s): from the moment the coordinator learns of it,
    no request of any actor gets a lease for that second; only requests that already held a lease may
    still reach the server then. Checked on what the coordinator and the server recorded, in order and
    in counts, not on wall times (a loaded machine delays the news of the 429 by a varying amount)."""
    from fake_openai import Reply

    stamps: list[float] = []
    lock = threading.Lock()
    inner = scripted(ROUTES)

    def responder(body):
        with lock:
            stamps.append(time.monotonic())  # CLOCK_MONOTONIC: one clock for every process on this machine
            first = len(stamps) == 1
        return Reply(status=429, headers={"Retry-After": "1"}) if first else inner(body)

    with FakeOpenAIServer(responder) as srv:
        settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        for role in ("planner", "executor", "summarizer"):
            settings.backends.role(role).num_retries = 2
        coordinator = recording_coordinator(4)
        dist = distributed(images[:8], settings, coordinator=coordinator)
        state, record = ray.get([coordinator.state.remote(), coordinator.record.remote()])
    assert all(r["status"] == "ok" and r["backend"].startswith("vlm") for r in dist.values())
    assert state["pauses"] == 1 and len(record["back_offs"]) == 1
    pause = record["back_offs"][0]
    assert pause["seconds"] == 1.0  # the server's Retry-After, for everyone
    assert not [g for g in record["grants"] if pause["start"] <= g < pause["until"]]  # no lease in the pause
    # What reached the server in the pause: at most the requests that held a lease when it began (the
    # rate-limited one's lease included, which it still held).
    reached = [t for t in stamps[1:] if pause["start"] <= t < pause["until"]]
    assert len(reached) <= pause["leases"] - 1, (reached, pause)
    assert len(stamps) == 5 * 8 + 1  # and then the work went on: every call once, the limited one twice


def test_killed_actor_is_restarted_and_no_item_is_lost_or_duplicated(cluster, slow_images, tmp_path):
    images = slow_images
    settings = load_settings(tmp_path, backend="offline", cache={"enabled": False})
    coordinator = make_coordinator()
    ds = ray.data.from_items([{"image": p} for p in images])
    out = assess_dataset(ds, settings=settings, concurrency=2, batch_size=2, coordinator=coordinator)
    rows: list = []
    runner = threading.Thread(target=lambda: rows.extend(out.take_all()))
    runner.start()
    deadline = time.monotonic() + 120
    while ray.get(coordinator.state.remote())["counts"]["batches"] < 2:
        assert time.monotonic() < deadline and runner.is_alive(), "no batch finished"
        time.sleep(0.05)
    handles = ray.get(coordinator.worker_handles.remote())
    ray.kill(next(iter(handles.values())), no_restart=False)
    done_at_kill = ray.get(coordinator.state.remote())["counts"]["ok"]
    runner.join(timeout=300)
    assert not runner.is_alive()
    assert done_at_kill < N  # killed mid-run
    assert Counter(r["image"] for r in rows) == Counter(images)  # exactly one row per item
    assert all(r["status"] == "ok" for r in rows)
    assert len(ray.get(coordinator.state.remote())["workers"]) >= 3  # the killed actor came back


def shard_rows(out: Path) -> list[dict]:
    return read_shards(out)


def test_cli_interrupted_then_resumed_gives_one_row_per_item(cluster, slow_images, tmp_path):
    images = slow_images  # 128×96 items finished the whole run before the SIGINT landed (exit 0)
    folder = Path(images[0]).parent
    out = tmp_path / "shards"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
           "AGENTIC_IQA_RAY_BATCH_SIZE": "2", "AGENTIC_IQA_RAY_ACTORS": "1"}
    cmd = [sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess", str(folder), "--engine", "ray", "--address", cluster,
           "--offline", "--no-cache", "--out", str(out), "--json"]
    # Started as a CI script's `cmd &` starts it (a non-interactive shell's background job): with SIGINT
    # ignored, which the child inherits, and then Python installs no KeyboardInterrupt handler of its own.
    # That is how the fresh-clone CI runs met it: the SIGINT did nothing and the run exited 0 complete.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 180
        while len(list(out.glob("*.json"))) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = shard_rows(out)
    assert proc.returncode == EXIT_INTERRUPTED, stderr.decode()[-2000:]
    assert 0 < len(first) < N
    interrupted = json.loads(stdout)
    assert interrupted["interrupted"] is True  # the summary was printed (not cut short by the watchdog)
    # What --resume has left to do is counted, as a local batch counts it (was 0: "nothing left").
    assert interrupted["ran"] <= len(first) and interrupted["not_attempted"] == N - interrupted["ran"]
    assert interrupted["not_attempted"] >= N - len(first) > 0
    result = cli.invoke(app, ["assess", str(folder), "--engine", "ray", "--offline", "--no-cache", "--out", str(out),
                              "--resume", "--json"], env={"AGENTIC_IQA_RAY_BATCH_SIZE": "4"})
    assert result.exit_code == EXIT_OK, result.output
    summary = json.loads(result.stdout)
    assert summary["already_done"] == len({r["key"] for r in first}) and summary["ran"] == N - summary["already_done"]
    rows = shard_rows(out)
    assert Counter(r["image"] for r in rows) == Counter(images) and all(r["status"] == "ok" for r in rows)
    again = cli.invoke(app, ["assess", str(folder), "--engine", "ray", "--offline", "--no-cache", "--out", str(out), "--resume", "--json"])
    assert again.exit_code == EXIT_OK and json.loads(again.stdout)["ran"] == 0
    assert len(shard_rows(out)) == N


def test_a_ray_batch_handles_sigint_itself_and_a_ctrl_c_outside_the_write_exits_130(images, tmp_path, monkeypatch):
    """In-process and without a cluster: while the Ray batch runs, SIGINT has the batch's handler even
    when it was inherited ignored, and a KeyboardInterrupt escaping the run (Ctrl-C while connecting to
    the cluster) exits 130 with a --resume hint, not click's "Aborted!" (exit 1)."""
    import agentic_iqa.distributed as dist

    seen = []

    def interrupted_run(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGINT))
        raise KeyboardInterrupt

    monkeypatch.setattr(dist, "run_cli_batch", interrupted_run)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = cli.invoke(app, ["assess", str(Path(images[0]).parent), "--engine", "ray", "--offline",
                                  "--out", str(tmp_path / "out"), "--json"])
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back after the batch
    finally:
        signal.signal(signal.SIGINT, previous)
    assert callable(seen[0]) and seen[0] is not signal.default_int_handler, seen
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert "--resume" in result.stderr


def test_bad_items_become_failed_rows_in_parquet(cluster, images, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_test_image(data / "good.jpg", size=(128, 96))
    (data / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    write_test_image(tmp_path / "outside.jpg", size=(128, 96))
    rows = [{"id": "good", "image": "good.jpg"}, {"id": "missing", "image": "missing.jpg"},
            {"id": "corrupt", "image": "corrupt.jpg"}, {"id": "outside", "image": "../outside.jpg"}]
    manifest = data / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = cli.invoke(app, ["assess", "--manifest", str(manifest), "--engine", "ray", "--offline", "--out", str(out),
                              "--format", "parquet", "--json"])
    assert result.exit_code == EXIT_PARTIAL, result.output
    import pyarrow.parquet as pq

    table = pq.read_table(sorted(out.glob("*.parquet")))
    by_id = {r["id"]: r for r in table.to_pylist()}
    assert set(by_id) == {"good", "missing", "corrupt", "outside"}
    assert by_id["good"]["status"] == "ok" and by_id["good"]["score"] is not None
    for bad, why in (("missing", "not found"), ("corrupt", "corrupt.jpg"), ("outside", "outside the manifest's folder")):
        assert by_id[bad]["status"] == "failed" and why in by_id[bad]["error"], by_id[bad]["error"]
        assert by_id[bad]["error_type"] == "bad_input"
    summary = json.loads(result.stdout)
    assert summary["ok"] == 1 and summary["failed"] == 3


def test_an_lm_set_up_wrong_stops_the_whole_cluster(cluster, images, tmp_path):
    """The local batch's circuit breaker: a refused key fails the items that met it; no further item
    starts on any actor, and the run says why."""
    from fake_openai import Reply

    refused = Reply(status=401, error_body={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}})
    with FakeOpenAIServer(scripted({k: refused for k in ("plan", "detect", "analyze", "select", "score")})) as srv:
        out = tmp_path / "out"
        result = cli.invoke(app, ["assess", str(Path(images[0]).parent), "--engine", "ray", "--lm", "openai/fake-vlm",
                                  "--api-base", srv.base_url, "--out", str(out), "--json"],
                            env={"AGENTIC_IQA_RAY_BATCH_SIZE": "2", "AGENTIC_IQA_RAY_ACTORS": "2"})
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    summary = json.loads(result.stdout)
    assert summary["stopped"] and "the LM cannot be used" in summary["stopped"]
    assert summary["failed"] >= 1 and summary["not_attempted"] > N / 2
    assert len(srv.requests) < N
    rows = read_shards(out)
    assert rows and all(r["error_type"] == "lm_setup" for r in rows)


def test_without_engine_ray_nothing_imports_ray(images, tmp_path):
    code = (
        "import sys; from typer.testing import CliRunner; from agentic_iqa.cli import app\n"
        f"r = CliRunner().invoke(app, ['assess', {images[0]!r}, {images[1]!r}, '--offline', '--out', {str(tmp_path / 'r.jsonl')!r}, '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "import agentic_iqa.batch, agentic_iqa.api\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_cluster_settings_from_the_environment_are_checked(monkeypatch):
    from agentic_iqa.config import ConfigError
    from agentic_iqa.distributed import cluster_knobs

    monkeypatch.setenv("AGENTIC_IQA_RAY_GPUS_PER_WORKER", "0.25")
    monkeypatch.setenv("AGENTIC_IQA_RAY_LM_MAX_IN_FLIGHT", "8")
    assert cluster_knobs() == {"actors": None, "batch_size": None, "gpus_per_worker": 0.25, "lm_max_in_flight": 8}
    assert cluster_knobs(skip={"gpus_per_worker"})["gpus_per_worker"] is None
    monkeypatch.setenv("AGENTIC_IQA_RAY_ACTORS", "0")
    with pytest.raises(ConfigError, match=r"AGENTIC_IQA_RAY_ACTORS=0|AGENTIC_IQA_RAY_ACTORS='0'"):
        cluster_knobs()
    assert cluster_knobs(skip={"actors"})["actors"] is None  # a flag overrides it: not read, not refused
    monkeypatch.delenv("AGENTIC_IQA_RAY_ACTORS")
    monkeypatch.setenv("AGENTIC_IQA_RAY_GPUS_PER_WORKER", "nan")
    with pytest.raises(ConfigError, match="AGENTIC_IQA_RAY_GPUS_PER_WORKER"):
        cluster_knobs()


def test_a_bad_cluster_address_fails_in_seconds_with_one_line(images, tmp_path):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess", str(Path(images[0]).parent),
            "--engine", "ray", "--offline", "--out", str(tmp_path / "out")]
    for extra, message in (([f"--address", f"127.0.0.1:{port}"], "no Ray cluster answers there"),
                           (["--address", "nonsense"], "give auto, host:port"),
                           (["--format", "csv"], "--format must be jsonl or parquet")):
        proc = subprocess.run(base + extra, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_resume_keys_are_computed_on_the_workers(cluster, tmp_path, monkeypatch):
    """The driver reads no image (it only lists and identifies items: the workers hash them), and a
    resume still skips what is done, re-assesses a file whose content changed (its old row replaced),
    and heals two rows left for one item by an interrupted replacement."""
    import agentic_iqa.batch.items as items_module

    folder = tmp_path / "imgs"
    folder.mkdir()
    paths = [write_test_image(folder / f"r{i}.jpg", size=(96, 64), seed=50 + i, quality=40) for i in range(4)]
    out = tmp_path / "shards"

    def no_reading(path):
        raise AssertionError(f"the driver read {path}")

    monkeypatch.setattr(items_module, "_sha256_file", no_reading)  # the workers are other processes
    args = ["assess", str(folder), "--engine", "ray", "--offline", "--no-cache", "--out", str(out), "--json"]
    env = {"AGENTIC_IQA_RAY_BATCH_SIZE": "2", "AGENTIC_IQA_RAY_ACTORS": "1"}
    first = cli.invoke(app, args, env=env)
    assert first.exit_code == EXIT_OK, first.output
    before = {r["image"]: r for r in read_shards(out)}
    assert len(before) == 4 and json.loads(first.stdout)["ran"] == 4

    write_test_image(paths[1], size=(96, 64), seed=99, quality=20)  # new content, same name
    second = cli.invoke(app, args + ["--resume"], env=env)
    assert second.exit_code == EXIT_OK, second.output
    summary = json.loads(second.stdout)
    assert (summary["ran"], summary["already_done"], summary["replaced_lines"]) == (1, 3, 1)
    rows = read_shards(out)
    assert Counter(r["image"] for r in rows) == Counter(str(p) for p in paths)
    changed = next(r for r in rows if r["image"] == str(paths[1]))
    assert changed["key"] != before[str(paths[1])]["key"]

    # An interruption between writing a new row and dropping the old one leaves both: the next
    # resume keeps the row whose key matches the file, and assesses nothing.
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**before[str(paths[1])], "status": "ok"}) + "\n")
    stale.rename(out / "00000000T000000-stale-000000.json")
    assert len(read_shards(out)) == 5
    third = cli.invoke(app, args + ["--resume"], env=env)
    assert third.exit_code == EXIT_OK, third.output
    summary = json.loads(third.stdout)
    assert (summary["ran"], summary["already_done"], summary["replaced_lines"]) == (0, 4, 1)
    rows = read_shards(out)
    assert len(rows) == 4 and next(r for r in rows if r["image"] == str(paths[1]))["key"] == changed["key"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_unusable_manifest_row_is_a_failed_row_once_and_goes_when_fixed(cluster, tmp_path, fmt):
    """As in a local results file: the shards account for every manifest row (before, a bad row was only
    printed), with one `manifest_row` line across resumes, dropped once the row is fixed."""
    data = tmp_path / "data"
    data.mkdir()
    for name, seed in (("a.jpg", 90), ("b.jpg", 91)):
        write_test_image(data / name, size=(96, 64), seed=seed)
    manifest = data / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "image": "a.jpg"}) + "\noops\n")
    out = tmp_path / "out"
    args = ["assess", "--manifest", str(manifest), "--engine", "ray", "--offline", "--no-cache", "--out", str(out),
            "--format", fmt, "--json"]
    first = cli.invoke(app, args)
    assert first.exit_code == EXIT_PARTIAL, first.output
    rows = read_shards(out)
    problems = [r for r in rows if r.get("manifest_row")]
    assert len(rows) == 2 and len(problems) == 1, rows
    assert problems[0]["status"] == "failed" and problems[0]["image"] is None
    assert problems[0]["error"].startswith("manifest line 2: bad JSON") and problems[0]["error_type"] == "bad_input"
    again = cli.invoke(app, args + ["--resume"])
    assert again.exit_code == EXIT_PARTIAL and json.loads(again.stdout)["ran"] == 0, again.output
    assert len(read_shards(out)) == 2  # once across resumes
    manifest.write_text(json.dumps({"id": "a", "image": "a.jpg"}) + "\n" + json.dumps({"id": "b", "image": "b.jpg"}) + "\n")
    fixed = cli.invoke(app, args + ["--resume"])
    assert fixed.exit_code == EXIT_OK, fixed.output
    summary = json.loads(fixed.stdout)
    assert (summary["ran"], summary["already_done"], summary["replaced_lines"]) == (1, 1, 1)
    rows = read_shards(out)
    assert sorted(Path(r["image"]).name for r in rows) == ["a.jpg", "b.jpg"] and all(r["status"] == "ok" for r in rows)


def test_a_failed_image_fixed_since_runs_again_on_resume(cluster, tmp_path, monkeypatch):
    """As in a local batch, without --retry-failed: the driver hashes only the files of the items that failed
    before (a fixed one runs again, its failed row replaced; an unchanged one stays settled)."""
    import agentic_iqa.batch.items as items_module

    folder = tmp_path / "imgs"
    folder.mkdir()
    good = write_test_image(folder / "good.jpg", size=(96, 64), seed=60)
    broken = folder / "broken.jpg"
    broken.write_bytes(Path(good).read_bytes()[:200])
    out = tmp_path / "shards"
    args = ["assess", str(folder), "--engine", "ray", "--offline", "--no-cache", "--out", str(out), "--json"]
    env = {"AGENTIC_IQA_RAY_BATCH_SIZE": "2", "AGENTIC_IQA_RAY_ACTORS": "1"}
    first = cli.invoke(app, args, env=env)
    assert first.exit_code == EXIT_PARTIAL and json.loads(first.stdout)["failed"] == 1, first.output

    read: list[str] = []
    real = items_module._sha256_file
    monkeypatch.setattr(items_module, "_sha256_file", lambda path: read.append(str(path)) or real(path))
    again = cli.invoke(app, args + ["--resume"], env=env)
    summary = json.loads(again.stdout)
    assert (summary["ran"], summary["failed_before"]) == (0, 1), again.output  # unchanged: settled
    read_when_settled = list(read)

    write_test_image(broken, size=(96, 64), seed=61)
    fixed = cli.invoke(app, args + ["--resume"], env=env)
    assert fixed.exit_code == EXIT_OK, fixed.output
    summary = json.loads(fixed.stdout)
    assert (summary["ran"], summary["ok"], summary["failed_before"], summary["replaced_lines"]) == (1, 1, 0, 1)
    rows = read_shards(out)
    assert sorted(Path(r["image"]).name for r in rows) == ["broken.jpg", "good.jpg"] and all(r["status"] == "ok" for r in rows)
    assert read_when_settled == [str(broken)]  # the driver read the failed item's file, no other


RAY_FLAGS = (["--actors", "2"], ["--ray-batch-size", "4"], ["--gpus-per-worker", "0.5"], ["--lm-max-in-flight", "8"])


@pytest.mark.parametrize("extra", RAY_FLAGS, ids=lambda e: e[0])
def test_cluster_flags_need_engine_ray(images, tmp_path, extra):
    result = cli.invoke(app, ["assess", images[0], images[1], "--offline", "--out", str(tmp_path / "r.jsonl"), *extra])
    assert result.exit_code == EXIT_BAD_INPUT
    assert f"{extra[0]}: only with --engine ray" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.jsonl").exists()


def test_cluster_flags_are_checked_and_documented(images, tmp_path):
    base = ["assess", images[0], images[1], "--engine", "ray", "--offline", "--out", str(tmp_path / "o")]
    for extra in (["--actors", "0"], ["--ray-batch-size", "0"], ["--gpus-per-worker", "-1"], ["--lm-max-in-flight", "0"],
                  ["--gpus-per-worker", "nan"]):
        result = cli.invoke(app, base + extra)
        assert result.exit_code == EXIT_BAD_INPUT and extra[0] in result.output, (extra, result.output)
    assert not (tmp_path / "o").exists()
    help_text = cli.invoke(app, ["assess", "--help"], env={"COLUMNS": "300"}).output
    for flag, words in (("--actors", "worker actors"), ("--ray-batch-size", "items per batch"),
                        ("--gpus-per-worker", "GPU share per actor"), ("--lm-max-in-flight", "across the whole cluster")):
        assert flag in help_text and words in help_text, flag


def test_cluster_flags_override_the_environment(cluster, tmp_path, monkeypatch):
    """Each flag reaches the run (spied on, the real calls made) and wins over its variable, which is
    then not even read (these values would be refused)."""
    import agentic_iqa.distributed as distributed

    seen: dict = {}
    real_assess, real_coordinator = distributed.assess_dataset, distributed.make_coordinator

    def assess_spy(ds, **kw):
        seen.update(kw)
        return real_assess(ds, **kw)

    def coordinator_spy(cap=None, *a):
        seen["cap"] = cap
        return real_coordinator(cap, *a)

    monkeypatch.setattr(distributed, "assess_dataset", assess_spy)
    monkeypatch.setattr(distributed, "make_coordinator", coordinator_spy)
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        write_test_image(folder / f"f{i}.jpg", size=(96, 64), seed=70 + i)
    env = {"AGENTIC_IQA_RAY_ACTORS": "zero", "AGENTIC_IQA_RAY_BATCH_SIZE": "-1",
           "AGENTIC_IQA_RAY_GPUS_PER_WORKER": "x", "AGENTIC_IQA_RAY_LM_MAX_IN_FLIGHT": "0"}
    out = tmp_path / "out"
    result = cli.invoke(app, ["assess", str(folder), "--engine", "ray", "--offline", "--no-cache", "--out", str(out),
                              "--json", "--actors", "2", "--ray-batch-size", "2", "--gpus-per-worker", "0",
                              "--lm-max-in-flight", "3"], env=env)
    assert result.exit_code == EXIT_OK, result.output
    assert (seen["concurrency"], seen["batch_size"], seen["num_gpus_per_worker"], seen["cap"]) == (2, 2, 0.0, 3)
    assert len(list(out.glob("*.json"))) == 2  # a shard per batch of 2
    assert len(read_shards(out)) == 4
    without_flags = cli.invoke(app, ["assess", str(folder), "--engine", "ray", "--offline", "--out", str(tmp_path / "o2")], env=env)
    assert without_flags.exit_code == EXIT_BAD_INPUT and "AGENTIC_IQA_RAY_ACTORS='zero'" in without_flags.stderr


def test_with_trace_and_no_progress_work_with_engine_ray(cluster, tmp_path):
    """--with-trace keeps each result's trace in its row (as in a local results file); --no-progress
    turns Ray Data's progress output off (off a terminal Ray logs progress lines instead of bars)."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(2):
        write_test_image(folder / f"t{i}.jpg", size=(96, 64), seed=80 + i)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess", str(folder), "--engine", "ray",
            "--address", cluster, "--offline", "--actors", "1", "--ray-batch-size", "2"]

    def run(out: Path, *extra: str) -> tuple[str, list[dict]]:
        proc = subprocess.run(base + ["--out", str(out), *extra], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == EXIT_OK, proc.stderr[-2000:]
        rows = [json.loads(line) for p in sorted(out.glob("*.json")) for line in p.read_text().splitlines() if line.strip()]
        assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
        return proc.stderr, [json.loads(r["result"]) for r in rows]

    progress_markers = ("Running Dataset", "Total Progress", "Progress bars disabled")
    stderr, results = run(tmp_path / "traced", "--with-trace")
    assert any(m in stderr for m in progress_markers[:2]), stderr[-2000:]  # Ray's progress, by default
    assert all(isinstance(r.get("trace"), list) and r["trace"] for r in results), results[0].keys()
    stderr, results = run(tmp_path / "quiet", "--no-progress")
    assert not any(m in stderr for m in progress_markers), stderr[-2000:]
    assert all("trace" not in r for r in results)
