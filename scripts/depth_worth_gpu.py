"""The depth-worth grid (figures/depth-worth/README.md) on one CUDA device, in one call: 36 runs (6 variants x
budgets of 1,200 and 4,800 steps x seeds 1-3), each measured at its last step, into figures/depth-worth-gpu/ — a second
column of the study's rules, never mixed with the CPU records. `bash scripts/depth_worth_gpu.sh` is the whole call
(a dry run on the device first, a deadline, then what was finished published).

    python scripts/depth_worth_gpu.py                       # on the GPU machine, from the repository's top folder
    python scripts/depth_worth_gpu.py --publish-only        # after an interruption: publish what was measured
    python scripts/depth_worth_gpu.py --grid worth --device auto --publish-only   # the CPU study's runs, as they ran
    python scripts/depth_worth_gpu.py --grid worth-tiny --device cpu --out-dir /tmp/x   # the dry run of the tests

The grid is 108,000 optimiser steps plus 36 full diagnoses; 27 runs x 1,000 steps of this preset took 109 s on one
H200 with 9 workers (figures/cpu-cosine-3seeds/). It resumes: run it again after an interruption and only what is
missing is trained and measured.
"""

import argparse
import time

from looped_lm.extensions.worth import WORTH, run_worth
from looped_lm.studies.runner import finish_grid


def publish_measured(grid: str, out_dir, device: str, remove_stale: bool = False) -> list:
    """Publish the records of the runs already measured, training nothing: what an interrupted grid finished. A
    published record no run folder here reproduces is kept as it was, and named; `remove_stale` drops runs redone."""
    plan = WORTH.check(grid, out_dir, None, device, 1)
    records = finish_grid(WORTH, plan, WORTH.data(plan), remove_stale=remove_stale).records
    print(f"published {len(records)} of {len(plan.jobs)} runs' records into {plan.fig_dir}")
    return records


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--grid', default='worth-gpu', help="a grid of WORTH_GRIDS (default worth-gpu; worth-tiny: dry run)")
    p.add_argument('--device', default='cuda', help='cuda (default) or cpu')
    p.add_argument('--workers', type=int, default=12, help='processes training at once (default 12, sharing one GPU)')
    p.add_argument('--out-dir', default=None, help='where the runs go (default results/depth-<grid>/)')
    p.add_argument('--publish-only', action='store_true', help='train nothing; publish the runs already measured')
    p.add_argument('--remove-stale', action='store_true', help='with --publish-only: drop published runs redone since')
    a = p.parse_args()
    t0 = time.time()
    if a.publish_only:
        recs = publish_measured(a.grid, a.out_dir, a.device, a.remove_stale)
    else:
        recs = run_worth(a.grid, out_dir=a.out_dir, device=a.device, workers=a.workers).records
    print(f"{len(recs)} records in {time.time() - t0:.0f} s on {recs[0]['machine'] if recs else 'no machine'}")
