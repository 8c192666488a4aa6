"""Issue 12, CLI part: flags read as flags, every option explained, --device/--weights-dir where users need
them, the library leaves logging alone, one tools-table row per tool run, honest labels in --verbose."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from agentic_iqa.cli import app
from agentic_iqa.cli.assess import tool_runs
from iqa_tools import ToolExecutionLog


def _commands(group, path=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_option_has_help_and_flags_take_no_value():
    root = typer.main.get_command(app)
    seen = 0
    for path, cmd in _commands(root):
        for param in cmd.params:
            if param.param_type_name != "option":
                continue
            seen += 1
            assert (param.help or "").strip(), f"{' '.join(path)} {param.opts[0]} has no help text"
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        rows = [line for line in out.splitlines() if "<bool>" in line and "--help" not in line]
        assert not rows, f"{' '.join(path)} --help shows a flag as taking a value: {rows}"
    assert seen > 40


@pytest.mark.parametrize("word", ["true", "False", "yes"])
def test_flag_followed_by_a_value_is_refused_in_one_line(word):
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--offline", word])
    assert res.exit_code == 2
    assert "take no value" in res.output and "several images" not in res.output


def test_flag_value_refused_through_a_subprocess():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess",
                           "example:chelsea", "--offline", "true"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert "--offline, not --offline true" in proc.stderr and "Traceback" not in proc.stderr


def test_assess_and_eval_take_device_and_weights_dir(tmp_path):
    for cmd in ("assess", "eval"):
        out = CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200"}).output
        assert "--device" in out and "--weights-dir" in out, cmd
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--offline", "--no-cache", "--device", "cpu",
                                   "--weights-dir", str(tmp_path), "--json", "--verbose"])
    assert res.exit_code == 0, res.output
    assert '"device": "cpu"' in res.output  # the tool runs were placed where asked


def test_a_weights_dir_that_does_not_exist_is_refused(tmp_path, monkeypatch):
    """`--weights-dir /nope` and AGENTIC_IQA_WEIGHTS_DIR=/nope were accepted without a word: a typo in the folder
    passed silently and weight-based tools then said their file was missing. Refused as a missing --config
    folder is: exit 2, naming the flag, the variable, or the config file and key."""
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))
    nope = str(tmp_path / "nope")
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    for args in (["assess", "example:chelsea", "--offline"], ["eval", "m.jsonl"], ["tools", "run", "PIQE", "example:chelsea"],
                 ["tools", "list"]):
        for where, word in ((nope, "does not exist"), (str(a_file), "is a file")):
            res = CliRunner().invoke(app, [*args, "--weights-dir", where], env={"COLUMNS": "300"})
            assert res.exit_code == 2, (args, res.output)
            assert "Invalid value for '--weights-dir'" in res.output and word in res.output, (args, res.output)
    res = CliRunner().invoke(app, ["tools", "list"], env={"COLUMNS": "300", "AGENTIC_IQA_WEIGHTS_DIR": nope})
    assert res.exit_code == 2, res.output
    assert res.output == (f"error: AGENTIC_IQA_WEIGHTS_DIR={nope!r}: no such folder ({nope}); give the folder holding "
                          "the tools' pyiqa checkpoints, or leave it unset\n")
    (tmp_path / "pipeline.yaml").write_text(f"tools:\n  weights_dir: {a_file}\n")
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--config", str(tmp_path)], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert f"pipeline.yaml: `tools.weights_dir`: is a file, not a folder ({a_file})" in res.output
    monkeypatch.setenv("HOME", str(tmp_path))  # `~` is expanded before the folder is looked for
    res = CliRunner().invoke(app, ["tools", "list", "--json"], env={"AGENTIC_IQA_WEIGHTS_DIR": "~"})
    assert res.exit_code == 0, res.output


def test_with_tool_options_sets_the_tools_settings(tmp_path):
    from agentic_iqa.cli.common import with_tool_options
    from agentic_iqa.config import load_settings

    s = with_tool_options(load_settings(), "cpu", tmp_path)
    assert s.pipeline.tools.device == "cpu" and s.pipeline.tools.weights_dir == tmp_path
    before = load_settings()
    assert with_tool_options(before).pipeline.tools == before.pipeline.tools


def test_assess_and_eval_take_tools_file_like_the_tools_commands(tmp_path, monkeypatch):
    """README offered --tools-file beside tools.extra_tables and $AGENTIC_IQA_TOOL_FILES, but only `tools list/run`
    had it: `assess --tools-file x` was "No such option". It adds a table after the configured ones, as the variable
    does: here BRISQUE without its β is mapped linearly over its range instead of through the logistic."""
    from canned import write_test_image

    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))
    table = tmp_path / "mine.yaml"
    table.write_text("tools:\n  - name: BRISQUE\n    beta: null\n")

    def brisque(*extra):
        res = CliRunner().invoke(app, ["assess", "example:chelsea", "--offline", "--json", *extra])
        assert res.exit_code == 0, res.output
        import json

        return next(lg["normalization"] for lg in json.loads(res.stdout)["evidence"]["tool_logs"] if lg["tool_name"] == "BRISQUE")

    assert brisque().startswith("logistic")
    assert brisque("--tools-file", str(table)).startswith("linear")
    monkeypatch.setenv("AGENTIC_IQA_TOOL_FILES", str(table))
    assert brisque().startswith("linear")  # the same setting the variable feeds
    monkeypatch.delenv("AGENTIC_IQA_TOOL_FILES")
    (tmp_path / "m.jsonl").write_text('{"id": "a", "image": "a.png", "mos": 3}\n')
    write_test_image(tmp_path / "a.png", size=(96, 96), fmt="PNG")
    missing = str(tmp_path / "nope.yaml")
    for args in (["assess", "example:chelsea"], ["assess", "example:chelsea", "example:coffee", "--out", str(tmp_path / "r.jsonl")],
                 ["eval", str(tmp_path / "m.jsonl"), "--mode", "nr"]):
        res = CliRunner().invoke(app, [*args, "--offline", "--tools-file", missing], env={"COLUMNS": "300"})
        assert res.exit_code == 2, (args, res.output)
        assert f"error: tool file {missing}: file not found; check the path" in res.output, (args, res.output)


def test_library_use_prints_no_log_lines(tmp_path):
    """Used from Python, a warning inside the library reaches no handler unless the application adds one."""
    code = ("import logging, agentic_iqa, iqa_tools\n"
            "logging.getLogger('agentic_iqa.fusion').warning('library warning')\n"
            "logging.getLogger('iqa_tools.registry').error('library error')\n"
            "from agentic_iqa import assess\n"
            "r = assess('example:chelsea', backend='offline')\n"
            "print(r.level)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "library warning" not in proc.stderr and "library error" not in proc.stderr
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr


def test_tools_table_has_one_row_per_tool_run():
    run = ToolExecutionLog(tool_name="NIQE", raw_score=4.2, normalized_score=3.3, execution_time=0.5)
    logs = [run.model_copy(update={"object_name": "Global", "distortion": d}) for d in ("Blur", "Noise", "Compression")]
    other = ToolExecutionLog(tool_name="BRISQUE", distortion="Noise", raw_score=20.0, normalized_score=4.0, execution_time=0.2)
    rows = tool_runs([*logs, other])
    assert [(lg.tool_name, serves) for lg, serves in rows] == [
        ("NIQE", ["Global/Blur", "Global/Noise", "Global/Compression"]), ("BRISQUE", ["Global/Noise"])]
    failed = ToolExecutionLog(tool_name="NIQE", raw_score=math.nan, error="boom", execution_time=0.1)
    assert len(tool_runs([*logs, failed])) == 2  # a different run of the same tool keeps its own row


def test_verbose_offline_does_not_claim_vlm_probabilities(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess", "example:chelsea",
                           "--offline", "--verbose", "--no-cache"], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    both = proc.stdout + proc.stderr
    assert "Offline analyst's level distribution" in both
    assert "VLM probabilities" not in both
    # the tools table: each tool once
    tools = [line.split("│")[1].strip() for line in proc.stdout.splitlines()
             if line.startswith("│ ") and line.count("│") >= 6]  # rows of the tools table
    assert tools and len(tools) == len(set(tools)), proc.stdout


@pytest.mark.parametrize("value,needle", [("png", "is not one of"), ("jpeg:0", "quality is a whole number 1-100"),
                                          ("original,side:512", "contradict")])
def test_bad_image_transport_is_one_line(value, needle):
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--offline", "--image-transport", value])
    assert res.exit_code == 2 and needle in res.output and "image_transport" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 2


def test_image_transport_in_pipeline_yaml_is_checked(tmp_path):
    from agentic_iqa.config import ConfigError, load_settings

    (tmp_path / "pipeline.yaml").write_text("image_transport: 'jpeg:85, side:1024'\n")
    assert load_settings(tmp_path).pipeline.image_transport == "jpeg:85,side:1024"
    (tmp_path / "pipeline.yaml").write_text("image_transport: webp\n")
    with pytest.raises(ConfigError, match="pipeline.yaml.*image_transport"):
        load_settings(tmp_path)


def test_default_summary_says_which_stages_fell_back_and_why(tmp_path):
    """Not only --verbose: each stage that fell back is one line (why → what instead), and the footer names them."""
    from canned import disable_dspy_cache, valid_reply, write_test_image
    from fake_openai import FakeOpenAIServer, scripted

    disable_dspy_cache()
    img = write_test_image(tmp_path / "p.jpg", size=(128, 96))
    routes = {"plan": valid_reply("plan"), "detect": "Sure! The image looks blurry.",  # never JSON
              "select": {"selected_tools": {"Global": {"Overall": "NoSuchTool"}}},  # rejected by the validator
              "score": valid_reply("score", level="B")}
    with FakeOpenAIServer(scripted(routes)) as srv:
        res = CliRunner().invoke(app, ["assess", str(img), "--lm", "openai/fake", "--api-base", srv.base_url,
                                       "--no-cache", "--config", str(tmp_path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    lines = [ln.strip() for ln in res.output.splitlines() if ln.strip().startswith("fallback:")]
    assert lines[0] == ("fallback: detect: model reply rejected 4× (invalid JSON) → no distortions listed "
                        "(analysis skipped; tools rate the whole image)")
    assert re.fullmatch(r"fallback: select: model reply rejected 4× \(.*NoSuchTool.*\) → generic tools \(\w+\)", lines[1]), lines
    assert len(lines) == 2  # the planner and the summarizer answered: no line for them
    assert "with fallbacks in detect, select (see below)" in res.output
    assert "retry" not in res.output.lower()  # the per-attempt details stay in --verbose / the trace


def test_help_shows_square_brackets_rich_would_take_for_markup():
    """Rich reads `[word]` in a help text as a style tag and drops it: `--engine` said "needs the  extra"
    for "needs the [ray] extra". Every bracketed word of every help text must reach the rendered help."""
    root = typer.main.get_command(app)
    checked = 0
    for path, cmd in _commands(root):
        texts = [cmd.help or ""] + [p.help or "" for p in cmd.params if getattr(p, "help", None)]
        words = {m.group(0) for t in texts for m in re.finditer(r"\[[a-z#/@][^\[\]]*\]", t.replace("\\[", "["))}
        if not words:
            continue
        out = " ".join(CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"}).output.split())
        for word in words:
            checked += 1
            assert word in out, f"{' '.join(path)} --help lost {word!r}"
    assert checked


def test_python_dash_m_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "agentic_iqa", "tools", "list", "--mode", "FR"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "SSIM" in proc.stdout
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "agentic_iqa", "--help"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "Usage:" in proc.stdout
    assert not re.search(r"\|\s+(torch|dspy|pyiqa)$", proc.stderr, re.M)  # the CLI's imports stay lazy


@pytest.mark.parametrize("args, without", [
    (["assess", "example:chelsea", "--lm", ""], "--offline"),
    (["assess", "example:chelsea", "--lm", " "], "--offline"),
    (["eval", "manifest.jsonl", "--lm", ""], "--offline"),
    (["compile", "--module", "planner", "--lm", ""], "--lm demo"),
    (["compile", "--module", "planner", "--teacher", ""], "--lm demo"),
])
def test_an_empty_model_is_refused_not_read_as_no_model(args, without, tmp_path):
    """`--lm "$MODEL"` with MODEL unset ran on the configured model, or quietly without one."""
    res = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    flag = args[-2]
    assert res.output.startswith(f"error: {flag} is empty") and without in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["assess", "example:chelsea", "--lm", "openai/gpt-4o", "--api-base", ""],
    ["eval", "manifest.jsonl", "--api-base", " "],
    ["compile", "--module", "planner", "--lm", "demo", "--api-base", ""],
])
def test_an_empty_api_base_is_refused_not_read_as_the_providers_endpoint(args):
    """`--api-base "$URL"` with URL unset sent the requests (and the key) to the provider's own endpoint."""
    res = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: --api-base is empty") and "leave --api-base out" in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, env, named", [
    (["assess", "example:chelsea", "--api-base", "http//127.0.0.1:8000"], {}, "--api-base 'http//127.0.0.1:8000'"),
    (["assess", "example:chelsea"], {"AGENTIC_IQA_API_BASE": "not a url"}, "AGENTIC_IQA_API_BASE 'not a url'"),
    (["eval", "manifest.jsonl", "--offline"], {"AGENTIC_IQA_API_BASE": "http://h:99999/v1"}, "AGENTIC_IQA_API_BASE"),
])
def test_a_malformed_api_base_is_an_error_without_a_model_too(args, env, named, tmp_path, monkeypatch):
    """With no model set, a malformed --api-base / AGENTIC_IQA_API_BASE was ignored (exit 0): the typo waited for
    the day a model was set. It is one line naming the setting, exit 2, model or not."""
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "manifest.jsonl").write_text('{"id": "a", "image": "a.png", "mos": 3}\n')
    args = [str(tmp_path / a) if a == "manifest.jsonl" else a for a in args]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "300", **env})
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {named}") and "is not a valid http(s) URL" in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_a_malformed_api_base_in_a_config_file_names_the_file_and_key(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model_backends.yaml").write_text("executor:\n  api_base: localhost:8000/v1\n")
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--config", str(tmp_path)], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert f"model_backends.yaml: `executor.api_base` 'localhost:8000/v1' is not a valid http(s) URL" in res.output


@pytest.mark.parametrize("args, env, source", [
    (["--api-base", "http://127.0.0.1:9/v1"], {}, "--api-base"),
    ([], {"AGENTIC_IQA_API_BASE": "http://127.0.0.1:9/v1"}, "AGENTIC_IQA_API_BASE"),
])
def test_an_api_base_without_a_model_gets_a_note(args, env, source, tmp_path, monkeypatch):
    """`assess example:chelsea --api-base URL` answered offline with exit 0 and not a word (--program got a note)."""
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--json", *args], env={"COLUMNS": "300", **env})
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(f"note: {source} is not used: no model is set (--lm"), res.stderr
    assert "pass --lm MODEL to use the server" in res.stderr
    assert CliRunner().invoke(app, ["assess", "example:chelsea", "--json"]).stderr == ""  # no server, no note


def test_the_result_footer_wraps_in_a_narrow_terminal(monkeypatch, capsys):
    """A rich panel's subtitle is one line, cut at the border: at 60 columns "answered by …, with
    fallbacks in …" lost its end. A footer that does not fit goes inside the panel, where it wraps."""
    from agentic_iqa import assess
    from agentic_iqa.cli.assess import answered_by, render

    result = assess("example:chelsea", backend="offline").model_copy(update={
        "backend": "vlm (openai/a-vision-language-model)",
        "fallbacks": ["detect: invalid JSON → none", "planner: invalid JSON → rules", "select: x → generic tools",
                      "summarizer: timeout → offline analyst"]})
    footer = answered_by(result)
    assert len(footer) > 60
    monkeypatch.setenv("COLUMNS", "60")
    render(result)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 60
    assert " ".join(footer.split()) in " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())
    monkeypatch.setenv("COLUMNS", "200")  # where it fits it stays the panel's subtitle
    render(result)
    assert any(footer in line and line.startswith("╰") for line in capsys.readouterr().out.splitlines())


def _column(out: str, index: int) -> str:
    """Column `index` of a rich table's body rows, its cells joined: a folded word comes back whole."""
    return "".join(line.split("│")[index].strip() for line in out.splitlines() if line.startswith("│ "))


def test_a_narrow_terminal_wraps_what_the_user_asked_for_instead_of_cutting_it(monkeypatch, capsys):
    """At 60 columns the tools table showed "Global/Ov…" and a long question, the panel's title, lost its
    end: cells fold, and a question too long for the title is the panel's first line, where it wraps."""
    from agentic_iqa import assess
    from agentic_iqa.cli.assess import render

    question = "Is the sky in the upper left corner of this photograph blurry or sharp? A. Yes B. No"
    result = assess("example:chelsea", backend="offline")
    monkeypatch.setenv("COLUMNS", "60")
    render(result)
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 60
    assert "Global/Overall" in _column(out.split("┡")[1], 2), out  # the tools table, below its header
    for columns in ("60", "80"):
        monkeypatch.setenv("COLUMNS", columns)
        render(result.model_copy(update={"query": question}))
        out = capsys.readouterr().out
        assert "…" not in out and max(len(line) for line in out.splitlines()) <= int(columns)
        assert question in " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split()), out
    # a tool's error note is shown whole (it was cut at 80 characters): a missing-weights note names the folder last
    note = ("missing weights: put topiq_nr_koniq_res50.pth in /home/someone/.cache/torch/hub/pyiqa/ or in a weights dir "
            "(AGENTIC_IQA_WEIGHTS_DIR)")
    logs = [lg.model_copy(update={"error": note}) for lg in result.evidence.tool_logs]
    monkeypatch.setenv("COLUMNS", "100")
    render(result.model_copy(update={"evidence": result.evidence.model_copy(update={"tool_logs": logs})}))
    out = capsys.readouterr().out
    assert note.replace(" ", "") in _column(out.split("┡")[1], 6).replace(" ", ""), out  # wrapped at its spaces
