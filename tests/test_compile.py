"""`agentic-iqa compile` end to end: the DSPy optimizers really run (against canned LMs), programs are
saved as JSON, load back, are refused when they do not fit, and reach the model over HTTP."""
from __future__ import annotations

import base64
import json
import re
import sys

import dspy
import pytest
from typer.testing import CliRunner

from bad_inputs import png_claiming
from canned import CannedVLM, disable_dspy_cache, valid_reply
from fake_openai import FakeOpenAIServer, route_of, scripted

from agentic_iqa.cli import app
from agentic_iqa.programs import ProgramError, load_program, read_program
from optimizers.demo_lm import DEMO_REWARDED_PHRASE, FixtureEchoEngine, demo_lm
from optimizers.fixtures import FIXTURE_DIR, Dataset, default_catalog, load_dataset, sha256_file
from optimizers.runner import CompileError, CompileOptions, compile_module, evaluate
from optimizers.tasks import new_module, part_programs

REWARD = "Think about which steps the named region and tools make unnecessary."
runner = CliRunner()


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch):
    disable_dspy_cache()
    for var in ("AGENTIC_IQA_LM", "AGENTIC_IQA_API_BASE", "AGENTIC_IQA_BACKEND", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def catalog():
    return default_catalog()


@pytest.fixture(scope="module")
def planner_data():
    return load_dataset("planner")


def small(dataset: Dataset, n_train: int, n_val: int) -> Dataset:
    return Dataset(dataset.module, dataset.train[:n_train], dataset.val[:n_val], dataset.files)


def query_of(call) -> str:
    return re.search(r"\[\[ ## query ## \]\]\n(.*?)\n\n\[\[ ##", call.user_text, re.S).group(1)


def wrong_plan(gold):
    """Gold plan with the pipeline-everything slip (or, where that changes nothing, the wrong type)."""
    bad = gold.model_dump(mode="json")
    flags = {"distortion_detection": True, "distortion_analysis": True, "tool_selection": True, "tool_execution": True}
    if bad["plan"] == flags:
        bad["query_type"], bad["plan"] = "Other", {k: False for k in flags}
    else:
        bad["plan"] = flags
    return {"planner_output": bad}


def planner_answer(data: Dataset, right):
    """A canned planner's reply: the query's fixture label when right(call, example) is true, else a wrong plan."""
    by_query = {ex.query: ex for ex in data.train + data.val}

    def answer(call):
        ex = by_query[query_of(call)]
        return {"planner_output": ex.planner_output.model_dump(mode="json")} if right(call, ex) else wrong_plan(ex.planner_output)

    return answer


def demos_of(program_state: dict, name: str = "step.predict") -> list[dict]:
    return program_state[name]["demos"]


# ── the optimizers ─────────────────────────────────────────────────────────────────────────────


def test_labeled_fewshot_saves_labelled_fixtures_as_demos_without_an_lm(tmp_path, planner_data, catalog):
    result = compile_module("planner", planner_data, lm=None, options=CompileOptions("labeled", max_demos=3), catalog=catalog)
    assert result.before is None and result.after is None and result.lm_calls["total"] == 0
    path = result.save(tmp_path / "planner.json")
    header, state = read_program(path)
    demos = demos_of(state)
    train_ids = {ex.fixture_id for ex in planner_data.train}
    assert len(demos) == 3 and {d["fixture_id"] for d in demos} <= train_ids
    # Planner demos carry the query and the plan, not an image per demo nor the 31-name tool list.
    assert all("planner_output" in d and "query" in d and "image" not in d and "available_tools" not in d for d in demos)
    assert header["optimizer"] == "labeled" and header["demos"] == {"step.predict": 3}


def test_bootstrap_keeps_only_traces_the_metric_grades_correct(tmp_path, planner_data, catalog):
    data = small(planner_data, 10, 4)
    wrong_ids = {ex.fixture_id for ex in data.train[:4]}  # the first four training queries are answered wrongly
    rejected_once: set[str] = set()

    answer = planner_answer(data, lambda call, ex: ex.fixture_id not in wrong_ids)
    first = data.train[5]

    def with_a_rejected_reply(call):
        # One query first gets a plan naming a tool that does not exist: the validator rejects it,
        # the retry answers correctly, and only the corrected reply may become a demo.
        if query_of(call) == first.query and first.fixture_id not in rejected_once:
            rejected_once.add(first.fixture_id)
            bad = first.planner_output.model_dump(mode="json")
            bad["required_tool"] = ["NoSuchTool"]
            return {"planner_output": bad}
        return answer(call)

    lm = CannedVLM({"plan": with_a_rejected_reply}, repeat_last=True)
    result = compile_module("planner", data, lm=lm.lm, options=CompileOptions("bootstrap", max_demos=4), catalog=catalog)
    state = read_program(result.save(tmp_path / "p.json"))[1]
    demos = demos_of(state)
    assert len(demos) == 4
    augmented = [d for d in demos if d.get("augmented")]
    assert augmented, "bootstrapped demos come from the module's own answers"
    assert not {d["fixture_id"] for d in demos} & wrong_ids
    demo5 = next((d for d in augmented if d["query"] == first.query), None)
    assert demo5 is not None and demo5["planner_output"]["required_tool"] == first.planner_output.required_tool
    assert first.fixture_id in rejected_once
    # Cost: the four wrong answers are tried and dropped; bootstrapping stops once it has four demos.
    assert result.lm_calls["compile"]["task"] <= len(data.train) + 1
    assert result.lm_calls["evaluate_before"]["task"] == len(data.val)


def test_gepa_adopts_the_instruction_the_lm_rewards_and_the_score_rises(tmp_path, planner_data, catalog):
    data = small(planner_data, 8, 6)
    task = CannedVLM({"plan": planner_answer(data, lambda call, ex: REWARD in call.system)}, repeat_last=True)

    def propose(call):
        current = re.search(r"\[\[ ## current_instruction ## \]\]\n(.*?)\n\n\[\[ ##", call.user_text, re.S).group(1)
        if "[[ ## completed ## ]]" in call.system:  # answer in whichever format the adapter asked for
            return f"[[ ## new_instruction ## ]]\n{current}\n{REWARD}\n\n[[ ## completed ## ]]"
        return {"new_instruction": f"{current}\n{REWARD}"}

    reflection = CannedVLM({"new_instruction": propose}, repeat_last=True)
    result = compile_module("planner", data, lm=task.lm, proposal_lm=reflection.lm, catalog=catalog,
                            options=CompileOptions("gepa", max_metric_calls=40))
    assert result.before.mean < 1.0 and result.after.mean == 1.0 and result.delta > 0
    assert result.header["instructions_changed"] == ["step.predict"]
    assert result.lm_calls["compile"]["proposal"] == reflection.count() >= 1
    state = read_program(result.save(tmp_path / "g.json"))[1]
    assert REWARD in state["step.predict"]["signature"]["instructions"]
    # The reflection LM read the metric's feedback, which names the rule that was broken.
    assert any("should be" in c.user_text for c in reflection.calls)


def test_mipro_and_gepa_say_clearly_when_no_proposal_lm_is_configured(planner_data, catalog, monkeypatch):
    lm = CannedVLM({}).lm
    with pytest.raises(CompileError, match="reflection LM.*--reflection-lm"):
        compile_module("planner", planner_data, lm=lm, options=CompileOptions("gepa"), catalog=catalog)
    with pytest.raises(CompileError, match="propose instructions.*--teacher"):
        compile_module("planner", planner_data, lm=lm, options=CompileOptions("mipro"), catalog=catalog)
    monkeypatch.setitem(sys.modules, "optuna", None)  # as on a machine without the optional package
    with pytest.raises(CompileError, match="optuna"):
        compile_module("planner", planner_data, lm=lm, proposal_lm=lm, options=CompileOptions("mipro"), catalog=catalog)
    with pytest.raises(CompileError, match="needs an LM"):
        compile_module("planner", planner_data, lm=None, options=CompileOptions("bootstrap"), catalog=catalog)


# ── saved programs ─────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def detect_program(tmp_path_factory, catalog):
    data = load_dataset("detect")
    result = compile_module("detect", data, lm=None, options=CompileOptions("labeled", max_demos=2), catalog=catalog)
    return result.save(tmp_path_factory.mktemp("prog") / "detect.json"), data


def test_saved_program_round_trips_with_its_header(detect_program):
    path, data = detect_program
    header, state = read_program(path)
    assert header["module"] == "detect" and header["signature_version"] and header["created"]
    assert header["fixtures"]["train"]["sha256"] == sha256_file(data.files["train"].path)
    assert header["fixtures"]["train"]["images_sha256"]
    modules = {m: new_module(m) for m in ("planner", "detect")}
    load_program(modules, "detect", path)
    assert modules["detect"].dump_state() == json.loads(json.dumps(state))
    # The demo images survive JSON: after loading, the model receives the fixture files' own bytes.
    vlm = CannedVLM({"detect": valid_reply("detect")})
    ex = data.val[0]
    with vlm.context():
        modules["detect"](**ex.inputs())
    images = [p.bytes for m in vlm.calls[0].request.messages for p in m.parts if getattr(p, "type", None) == "image"]
    demo_files = [data.files["train"].resolve(next(line.image for line in data.files["train"].lines if line.id == d["fixture_id"]))
                  for d in state["step.predict"]["demos"]]
    assert images[:2] == [f.read_bytes() for f in demo_files] and len(images) == 3


def test_programs_for_another_module_or_signature_version_are_refused(tmp_path, detect_program):
    path, _ = detect_program
    modules = {m: new_module(m) for m in ("planner", "detect")}
    with pytest.raises(ProgramError, match="compiled for the 'detect' module, not 'planner'"):
        load_program(modules, "planner", path)
    payload = json.loads(path.read_text())
    payload["agentic_iqa_program"]["signature_version"] = "0"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(payload))
    with pytest.raises(ProgramError, match="signature version '0'.*compile it again"):
        load_program(modules, "detect", old)
    payload = json.loads(path.read_text())
    payload["state"]["step.predict"]["lm"] = {"model": "openai/other", "api_base": "http://elsewhere"}
    sneaky = tmp_path / "lm.json"
    sneaky.write_text(json.dumps(payload))
    with pytest.raises(ProgramError, match="sets its own LM"):
        load_program(modules, "detect", sneaky)
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ProgramError, match="no 'agentic_iqa_program' header"):
        load_program(modules, "detect", tmp_path / "junk.json")


# ── the demo LM ────────────────────────────────────────────────────────────────────────────────


def test_demo_lm_accuracy_only_grows_with_demos_and_the_rewarded_phrase(planner_data, catalog):
    engine = FixtureEchoEngine(planner_data.train + planner_data.val, catalog.modes, catalog.strengths)
    lm = demo_lm([], engine=engine)
    parts = part_programs("planner", catalog)

    def scores():
        with dspy.context(lm=lm):
            return evaluate(parts, planner_data.val, tool_modes=catalog.modes).scores

    zero = scores()
    parts["plan"].step.predict.demos = planner_data.train[:4]
    four = scores()
    sig = parts["plan"].step.predict.signature
    parts["plan"].step.predict.signature = sig.with_instructions(sig.instructions + "\n" + DEMO_REWARDED_PHRASE)
    phrase = scores()
    right = lambda s: {k for k, v in s.items() if v == 1.0}  # noqa: E731
    assert right(zero) < right(four) <= right(phrase)
    assert sum(zero.values()) < sum(four.values())
    assert engine.p_correct(0, "") == pytest.approx(0.45) and engine.p_correct(9, DEMO_REWARDED_PHRASE) == pytest.approx(0.95)


# ── the CLI ────────────────────────────────────────────────────────────────────────────────────


def test_cli_compile_with_the_demo_lm_reports_before_after_and_saves(tmp_path):
    out = tmp_path / "planner.json"
    res = runner.invoke(app, ["compile", "--module", "planner", "--optimizer", "bootstrap", "--lm", "demo",
                              "--out", str(out), "--json", "--config", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["before"] < row["after"] and row["delta"] == pytest.approx(row["after"] - row["before"], abs=1e-3)
    assert row["lm_calls"]["evaluate_before"]["task"] == row["val_examples"]
    header, state = read_program(out)
    assert header["lm"] == "demo/fixture-echo" and "demo LM" in header["demo_lm"]
    assert header["scores"]["after"]["mean"] == row["after"] and len(demos_of(state)) == 4


def test_cli_compile_errors_are_one_clear_line(tmp_path, monkeypatch):
    res = runner.invoke(app, ["compile", "-m", "planner", "-O", "gepa", "--config", str(tmp_path)])
    assert res.exit_code == 2 and "no LM for the planner module" in res.output and "--reflection-lm" in res.output
    monkeypatch.setitem(sys.modules, "optuna", None)
    res = runner.invoke(app, ["compile", "-m", "planner", "-O", "mipro", "--lm", "demo", "--config", str(tmp_path)])
    assert res.exit_code == 2 and "pip install 'dspy[optuna]'" in res.output
    res = runner.invoke(app, ["compile", "-m", "all", "--trainset", "x.jsonl", "--lm", "demo"])
    assert res.exit_code == 2 and "per module" in res.output
    res = runner.invoke(app, ["compile", "-m", "planner", "--lm", "demo", "--trainset", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "does not exist" in res.output
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    res = runner.invoke(app, ["compile", "-m", "planner", "-O", "labeled", "--lm", "openai/gpt-4o", "--config", str(tmp_path)])
    assert res.exit_code == 2 and "OPENAI_API_KEY" in res.output and "--lm demo" in res.output, res.output


def test_cli_compile_checks_api_base_and_says_when_the_demo_lm_ignores_it(tmp_path):
    """A malformed --api-base ran the compile (with --lm demo) as if it were fine; a valid one was silently unused."""
    args = ["compile", "-m", "planner", "-O", "labeled", "--lm", "demo", "--config", str(tmp_path), "--json"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "a.json"), "--api-base", "notaurl"])
    assert res.exit_code == 2 and "--api-base 'notaurl' is not a valid http(s) URL" in res.output, res.output
    assert not (tmp_path / "a.json").exists()
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "b.json"), "--api-base", "http://127.0.0.1:9/v1"])
    assert res.exit_code == 0, res.output
    assert "--api-base is not used: the demo LM (--lm demo) sends no requests" in res.stderr


def test_cli_compile_checks_the_output_path_before_spending_lm_calls(tmp_path, monkeypatch):
    # Before, an --out that cannot be written failed only after the whole compile (every LM call spent)
    # with "compile failed: FileNotFoundError …" (exit 1); /dev/full gave "FileExistsError: File exists".
    import optimizers.runner

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the output path was checked")

    monkeypatch.setattr(optimizers.runner, "compile_module", no_compile)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for out, expected in ((a_file / "planner.json", "notes.txt is not a folder"),
                          (a_file / "sub" / "planner.json", "notes.txt is not a folder")):
        res = runner.invoke(app, ["compile", "-m", "planner", "--lm", "demo", "--out", str(out),
                                  "--config", str(tmp_path)])
        assert res.exit_code == 2, res.output
        assert "cannot write the program to" in res.output and expected in res.output, res.output
        assert "Traceback" not in res.output and "compile failed" not in res.output
    assert a_file.read_text() == "x"
    # An existing file that is not a compiled program (the fixtures themselves, an image) is not replaced.
    notes = tmp_path / "planner.json"
    notes.write_text('{"id": "a"}\n')
    res = runner.invoke(app, ["compile", "-m", "planner", "--lm", "demo", "--out", str(notes), "--config", str(tmp_path)])
    assert res.exit_code == 2 and "is not a compiled program" in " ".join(res.output.split()), res.output
    assert notes.read_text() == '{"id": "a"}\n'


def test_cli_compile_says_when_the_model_gave_no_usable_answer(tmp_path):
    # A server answering prose (or a wrong model) made every validation answer fail; the table said
    # "0.000 → 0.000" as if the model had been scored, and nothing else. The failures are now counted
    # in --json and stated under the table. DSPy's own INFO lines ("Average Metric: …") are --verbose only.
    with FakeOpenAIServer(scripted({r: "not JSON at all" for r in ("plan",)})) as srv:
        args = ["compile", "-m", "planner", "--lm", "openai/fake", "--api-base", srv.base_url,
                "--config", str(tmp_path)]
        res = runner.invoke(app, [*args, "--out", str(tmp_path / "p.json")])
        as_json = runner.invoke(app, [*args, "--out", str(tmp_path / "q.json"), "--json"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "planner: 18 of 18 validation answers before compiling and 18 of 18 after were unusable" in text, text
    assert "INFO dspy" not in res.output
    (row,) = json.loads(as_json.stdout)
    assert (row["failures_before"], row["failures_after"]) == (18, 18)


def test_assess_with_a_compiled_program_sends_its_demos_to_the_model(tmp_path, planner_data, catalog):
    program = compile_module("planner", planner_data, lm=None, options=CompileOptions("labeled", max_demos=2),
                             catalog=catalog).save(tmp_path / "planner.json")
    demos = demos_of(read_program(program)[1])
    image = planner_data.files["val"].resolve(planner_data.files["val"].lines[0].image)
    plan = valid_reply("plan", query_scope=["sky"], distortion_source="Explicit", distortions={"sky": ["Noise"]},
                       plan={"distortion_detection": False, "distortion_analysis": True, "tool_selection": False,
                             "tool_execution": False})
    analysis = {"distortion_analysis": {"sky": [{"type": "Noise", "severity": "slight", "explanation": "faint grain"}]}}
    routes = {"plan": plan, "analyze": analysis, "explain": valid_reply("explain", final_answer="slightly")}
    with FakeOpenAIServer(scripted(routes)) as srv:
        args = ["assess", str(image), "-q", "Is the sky noisy?", "--lm", "openai/fake-vlm", "--api-base", srv.base_url,
                "--config", str(tmp_path), "--no-cache", "--json"]
        res = runner.invoke(app, args + ["--program", str(program)])
        plan_bodies = [r["body"] for r in srv.requests if route_of(r["body"]) == "plan"]
        refused = runner.invoke(app, args + ["--program", f"detect={program}"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["result"]["final_answer"] == "slightly"
    (body,) = plan_bodies
    messages = body["messages"]
    # system, (user demo, assistant demo) x 2, the real question
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    text = json.dumps(messages)
    for demo in demos:
        assert demo["query"] in text
        assert json.dumps(demo["planner_output"]["plan"]["tool_selection"]) in messages[2]["content"] + messages[4]["content"]
    images = [p for m in messages if isinstance(m["content"], list) for p in m["content"] if p.get("type") == "image_url"]
    assert len(images) == 1  # only the real question carries an image
    assert base64.b64decode(images[0]["image_url"]["url"].split(",", 1)[1]) == image.read_bytes()
    assert refused.exit_code == 2 and "compiled for the 'planner' module, not 'detect'" in refused.output


def test_programs_listed_in_pipeline_yaml_are_loaded_by_the_python_api(tmp_path, detect_program):
    from agentic_iqa.agents.vlm import VLMRoles
    from agentic_iqa.config import load_settings

    path, _ = detect_program
    (tmp_path / "detect.json").write_bytes(path.read_bytes())
    (tmp_path / "pipeline.yaml").write_text("programs:\n  detect: detect.json\n")  # relative to the config folder
    roles = VLMRoles(load_settings(tmp_path, lm="openai/fake-vlm", api_base="http://127.0.0.1:9/v1"))
    assert len(roles.modules["detect"].step.predict.demos) == 2
    assert roles.modules["planner"].step.predict.demos == []
    (tmp_path / "pipeline.yaml").write_text("programs:\n  planner: detect.json\n")
    with pytest.raises(ProgramError, match="not 'planner'"):
        VLMRoles(load_settings(tmp_path, lm="openai/fake-vlm", api_base="http://127.0.0.1:9/v1"))


def test_evaluate_runs_threads_in_the_callers_context_and_raises_the_first_error(planner_data, catalog):
    engine = FixtureEchoEngine(planner_data.train + planner_data.val, catalog.modes, catalog.strengths)
    parts = part_programs("planner", catalog)
    with dspy.context(lm=demo_lm([], engine=engine)):
        one = evaluate(parts, planner_data.val, tool_modes=catalog.modes).scores
        four = evaluate(parts, planner_data.val, tool_modes=catalog.modes, threads=4).scores
    assert one == four and list(four) == [ex.fixture_id for ex in planner_data.val]

    class Broken(dspy.Module):
        def forward(self, **_):
            raise KeyError("the part broke")

    with dspy.context(lm=demo_lm([], engine=engine)), pytest.raises(KeyError, match="the part broke"):
        evaluate({"plan": Broken()}, planner_data.val, tool_modes=catalog.modes, threads=2)


def test_cli_compile_with_an_unreachable_server_is_one_clear_line(tmp_path):
    # Before: "error: compile failed: LMTransportError: … Connection refused" with exit 1, the code for
    # an unforeseen failure; an LM that cannot be reached is the user's setup, as for a batch (exit 2).
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    res = runner.invoke(app, ["compile", "-m", "planner", "--lm", "openai/fake", "--api-base",
                              f"http://127.0.0.1:{port}/v1", "--config", str(tmp_path), "--out", str(tmp_path / "p.json")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "the LM could not be reached" in text and "Connection refused" in text and "--api-base" in text, text
    assert "compile failed" not in text and not (tmp_path / "p.json").exists()


def test_cli_compile_with_a_bad_fixture_image_names_the_file_line_and_image(tmp_path):
    # Before: "error: compile failed: DecompressionBombError …", exit 1, naming neither the file nor the line.
    line = json.loads((FIXTURE_DIR / "detect.jsonl").read_text().splitlines()[-1])
    png_claiming(tmp_path / "bomb.png", 60000, 60000)
    trainset = tmp_path / "detect.jsonl"
    trainset.write_text(json.dumps(line | {"image": "bomb.png"}) + "\n")
    res = runner.invoke(app, ["compile", "-m", "detect", "--lm", "demo", "--trainset", str(trainset),
                              "--config", str(tmp_path), "--out", str(tmp_path / "d.json")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert f"{trainset}: 1 bad line(s): line 1" in text and "image bomb.png: 60000×60000" in text, text
    assert "compile failed" not in text and not (tmp_path / "d.json").exists()


def test_cli_compile_shows_the_traceback_of_an_unforeseen_error_with_debug(tmp_path, monkeypatch):
    import optimizers.runner

    def broken(*args, **kwargs):
        raise RuntimeError("something we did not foresee")

    monkeypatch.setattr(optimizers.runner, "compile_module", broken)
    args = ["compile", "-m", "planner", "--lm", "demo", "--config", str(tmp_path), "--out", str(tmp_path / "p.json")]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "compile failed: RuntimeError: something we did not foresee (set AGENTIC_IQA_DEBUG=1" in " ".join(res.output.split())
    monkeypatch.setenv("AGENTIC_IQA_DEBUG", "1")
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "Traceback" in res.output and "something we did not foresee" in res.output
