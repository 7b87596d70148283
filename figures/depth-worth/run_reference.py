"""Issue 54.5: `one-pass-penalty` beside `depth-worth`, a second depth-value reference (descriptive, outside the rules).

    python figures/depth-worth/run_reference.py             # train and measure the six runs, publish into reference/
    python figures/depth-worth/run_reference.py --rebuild   # only reference/reference.md, from the records

Runs of `REFERENCE_GRIDS['worth-reference']` (`nbs/06e_worth.ipynb`), resumable, two one-thread workers.
"""

import sys
from pathlib import Path

from looped_lm.extensions.worth import run_reference, write_reference

FOLDER = Path(__file__).resolve().parent / 'reference'

if __name__ == '__main__':
    if '--rebuild' in sys.argv:
        write_reference(FOLDER)
    else:
        run_reference('worth-reference', fig_dir=FOLDER, workers=2)
    print((FOLDER / 'reference.md').read_text())
