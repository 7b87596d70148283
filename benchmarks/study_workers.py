#!/usr/bin/env python
"""Parallel study benchmark: the same study with `workers=1` and `workers=2`, from empty results folders.

    python benchmarks/study_workers.py                  # cpu preset, two variants, one seed (~25 min on 2 idle cores)
    python benchmarks/study_workers.py --preset smoke   # the script itself, in seconds

Both studies train the same (variant, seed) runs with the same total number of threads (1 worker x 2 threads vs
2 workers x 1 thread on 2 cores), so the ratio measures what running independent runs side by side buys, and the
tables must be identical (the runs are deterministic on CPU). Writes `results/study_workers.{json,md}` (or
`_out/` for the smoke preset). Run it alone on the machine: other processes on the same cores change the ratio.
"""

from __future__ import annotations
import argparse, shutil, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lib import RESULTS, SCRATCH, machine, write_json


def run_study(preset, variants, seeds, workers, out_dir) -> dict:
    from looped_lm.studies.ablation import run_ablation

    t = time.perf_counter()
    res = run_ablation(preset, variants, seeds, out_dir, workers=workers, progress=False)
    dt = time.perf_counter() - t
    return dict(seconds=dt, table1=res.tables['table1'].to_csv(), records=len(res.records))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--preset', default='cpu')
    ap.add_argument('--variants', nargs='+', default=['perloop-rmsnorm', 'perloop-raw'])
    ap.add_argument('--seeds', nargs='+', type=int, default=[0])
    a = ap.parse_args()
    out = RESULTS if a.preset == 'cpu' else SCRATCH / 'study-workers'
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix='study-workers-'))
    res = dict(machine=machine(), preset=a.preset, variants=a.variants, seeds=a.seeds, runs={})
    from looped_lm.core.config import load_preset
    from looped_lm.training.data import prepare_data

    prepare_data(load_preset(a.preset), verbose=False)  # the token cache, built before either study is timed
    try:
        for w in (1, 2):
            res['runs'][f'workers={w}'] = run_study(a.preset, a.variants, a.seeds, w, scratch / f'w{w}')
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    r1, r2 = res['runs']['workers=1'], res['runs']['workers=2']
    res['speedup'] = r1['seconds'] / r2['seconds']
    res['identical_tables'] = r1['table1'] == r2['table1']
    write_json(out / 'study_workers.json', res)
    md = (
        f"# Parallel study: workers=2 vs workers=1\n\n{res['machine']['cpu']} ({res['machine']['cores']} cores), torch "
        f"{res['machine']['torch']}, load {res['machine']['load_average_1min']:.2f} at the start.\n\n"
        f"Preset `{a.preset}`, variants {', '.join(a.variants)}, seeds {a.seeds}, from empty results folders.\n\n"
        f"| workers | seconds |\n|---:|---:|\n| 1 | {r1['seconds']:.1f} |\n| 2 | {r2['seconds']:.1f} |\n\n"
        f"Speed-up {res['speedup']:.2f}x (goal >= 1.3x); Table 1 identical: {res['identical_tables']}.\n"
    )
    (out / 'study_workers.md').write_text(md)
    print(md)
    if not res['identical_tables']:
        sys.exit('workers=2 gave a different Table 1 than workers=1')


if __name__ == '__main__':
    main()
