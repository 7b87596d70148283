"""What moves when the same config and seed is trained with other CPU kernels. torch picks its vectorised kernels by
the instruction set (AVX-512, AVX2, ...); `ATEN_CPU_CAPABILITY` caps it, so two ISAs can be compared on one machine.
Each (variant, ISA) trains the `cpu` preset (seed 1, 800 steps) in a fresh one-thread process and is measured by the
ablation's own `diagnose` (validation exits on the first `--batches` windows, token norms, radial fractions, clamps,
halting); the JSON and Markdown in `results/` say, per variant, how far each number moves and whether the weights are
bit-identical.

    python benchmarks/isa_sensitivity.py                        # perloop-rmsnorm and perloop-raw, AVX512 vs AVX2
    python benchmarks/isa_sensitivity.py --steps 20 --batches 1 --out benchmarks/_out/isa   # a quick check
"""

import argparse, json, os, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ONE = r"""
import json, sys, torch
torch.set_num_threads(1)
from looped_lm.core.config import load_preset
from looped_lm.core.files import machine_record, file_sha256
from looped_lm.training.train import train
from looped_lm.training.rundir import load_run, latest_checkpoint
from looped_lm.training.data import prepare_data
from looped_lm.measure.diagnostics import diagnose
from looped_lm.studies.variants import VARIANTS
variant, steps, batches, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
base = load_preset('cpu')
cfg = VARIANTS[variant].config(base).replace(train_tokens=steps * base.batch_size * base.seq_len, ckpt_every=steps)
data = prepare_data(cfg, verbose=False)
train(cfg, run_dir, data=data, progress=False)
_, model = load_run(run_dir)
d = diagnose(model, data, 128, cfg.seq_len, max_batches=batches, loss=cfg.loss, norm_penalty=cfg.norm_penalty)
print(json.dumps(dict(
    machine=machine_record('cpu', cfg.dtype),
    weights=file_sha256(latest_checkpoint(run_dir) / 'model.safetensors')[:16],
    ppl=[e['ppl'] for e in d['exits']['validation']],
    norm=d['norms'][-1]['mean'], hill=d['norms'][-1]['hill'], radial=d['radial'][-1]['readout'],
    clamp={m: d['clamp'][m][-1]['ppl'] / d['clamp']['none'][-1]['ppl'] for m in ('freeze_loop1', 'remove_radial')},
)))
"""


def run_one(variant: str, isa: str, steps: int, batches: int, out: Path) -> dict:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=isa.lower(), OMP_NUM_THREADS='1')
    run_dir = out / f'{variant}-{isa}'
    p = subprocess.run(
        [sys.executable, '-c', ONE, variant, str(steps), str(batches), str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        raise SystemExit(f"{variant} under {isa} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def moves(a: dict, b: dict) -> dict:
    "Relative change of each number from ISA a to ISA b."
    rel = lambda x, y: abs(y - x) / abs(x)
    out = {f'ppl@{k}': rel(x, y) for k, (x, y) in enumerate(zip(a['ppl'], b['ppl']), 1)}
    out.update({k: rel(a[k], b[k]) for k in ('norm', 'hill', 'radial')})
    out.update({f'clamp {m}': rel(a['clamp'][m], b['clamp'][m]) for m in a['clamp']})
    return out


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--variants', default='perloop-rmsnorm,perloop-raw')
    ap.add_argument('--isas', default='AVX512,AVX2')
    ap.add_argument('--steps', type=int, default=800)
    ap.add_argument('--batches', type=int, default=20, help='validation windows of 128 x 64 tokens measured')
    ap.add_argument('--out', default=str(HERE / 'results'))
    a = ap.parse_args()
    out, scratch = Path(a.out), HERE / '_out' / 'isa'
    out.mkdir(parents=True, exist_ok=True)
    t0, isas = time.time(), a.isas.split(',')
    res = {v: {i: run_one(v, i, a.steps, a.batches, scratch) for i in isas} for v in a.variants.split(',')}
    caps = {v: {i: r['machine']['cpu_capability'] for i, r in rs.items()} for v, rs in res.items()}
    summary = dict(steps=a.steps, batches=a.batches, seconds=round(time.time() - t0), capabilities=caps, runs=res)
    summary['moves'] = {v: moves(rs[isas[0]], rs[isas[1]]) for v, rs in res.items()}
    (out / 'isa_sensitivity.json').write_text(json.dumps(summary, indent=1))
    m = next(iter(next(iter(res.values())).values()))['machine']
    lines = [
        f"# The same run under two CPU instruction sets ({' vs '.join(isas)})",
        '',
        f"{m['cpu']}, torch {m['torch']}, one thread; `cpu` preset, seed 1, {a.steps} steps; measured on the first "
        f"{a.batches} validation windows of 128 x 64 tokens. Made by `python benchmarks/isa_sensitivity.py` in "
        f"{summary['seconds']} s. Kernels used: {caps}.",
        '',
        '| variant | weights equal | ' + ' | '.join(summary['moves'][next(iter(res))]) + ' |',
        '|---|---|' + '---|' * len(summary['moves'][next(iter(res))]),
    ]
    for v, mv in summary['moves'].items():
        same = res[v][isas[0]]['weights'] == res[v][isas[1]]['weights']
        lines.append(f"| {v} | {same} | " + ' | '.join(f"{100 * x:.2g}%" for x in mv.values()) + ' |')
    lines += [
        '',
        'Relative change of each number from the first ISA to the second (0%: equal).',
    ]
    (out / 'isa_sensitivity.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))
