"""Configuration files, precedence and errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from agentic_iqa.config import ConfigError, ModelBackends, PipelineConfig, load_settings
from agentic_iqa.lm import build_role_lms

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def test_shipped_yaml_files_state_exactly_the_defaults():
    assert ModelBackends.model_validate(yaml.safe_load((CONFIGS / "model_backends.yaml").read_text())) == ModelBackends()
    assert PipelineConfig.model_validate(yaml.safe_load((CONFIGS / "pipeline.yaml").read_text())) == PipelineConfig()


def test_precedence_defaults_file_env_arguments(tmp_path, monkeypatch):
    (tmp_path / "pipeline.yaml").write_text("max_replan: 1\nfusion: {prob_mode: classification}\nprograms: {planner: p.json}\n")
    (tmp_path / "model_backends.yaml").write_text("planner: {model: openai/a}\n")
    s = load_settings(tmp_path)
    assert s.pipeline.max_replan == 1 and s.pipeline.fusion.prob_mode == "classification"
    assert s.pipeline.programs["planner"] == tmp_path / "p.json"  # relative to the config folder
    assert s.backends.planner.model == "openai/a" and s.backends.executor.model is None
    monkeypatch.setenv("AGENTIC_IQA_LM", "openai/from-env")
    monkeypatch.setenv("AGENTIC_IQA_PROB_MODE", "uniform")
    s = load_settings(tmp_path)
    assert {s.backends.role(r).model for r in ("planner", "executor", "summarizer")} == {"openai/from-env"}
    assert s.pipeline.fusion.prob_mode == "uniform"
    s = load_settings(tmp_path, lm="openai/flag", max_replan=0)
    assert s.backends.summarizer.model == "openai/flag" and s.pipeline.max_replan == 0


@pytest.mark.parametrize("text,needle", [
    ("max_replan: [1", "not valid YAML"),
    ("- a\n- b\n", "mapping"),
    ("max_replan: -1\n", "max_replan"),
    ("fusion: {prob_mode: psychic}\n", "fusion.prob_mode"),
    ("unknown_key: 1\n", "unknown_key"),
    # .inf passed and failed later as "eta must be a finite number >= 0, got inf", naming no file or key
    ("fusion: {eta: .inf}\n", "`fusion.eta`: Input should be a finite number"),
    ("fusion: {eta: .nan}\n", "`fusion.eta`: Input should be a finite number"),
    ("cache: {max_mb: .inf}\n", "`cache.max_mb`: Input should be a finite number"),
])
def test_bad_config_files_name_the_file_and_key(tmp_path, text, needle):
    (tmp_path / "pipeline.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path)
    assert "pipeline.yaml" in str(err.value) and needle in str(err.value)


def test_infinite_role_settings_are_refused_naming_the_file_and_key(tmp_path):
    (tmp_path / "model_backends.yaml").write_text("planner: {call_budget: .inf}\n")
    with pytest.raises(ConfigError, match=r"model_backends.yaml: `planner.call_budget`: Input should be a finite number"):
        load_settings(tmp_path)


def test_missing_config_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope")


def test_config_given_a_file_says_it_wants_the_folder(tmp_path):
    """`--config cfg/pipeline.yaml` said "config directory … does not exist" of a file that exists."""
    (tmp_path / "pipeline.yaml").write_text("max_replan: 1\n")
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "pipeline.yaml")
    msg = str(err.value)
    assert "does not exist" not in msg and "is a file, not a folder" in msg and f"(here: {tmp_path})" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("text,where", [
    ("max_replan: 1\nfusion:\n  eta: 1\n prob_mode: [x\n", "line 4, column 2"),
    ('max_replan: "unterminated\n', "line 2, column 1"),
    ("max_replan: 1\n\tfusion: 2\n", "line 2, column 1"),
])
def test_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path, text, where):
    (tmp_path / "pipeline.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"config file {tmp_path / 'pipeline.yaml'}: not valid YAML (") and where in msg, msg
    assert "<unicode string>" not in msg and "fix the YAML there" in msg


def test_roles_with_the_same_settings_share_one_lm_and_keys_come_from_env(tmp_path, monkeypatch):
    s = load_settings(tmp_path, lm="openai/gpt-4o")
    lms = build_role_lms(s.backends)
    assert lms["planner"] is lms["executor"]  # same settings: one client
    assert lms["summarizer"] is not lms["planner"]  # the summarizer asks for log-probs
    assert lms["summarizer"].kwargs.get("logprobs") is True
    s.backends.planner.api_key_env = "MY_VLM_KEY"
    monkeypatch.delenv("MY_VLM_KEY", raising=False)
    with pytest.raises(ConfigError, match="MY_VLM_KEY"):
        build_role_lms(s.backends)


# ── the environment is read in one place; bad values are configuration errors (exit 2) ──────────


def _cli_assess(*args):
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    r = CliRunner().invoke(app, ["assess", *args, "--offline", "--no-cache"])
    assert "Traceback" not in r.output
    return r


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_bad_max_pixels_in_environment_is_a_configuration_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv("AGENTIC_IQA_MAX_PIXELS", value)
    with pytest.raises(ConfigError, match="AGENTIC_IQA_MAX_PIXELS"):
        load_settings(tmp_path)
    r = _cli_assess("example:chelsea")
    assert r.exit_code == 2 and "AGENTIC_IQA_MAX_PIXELS" in " ".join(r.stderr.split())


def test_max_pixels_from_environment_takes_effect_on_assess(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTIC_IQA_MAX_PIXELS", "1000")  # chelsea is 451×300 = 135 300 pixels
    assert load_settings(tmp_path).pipeline.max_image_pixels == 1000
    assert load_settings(tmp_path).build_registry(cache=False).max_pixels == 1000
    r = _cli_assess("example:chelsea")
    assert r.exit_code == 2 and "pixels" in r.stderr


@pytest.mark.parametrize("value,needle", [("garbage", "unknown device"), ("cuda:99", "does not exist here")])
def test_bad_device_in_environment_is_a_configuration_error(tmp_path, monkeypatch, value, needle):
    monkeypatch.setenv("AGENTIC_IQA_DEVICE", value)
    with pytest.raises(ConfigError, match="AGENTIC_IQA_DEVICE") as err:
        load_settings(tmp_path).build_registry(cache=False)
    assert needle in str(err.value)
    r = _cli_assess("example:chelsea")
    assert r.exit_code == 2 and "AGENTIC_IQA_DEVICE" in " ".join(r.stderr.split())


def test_api_key_in_config_file_is_refused_naming_the_variable(tmp_path):
    (tmp_path / "model_backends.yaml").write_text("planner: {model: openai/x, api_key: sk-secret, api_key_env: MY_KEY}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path)
    msg = str(err.value)
    assert "environment" in msg and "MY_KEY" in msg and "sk-secret" not in msg


def test_settings_are_importable_from_the_package_and_feed_the_registry(tmp_path, monkeypatch):
    import agentic_iqa

    monkeypatch.setenv("AGENTIC_IQA_WEIGHTS_DIR", str(tmp_path))
    s = agentic_iqa.load_settings(tmp_path)
    assert isinstance(s, agentic_iqa.Settings) and s.pipeline.tools.weights_dir == tmp_path
    assert s.build_registry(cache=False).weights_dir == tmp_path


def test_environment_is_read_by_one_pydantic_settings_class_listed_in_the_readme():
    """Every variable EnvSettings reads is in README's table, and no other module reads AGENTIC_IQA_* itself."""
    import re

    from pydantic_settings import BaseSettings

    from agentic_iqa.config import EnvSettings, env_vars

    assert issubclass(EnvSettings, BaseSettings)
    readme = (ROOT / "README.md").read_text()
    missing = [v for v in env_vars() if f"`{v}" not in readme]
    assert not missing, f"README's environment table lacks {missing}"
    readers = []
    for path in [*ROOT.glob("agentic_iqa/**/*.py"), *ROOT.glob("iqa_tools/**/*.py"), *ROOT.glob("signatures/**/*.py"),
                 *ROOT.glob("optimizers/**/*.py")]:
        text = path.read_text()
        if re.search(r"(environ|getenv)[^\n]*AGENTIC_IQA_", text) and path.name != "config.py":
            readers.append(str(path.relative_to(ROOT)))
    # In the pipeline package nothing else reads the environment at all, except the API keys (lm.py: kept
    # out of Settings, which is printed and saved) and the redactor looking for key values to mask.
    for path in ROOT.glob("agentic_iqa/**/*.py"):
        if path.name in ("config.py", "lm.py", "redact.py"):
            continue
        if re.search(r"environ\.get\(|environ\[|getenv\(|environ\.items\(", path.read_text()):
            readers.append(str(path.relative_to(ROOT)))
    assert not readers, f"these read the environment themselves instead of through EnvSettings: {readers}"


@pytest.mark.parametrize("var,value,needle", [
    ("AGENTIC_IQA_OFFLINE", "maybe", "AGENTIC_IQA_OFFLINE='maybe': expected 1/0"),
    ("AGENTIC_IQA_BACKEND", "cloud", "AGENTIC_IQA_BACKEND='cloud'"),
    ("AGENTIC_IQA_PROB_MODE", "softmax", "AGENTIC_IQA_PROB_MODE='softmax'"),
    # Read by iqa_tools.backend, which silently ignored a bad value (e.g. TORCH_THREADS=abc ran on 1 thread).
    ("AGENTIC_IQA_TORCH_THREADS", "abc", "AGENTIC_IQA_TORCH_THREADS='abc': expected a positive whole number"),
    ("AGENTIC_IQA_TORCH_THREADS", "-3", "AGENTIC_IQA_TORCH_THREADS='-3': expected a positive whole number"),
    ("AGENTIC_IQA_MALLOC_TUNING", "x", "AGENTIC_IQA_MALLOC_TUNING='x': expected 1/0"),
])
def test_bad_environment_values_name_the_variable(monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_settings()


def test_debug_switch_is_read_through_settings_and_never_fails(monkeypatch):
    from agentic_iqa.config import debug_enabled

    monkeypatch.setenv("AGENTIC_IQA_DEBUG", "1")
    assert debug_enabled()
    monkeypatch.setenv("AGENTIC_IQA_MAX_PIXELS", "abc")  # another bad variable: the error path still works
    assert debug_enabled()
    monkeypatch.delenv("AGENTIC_IQA_MAX_PIXELS")
    monkeypatch.setenv("AGENTIC_IQA_DEBUG", "0")
    assert not debug_enabled()


@pytest.mark.parametrize("where", ["env", "file"])
def test_lm_flag_under_an_offline_backend_is_said_to_be_ignored(tmp_path, monkeypatch, where):
    # AGENTIC_IQA_BACKEND=offline (or `backend: offline` in pipeline.yaml) wins over --lm, which is
    # another key; before, `assess --lm MODEL` then answered offline without a word.
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    if where == "env":
        monkeypatch.setenv("AGENTIC_IQA_BACKEND", "offline")
        needle = "AGENTIC_IQA_BACKEND"
    else:
        (tmp_path / "pipeline.yaml").write_text("backend: offline\n")
        needle = "pipeline.yaml"
    r = CliRunner().invoke(app, ["assess", "example:chelsea", "--lm", "openai/gpt-4o", "--config", str(tmp_path),
                                 "--no-cache"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "--lm is ignored: the backend is 'offline'" in err and needle in err, err
    r = CliRunner().invoke(app, ["assess", "example:chelsea", "--lm", "openai/gpt-4o", "--offline",
                                 "--config", str(tmp_path), "--no-cache"])
    assert "--lm is ignored" not in r.stderr  # asked for in the same command: nothing to point out


def test_a_refused_value_reads_without_pydantics_prefix(tmp_path):
    # Before: "setting `image_transport`: Value error, image_transport 'png' is not one of: …" (also
    # for a file); the manifest, tool-table and fixture readers already dropped the prefix.
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path, image_transport="png")
    assert "Value error" not in str(err.value) and "image_transport 'png' is not one of" in str(err.value)
    (tmp_path / "pipeline.yaml").write_text("image_transport: png\n")
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path)
    assert "Value error" not in str(err.value) and "pipeline.yaml: `image_transport`: image_transport 'png'" in str(err.value)


def test_a_misspelt_variable_is_pointed_out(monkeypatch):
    # AGENTIC_IQA_DEVICES=cpu (for AGENTIC_IQA_DEVICE) did nothing and said nothing.
    from typer.testing import CliRunner

    from agentic_iqa.cli import app
    from agentic_iqa.config import unknown_env_vars

    monkeypatch.setenv("AGENTIC_IQA_DEVICES", "cpu")
    monkeypatch.setenv("AGENTIC_IQA_SOMETHING_ELSE", "1")
    found = dict(unknown_env_vars())
    assert found == {"AGENTIC_IQA_DEVICES": "AGENTIC_IQA_DEVICE", "AGENTIC_IQA_SOMETHING_ELSE": None}
    r = CliRunner().invoke(app, ["assess", "example:chelsea", "--offline", "--no-cache"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "warning: AGENTIC_IQA_DEVICES is not a variable agentic-iqa reads (did you mean AGENTIC_IQA_DEVICE?)" in err, err
    assert "warning: AGENTIC_IQA_SOMETHING_ELSE is not a variable agentic-iqa reads" in err
    monkeypatch.delenv("AGENTIC_IQA_DEVICES")
    monkeypatch.delenv("AGENTIC_IQA_SOMETHING_ELSE")
    monkeypatch.setenv("AGENTIC_IQA_RAY_ACTORS", "2")  # read by --engine ray runs: known
    assert unknown_env_vars() == []


def test_program_module_names_match_the_agents_table():
    from agentic_iqa.agents.modules import MODULE_NAMES
    from agentic_iqa.config import PROGRAM_MODULES

    assert PROGRAM_MODULES == MODULE_NAMES


def test_programs_in_pipeline_yaml_are_checked_with_or_without_a_model(tmp_path):
    """`programs: {plannr: x.json}` gave exit 0 and no word when no model was set (with one, the module
    name was refused only when the agents were built)."""
    (tmp_path / "pipeline.yaml").write_text("programs: {plannr: x.json}\n")
    for lm in (None, "openai/fake"):
        with pytest.raises(ConfigError) as err:
            load_settings(tmp_path, lm=lm)
        msg = str(err.value)
        assert "pipeline.yaml: `programs`: unknown module 'plannr' (did you mean 'planner'?)" in msg, msg
        assert "planner, detect, analyze, select, summarize" in msg
    # No model: the file itself is checked, as --program's is.
    (tmp_path / "pipeline.yaml").write_text("programs: {planner: missing.json}\n")
    with pytest.raises(ConfigError, match=r"pipeline.yaml: `programs.planner`: compiled program .*missing.json: file not found"):
        load_settings(tmp_path)
    (tmp_path / "detect.json").write_text(json.dumps({"agentic_iqa_program": {"module": "detect"}, "state": {}}))
    (tmp_path / "pipeline.yaml").write_text("programs: {planner: detect.json}\n")
    with pytest.raises(ConfigError, match="compiled for the 'detect' module, not 'planner'"):
        load_settings(tmp_path)
    (tmp_path / "pipeline.yaml").write_text("programs: {detect: detect.json}\n")
    assert load_settings(tmp_path).pipeline.programs == {"detect": tmp_path / "detect.json"}


@pytest.mark.parametrize("url", ["http://host:8000/v1?api-version=2024-02-01", "http://host/v1?key=SECRETvalue123456",
                                 "http://host/v1#frgmnt123", "http://user:pa55word-xyz@host/v1?token=SECRETvalue123456"])
def test_a_base_url_with_a_query_or_fragment_is_refused_without_printing_it(url):
    """`--api-base http://host/v1?api-version=…` was accepted and broke every request (the path became
    `/v1?api-version=…/chat/completions`); a `?key=SECRET` in it was echoed as it was."""
    from agentic_iqa.config import checked_base_url

    with pytest.raises(ConfigError) as err:
        checked_base_url(url, "--api-base")
    msg = str(err.value)
    assert "--api-base" in msg and "query string or fragment" in msg and "azure/" in msg and "AZURE_API_VERSION" in msg, msg
    assert "SECRET" not in msg and "pa55word" not in msg and "2024-02-01" not in msg and "frgmnt123" not in msg, msg
