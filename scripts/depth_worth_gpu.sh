#!/usr/bin/env bash
# The depth-worth grid on one CUDA device (figures/depth-worth/README.md, "On a GPU"), as one bounded call:
#   1. the dry-run grid on the device (seconds): a broken CUDA path stops here, before the real grid spends anything;
#   2. the whole grid (36 runs, resumable) until SECONDS_TOTAL seconds after the start, less a margin;
#   3. if it was cut short, the runs already measured are published (the others read "not measured"; run again).
# The records land in figures/depth-worth-gpu/records/, the runs in results/depth-worth-gpu/.
#   bash scripts/depth_worth_gpu.sh [SECONDS_TOTAL [WORKERS]]      # defaults 3000 s, 12 workers
# Needs: a CUDA build of torch, the project's dependencies, WikiText-2 ($LOOPED_LM_DATA or the Hub's cache).
set -uo pipefail
cd "$(dirname "$0")/.."
total=${1:-3000}
workers=${2:-12}
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
dry=$(mktemp -d)
echo "== dry run (worth-tiny on cuda) =="
timeout 150 "$py" scripts/depth_worth_gpu.py --grid worth-tiny --workers 2 --out-dir "$dry" || {
  echo "the dry run failed: the grid is not started"; exit 1; }
left=$((total - SECONDS - 60))
echo "== the grid: $left s at most, $workers workers (dry run took $SECONDS s) =="
timeout --signal=INT --kill-after=20 "$left" "$py" scripts/depth_worth_gpu.py --workers "$workers"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "== the grid stopped (exit $rc): publishing the runs already measured =="
  timeout 50 "$py" scripts/depth_worth_gpu.py --publish-only
fi
echo "== done in $SECONDS s =="
exit "$rc"
