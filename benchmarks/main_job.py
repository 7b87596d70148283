"""The README's main job timed from empty, and again (a rerun trains nothing): writes `results/main_job.{json,md}`.

From empty means a new results folder and an empty token cache (`LOOPED_LM_CACHE` pointed at a new folder), so the
time includes fitting the BPE and tokenizing WikiText. The command is the README's (`papermill ... 05_ablation`),
with its results and figures sent to a scratch folder so that nothing committed is touched (`--in-place`: into the
chapter itself, `results/<preset>` and `figures/<preset>`, as the README runs it, an existing `results/<preset>` moved
aside first, never deleted; the rerun's notebook goes to the scratch folder, so the chapter shows the run from
empty). Each run's training and diagnostics seconds are read from its folder (`config.json` written → `latest`
written → `diagnostics.json` written; with several workers the runs go side by side, so the table also gives the span
from the first run's start to the last run's report). Run it alone on an idle machine.

    python benchmarks/main_job.py                       # the `cpu` preset: about 10-15 minutes on 2 cores
    python benchmarks/main_job.py --in-place            # the same into nbs/05_ablation.ipynb, results/, figures/cpu
    python benchmarks/main_job.py --preset smoke --out benchmarks/_out/main_job     # a quick check
"""

import argparse, json, os, resource, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_lib import RESULTS, machine, write_json  # noqa: E402
from looped_lm.studies.runner import default_workers  # noqa: E402

ROOT = HERE.parent


def run_main_job(preset: str, scratch: Path, env: dict, in_place: bool = False, notebook: str = None) -> dict:
    "Wall and CPU seconds of one execution of the main job into `scratch` (`in_place`: where the README puts it)."
    cmd = ['papermill', '--log-output', 'nbs/05_ablation.ipynb', notebook or str(scratch / '05_ablation.ipynb')]
    if not in_place:  # in place: the chapter's own parameters (its default preset), no injected cell
        cmd += [
            '-p',
            'preset',
            preset,
            '-p',
            'out_dir',
            str(scratch / preset),
            '-p',
            'fig_dir',
            str(scratch / 'figures'),
        ]
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"the main job failed:\n{p.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(wall_s=round(wall, 1), cpu_s=round(cpu, 1))


def run_stages(study: Path) -> dict:
    "{run: (training s, diagnostics s)} from the mtimes of each run folder's files, and the span from first to last."
    out, first, last = {}, float('inf'), 0.0
    for rd in sorted((study / 'runs').iterdir()):
        t = {f: (rd / f).stat().st_mtime for f in ('config.json', 'latest', 'diagnostics.json')}
        out[rd.name] = dict(
            training_s=round(t['latest'] - t['config.json'], 1),
            diagnostics_s=round(t['diagnostics.json'] - t['latest'], 1),
        )
        first, last = min(first, t['config.json']), max(last, t['diagnostics.json'])
    return out, round(last - first, 1)


def markdown(r: dict) -> str:
    m, runs, workers = r['machine'], r['runs'], r['workers']
    train, diag = (sum(v[k] for v in runs.values()) for k in ('training_s', 'diagnostics_s'))
    first, side = r['from_empty'], f", side by side in {workers} workers" if workers > 1 else ''
    lines = [
        f"# The main job, timed from empty (`python benchmarks/main_job.py`, {r['date']})",
        '',
        f"`papermill nbs/05_ablation.ipynb` on the `{r['preset']}` preset ({len(runs)} runs, `workers` at its default: "
        f"{workers} on this machine), its results "
        f"and figures {'where the README puts them' if r.get('in_place') else 'in a scratch folder'}, an empty token "
        'cache. Machine: '
        f"{m['cpu']} ({m['cpu_capability']}), {m['cores']} cores, torch {m['torch']}, numpy {m['numpy']}; load "
        f"{m['load_average_1min']:.2f} at the start.",
        '',
        '| stage | seconds |',
        '|---|---:|',
        f"| training, summed over the runs (each run's folder: config written → last checkpoint) | {train:.0f} |",
        f"| diagnostics, summed over the runs (last checkpoint → report) | {diag:.0f} |",
        f"| the runs, first config written → last report (wall clock{side}) | {r['runs_span_s']:.0f} |",
        f"| the rest: start, imports, BPE and tokens, throughput, tables, claims, figures, checks | "
        f"{first['wall_s'] - r['runs_span_s']:.0f} |",
        f"| **from empty (wall clock)** | **{first['wall_s']:.0f}** (CPU {first['cpu_s']:.0f} s) |",
        f"| a rerun (trains and measures nothing) | {r['rerun']['wall_s']:.0f} |",
        '',
        '| run | training s | diagnostics s |',
        '|---|---:|---:|',
    ]
    lines += [f"| {k} | {v['training_s']:.0f} | {v['diagnostics_s']:.0f} |" for k, v in runs.items()]
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--preset', default='cpu')
    ap.add_argument('--in-place', action='store_true', help='into the chapter, results/ and figures/, as the README')
    ap.add_argument('--out', default=None, help=f'folder of main_job.json/.md (default {RESULTS})')
    a = ap.parse_args()
    if a.in_place and a.preset != 'cpu':
        raise SystemExit('--in-place runs the chapter as the README does, on its default preset (cpu): drop --preset.')
    scratch = Path(tempfile.mkdtemp(prefix='main-job-'))
    env = dict(os.environ, LOOPED_LM_CACHE=str(scratch / 'token-cache'))
    study = ROOT / 'results' / a.preset if a.in_place else scratch / a.preset
    if a.in_place and study.exists():  # from empty, and nothing computed is lost: moved aside
        study.rename(study.with_name(f"{a.preset}.before-{time.strftime('%Y%m%d-%H%M%S')}"))
    res = dict(preset=a.preset, date=time.strftime('%Y-%m-%d'), machine=machine(), in_place=a.in_place)
    res['from_empty'] = run_main_job(
        a.preset, scratch, env, a.in_place, 'nbs/05_ablation.ipynb' if a.in_place else None
    )
    res['runs'], res['runs_span_s'] = run_stages(study)
    res['workers'] = default_workers(len(res['runs']), 'cpu')  # the job's default, in the same environment
    res['rerun'] = run_main_job(a.preset, scratch, env, a.in_place)
    out = Path(a.out or RESULTS)
    write_json(out / 'main_job.json', res)
    (out / 'main_job.md').write_text(markdown(res))
    print(json.dumps(res['from_empty']), json.dumps(res['rerun']))
    print(markdown(res))
    if a.in_place:
        print('nbs/05_ablation.ipynb holds the run from empty: nbdev-clean, review it with git diff, commit.')
