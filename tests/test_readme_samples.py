"""The README's sample outputs are what the commands print now (issue 12): scripts/readme_samples.py runs
the real CLI and API offline on the bundled example image; timings are the only thing allowed to differ."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _samples_module():
    spec = importlib.util.spec_from_file_location("readme_samples", ROOT / "scripts" / "readme_samples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_readme_samples_are_what_the_commands_print_now():
    mod = _samples_module()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = mod.readme_blocks(text)
    assert set(blocks) == set(mod.SAMPLES), "every sample is in the README, once"
    fresh = mod.readme_blocks(mod.render(text, mod.run_samples(list(blocks))))
    for name in blocks:
        assert mod.normalize(blocks[name]) == mod.normalize(fresh[name]), (
            f"README sample {name!r} is out of date: run python scripts/readme_samples.py\n{fresh[name]}")


def test_normalize_ignores_timings_but_not_results():
    mod = _samples_module()
    table = "│ BRISQUE │ Global/Overall │ 2.572 │ 3.33      │ {} │      │"
    assert mod.normalize(table.format("4248 ms")) == mod.normalize(table.format("98 ms"))
    assert mod.normalize("median 0.20 s") == mod.normalize("median 11.04 s")
    assert mod.normalize("Level B · score 4.36 / 5") != mod.normalize("Level C · score 3.42 / 5")
    assert mod.normalize(table.format("4248 ms")) != mod.normalize(table.format("4248 ms").replace("3.33", "3.34"))


def test_render_fills_only_the_marked_blocks():
    mod = _samples_module()
    text = "intro\n<!-- sample: assess -->\nold\n<!-- /sample -->\nend\n"
    out = mod.render(text, {"assess": "new output"})
    assert out == ("intro\n<!-- sample: assess -->\n```text\n$ agentic-iqa assess example:chelsea\nnew output\n```\n"
                   "<!-- /sample -->\nend\n")
    with pytest.raises(KeyError, match="does not know"):
        mod.render("<!-- sample: nope -->\n<!-- /sample -->", {})


def test_readme_names_every_package_of_the_pip_warning():
    """The install's resolver warning lists pyiqa's declared dependencies that the lean install leaves out;
    the README names them all (so nobody is alarmed by one it does not mention), and only those."""
    import importlib.metadata as md
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = {w.strip() for w in re.search(r"<!-- pip-warning -->(.*?)<!-- /pip-warning -->", text, re.S).group(1)
              .replace("\n", " ").split(",")}
    declared = {re.split(r"[ ;<>=!~\[]", r)[0].lower() for r in md.requires("pyiqa")}
    assert listed <= declared, listed - declared

    def installed(name: str) -> bool:
        try:
            md.version(name)
            return True
        except md.PackageNotFoundError:
            return False

    missing = {name for name in declared if not installed(name)}
    assert missing <= listed, f"pip would also name {sorted(missing - listed)}: add them to the README"
    assert f"and {len(listed)} lines `pyiqa" in text.replace("\n", " ")
