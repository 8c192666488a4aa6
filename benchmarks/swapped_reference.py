"""How often the offline analyst's swapped-files note (``offline.analyst.looks_swapped``) fires on genuine pairs
(a damaged image, its clean reference) and on swapped ones (the clean photo given as the image), on the blind
sources' working copies (CBSD68, McMaster: evaluation-only, in no fit), every synthetic type at levels 1-5.

    python benchmarks/fit_corpus.py --blind-report --blind-source cbsd68   # writes the working copies (or --fetch-only)
    python benchmarks/swapped_reference.py [N_PHOTOS]
"""
import glob
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from agentic_iqa.bench import synth
from agentic_iqa.offline import stats as st
from agentic_iqa.offline.analyst import looks_swapped

sys.path.insert(0, str(Path(__file__).parent))
from fit_corpus import DEFAULT_CACHE, _apply  # noqa: E402

files = sorted(glob.glob(str(DEFAULT_CACHE / "work/blind-512/*.png")))[:int(sys.argv[1]) if len(sys.argv) > 1 else None]
fires: dict = {}
swapped: dict = {}
n = 0
for f in files:
    x = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255
    clean = st.measure(x)
    for name, t in synth.TYPES.items():
        for lvl, p in enumerate(t.params, 1):
            y = _apply(x, t, p, np.random.default_rng(lvl))  # 8-bit, as a user's file is
            damaged = st.measure(y)
            n += 1
            if looks_swapped(damaged, clean):  # a genuine pair (damaged image, clean reference) flagged: a false note
                fires[name] = fires.get(name, 0) + 1
            if looks_swapped(clean, damaged):  # the swapped pair flagged
                swapped[name] = swapped.get(name, 0) + 1
print(f"{len(files)} photos, {n} damaged images")
print("genuine pairs flagged (false notes):", sum(fires.values()), fires)
print("swapped pairs flagged:", sum(swapped.values()), {k: v for k, v in sorted(swapped.items())})
