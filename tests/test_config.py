"""Configuration files, precedence and errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentic_iqa.config import ConfigError, ModelBackends, PipelineConfig, load_settings
from agentic_iqa.lm import build_role_lms

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


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
])
def test_bad_config_files_name_the_file_and_key(tmp_path, text, needle):
    (tmp_path / "pipeline.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path)
    assert "pipeline.yaml" in str(err.value) and needle in str(err.value)


def test_missing_config_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope")


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
