#!/usr/bin/env bash
# Re-execute every chapter in place so that nbs/ shows its outputs (plots, tables, printed checks), then clean them.
#   bash scripts/build_book.sh                 # all chapters (05 runs or reuses the default `cpu` study in results/cpu)
#   bash scripts/build_book.sh nbs/01_model.ipynb nbs/03c_diagnostics.ipynb   # some chapters
# Run the main job first (README): 05 and 06 then read its results instead of training again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
. .venv/bin/activate
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
nbs=("$@"); [ ${#nbs[@]} -gt 0 ] || nbs=(nbs/[0-9]*.ipynb)
for nb in "${nbs[@]}"; do
  echo "== executing $nb"
  ( cd nbs && papermill --cwd . "$(basename "$nb")" "$(basename "$nb")" --log-output >/dev/null )
done
nbdev-clean
echo "done: ${#nbs[@]} chapter(s) executed in place and cleaned; review with git diff nbs/ and commit"
