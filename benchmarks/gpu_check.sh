#!/usr/bin/env bash
# GPU check of the paper presets on one GPU (H100/H200), from the working tree alone: no network, synthetic tokens.
# Writes benchmarks/results/gpu.json and gpu.md (or the folder given as --out DIR); at most about 9 minutes on one H200.
#   bash benchmarks/gpu_check.sh                 # paper-44m, paper-129m, paper-exact-44m, paper-exact-129m
#   bash benchmarks/gpu_check.sh --dry-run       # every code path on the CPU, smoke-sized, in seconds
# Needs a Python with torch (CUDA build) and the project's dependencies (numpy, tokenizers, safetensors, tqdm,
# fastcore); the repository's .venv is used when there is one, and the package is imported from the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/benchmarks/_out/inductor-cache}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec timeout --signal=INT --kill-after=20 560 python benchmarks/gpu_check.py "$@"
