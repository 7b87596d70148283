"""Where the main job's time goes on this CPU: one training step of the `cpu` preset taken apart by op group, and one
`diagnose_run` pass taken apart by diagnostic. Run alone on an idle machine (other processes slow torch 10-40x).

A training step (per-loop CE, the at-risk `perloop-rmsnorm` model, 16 x 64 tokens) is timed whole, then each group
alone on the same shapes and model, forward and backward: the K applications of the shared stack's attention and
MLP, the K readouts with their CE, the embedding, the gradient clipping and AdamW; what the groups do not cover is the
glue (norms, residual adds, Python). torch.profiler's table of the step's own ops is written beside it. A diagnostics
pass of a trained `cpu` run (default: the main job's) is timed per diagnostic by wrapping each of `diagnose`'s calls.

    python benchmarks/profile_cpu.py                              # results/profile_cpu.{json,md}
    python benchmarks/profile_cpu.py --rounds 2 --no-diagnostics --out benchmarks/_out/profile   # a quick check
"""

import argparse, statistics, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch  # noqa: E402
from bench_lib import RESULTS, cpu_config, interleaved_times, machine, make_step, synthetic_batch, write_json  # noqa: E402
from looped_lm.model.looped import LoopedLM, LoopedLMConfig, linear_ce  # noqa: E402
from looped_lm.studies.variants import VARIANTS  # noqa: E402


def _grad_step(fn, params):
    "A callable: forward `fn()` to a scalar, backward, and drop the gradients (what the group costs in a step)."

    def call():
        fn().backward()
        for p in params:
            p.grad = None

    return call


def training_groups(variant: str, rounds: int) -> dict:
    "Seconds per call (median over rounds) of the whole step and of each op group, on the same model and shapes."
    cfg = VARIANTS[variant].config(cpu_config('cpu'))
    torch.manual_seed(0)
    model = LoopedLM(LoopedLMConfig.from_experiment(cfg))
    x, y = synthetic_batch(cfg, 'cpu')
    step = make_step(model, cfg, torch.device('cpu'))
    params = list(model.parameters())
    with torch.no_grad():
        out = model(x, targets=y)
    h_in = [model.embed(x).detach()] + [h.detach() for h in out.hidden[:-1]]  # what each loop receives
    hidden = [h.detach().requires_grad_() for h in out.hidden]
    blk = model.stack
    groups = dict(
        step=lambda: step(x, y),
        attention=_grad_step(lambda: sum(b.attn(b.norm1(h)).sum() for h in h_in for b in blk), params),
        mlp=_grad_step(lambda: sum(b.mlp(b.norm2(h)).sum() for h in h_in for b in blk), params),
        readout_ce=_grad_step(
            lambda: sum(linear_ce(model.readout_input(h, k), model.head.weight, y) for k, h in enumerate(hidden, 1)),
            params + hidden,
        ),
        embedding=_grad_step(lambda: model.embed(x).sum(), params),
    )
    times = interleaved_times(groups, rounds=rounds, reps=5, warmup=2)
    out = {k: statistics.median(v) for k, v in times.items()}
    phases = step.phases[-rounds * 5 :]
    out['clip_adamw'] = statistics.median(p[1] for p in phases)
    out['glue'] = out['step'] - sum(out[k] for k in ('attention', 'mlp', 'readout_ce', 'embedding', 'clip_adamw'))
    return dict(variant=variant, seconds=out, ops=_op_table(step, x, y))


def _op_table(step, x, y, top: int = 12) -> list:
    "torch.profiler's self CPU time of the step's ops (forward, backward and AdamW), the `top` most costly."
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step(x, y)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [dict(op=e.key, calls=e.count // 5, ms_per_step=e.self_cpu_time_total / 5e3) for e in rows]


DIAGNOSTICS = (  # what `diagnose` calls, by name in its module
    'guarded_spec', 'checked_spec', 'loop_scores', 'clamp_modes', 'lemma2', 'eval_exits', 'norm_distribution',
    'radial_fractions', 'angular_updates', 'scale_sensitivity', 'adaptive_halting',
)  # fmt: skip


def diagnostics_parts(run_dir: Path) -> dict:
    """Seconds of each of `diagnose`'s calls (the outermost one where they nest) in one pass over a trained run, as
    `diagnose_run` calls it (its batch, every window), and of the whole pass."""
    from looped_lm.measure import diagnostics as dg
    from looped_lm.training.data import prepare_data
    from looped_lm.training.rundir import load_run

    cfg, model = load_run(run_dir)
    data = prepare_data(cfg, verbose=False)
    spent, depth, saved = {}, [0], {n: getattr(dg, n) for n in DIAGNOSTICS}

    def timed(name, fn):
        def call(*a, **kw):
            t0, depth[0] = time.perf_counter(), depth[0] + 1
            try:
                return fn(*a, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return call

    for n, fn in saved.items():
        setattr(dg, n, timed(n, fn))
    try:
        t0 = time.perf_counter()
        bs = max(cfg.batch_size, dg.EVAL_TOKENS // cfg.seq_len)
        dg.diagnose(model, data, bs, cfg.seq_len, loss=cfg.loss, norm_penalty=cfg.norm_penalty, ce_chunk=cfg.ce_chunk)
        total = time.perf_counter() - t0
    finally:
        for n, fn in saved.items():
            setattr(dg, n, fn)
    return dict(run=str(run_dir), total=total, parts=dict(sorted(spent.items(), key=lambda kv: -kv[1])))


def markdown(r: dict) -> str:
    m, s = r['machine'], r['training']['seconds']
    lines = [
        '# Where the main job\'s time goes (`benchmarks/profile_cpu.py`)',
        '',
        f"Machine: {m['cpu']} ({m['cpu_capability']}), {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} "
        f"threads; load {m['load_average_1min']:.2f} at the start. `cpu` preset, `{r['training']['variant']}`, one "
        'training step of 16 × 64 tokens (median of interleaved rounds; each group alone, forward and backward).',
        '',
        '| op group | ms per step | share |',
        '|---|---:|---:|',
    ]
    for k in ('attention', 'mlp', 'readout_ce', 'embedding', 'clip_adamw', 'glue'):
        lines.append(f"| {k} | {1e3 * s[k]:.1f} | {s[k] / s['step']:.0%} |")
    lines += [
        f"| **the step** | **{1e3 * s['step']:.1f}** | |",
        '',
        'The step\'s own ops (torch.profiler, self CPU):',
        '',
    ]
    lines += ['| op | calls | ms per step |', '|---|---:|---:|']
    lines += [f"| `{o['op']}` | {o['calls']} | {o['ms_per_step']:.2f} |" for o in r['training']['ops']]
    if d := r.get('diagnostics'):
        lines += ['', f"One diagnostics pass of `{d['run']}` ({d['total']:.1f} s):", '', '| diagnostic | s | share |']
        lines += ['|---|---:|---:|'] + [f"| `{k}` | {v:.1f} | {v / d['total']:.0%} |" for k, v in d['parts'].items()]
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--variant', default='perloop-rmsnorm')
    ap.add_argument('--rounds', type=int, default=10)
    ap.add_argument('--run', default='results/cpu/runs/perloop-rmsnorm-seed1', help='a trained run to diagnose')
    ap.add_argument('--no-diagnostics', action='store_true')
    ap.add_argument('--out', default=None, help=f'folder of profile_cpu.json/.md (default {RESULTS})')
    a = ap.parse_args()
    res = dict(machine=machine(), training=training_groups(a.variant, a.rounds))
    if not a.no_diagnostics:
        res['diagnostics'] = diagnostics_parts(Path(a.run))
    out = Path(a.out or RESULTS)
    write_json(out / 'profile_cpu.json', res)
    (out / 'profile_cpu.md').write_text(markdown(res))
    print(markdown(res))
