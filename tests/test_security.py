"""Security (issue 6): API keys come only from the environment and never reach output, results,
traces, logs, caches or compiled programs; YAML is parsed safely; nothing we write or read is a
pickle; manifest paths cannot send files from outside the manifest's folder to a model.

A sentinel key is used for real (the fake server checks it arrives as the Authorization header), then
searched for everywhere the tool writes.
"""
from __future__ import annotations

import ast
import base64
import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, scripted

from agentic_iqa.api import Assessor
from agentic_iqa.cli import app
from agentic_iqa.cli.common import EXIT_OK, EXIT_PARTIAL
from agentic_iqa.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[1]
SENTINEL = "sk-agentic-iqa-SENTINEL-7f3a9c1e5b2d4a6f"
ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"), "explain": valid_reply("explain"),
    "_logprobs": {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0},
}
runner = CliRunner()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    disable_dspy_cache()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))  # searched below, so it is ours


def everything_written(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_api_key_from_the_environment_is_used_but_never_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    imgs = [write_test_image(tmp_path / f"p{i}.jpg", size=(64, 48), seed=i) for i in range(2)]
    trace, out = tmp_path / "trace.json", tmp_path / "results.jsonl"
    with FakeOpenAIServer(scripted(ROUTES)) as srv:
        lm = ["--lm", "openai/fake-vlm", "--api-base", srv.base_url, "--config", str(tmp_path)]
        single = runner.invoke(app, ["assess", str(imgs[0]), *lm, "--json", "--verbose", "--save-trace", str(trace)])
        batch = runner.invoke(app, ["assess", *map(str, imgs), *lm, "--out", str(out), "--with-trace", "--json"])
        # The Python API with every logger at DEBUG, HTTP clients included.
        caplog.set_level(logging.DEBUG)
        for name in ("httpx", "httpcore", "LiteLLM", "litellm", "urllib3", "dspy"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        assessor = Assessor(load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, lm_history=True))
        result = assessor.assess(imgs[1], "Is it blurry? A. Yes B. No")
    assert single.exit_code == EXIT_OK and batch.exit_code == EXIT_OK, single.output + batch.output
    # The key really was sent, so its absence below means something.
    assert {r["headers"].get("Authorization") for r in srv.requests} == {f"Bearer {SENTINEL}"}
    history = json.dumps([lm.history for lm in assessor.roles.lms.values()], default=str)
    assert "image_url" in history  # kept on request (lm_history): the check below looks at real entries
    for where, text in {
        "single-image output": single.output, "batch output": batch.output, "saved trace": trace.read_text(),
        "results file": out.read_text(), "logs": caplog.text, "API result": result.model_dump_json(),
        "DSPy history": history, "tool cache and everything else written": everything_written(tmp_path).decode("latin-1"),
    }.items():
        assert SENTINEL not in text, f"the API key leaked into the {where}"


def test_a_key_named_by_api_key_env_is_read_from_that_variable(tmp_path, monkeypatch):
    (tmp_path / "model_backends.yaml").write_text(
        "planner: {api_key_env: MY_VLM_KEY}\nexecutor: {api_key_env: MY_VLM_KEY}\nsummarizer: {api_key_env: MY_VLM_KEY}\n")
    img = write_test_image(tmp_path / "p.jpg", size=(64, 48))
    with FakeOpenAIServer(scripted(ROUTES)) as srv:
        args = ["assess", str(img), "--lm", "openai/fake-vlm", "--api-base", srv.base_url, "--config", str(tmp_path), "--json"]
        unset = runner.invoke(app, args)
        monkeypatch.setenv("MY_VLM_KEY", SENTINEL)
        ok = runner.invoke(app, args)
    assert unset.exit_code == 2 and "MY_VLM_KEY" in unset.stderr and "not set" in unset.stderr
    assert ok.exit_code == EXIT_OK and SENTINEL not in ok.output
    assert {r["headers"].get("Authorization") for r in srv.requests} == {f"Bearer {SENTINEL}"}


def test_keys_are_never_read_from_config_files(tmp_path):
    (tmp_path / "model_backends.yaml").write_text(f"planner:\n  model: openai/gpt-4o\n  api_key: {SENTINEL}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    assert "api_key" in str(info.value) and SENTINEL not in str(info.value)


def test_compiled_programs_hold_no_key(tmp_path):
    """An optimizer can leave an LM on a predictor; saving the program must not write its key."""
    import dspy

    from agentic_iqa.agents.vlm import VLMRoles
    from agentic_iqa.programs import save_program

    settings = load_settings(tmp_path)
    lm = dspy.LM("openai/gpt-4o-mini", api_key=SENTINEL, cache=False)
    roles = VLMRoles(settings, lms={"planner": lm, "executor": lm, "summarizer": lm})
    module = roles.modules["planner"]
    for predictor in module.predictors():
        predictor.lm = lm
        predictor.demos = [dspy.Example(query="Rate it", planner_output=valid_reply("plan")["planner_output"])]
    path = save_program(module, "planner", tmp_path / "planner.json", lm=lm.model)
    text = path.read_text()
    assert json.loads(text)["agentic_iqa_program"]["module"] == "planner"  # plain JSON
    assert '"gpt-4o-mini"' in text or "gpt-4o-mini" in text  # the LM is described …
    assert SENTINEL not in text  # … without its key


def test_yaml_is_parsed_safely(tmp_path):
    """A config or tool file that asks YAML to run code is refused and runs nothing."""
    from iqa_tools import ToolRegistry, ToolTableError

    marker = tmp_path / "pwned"
    evil = f'!!python/object/apply:os.system ["touch {marker}"]\n'
    (tmp_path / "pipeline.yaml").write_text(evil)
    with pytest.raises(ConfigError):
        load_settings(tmp_path)
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - " + evil)
    with pytest.raises(ToolTableError):
        ToolRegistry(table_paths=[tools], cache=False)
    assert not marker.exists()


def _data_only(module: str, call) -> bool:
    """torch.load(..., weights_only=True) and np.load(..., allow_pickle=False) load data, never code."""
    wanted = {"torch": ("weights_only", True), "np": ("allow_pickle", False), "numpy": ("allow_pickle", False)}.get(module)
    return wanted is not None and any(
        k.arg == wanted[0] and isinstance(k.value, ast.Constant) and k.value.value is wanted[1] for k in call.keywords)


def _unsafe_uses(tree) -> list[tuple[int, str]]:
    """Imports of pickle-family modules and calls that deserialize code or run strings, from the AST
    (so docstrings and comments that mention them do not count)."""
    bad_modules = {"pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}
    bad_calls = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("torch", "load"),
                 ("numpy", "load"), ("np", "load")}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in bad_modules]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in bad_modules:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in bad_calls:
                if not _data_only(f.value.id, node):
                    found.append((node.lineno, f"{f.value.id}.{f.attr}"))
            elif isinstance(f, ast.Name) and f.id in {"eval", "exec"}:
                found.append((node.lineno, f.id))
            found += [(node.lineno, "Loader=") for k in node.keywords if k.arg == "Loader"]
    return found


def test_no_pickle_and_no_unsafe_yaml_in_our_code():
    """Compiled programs are JSON and caches SQLite; nothing of ours unpickles, loads YAML unsafely or
    runs strings. (pyiqa unpickles its own weight files: DESIGN §6 — only trusted files go there.)"""
    sources = [p for pkg in ("agentic_iqa", "iqa_tools", "signatures", "optimizers") for p in (ROOT / pkg).rglob("*.py")]
    assert len(sources) > 20
    hits = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in sources
            for line, what in _unsafe_uses(ast.parse(path.read_text(encoding="utf-8")))]
    assert not hits, hits
    # The check itself sees what it looks for.
    probe = ast.parse("import pickle\nfrom dill import loads\nyaml.load(x)\ntorch.load(f)\neval('1')\nyaml.load(s, Loader=L)\n"
                      "torch.load(f, weights_only=False)\nnp.load(f, allow_pickle=True)\n"
                      "torch.load(f, weights_only=True)\nnp.load(f, allow_pickle=False)")
    assert [w for _, w in _unsafe_uses(probe)].count("yaml.load") == 2 and len(_unsafe_uses(probe)) == 9


def test_caches_are_sqlite_and_lms_keep_no_disk_cache(tmp_path):
    from agentic_iqa.lm import build_role_lms
    from iqa_tools import ToolCache, ToolRegistry

    img = write_test_image(tmp_path / "p.png", size=(64, 48), fmt="PNG")
    cache = ToolCache(tmp_path / "c")
    ToolRegistry(cache=cache).score("PIQE", str(img))
    assert (tmp_path / "c" / "tools.sqlite").read_bytes()[:16] == b"SQLite format 3\x00"
    lms = build_role_lms(load_settings(tmp_path, lm="openai/gpt-4o").backends)
    # DSPy's own response cache is a pickle store on disk: every LM we build opts out of it.
    assert all(lm.cache is False for lm in lms.values())


def test_manifest_cannot_send_files_from_outside_its_folder(tmp_path):
    data = tmp_path / "dataset"
    data.mkdir()
    write_test_image(data / "inside.jpg", size=(64, 48), seed=1)
    secret = write_test_image(tmp_path / "secret.jpg", size=(64, 48), seed=2)
    manifest = data / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "ok", "image": "inside.jpg"}) + "\n"
                        + json.dumps({"id": "escape", "image": "../secret.jpg"}) + "\n"
                        + json.dumps({"id": "absolute", "image": str(secret)}) + "\n")
    secret_b64 = base64.b64encode(secret.read_bytes()).decode()

    def run(*extra):
        with FakeOpenAIServer(scripted(ROUTES)) as srv:
            r = runner.invoke(app, ["assess", "--manifest", str(manifest), "--out", str(tmp_path / f"r{len(extra)}.jsonl"),
                                    "--lm", "openai/fake-vlm", "--api-base", srv.base_url, "--config", str(tmp_path), "--json", *extra])
        return r, json.dumps([q["body"] for q in srv.requests])

    refused, sent = run()
    assert refused.exit_code == EXIT_PARTIAL and json.loads(refused.stdout)["failed"] == 2
    assert secret_b64 not in sent
    allowed, sent = run("--allow-absolute")
    assert allowed.exit_code == EXIT_OK and secret_b64 in sent  # the check above could have seen it
