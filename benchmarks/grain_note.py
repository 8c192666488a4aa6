"""Grain with no colour in it (the same N(0, sigma) in all three channels) on the blind sources' working copies
(CBSD68, McMaster: evaluation-only, in no fit), scored without a reference: how often the offline analyst measures
no distortion, and how often the reasoning then says that BRISQUE reads below the clean photos' floor
(``offline.analyst._CLEAN_TOOL_FLOOR``, set on scikit-image training photos). Clean photos: how often it says so
wrongly. benchmarks/RESULTS.md, issue 10 follow-ups 36 and 38.

    python benchmarks/fit_corpus.py --blind-report --blind-source cbsd68 --blind-source mcmaster   # working copies
    python benchmarks/grain_note.py
"""
import glob
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from agentic_iqa.offline import severity as sv
from agentic_iqa.offline.analyst import _CLEAN_TOOL_FLOOR
from iqa_tools.registry import ToolRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fit_corpus import DEFAULT_CACHE  # noqa: E402

SIGMAS = (0, 5, 10, 20)  # 0: the clean photo
files = sorted(glob.glob(str(DEFAULT_CACHE / "work/blind-512/*.png")))
registry, floor, scratch = ToolRegistry(), _CLEAN_TOOL_FLOOR["BRISQUE"], Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
rows: dict[int, list[tuple[bool, float]]] = {s: [] for s in SIGMAS}
for f in files:
    x = np.asarray(Image.open(f).convert("RGB"), dtype=np.float64)
    for sigma in SIGMAS:
        u8 = np.clip(x + rng.normal(0, sigma, x.shape[:2])[..., None] + 0.5, 0, 255).astype(np.uint8)
        found = any(a.severity != "none" for a in sv.analyze(u8).values())
        path = scratch / "x.png"
        Image.fromarray(u8).save(path)
        rows[sigma].append((found, registry.score("BRISQUE", path, use_cache=False).normalized_score))
print(f"{len(files)} photos; BRISQUE floor {floor:g}")
for sigma, r in rows.items():
    missed = [b for found, b in r if not found]
    noted = sum(b < floor for b in missed)
    scores = [b for _, b in r]
    print(f"{'clean' if sigma == 0 else f'grain sigma {sigma}'}: analyst measures nothing on {len(missed)}/{len(r)}; "
          f"BRISQUE {min(scores):.2f}-{max(scores):.2f}; the note is given on {noted} of those {len(missed)}")
