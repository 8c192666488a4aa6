"""Generate (or check) the sample outputs in README.md by running the real CLI and API, offline, on the
bundled example images.

    python scripts/readme_samples.py           # rewrite the README's sample blocks
    python scripts/readme_samples.py --check   # exit 1 (with a diff) if the README differs from a fresh run

A sample block in README.md sits between `<!-- sample: NAME -->` and `<!-- /sample -->`; NAME is a key of
SAMPLES. Each run uses a clean environment (no AGENTIC_IQA_* variables, no user config, a fresh cache
folder, 100 columns), so what it prints is what a new user sees on a first run. Timings differ from run to
run: `normalize()` blanks them (and the table padding that depends on their width) before comparing.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WIDTH = 100

#: name -> (what the README shows as typed, how to run it: a CLI argument list or Python code)
SAMPLES: dict[str, tuple[str, list[str] | str]] = {
    "assess": ("agentic-iqa assess example:chelsea", ["assess", "example:chelsea"]),
    "assess-mcq": ('agentic-iqa assess example:chelsea -q "Is the image blurry? A. Yes B. No"',
                   ["assess", "example:chelsea", "-q", "Is the image blurry? A. Yes B. No"]),
    "python": (
        'python -c "from agentic_iqa import assess; r = assess(\'example:chelsea\'); print(round(r.score, 3), r.level, repr(r.answer))"',
        "from agentic_iqa import assess; r = assess('example:chelsea'); print(round(r.score, 3), r.level, repr(r.answer))",
    ),
}

_BLOCK = re.compile(r"(<!-- sample: ([\w-]+) -->\n)(.*?)(<!-- /sample -->)", re.S)


def clean_env(cache_dir: Path, config_home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIC_IQA_")}
    env.update(AGENTIC_IQA_CACHE_DIR=str(cache_dir), XDG_CONFIG_HOME=str(config_home), COLUMNS=str(WIDTH),
               LINES="50", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "TERM_PROGRAM", "FORCE_COLOR"):
        env.pop(var, None)
    env["NO_COLOR"] = "1"
    return env


# Runs every sample in one process (one torch import instead of one per sample), each with a cache folder
# of its own, so each prints what a first run prints (no "cached" scores, the example image written anew).
_DRIVER = r"""
import contextlib, io, json, os, sys, tempfile
samples, out = json.loads(sys.argv[1]), {}
for name, how in samples.items():
    with tempfile.TemporaryDirectory(prefix="readme-sample-") as cache:
        os.environ["AGENTIC_IQA_CACHE_DIR"] = cache
        buf = io.StringIO()
        code = 0
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                if isinstance(how, list):
                    from agentic_iqa.cli import app
                    code = app(how, standalone_mode=False, prog_name="agentic-iqa") or 0
                else:
                    exec(how, {})
            except SystemExit as exc:
                code = exc.code or 0
        out[name] = [code, buf.getvalue()]
sys.__stdout__.write(json.dumps(out))
"""


def run_samples(names: list[str], python: str = sys.executable) -> dict[str, str]:
    """What each sample prints (stdout and stderr as a terminal would interleave them), by name."""
    import json

    with tempfile.TemporaryDirectory(prefix="readme-samples-") as tmp:
        env = clean_env(Path(tmp) / "cache", Path(tmp) / "config")
        proc = subprocess.run([python, "-c", _DRIVER, json.dumps({n: SAMPLES[n][1] for n in names})], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the samples could not run (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    outputs = {}
    for name, (code, text) in json.loads(proc.stdout).items():
        if code != 0:
            raise RuntimeError(f"sample {name!r} exited {code}:\n{text}")
        outputs[name] = "\n".join(line.rstrip() for line in text.rstrip().splitlines())
    return outputs


def block(name: str, output: str) -> str:
    typed, _ = SAMPLES[name]
    return f"```text\n$ {typed}\n{output}\n```\n"


def normalize(text: str) -> str:
    """A sample with what varies between runs blanked: timings, and the table padding they widen."""
    text = re.sub(r"\d+(\.\d+)? ?(ms|s)\b", "T", text)
    text = re.sub(r"[ ━─═]+", " ", text)
    return "\n".join(line.strip() for line in text.splitlines())


def readme_blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(text)}


def render(text: str, outputs: dict[str, str]) -> str:
    def replace(m: re.Match) -> str:
        name = m.group(2)
        if name not in SAMPLES:
            raise KeyError(f"README.md has a sample block {name!r} that scripts/readme_samples.py does not know")
        return m.group(1) + block(name, outputs[name]) + m.group(4)

    return _BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    names = list(readme_blocks(text))
    missing = sorted(set(SAMPLES) - set(names))
    if missing:
        print(f"README.md lacks the sample block(s) {missing}: add <!-- sample: NAME --><!-- /sample -->", file=sys.stderr)
        return 1
    outputs = run_samples(names)
    fresh = render(text, outputs)
    if not args.check:
        README.write_text(fresh, encoding="utf-8")
        print(f"wrote {len(outputs)} sample(s) into {README}")
        return 0
    old, new = readme_blocks(text), readme_blocks(fresh)
    stale = [n for n in names if normalize(old[n]) != normalize(new[n])]
    for n in stale:
        sys.stdout.writelines(difflib.unified_diff(old[n].splitlines(True), new[n].splitlines(True), f"README {n}", f"now {n}"))
    if stale:
        print(f"\nREADME samples out of date: {stale}; run python scripts/readme_samples.py", file=sys.stderr)
        return 1
    print(f"README samples match ({len(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
