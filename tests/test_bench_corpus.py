"""The real-photo corpus tooling (benchmarks/fit_corpus.py): the manifest names every file's source and
licence, the evaluation ladder differs from the training one yet keeps level order, working copies are
downscaled without upscaling, and the clean offsets come from sources left out of each inner fit."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
from agentic_iqa.bench import synth  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402


def test_manifest_names_sources_and_licences():
    m = json.loads(fc.MANIFEST.read_text())
    assert len(m["sources"]) >= 4
    for name, src in m["sources"].items():
        assert src["registry"] in ("PyPI", "Debian") and src["package"] and src["licence"] and src["files"], name


@pytest.mark.parametrize("type_name", sorted(synth.TYPES))
def test_alt_ladder_is_new_values_in_the_same_order(type_name):
    t = synth.TYPES[type_name]
    fit = [fc.ladder_param(t, lv, "fit") for lv in range(1, 6)]
    alt = [fc.ladder_param(t, lv, "alt") for lv in range(1, 6)]
    assert fit == list(t.params)
    assert len(set(alt)) == 5 and any(a != f for a, f in zip(alt, fit))
    increasing = t.params[1] > t.params[0]
    assert alt == sorted(alt, reverse=not increasing)


def test_working_copy_downscales_only(tmp_path):
    big = tmp_path / "big.png"
    Image.fromarray(np.full((900, 1200, 3), 128, np.uint8)).save(big)
    x = fc.working_copy(big, 512)
    assert x.shape == (384, 512, 3) and x.dtype == np.float32 and abs(float(x.mean()) - 128 / 255) < 1e-3
    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((101, 150, 3), np.uint8)).save(small)
    assert fc.working_copy(small, 512).shape == (100, 150, 3)  # never upscaled; even sizes


def test_clean_offsets_are_measured_on_sources_left_out():
    from agentic_iqa.bench.synth import distort, load_reference

    samples, sources = [], []
    for src, ref in (("a", "astronaut"), ("b", "chelsea"), ("c", "coffee")):
        x = load_reference(ref)[::2, ::2]
        from agentic_iqa.offline import stats as st

        base = st.measure(x)
        samples.append(({**base, **st.measure_fr(x, x, base, base)}, None, 0))
        sources.append(src)
        for lv in (2, 4):
            y = distort(x, "gaussian blur", lv)
            nr = st.measure(y)
            samples.append(({**nr, **st.measure_fr(y, x, nr, base)}, "gaussian blur", lv))
            sources.append(src)
    th = sv.fit_with_clean_offsets(samples, sources)
    assert all(0.0 <= th[m][d.name]["clean_offset"] <= 2.5 for m in ("nr", "fr") for d in sv.DETECTORS)
    # The positives-only blend is for the no-reference levels only; FR keeps its shrunk maps.
    assert all(th["nr"][d.name]["pos_ramp"] == list(sv.POS_RAMP) and "pos_ramp" not in th["fr"][d.name]
               for d in sv.DETECTORS)
    single = sv.fit_with_clean_offsets(samples, ["a"] * len(samples))  # one source: nothing held out
    assert all(single["nr"][d.name]["clean_offset"] == 0.0 for d in sv.DETECTORS)
