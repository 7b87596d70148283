#!/usr/bin/env bash
# Idempotent set-up for looped-lm: a virtual environment in .venv with torch and the project (editable, with the dev
# tools and the `eval` extra), and the results/ folder papermill writes into. Fast when everything is already there.
#   bash scripts/setup.sh
# Environment:
#   PYTHON       the interpreter that creates .venv (default: python3; Python >= 3.10)
#   TORCH_SPEC   what pip installs for torch when .venv has none (default: torch==2.13.0). On a machine without a GPU,
#                point pip at PyTorch's CPU wheel index first (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL) to avoid a
#                multi-GB CUDA build; on a GPU machine the default from PyPI is the CUDA build you want.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
stamp=.venv/.looped-lm-installed

if [ ! -x .venv/bin/python ]; then
  "$PY" -c 'import sys; assert sys.version_info >= (3, 10), "looped-lm needs Python >= 3.10"'
  "$PY" -m venv .venv
fi
. .venv/bin/activate
if ! python -c 'import torch' 2>/dev/null; then
  python -m pip install -q --upgrade pip
  # torch first: any other package that asks for torch could otherwise pull a large CUDA build.
  python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
# The project itself: again only when pyproject.toml changed since the last install.
# The `eval` extra (transformers, lm-evaluation-harness: nbs/07a_transformers, 07b_lm_eval) installs beside the torch
# above: a constraint pins the torch that is there, so no requirement of theirs can replace it.
needed='import looped_lm, papermill, nbdev, transformers, lm_eval'
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! python -c "$needed" 2>/dev/null; then
  python -m pip install -q -e ".[dev,eval]" -c <(python -c 'import torch; print("torch==" + torch.__version__)')
  touch "$stamp"
fi
# Test-only: looped models published by others (tests/test_outside_models.py, nbs/03d_outside.ipynb), pinned, with
# --no-deps so that no requirement of theirs (open-mythos pins torch==2.11.0) can replace the torch above.
outside=.venv/.looped-lm-outside-installed
outside_needed='import open_mythos, tiny_recursive_model, block_recurrent_transformer_pytorch, x_transformers'
if [ ! -f "$outside" ] || [ tests/outside-models.txt -nt "$outside" ] || ! python -c "$outside_needed" 2>/dev/null; then
  python -m pip install -q --no-deps -r tests/outside-models.txt
  touch "$outside"
fi
mkdir -p results
echo "looped-lm: environment ready in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
