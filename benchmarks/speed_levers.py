"""Levers on the main job's training step, measured side by side against today's code in one run (same machine, same
seed, interleaved rounds): the `cpu` preset's per-loop step as it is; the readout's CE in chunks (`ce_chunk`: the
logits of a chunk of tokens at a time, their gradient computed in the forward pass, never a whole (tokens, vocabulary)
tensor and its log-softmax backward); `torch.compile` (inductor, CPU) of the model, its compile seconds counted; one
thread instead of two; bf16 autocast (the paper's GPU precision; on a CPU fast only with AVX-512 BF16 or AMX, emulated
elsewhere). Each lever's loss after the same steps is compared with today's: a lever that changes the
numbers changes the default's code identity. And one lever on the diagnostics: a `diagnose_run` pass of a trained
run in a fresh process (as the main job's run meets it), its readout's logits whole or `EVAL_CE_CHUNK` tokens at a
time, with the report's numbers compared. Run alone on an idle machine.

    python benchmarks/speed_levers.py                        # results/speed_levers.{json,md}
    python benchmarks/speed_levers.py --rounds 2 --out benchmarks/_out/levers      # a quick check
"""

import argparse, json, statistics, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch  # noqa: E402
from bench_lib import RESULTS, cpu_config, interleaved_times, machine, make_step, synthetic_batch, write_json  # noqa: E402
from looped_lm.model.looped import LoopedLM, LoopedLMConfig  # noqa: E402
from looped_lm.studies.variants import VARIANTS  # noqa: E402


def contestant(variant: str, ce_chunk: int = 0, compiled: bool = False, dtype: str = 'float32') -> dict:
    "A model (seed 0) and its training step at the `cpu` preset; `seconds_to_ready`: building (and compiling) it."
    t0 = time.perf_counter()
    cfg = VARIANTS[variant].config(cpu_config('cpu', ce_chunk=ce_chunk, dtype=dtype))
    torch.manual_seed(0)
    model = LoopedLM(LoopedLMConfig.from_experiment(cfg))
    run = torch.compile(model) if compiled else model
    step = make_step(run, cfg, torch.device('cpu'))
    x, y = synthetic_batch(cfg, 'cpu')
    first = float(step(x, y).detach())  # the first step: where torch.compile compiles
    return dict(step=lambda: step(x, y), first_loss=first, seconds_to_ready=time.perf_counter() - t0)


def threads_call(fn, n: int):
    "`fn` run with `n` torch threads (restored after)."

    def call():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)

    return call


def measure(variant: str, rounds: int) -> dict:
    levers = dict(
        today=contestant(variant, ce_chunk=0),
        ce_chunk_256=contestant(variant, ce_chunk=256),
        ce_chunk_512=contestant(variant, ce_chunk=512),
        compiled=contestant(variant, compiled=True),
        bf16_autocast=contestant(variant, dtype='bfloat16'),
    )
    fns = {k: v['step'] for k, v in levers.items()}
    fns['today_1_thread'] = threads_call(levers['today']['step'], 1)
    times = interleaved_times(fns, rounds=rounds, reps=5, warmup=2)
    base = statistics.median(times['today'])
    out = {}
    for k, ts in times.items():
        lever = levers.get(k, levers['today'])
        out[k] = dict(
            ms_per_step=1e3 * statistics.median(ts),
            spread=(max(ts) - min(ts)) / statistics.median(ts),
            speedup=base / statistics.median(ts),
            seconds_to_ready=lever['seconds_to_ready'],
            first_loss_change=lever['first_loss'] - levers['today']['first_loss'],
        )
    return out


ONE_PASS = r"""
import json, resource, sys, time
from looped_lm.training.rundir import load_run
from looped_lm.training.data import prepare_data
from looped_lm.measure.diagnostics import diagnose, EVAL_TOKENS
cfg, model = load_run(sys.argv[1])
data = prepare_data(cfg, verbose=False)
t = time.perf_counter()
rep = diagnose(model, data, max(cfg.batch_size, EVAL_TOKENS // cfg.seq_len), cfg.seq_len, loss=cfg.loss,
               norm_penalty=cfg.norm_penalty, ce_chunk=int(sys.argv[2]))
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps(dict(seconds=time.perf_counter() - t, sys_seconds=ru.ru_stime, report=rep)))
"""  # fmt: skip


def diagnostics_pass(run: str, chunks=(0, 1024), repeats: int = 2) -> dict:
    "Per chunk: seconds and system seconds of a fresh process's `diagnose` pass (each `repeats` times, alternating)."
    got = {c: [] for c in chunks}
    for _ in range(repeats):
        for c in chunks:
            p = subprocess.run([sys.executable, '-c', ONE_PASS, run, str(c)], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"the diagnostics pass failed:\n{p.stderr[-3000:]}")
            got[c].append(json.loads(p.stdout.strip().splitlines()[-1]))
    same = json.dumps(got[chunks[0]][0]['report']) == json.dumps(got[chunks[-1]][0]['report'])
    return dict(
        run=run,
        same_report=same,
        passes={
            str(c): dict(seconds=[r['seconds'] for r in rs], sys_seconds=[r['sys_seconds'] for r in rs])
            for c, rs in got.items()
        },
    )


def markdown(r: dict) -> str:
    m = r['machine']
    lines = [
        '# Levers on the training step, side by side (`benchmarks/speed_levers.py`)',
        '',
        f"Machine: {m['cpu']} ({m['cpu_capability']}), {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} "
        f"threads; load {m['load_average_1min']:.2f} at the start. `cpu` preset, one training step of 16 × 64 tokens, "
        f"median of {r['rounds']} interleaved rounds of 5 steps; 800 steps × 9 runs is the main job's training. "
        "`today`: the preset's step (`ce_chunk` 0); the first loss: the same step on the same batch.",
        '',
        '| variant | lever | ms per step | spread | speed-up | ready in (s) | first loss − today\'s |',
        '|---|---|---:|---:|---:|---:|---:|',
    ]
    for v, levers in r['variants'].items():
        for k, x in levers.items():
            lines.append(
                f"| {v} | {k} | {x['ms_per_step']:.1f} | {x['spread']:.0%} | {x['speedup']:.2f}× | "
                f"{x['seconds_to_ready']:.1f} | {x['first_loss_change']:+.1e} |"
            )
    if d := r.get('diagnostics'):
        lines += ['', f"A diagnostics pass of `{d['run']}` in a fresh process (each twice, alternating); the reports "
                  f"are {'identical' if d['same_report'] else 'NOT identical'}:", '']  # fmt: skip
        lines += ['| readout logits | seconds | of which in the kernel (sys) |', '|---|---:|---:|']
        for c, x in d['passes'].items():
            what = 'a whole batch (today)' if c == '0' else f'{c} tokens at a time'
            secs = ', '.join(f'{t:.1f}' for t in x['seconds'])
            lines.append(f"| {what} | {secs} | {', '.join(f'{t:.1f}' for t in x['sys_seconds'])} |")
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--variants', nargs='+', default=['perloop-rmsnorm', 'terminal-rmsnorm'])
    ap.add_argument('--rounds', type=int, default=8)
    ap.add_argument('--run', default='results/cpu/runs/perloop-rmsnorm-seed1', help="a trained run (''): none")
    ap.add_argument('--out', default=None, help=f'folder of speed_levers.json/.md (default {RESULTS})')
    a = ap.parse_args()
    res = dict(machine=machine(), rounds=a.rounds, variants={v: measure(v, a.rounds) for v in a.variants})
    if a.run:
        res['diagnostics'] = diagnostics_pass(a.run)
    out = Path(a.out or RESULTS)
    write_json(out / 'speed_levers.json', res)
    (out / 'speed_levers.md').write_text(markdown(res))
    print(markdown(res))
