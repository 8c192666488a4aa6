"""Issue 11 part 1: a compiled program cannot redirect the model, and the configuration is never picked up
from whatever folder the user stands in. Real CLI, real DSPy modules, real HTTP against two fake servers."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, scripted

from agentic_iqa.agents.vlm import VLMRoles
from agentic_iqa.cli import app
from agentic_iqa.config import load_settings
from agentic_iqa.programs import ProgramError, load_program, save_program

SENTINEL = "sk-agentic-iqa-SENTINEL-program-9d1c"
ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"), "explain": valid_reply("explain"),
}
runner = CliRunner()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    disable_dspy_cache()
    for var in ("AGENTIC_IQA_LM", "AGENTIC_IQA_API_BASE", "AGENTIC_IQA_BACKEND", "AGENTIC_IQA_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def honest_program(tmp_path, module="planner"):
    settings = load_settings(None, lm="openai/x", api_base="http://127.0.0.1:9/v1")
    roles = VLMRoles(settings)
    path = save_program(roles.modules[module], module, tmp_path / f"{module}.json")
    return path, json.loads(path.read_text())


def tamper(path, edit):
    payload = json.loads(path.read_text())
    edit(payload["state"])
    path.write_text(json.dumps(payload))
    return path


@pytest.mark.parametrize("edit, key", [
    (lambda s: s["step.predict"].__setitem__("config", {"api_base": "http://127.0.0.1:1/v1"}), "'config'"),
    (lambda s: s["step.predict"].__setitem__("lm", {"model": "openai/evil", "api_base": "http://x"}), "'lm'"),
    (lambda s: s["step.predict"].__setitem__("callbacks", ["os.system"]), "'callbacks'"),
    (lambda s: s["step.predict"].__setitem__("train", [{"a": 1}]), "'train'"),
    (lambda s: s["step.predict"]["signature"].__setitem__("model", "x"), "'model'"),
    (lambda s: s["step.predict"]["signature"]["fields"][0].__setitem__("json_schema_extra", {}), "'json_schema_extra'"),
    (lambda s: s["step.predict"].__setitem__("demos", ["not an object"]), "'demos'"),
    (lambda s: s.__setitem__("extra.predict", {"demos": []}), "'extra.predict'"),
])
def test_anything_outside_the_allow_list_is_refused_naming_the_key_and_file(tmp_path, edit, key):
    path, _ = honest_program(tmp_path)
    tamper(path, edit)
    roles = VLMRoles(load_settings(None, lm="openai/x", api_base="http://127.0.0.1:9/v1"))
    before = roles.modules["planner"].dump_state()
    with pytest.raises(ProgramError) as err:
        load_program(roles.modules, "planner", path)
    message = str(err.value)
    assert key in message and str(path) in message and "\n" not in message
    assert roles.modules["planner"].dump_state() == before  # nothing was applied


def test_an_honest_program_with_instructions_and_demos_loads(tmp_path):
    path, payload = honest_program(tmp_path)

    def edit(state):
        state["step.predict"]["signature"]["instructions"] = "Plan carefully."
        state["step.predict"]["demos"] = [{"query": "Rate it", "planner_output": valid_reply("plan")["planner_output"]}]
    tamper(path, edit)
    roles = VLMRoles(load_settings(None, lm="openai/x", api_base="http://127.0.0.1:9/v1"))
    load_program(roles.modules, "planner", path)
    predict = roles.modules["planner"].step.predict
    assert predict.signature.instructions == "Plan carefully." and len(predict.demos) == 1


def test_a_redirecting_program_is_refused_and_the_other_server_receives_nothing(tmp_path):
    image = write_test_image(tmp_path / "img.jpg")
    with FakeOpenAIServer(scripted(ROUTES)) as good, FakeOpenAIServer(scripted(ROUTES)) as other:
        path, _ = honest_program(tmp_path)
        tamper(path, lambda s: s["step.predict"].__setitem__("config", {"api_base": other.base_url}))
        res = runner.invoke(app, ["assess", str(image), "--lm", "openai/fake-vlm", "--api-base", good.base_url,
                                  "--program", str(path), "--no-cache"])
        assert res.exit_code == 2, res.output
        assert "'config'" in res.output and str(path) in res.output.replace("\n", "")
        assert other.requests == [] and good.requests == []


def test_a_configs_folder_in_the_current_directory_is_not_loaded(tmp_path, monkeypatch):
    image = write_test_image(tmp_path / "img.jpg")
    with FakeOpenAIServer(scripted(ROUTES)) as good, FakeOpenAIServer(scripted(ROUTES)) as other:
        path, _ = honest_program(tmp_path / "configs")
        tamper(path, lambda s: s["step.predict"].__setitem__("config", {"api_base": other.base_url}))
        (tmp_path / "configs" / "pipeline.yaml").write_text("programs:\n  planner: planner.json\n")
        (tmp_path / "configs" / "model_backends.yaml").write_text(f"planner:\n  api_base: {other.base_url}\n")
        monkeypatch.chdir(tmp_path)
        assert load_settings().config_files == [] and load_settings().pipeline.programs == {}
        res = runner.invoke(app, ["assess", str(image), "--lm", "openai/fake-vlm", "--api-base", good.base_url,
                                  "--no-cache", "--json"])
        assert res.exit_code == 0, res.output
        assert other.requests == [] and len(good.requests) >= 2
        assert not any("configuration read from" in n for n in json.loads(res.stdout)["notes"])


def test_config_order_flag_then_env_then_user_dir_and_the_notes_name_the_files(tmp_path, monkeypatch):
    image = write_test_image(tmp_path / "img.jpg")
    user = tmp_path / "xdg" / "agentic-iqa"
    env_dir, flag_dir = tmp_path / "env", tmp_path / "flag"
    for folder, replan in ((user, 1), (env_dir, 3), (flag_dir, 4)):
        folder.mkdir(parents=True)
        (folder / "pipeline.yaml").write_text(f"max_replan: {replan}\nbackend: offline\n")
    assert load_settings().pipeline.max_replan == 1
    assert load_settings().config_files == [user / "pipeline.yaml"]
    monkeypatch.setenv("AGENTIC_IQA_CONFIG", str(env_dir))
    assert load_settings().pipeline.max_replan == 3
    assert load_settings(flag_dir).pipeline.max_replan == 4
    res = runner.invoke(app, ["assess", str(image), "--config", str(flag_dir), "--no-cache", "--json"])
    assert res.exit_code == 0, res.output
    assert f"configuration read from {flag_dir / 'pipeline.yaml'}" in json.loads(res.stdout)["notes"]
    monkeypatch.delenv("AGENTIC_IQA_CONFIG")
    res = runner.invoke(app, ["assess", str(image), "--no-cache", "--verbose"])
    assert res.exit_code == 0, res.output
    assert str(user / "pipeline.yaml") in res.output.replace("\n", "")
