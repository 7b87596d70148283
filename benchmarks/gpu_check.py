#!/usr/bin/env python
"""GPU check of the paper presets (one GPU, synthetic tokens, no network): `bash benchmarks/gpu_check.sh`.

For each of paper-44m, paper-129m, paper-exact-44m and paper-exact-129m, at the preset's own shapes (paper-*: batch
32 x 1024 tokens, vocabulary 32768; paper-exact-*: batch 64/32 x 256 tokens, vocabulary 20000; bf16 autocast,
`torch.compile` of the shared stack, fused AdamW, chunked readout CE):

1. **trainer** — `train()` itself, on synthetic token data, for a few steps: its logged tokens/s and MFU, the
   peak GPU memory, and every host synchronisation CUDA's sync-debug mode reports, by source line (a line
   that synchronises on every step shows up with a count of about the number of steps);
2. **loss** — per-loop against terminal loss, chunked (the preset) and unchunked: tokens/s, MFU, peak memory;
3. **exit depth** — teacher-forced evaluation at exit k=1..K: tokens/s against the FLOP ratio, and the number
   of graphs torch.compile captured before and after changing the exit depth (must not grow);
4. **flash** — whether SDPA runs the block's attention with the flash kernel.

Results go to `<out>/gpu.json` (after every part, so a run cut short keeps what it measured) and `<out>/gpu.md`.
`--dry-run` runs every code path on the CPU at the smoke preset's size (eager-backend compile) in seconds.
"""

from __future__ import annotations
import argparse, contextlib, gc, shutil, statistics, sys, tempfile, time, traceback, warnings
from collections import Counter
from pathlib import Path
import numpy as np, torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lib import (
    LoopedLM,
    LoopedLMConfig,
    RESULTS,
    SCRATCH,
    make_step,
    synthetic_batch,
    interleaved_times,
    machine,
    num_params,
    forward_flops_per_token,
    train_flops_per_token,
    write_json,
    peak_rss_mib,
)
from looped_lm.core.config import load_preset
from looped_lm.training.data import TokenData
from looped_lm.training.rundir import read_metrics
from looped_lm.training.train import PEAK_BF16_FLOPS, autocast, train

med = statistics.median


def synthetic_data(vocab_size: int, n_train: int, n_val: int, seed: int = 0) -> TokenData:
    "Uniform random token ids standing in for WikiText-103 (throughput does not depend on the values)."
    rng = np.random.default_rng(seed)
    dt = np.uint16 if vocab_size <= 2**16 else np.uint32
    tr, va = (rng.integers(0, vocab_size, n, dtype=dt) for n in (n_train, n_val))
    return TokenData(
        train=tr,
        validation=va,
        test=va,
        tokenizer=None,
        vocab_size=vocab_size,
        fingerprint=f'synthetic-{seed}',
        cache_dir=Path(tempfile.gettempdir()),
        corpus='',
    )


def graphs() -> int:
    "Graphs torch.compile (dynamo) has captured so far in this process."
    from torch._dynamo.utils import counters

    return int(counters['stats']['unique_graphs'])


def peak_mem_gib(device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == 'cuda' else peak_rss_mib() / 1024


def reset_peak(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


@contextlib.contextmanager
def sync_report(device, into: dict):
    "Count the host synchronisations CUDA reports (set_sync_debug_mode) by source line, into `into['syncs']`."
    if device.type != 'cuda':
        into['syncs'] = None
        yield
        return
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode('default')
    c = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in ws if 'synchroniz' in str(w.message))
    into['syncs'] = [dict(where=k, count=v) for k, v in c.most_common(12)]


def trainer_part(cfg, device, steps: int) -> dict:
    "Train with `train()` for `steps` steps: its tokens/s and MFU of the last `steps/2`, peak memory, host syncs."
    half = max(1, steps // 2)
    c = cfg.replace(log_every=half, eval_batches=2, ckpt_every=10**9)
    data = synthetic_data(
        cfg.vocab_size,
        max(2_000_000, 4 * cfg.batch_size * (cfg.seq_len + 1)),
        max(200_000, 2 * cfg.batch_size * (cfg.seq_len + 1)),
    )
    rd = Path(tempfile.mkdtemp(prefix=f'gpu-check-{cfg.name}-'))  # the run directory (with a checkpoint): scratch
    res = dict(steps=2 * half, log_every=half)
    reset_peak(device)
    t = time.time()
    try:
        with sync_report(device, res):
            train(c, rd, data=data, max_steps=2 * half, progress=False)
        recs = read_metrics(rd, 'train')
    finally:
        shutil.rmtree(rd, ignore_errors=True)
    last = recs[-1]
    res.update(
        wall_s=time.time() - t,
        tokens_per_s=last['tokens_per_s'],
        mfu=last['mfu'],
        loss=last['loss'],
        first_record_tokens_per_s=recs[0]['tokens_per_s'],
        peak_mem_gib=peak_mem_gib(device),
    )
    return res


def free_memory(device):
    "Collect garbage and, on CUDA, return the cached blocks to the device."
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def compiled_model(cfg, device, dry: bool):
    "The preset's model on `device`, its shared stack compiled as the trainer does; dynamo's graph count reset."
    c = LoopedLMConfig.from_experiment(cfg)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # count this model's graphs only
    torch.manual_seed(0)
    model = LoopedLM(c).to(device)
    model.loop = torch.compile(
        model.loop, backend='eager' if dry else 'inductor'
    )  # as the trainer: one graph for the stack
    return c, model


def loss_peak_memory(model, cfg, device, x, y) -> dict:
    "Peak memory of a training step, per-loop and terminal, chunked and unchunked, each alone with its own AdamW."
    # -- loss: per-loop vs terminal, chunked as the preset and unchunked. Memory: each variant alone with its own
    #    AdamW (the previous one freed); speed: the two chunked variants interleaved.
    variants = [('perloop', cfg.ce_chunk), ('terminal', cfg.ce_chunk)]
    if cfg.ce_chunk:
        variants += [('perloop', 0), ('terminal', 0)]
    loss = {}
    for lo, ch in variants:
        name, step = f'{lo}/chunk={ch}', None
        try:
            step = make_step(model, cfg.replace(loss=lo, ce_chunk=ch), device)
            for _ in range(2):
                step(x, y)  # compile (first call), AdamW state
            model.zero_grad(set_to_none=True)
            reset_peak(device)
            step(x, y)
            loss[name] = dict(peak_mem_gib=peak_mem_gib(device))
        except torch.OutOfMemoryError as e:
            loss[name] = dict(error=f'out of memory: {str(e)[:200]}')
        del step
        model.zero_grad(set_to_none=True)
        free_memory(device)
    return loss


def loss_speed(model, cfg, c, device, x, y, dry: bool, loss: dict):
    "Step time, tokens/s and MFU of per-loop and terminal loss (chunked as the preset), interleaved, into `loss`."
    tok = cfg.batch_size * cfg.seq_len
    steps = {
        f'{lo}/chunk={cfg.ce_chunk}': make_step(model, cfg.replace(loss=lo), device) for lo in ('perloop', 'terminal')
    }
    t = interleaved_times(
        {k: (lambda s=s: s(x, y)) for k, s in steps.items()}, rounds=3, reps=2 if dry else 5, warmup=1, device=device
    )
    for k, v in t.items():
        f = train_flops_per_token(c, cfg.seq_len, k.split('/')[0])
        loss[k].update(
            seconds_per_step=v,
            tokens_per_s=tok / med(v),
            mfu=tok * f / med(v) / PEAK_BF16_FLOPS if device.type == 'cuda' else None,
            train_flops_per_token=f,
        )


def loss_part(model, cfg, c, device, x, y, dry: bool, g0: int) -> dict:
    "Per-loop against terminal loss: memory and speed of each variant, their ratios, the graphs compiled."
    loss = loss_peak_memory(model, cfg, device, x, y)
    loss_speed(model, cfg, c, device, x, y, dry, loss)
    P, T = loss[f'perloop/chunk={cfg.ce_chunk}'], loss[f'terminal/chunk={cfg.ce_chunk}']
    return dict(
        variants=loss,
        graphs_after_training=graphs() - g0,
        speed_ratio_perloop_over_terminal=med(T['seconds_per_step']) / med(P['seconds_per_step']),
        peak_ratio_perloop_over_terminal=P.get('peak_mem_gib', float('nan')) / T.get('peak_mem_gib', float('nan')),
    )


def exit_depth_part(model, cfg, c, device, x, y, dry: bool, g0: int) -> dict:
    "Teacher-forced evaluation at exit k=1..K: tokens/s, speed-up against FLOP ratio, graphs captured."
    # -- exit depth: teacher-forced evaluation, no recompile when k changes
    tok = cfg.batch_size * cfg.seq_len
    model.eval()

    def ev(k):
        @torch.no_grad()
        def f():
            with autocast(cfg, device):
                return model(x, targets=y, exit_k=k, loss_loops='last', ce_chunk=cfg.ce_chunk).loss

        return f

    ev(c.K)()
    ev(1)()  # the first evaluation captures the no-grad graph; changing k must not capture another
    g_eval = graphs()
    t = interleaved_times(
        {f'k={k}': ev(k) for k in range(1, c.K + 1)}, rounds=3, reps=2 if dry else 5, warmup=1, device=device
    )
    fl = {k: forward_flops_per_token(c, cfg.seq_len, exit_k=k) for k in range(1, c.K + 1)}
    res = dict(
        tokens_per_s={k: tok / med(v) for k, v in t.items()},
        speedup_k1=med(t[f'k={c.K}']) / med(t['k=1']),
        flop_ratio_k1=fl[c.K] / fl[1],
        graphs_after_first_evals=g_eval - g0,  # training (grad) + evaluation (no_grad) graphs
        new_graphs_while_changing_exit_depth=graphs() - g_eval,
    )
    res['efficiency_k1'] = res['speedup_k1'] / res['flop_ratio_k1']
    return res


def flash_attention(model, cfg, device, x):
    "True if SDPA runs the block's attention with the flash kernel, the reason if not; None off CUDA."
    # -- flash attention for the block's shapes
    if device.type != 'cuda':
        return None
    from torch.nn.attention import sdpa_kernel, SDPBackend

    try:
        with torch.no_grad(), autocast(cfg, device), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            model.stack[0](model.embed(x))
        return True
    except RuntimeError as e:
        return f'not usable: {str(e)[:300]}'


def model_parts(cfg, device, dry: bool) -> dict:
    "Per-loop vs terminal loss (tokens/s, MFU, memory), exit-depth evaluation and recompiles, flash attention."
    res = {}
    c, model = compiled_model(cfg, device, dry)
    x, y = synthetic_batch(cfg, device)
    g0 = graphs()
    res['loss'] = loss_part(model, cfg, c, device, x, y, dry, g0)
    model.zero_grad(set_to_none=True)
    free_memory(device)
    res['exit_depth'] = exit_depth_part(model, cfg, c, device, x, y, dry, g0)
    res['flash_attention'] = flash_attention(model, cfg, device, x)
    res['fused_adamw'] = device.type == 'cuda'  # make_optimizer: fused=True on CUDA
    return res


def markdown_summary(res: dict) -> list:
    "Title, machine line and the table of one row per preset."
    m = res['machine']
    L = [
        '# GPU check of looped-lm',
        '',
        f"Machine: {m.get('gpu', 'no GPU')} x{m.get('gpu_count', 0)}, CUDA {m.get('cuda')}, torch {m['torch']}, "
        f"CPU {m['cpu']} ({m['cores']} cores). "
        f"Synthetic tokens; `bash benchmarks/gpu_check.sh`{' --dry-run' if res['dry_run'] else ''}; "
        f"{res.get('wall_s', 0):.0f} s.",
        '',
        '| preset | params | trainer tokens/s | trainer MFU | trainer peak GiB | '
        'per-loop tokens/s | per-loop MFU | per-loop / terminal speed | '
        'per-loop / terminal peak mem (chunked) | exit k=1 speed-up / FLOP ratio | new graphs on exit change | flash |',
        '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|',
    ]
    for p, r in res['presets'].items():
        tr, lo, ex = r.get('trainer', {}), r.get('loss', {}), r.get('exit_depth', {})
        pv = lo.get('variants', {}).get(f"perloop/chunk={r['ce_chunk']}", {})
        f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) and v is not None else '-'
        L.append(
            f"| {p} | {r['params'] / 1e6:.1f}M | {f(tr.get('tokens_per_s'), ',.0f')} | {f(tr.get('mfu'), '.3f')} | "
            f"{f(tr.get('peak_mem_gib'), '.1f')} | "
            f"{f(pv.get('tokens_per_s'), ',.0f')} | {f(pv.get('mfu'), '.3f')} | "
            f"{f(lo.get('speed_ratio_perloop_over_terminal'), '.3f')} | "
            f"{f(lo.get('peak_ratio_perloop_over_terminal'), '.3f')} | {f(ex.get('efficiency_k1'), '.3f')} | "
            f"{ex.get('new_graphs_while_changing_exit_depth', '-')} | {r.get('flash_attention', '-')} |"
        )
    return L


def markdown_loss_variants(res: dict) -> list:
    "The table of every loss / readout-chunk variant of every preset."
    L = ['', '| preset | loss / readout chunk | tokens/s | MFU | peak GiB |', '|---|---|---:|---:|---:|']
    for p, r in res['presets'].items():
        for name, v in r.get('loss', {}).get('variants', {}).items():
            tps, mfu, pk = v.get('tokens_per_s'), v.get('mfu'), v.get('peak_mem_gib')
            L.append(
                f"| {p} | {name} | {'-' if tps is None else f'{tps:,.0f}'} | {'-' if mfu is None else f'{mfu:.3f}'} | "
                f"{'-' if pk is None else f'{pk:.1f}'}{' ' + v['error'] if 'error' in v else ''} |"
            )
    return L


def markdown_syncs(res: dict) -> list:
    "The host synchronisations inside `train()`, one line per preset."
    L = [
        '',
        'Host synchronisations reported inside `train()` '
        '(sync-debug mode; a per-step sync has a count near the step count):',
        '',
    ]
    for p, r in res['presets'].items():
        syncs = r.get('trainer', {}).get('syncs')
        L.append(
            f"- {p}: "
            + (
                ', '.join(f"`{s['where']}` x{s['count']}" for s in syncs)
                if syncs
                else 'none reported'
                if syncs == []
                else 'n/a'
            )
        )
    return L


def markdown(res: dict) -> str:
    L = markdown_summary(res) + markdown_loss_variants(res) + markdown_syncs(res)
    errs = {p: r['errors'] for p, r in res['presets'].items() if r.get('errors')}
    if errs:
        L += ['', 'Errors:', ''] + [f"- {p}: {e}" for p, es in errs.items() for e in es]
    return '\n'.join(L) + '\n'


def parse_args():
    "The command line: results folder, presets, trainer steps, time budget, dry run."
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument(
        '--out',
        default=None,
        help='results folder (default benchmarks/results; benchmarks/_out/gpu-dry with --dry-run)',
    )
    ap.add_argument('--presets', nargs='+', default=['paper-44m', 'paper-129m', 'paper-exact-44m', 'paper-exact-129m'])
    ap.add_argument('--trainer-steps', type=int, default=20)
    ap.add_argument('--budget-s', type=float, default=480, help='stop starting new parts after this many seconds')
    ap.add_argument(
        '--dry-run', action='store_true', help='CPU, smoke-sized shapes, eager compile: checks the code paths'
    )
    return ap.parse_args()


def smoke_sized(cfg):
    "The preset's options at the smoke preset's sizes, on the CPU (for --dry-run)."
    s = load_preset('smoke')
    return cfg.replace(
        vocab_size=s.vocab_size,
        d_model=s.d_model,
        n_layers=s.n_layers,
        n_heads=s.n_heads,
        max_seq_len=s.max_seq_len,
        seq_len=s.seq_len,
        stride=cfg.stride and max(1, cfg.stride * s.seq_len // cfg.seq_len),  # the preset's overlap at smoke length
        batch_size=4,
        ce_chunk=32,
        device='cpu',
        dtype='float32',
        compile=False,
    )


def run_parts(cfg, device, dry: bool, trainer_steps: int, r: dict, res: dict, out: Path, t0: float, left):
    "Run the trainer and model parts of one preset into `r`, within the time budget, writing gpu.json after each."
    for part, fn in (
        ('trainer', lambda: trainer_part(cfg, device, 4 if dry else trainer_steps)),
        ('model', lambda: model_parts(cfg, device, dry)),
    ):
        if left() < (0 if dry else 60):
            r['errors'].append(f'{part}: skipped, out of time budget')
            continue
        try:
            got = fn()
            if part == 'trainer':
                r['trainer'] = got
            else:
                r.update(got)
        except Exception as e:
            r['errors'].append(f'{part}: {type(e).__name__}: {e}')
            traceback.print_exc()
        gc.collect()
        if device.type == 'cuda':
            torch.cuda.empty_cache()
        res['wall_s'] = time.time() - t0
        write_json(out / 'gpu.json', res)
        print(f"   {part} done at {time.time() - t0:.0f} s", flush=True)


def write_results(res: dict, out: Path, t0: float):
    "Write gpu.json and gpu.md, print the report, and exit 1 if any preset had errors."
    res['wall_s'] = time.time() - t0
    write_json(out / 'gpu.json', res)
    (out / 'gpu.md').write_text(markdown(res))
    print(markdown(res))
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.md'}")
    if any(r['errors'] for r in res['presets'].values()):
        sys.exit(1)


def main():
    a = parse_args()
    t0 = time.time()
    dry = a.dry_run or not torch.cuda.is_available()
    if not a.dry_run and not torch.cuda.is_available():
        sys.exit('No GPU visible: run on a GPU machine, or pass --dry-run to check the script on the CPU.')
    out = Path(a.out) if a.out else (SCRATCH / 'gpu-dry' if dry else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device('cpu' if dry else 'cuda')
    if not dry:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    res = dict(machine=machine(), dry_run=dry, date=time.strftime('%Y-%m-%d %H:%M'), presets={})
    left = lambda: a.budget_s - (time.time() - t0)
    for p in a.presets:
        cfg = load_preset(p)
        if dry:  # the preset's options, the smoke preset's sizes, on the CPU
            cfg = smoke_sized(cfg)
        r = res['presets'][p] = dict(
            seq_len=cfg.seq_len, batch_size=cfg.batch_size, ce_chunk=cfg.ce_chunk, dtype=cfg.dtype, errors=[]
        )
        with torch.device('meta'):
            r['params'] = num_params(LoopedLM(LoopedLMConfig.from_experiment(cfg)))
        print(
            f"== {p}: {r['params'] / 1e6:.1f}M parameters, {cfg.batch_size}x{cfg.seq_len} tokens, {left():.0f} s left",
            flush=True,
        )
        run_parts(cfg, device, dry, a.trainer_steps, r, res, out, t0, left)
    write_results(res, out, t0)


if __name__ == '__main__':
    main()
