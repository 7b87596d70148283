"""The depth-worth grid (figures/depth-worth/README.md) on one CUDA device, in one call: 36 runs (6 variants x
budgets of 1,200 and 4,800 steps x seeds 1-3), each measured at its last step, into figures/depth-worth-gpu/ — a second
column of the study's rules, never mixed with the CPU records.

    python scripts/depth_worth_gpu.py                       # on the GPU machine, from the repository's top folder
    python scripts/depth_worth_gpu.py --grid worth-tiny --device cpu --out-dir /tmp/x   # the dry run of the tests

Expected on one H200: about 7-8 minutes with 4 workers sharing the device (estimated, not yet measured: 27 runs x
1,000 steps of this preset took 109 s there; this grid is 108,000 steps, plus 36 full diagnoses). It resumes: run it
again after an interruption and only what is missing is trained and measured.
"""

import argparse
import time

from looped_lm.extensions.worth import run_worth

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--grid', default='worth-gpu', help="a grid of WORTH_GRIDS (default worth-gpu; worth-tiny: dry run)")
    p.add_argument('--device', default='cuda', help='cuda (default) or cpu')
    p.add_argument('--workers', type=int, default=4, help='processes training at once (default 4, sharing one GPU)')
    p.add_argument('--out-dir', default=None, help='where the runs go (default results/depth-<grid>/)')
    a = p.parse_args()
    t0 = time.time()
    recs = run_worth(a.grid, out_dir=a.out_dir, device=a.device, workers=a.workers)
    print(f"{len(recs)} records in {time.time() - t0:.0f} s on {recs[0]['machine'] if recs else 'no machine'}")
