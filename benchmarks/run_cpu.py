#!/usr/bin/env python
"""CPU benchmarks of looped-lm, in one command (a few minutes on 2 cores):

    python benchmarks/run_cpu.py            # writes benchmarks/results/cpu.json and cpu.md
    python benchmarks/run_cpu.py --quick    # a smoke run of the script itself (seconds; writes to benchmarks/_out/)

1. Equal FLOPs: training-step speed of `LoopedLM` (L shared layers, K=4, terminal loss) against a plain GPT of
   L*K unshared layers (same width, heads, sequence, vocabulary, terminal loss), and of per-loop loss too; at the
   `cpu` preset's size and at the `paper-44m` size (widths and vocabulary kept, short sequence and batch).
2. Exit depth: teacher-forced evaluation speed at exit k=1..K on the paper-44m size, against the FLOP ratio
   of the model's own count.
3. Per-loop readout cost: step speed and peak memory of per-loop against terminal loss at the paper-44m size
   and its 32k vocabulary, with and without chunked readout CE; every configuration in a fresh subprocess,
   whose peak resident memory is read from the kernel.

Every figure is a ratio of two measurements taken in the same run (times interleaved round by round). On a CPU
absolute tokens/s depend on the machine and are kept in the JSON only; the Markdown reports ratios.
"""

from __future__ import annotations
import argparse, gc, json, os, statistics, subprocess, sys, time
from pathlib import Path
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lib import (
    GPT,
    LoopedLM,
    LoopedLMConfig,
    RESULTS,
    SCRATCH,
    bench_config,
    cpu_config,
    shape_record,
    make_step,
    synthetic_batch,
    interleaved_times,
    machine,
    num_params,
    forward_flops_per_token,
    train_flops_per_token,
    gpt_flops_per_token,
    write_json,
    current_rss_mib,
    peak_rss_mib,
)
from looped_lm.training.train import training_objective
from looped_lm.model.looped import saved_tensor_bytes

med = statistics.median

# ---------------------------------------------------------------------------------------------------------
# 1. Equal FLOPs


def equal_flops_times(cfg, looped_t, looped_p, gpt, x, y, rounds: int, reps: int):
    "Interleaved step times of the looped model (terminal, per-loop) and the GPT: whole, fwd+bwd and optimizer."
    steps = {
        'looped_terminal': make_step(looped_t, cfg.replace(loss='terminal'), torch.device('cpu')),
        'looped_perloop': make_step(looped_p, cfg.replace(loss='perloop'), torch.device('cpu')),
        'gpt': make_step(gpt, cfg, torch.device('cpu'), baseline=True),
    }
    t = interleaved_times({k: (lambda s=s: s(x, y)) for k, s in steps.items()}, rounds, reps)
    fb = {k: [p[0] for p in s.phases[1:]] for k, s in steps.items()}  # forward+backward part of each timed step
    op = {k: [p[1] for p in s.phases[1:]] for k, s in steps.items()}  # clip + AdamW part
    return t, fb, op


def equal_flops_ratios(t: dict, fb: dict, op: dict, f_loop: float, f_perloop: float) -> dict:
    "Speed ratios of the equal-FLOPs contestants, AdamW shares, and the per-loop / terminal FLOP ratio."
    return dict(
        ratio_looped_terminal_over_gpt=med(t['gpt']) / med(t['looped_terminal']),
        ratio_looped_terminal_over_gpt_best=min(t['gpt']) / min(t['looped_terminal']),  # from each one's fastest round
        ratio_looped_terminal_over_gpt_fwd_bwd=med(fb['gpt']) / med(fb['looped_terminal']),
        optimizer_share=dict(
            looped_terminal=med(op['looped_terminal']) / med(t['looped_terminal']), gpt=med(op['gpt']) / med(t['gpt'])
        ),
        ratio_looped_perloop_over_gpt=med(t['gpt']) / med(t['looped_perloop']),
        ratio_perloop_over_terminal=med(t['looped_terminal']) / med(t['looped_perloop']),
        flop_ratio_perloop_over_terminal=f_loop / f_perloop,
    )


def equal_flops(preset: str, seq_len: int, batch_size: int, rounds: int, reps: int) -> dict:
    cfg = cpu_config(preset, ce_chunk=0, seq_len=seq_len, batch_size=batch_size)
    c = LoopedLMConfig.from_experiment(cfg)
    n_gpt = c.n_layers * c.K
    torch.manual_seed(0)
    looped_t, looped_p, gpt = LoopedLM(c), LoopedLM(c), GPT(c, n_gpt)
    x, y = synthetic_batch(cfg, 'cpu')
    t, fb, op = equal_flops_times(cfg, looped_t, looped_p, gpt, x, y, rounds, reps)
    tok = batch_size * seq_len
    f_loop = train_flops_per_token(c, seq_len, 'terminal')
    f_gpt = 3 * gpt_flops_per_token(c, n_gpt, seq_len)
    assert abs(f_loop / f_gpt - 1) < 1e-9, (f_loop, f_gpt)  # equal FLOPs by construction
    return dict(
        preset=preset,
        d_model=c.d_model,
        n_heads=c.n_heads,
        vocab_size=c.vocab_size,
        looped_layers=c.n_layers,
        K=c.K,
        gpt_layers=n_gpt,
        seq_len=seq_len,
        batch_size=batch_size,
        tokens_per_step=tok,
        rounds=rounds,
        reps=reps,
        params=dict(looped=num_params(looped_t), gpt=num_params(gpt)),
        train_flops_per_token=dict(
            looped_terminal=f_loop, looped_perloop=train_flops_per_token(c, seq_len, 'perloop'), gpt=f_gpt
        ),
        seconds_per_step=t,
        tokens_per_s={k: tok / med(v) for k, v in t.items()},
        seconds_fwd_bwd=fb,
        seconds_optimizer=op,
        **equal_flops_ratios(t, fb, op, f_loop, train_flops_per_token(c, seq_len, 'perloop')),
    )


# ---------------------------------------------------------------------------------------------------------
# 2. Exit depth


def exit_speedups(t: dict, flops: dict, ks: list, K: int, ch: int) -> dict:
    "Speed-up against exit K and efficiency (speed-up / FLOP ratio) at every exit k, for readout chunk `ch`."
    sp = {k: med(t[f'k={K}/chunk={ch}']) / med(t[f'k={k}/chunk={ch}']) for k in ks}
    tag = 'chunked' if ch else 'plain'
    return {
        f'speedup_vs_k_max_{tag}': {f'k={k}': v for k, v in sp.items()},
        f'efficiency_{tag}': {f'k={k}': sp[k] * flops[k] / flops[K] for k in ks},
        f'efficiency_k1_{tag}': sp[1] * flops[1] / flops[K],
        f'efficiency_k1_{tag}_best': min(t[f'k={K}/chunk={ch}']) / min(t[f'k=1/chunk={ch}']) * flops[1] / flops[K],
    }


def exit_depth(preset: str, seq_len: int, batch_size: int, rounds: int, reps: int, ce_chunk: int) -> dict:
    """Teacher-forced evaluation at every exit k, with the readout CE chunked (`ce_chunk`, as the paper preset's
    evaluation runs it) and plain (chunk 0), all interleaved in the same rounds."""
    cfg = cpu_config(preset, seq_len=seq_len, batch_size=batch_size, ce_chunk=ce_chunk)
    c = LoopedLMConfig.from_experiment(cfg)
    torch.manual_seed(0)
    model = LoopedLM(c).eval()
    x, y = synthetic_batch(cfg, 'cpu')

    def ev(k, chunk):
        @torch.no_grad()
        def f():
            return model(x, targets=y, exit_k=k, loss_loops='last', ce_chunk=chunk).loss

        return f

    ks, chunks = list(range(1, c.K + 1)), (ce_chunk, 0)
    t = interleaved_times({f'k={k}/chunk={ch}': ev(k, ch) for ch in chunks for k in ks}, rounds, reps)
    flops = {k: forward_flops_per_token(c, seq_len, exit_k=k, n_readouts=1) for k in ks}
    tok = batch_size * seq_len
    res = dict(
        shape_record(preset, c, seq_len, batch_size),
        ce_chunk=ce_chunk,
        rounds=rounds,
        reps=reps,
        seconds_per_batch=t,
        tokens_per_s={k: tok / med(v) for k, v in t.items()},
        forward_flops_per_token={f'k={k}': v for k, v in flops.items()},
        flop_ratio_vs_k_max={f'k={k}': flops[c.K] / flops[k] for k in ks},
    )
    for ch in chunks:
        res.update(exit_speedups(t, flops, ks, c.K, ch))
    res.update(
        speedup_k1=res['speedup_vs_k_max_chunked']['k=1'],
        flop_ratio_k1=flops[c.K] / flops[1],
        efficiency_k1=res['efficiency_k1_chunked'],
        efficiency_k1_best=res['efficiency_k1_chunked_best'],
    )
    return res


# ---------------------------------------------------------------------------------------------------------
# 3. Per-loop readout cost, one configuration per fresh process


def _hwm_reset() -> bool:
    "Reset the kernel's peak-RSS mark of this process (VmHWM); False where the kernel does not allow it."
    try:
        Path('/proc/self/clear_refs').write_text('5')
        return True
    except OSError:
        return False


def _hwm_mib() -> float:
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) / 1024
    return peak_rss_mib()


def memory_probe(spec: dict) -> dict:
    """Run in a fresh process: build the model and optimizer, take one step (which creates the AdamW state),
    drop the gradients, then measure the peak resident memory of the following steps."""
    torch.manual_seed(0)
    cfg = cpu_config(
        spec['preset'],
        seq_len=spec['seq_len'],
        batch_size=spec['batch_size'],
        loss=spec['loss'],
        ce_chunk=spec['ce_chunk'],
    )
    model = LoopedLM(LoopedLMConfig.from_experiment(cfg))
    step = make_step(model, cfg, torch.device('cpu'))
    x, y = synthetic_batch(cfg, 'cpu')
    step(x, y)  # warm-up; AdamW state now exists
    model.zero_grad(set_to_none=True)
    gc.collect()
    base = current_rss_mib()  # weights + AdamW state + runtime, no activations or gradients
    can_reset = _hwm_reset()
    times = []
    for _ in range(spec['steps']):
        t = time.perf_counter()
        step(x, y).item()
        times.append(time.perf_counter() - t)
    peak = _hwm_mib() if can_reset else peak_rss_mib()
    model.zero_grad(set_to_none=True)
    saved = saved_tensor_bytes(lambda: training_objective(model, x, y, cfg)[0], model.parameters())[1]
    return dict(
        spec,
        peak_rss_mib=peak,
        base_rss_mib=base,
        step_mib=peak - base,
        seconds_per_step=times,
        saved_for_backward_mib=saved / 2**20,
        peak_source='VmHWM after reset' if can_reset else 'ru_maxrss (whole process)',
        ru_maxrss_mib=peak_rss_mib(),
    )


def readout_speed(preset: str, seq_len: int, batch_size: int, ce_chunk: int, rounds: int) -> dict:
    "Step time of per-loop and terminal loss with chunked readout CE, in this process, interleaved."
    cfg = cpu_config(preset, seq_len=seq_len, batch_size=batch_size, ce_chunk=ce_chunk)
    c = LoopedLMConfig.from_experiment(cfg)
    torch.manual_seed(0)
    steps = {lo: make_step(LoopedLM(c), cfg.replace(loss=lo), torch.device('cpu')) for lo in ('terminal', 'perloop')}
    x, y = synthetic_batch(cfg, 'cpu')
    return interleaved_times({k: (lambda s=s: s(x, y)) for k, s in steps.items()}, rounds, 1)


def memory_probe_runs(preset: str, seq_len: int, batch_size: int, ce_chunk: int, steps: int) -> dict:
    "Run `memory_probe` in a fresh process for terminal and per-loop loss, chunked and plain readout CE."
    runs = {}
    for loss in ('terminal', 'perloop'):
        for chunk in (ce_chunk, 0):
            spec = dict(preset=preset, seq_len=seq_len, batch_size=batch_size, loss=loss, ce_chunk=chunk, steps=steps)
            p = subprocess.run(
                [sys.executable, __file__, '--memory-probe', json.dumps(spec)],
                capture_output=True,
                text=True,
                env={**os.environ, 'PYTHONWARNINGS': 'ignore'},
            )
            if p.returncode:
                raise RuntimeError(f"memory probe {spec} failed:\n{p.stderr[-3000:]}")
            runs[f"{loss}/chunk={chunk}"] = json.loads(p.stdout.strip().splitlines()[-1])
            r = runs[f"{loss}/chunk={chunk}"]
            print(
                f"  {loss:8s} ce_chunk={chunk:<5d} peak {r['peak_rss_mib']:7.0f} MiB "
                f"(step {r['step_mib']:6.0f} MiB above "
                f"{r['base_rss_mib']:.0f}), {med(r['seconds_per_step']):.2f} s/step",
                flush=True,
            )
    return runs


def readout_cost(preset: str, seq_len: int, batch_size: int, ce_chunk: int, steps: int, rounds: int) -> dict:
    runs = memory_probe_runs(preset, seq_len, batch_size, ce_chunk, steps)
    P, T = runs[f'perloop/chunk={ce_chunk}'], runs[f'terminal/chunk={ce_chunk}']
    P0, T0 = runs['perloop/chunk=0'], runs['terminal/chunk=0']
    c = LoopedLMConfig.from_experiment(bench_config(preset))
    speed = readout_speed(preset, seq_len, batch_size, ce_chunk, rounds)
    return dict(
        shape_record(preset, c, seq_len, batch_size),
        tokens_per_step=seq_len * batch_size,
        ce_chunk=ce_chunk,
        runs=runs,
        peak_ratio_perloop_over_terminal=P['peak_rss_mib'] / T['peak_rss_mib'],
        step_mem_ratio_perloop_over_terminal=P['step_mib'] / T['step_mib'],
        peak_ratio_unchunked=P0['peak_rss_mib'] / T0['peak_rss_mib'],
        step_mem_ratio_unchunked=P0['step_mib'] / T0['step_mib'],
        saved_ratio_perloop_over_terminal=P['saved_for_backward_mib'] / T['saved_for_backward_mib'],
        saved_ratio_unchunked=P0['saved_for_backward_mib'] / T0['saved_for_backward_mib'],
        peak_ratio_perloop_chunked_over_terminal_unchunked=P['peak_rss_mib'] / T0['peak_rss_mib'],
        seconds_per_step_chunked=speed,
        speed_ratio_perloop_over_terminal=med(speed['terminal']) / med(speed['perloop']),
        flop_ratio_perloop_over_terminal=train_flops_per_token(c, seq_len, 'terminal')
        / train_flops_per_token(c, seq_len, 'perloop'),
    )


# ---------------------------------------------------------------------------------------------------------
# Report


def busy_cores(seconds: float = 1.0) -> float:
    "How many cores other processes keep busy, from /proc/stat over `seconds` (0 where it cannot be read)."

    def snap():
        v = [int(x) for x in Path('/proc/stat').read_text().split('\n')[0].split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    try:
        (t0, i0), _ = snap(), time.sleep(seconds)
        t1, i1 = snap()
        return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(1, t1 - t0))
    except (OSError, ValueError, IndexError):
        return 0.0


def best(g: dict) -> str:
    return f" ({g['best']:.3f})" if 'best' in g else ''


def markdown_intro(res: dict) -> list:
    "Title, machine and run line, and how to read the figures."
    m = res['machine']
    return [
        f"# CPU benchmarks of looped-lm",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads, {m['cpu_capability']}), "
        f"torch {m['torch']}, Python {m['python']}. "
        f"Cores kept busy by other jobs: {m['busy_cores_at_start']:.1f} at the start, "
        f"{m.get('busy_cores_at_end', float('nan')):.1f} at the end "
        f"(the interleaving makes such jobs slow every contestant "
        f"alike, but they widen the spread; with other jobs running the benchmark uses 1 thread). "
        f"Run {res['date']} in {res['wall_s']:.0f} s by "
        f"`{res['command']}`.",
        "",
        "Every figure is a ratio of two measurements taken in this run (median over interleaved rounds). "
        "Absolute CPU tokens/s are in `cpu.json` only.",
        "",
    ]


def markdown_goals(res: dict) -> list:
    "The Goals section: one row per goal, measured against its target."
    goals = res['goals']
    L = [
        "## Goals",
        "",
        "| goal | measured | target | met |",
        "|---|---:|---:|:-:|",
    ]
    for g in goals:
        L.append(
            f"| {g['what']} | {g['measured']:.3f}{best(g)} | {g['op']} {g['target']:.3f} | "
            f"{'yes' if g['met'] else '**no**'} |"
        )
    L += [
        "",
        "Speed ratios are of medians over the interleaved rounds; "
        "in brackets, the ratio of each contestant's fastest round.",
    ]
    return L


def markdown_equal_flops(res: dict) -> list:
    "Section 1: the equal-FLOPs table, one row per size."
    L = [
        "",
        "## 1. Equal FLOPs: looped (L shared layers x K) against a GPT of L*K layers",
        "",
        "Speed ratio = GPT step time / looped step time (> 1: the looped model is faster). "
        "A step is forward, backward, "
        "gradient clipping and AdamW, as in the trainer (`objective` + `make_optimizer`); *fwd+bwd* is the forward and "
        "backward part of the same steps; *AdamW share* is the part of a step spent clipping and in AdamW, which is "
        "proportional to the parameter count (the looped model has K times fewer block parameters).",
        "",
        "| size | d | heads | vocab | looped L x K | GPT layers | seq x batch | params looped / GPT "
        "| looped terminal / GPT | fwd+bwd only | AdamW share looped / GPT | looped per-loop / GPT "
        "| per-loop / terminal (FLOP ratio) |",
        "|---|---:|---:|---:|---|---:|---|---|---:|---:|---|---:|---|",
    ]
    for r in res['equal_flops']:
        L.append(
            f"| {r['preset']} | {r['d_model']} | {r['n_heads']} | {r['vocab_size']} | "
            f"{r['looped_layers']} x {r['K']} | {r['gpt_layers']} | "
            f"{r['seq_len']} x {r['batch_size']} | "
            f"{r['params']['looped'] / 1e6:.1f}M / {r['params']['gpt'] / 1e6:.1f}M | "
            f"**{r['ratio_looped_terminal_over_gpt']:.3f}** | {r['ratio_looped_terminal_over_gpt_fwd_bwd']:.3f} | "
            f"{r['optimizer_share']['looped_terminal']:.2f} / {r['optimizer_share']['gpt']:.2f} | "
            f"{r['ratio_looped_perloop_over_gpt']:.3f} | "
            f"{r['ratio_perloop_over_terminal']:.3f} ({r['flop_ratio_perloop_over_terminal']:.3f}) |"
        )
    return L


def markdown_exit_depth(res: dict) -> list:
    "Section 2: speed-up and efficiency at every exit k, chunked and plain readout CE."
    e = res['exit_depth']
    L = [
        "",
        f"## 2. Exit depth: teacher-forced evaluation at exit k "
        f"({e['preset']} size: d={e['d_model']}, L={e['n_layers']}, K={e['K']}, "
        f"vocab {e['vocab_size']}; seq {e['seq_len']} x batch {e['batch_size']})",
        "",
        "Speed-up = time at k=K / time at k; FLOP ratio = FLOPs(k=K) / FLOPs(k) from `forward_flops_per_token` "
        "(one readout); efficiency = speed-up / FLOP ratio. *Chunked*: the readout CE in chunks of "
        f"{e['ce_chunk']} tokens (4 per batch, as the paper preset evaluates: ce_chunk 8192 of 32x1024); *plain*: "
        "`F.cross_entropy` on the full logits, which also writes a full log-softmax (work the FLOP count leaves out).",
        "",
        "| exit k | FLOP ratio | speed-up, chunked | efficiency, chunked | speed-up, plain | efficiency, plain |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for k in range(1, e['K'] + 1):
        kk = f'k={k}'
        L.append(
            f"| {k} | {e['flop_ratio_vs_k_max'][kk]:.3f} | {e['speedup_vs_k_max_chunked'][kk]:.3f} | "
            f"{e['efficiency_chunked'][kk]:.3f} | "
            f"{e['speedup_vs_k_max_plain'][kk]:.3f} | {e['efficiency_plain'][kk]:.3f} |"
        )
    return L


def markdown_readout_cost(res: dict) -> list:
    "Section 3: peak, step and saved memory of every readout configuration, then the summary paragraph."
    r = res['readout_cost']
    L = [
        "",
        f"## 3. Per-loop readout cost "
        f"({r['preset']} size, vocab {r['vocab_size']}; seq {r['seq_len']} x batch {r['batch_size']} "
        f"= {r['tokens_per_step']} tokens/step; chunk {r['ce_chunk']} tokens = the paper preset's 4 chunks of a step)",
        "",
        "Each configuration runs in a fresh process. "
        "*Peak* is the peak resident memory of a training step after the first "
        "(weights, gradients, AdamW state, activations, runtime), "
        "read from the kernel (VmHWM after a reset, else ru_maxrss); "
        "*step* is that peak minus the resident memory before the step (weights + AdamW state + runtime); *saved* is "
        "the exact size of what autograd keeps for the backward pass (`saved_tensor_bytes`, no allocator noise).",
        "",
        "| loss | ce_chunk | peak MiB | step MiB | saved MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, run in r['runs'].items():
        L.append(
            f"| {run['loss']} | {run['ce_chunk']} | {run['peak_rss_mib']:.0f} | {run['step_mib']:.0f} | "
            f"{run['saved_for_backward_mib']:.0f} |"
        )
    return L + markdown_readout_summary(r)


def markdown_readout_summary(r: dict) -> list:
    "Section 3's paragraph: the per-loop / terminal ratios, and why chunking keeps the readout's memory flat."
    n, d = r['tokens_per_step'], r['d_model']
    return [
        "",
        f"Per-loop / terminal, chunked: peak memory **{r['peak_ratio_perloop_over_terminal']:.3f}x** (step memory "
        f"{r['step_mem_ratio_perloop_over_terminal']:.3f}x, "
        f"saved for backward {r['saved_ratio_perloop_over_terminal']:.3f}x); "
        f"unchunked: peak {r['peak_ratio_unchunked']:.3f}x (step {r['step_mem_ratio_unchunked']:.3f}x, "
        f"saved {r['saved_ratio_unchunked']:.3f}x). "
        f"Speed per-loop / terminal, chunked, interleaved in one process: "
        f"{r['speed_ratio_perloop_over_terminal']:.3f} "
        f"(FLOP ratio {r['flop_ratio_perloop_over_terminal']:.3f}).",
        "",
        f"Per readout, the plain path saves a (tokens x vocabulary) log-softmax "
        f"and the chunked path a (vocabulary x d) "
        f"gradient of the head: here ({n} tokens, d = {d}) they are "
        + ('the same size' if n == d else f'in the ratio {n / d:.2g} : 1')
        + f"; the first grows with the tokens of a step and the second does not "
        f"(at the paper batch of 32x1024 tokens the "
        f"plain path's is {32 * 1024 / d:.0f}x larger).",
        "",
    ]


def markdown(res: dict) -> str:
    L = markdown_intro(res) + markdown_goals(res)
    L += markdown_equal_flops(res) + markdown_exit_depth(res) + markdown_readout_cost(res)
    return '\n'.join(L)


def parse_args():
    "The command line: --quick, --out, --threads, and the hidden --memory-probe of the subprocesses."
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument(
        '--quick',
        action='store_true',
        help='tiny sizes and rounds: checks the script, not the machine; writes to benchmarks/_out/',
    )
    ap.add_argument(
        '--out', default=None, help='results folder (default benchmarks/results, or benchmarks/_out with --quick)'
    )
    ap.add_argument(
        '--threads',
        default='auto',
        help="torch threads: a number, or 'auto' (default): one per core on an idle "
        "machine, 1 when the load average says other jobs are running (several threads on shared cores stall "
        "on each other and the timings scatter)",
    )
    ap.add_argument('--memory-probe', default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def set_threads(threads: str):
    "Set torch's threads (and OMP_NUM_THREADS, inherited by the memory probes) from --threads."
    n = (torch.get_num_threads() if busy_cores() < 0.3 else 1) if threads == 'auto' else int(threads)
    torch.set_num_threads(n)
    os.environ['OMP_NUM_THREADS'] = str(n)  # here and in the memory probes


def run_equal_flops(Q: bool, small: str, big: str) -> list:
    "Benchmark 1 at the small and the big size, printing each one's ratios."
    print('1. equal FLOPs', flush=True)
    runs = [
        equal_flops(small, 64 if not Q else 32, 16, rounds=2 if Q else 7, reps=1 if Q else 3),
        equal_flops(big, 32 if Q else 128, 2 if Q else 4, rounds=2 if Q else 3, reps=1),
    ]
    for r in runs:
        print(
            f"  {r['preset']}: looped terminal / GPT {r['ratio_looped_terminal_over_gpt']:.3f} "
            f"(fwd+bwd {r['ratio_looped_terminal_over_gpt_fwd_bwd']:.3f}), "
            f"per-loop / GPT {r['ratio_looped_perloop_over_gpt']:.3f}",
            flush=True,
        )
    return runs


def run_exit_depth(Q: bool, big: str) -> dict:
    "Benchmark 2 at the big size, printing its k=1 efficiency."
    print('2. exit depth', flush=True)
    e = exit_depth(big, 32 if Q else 128, 4 if Q else 8, rounds=2 if Q else 3, reps=1, ce_chunk=32 if Q else 256)
    print(
        f"  k=1 speed-up {e['speedup_k1']:.3f} vs FLOP ratio {e['flop_ratio_k1']:.3f}: "
        f"efficiency {e['efficiency_k1']:.3f} "
        f"(plain CE {e['efficiency_k1_plain']:.3f})",
        flush=True,
    )
    return e


def goal_records(res: dict, big: str) -> list:
    "The goals the results are checked against, each with its measured value and whether it is met."
    e, r = res['exit_depth'], res['readout_cost']
    gs = [
        dict(
            what=f"equal FLOPs, {x['preset']} size: looped (terminal) / GPT step speed",
            measured=x['ratio_looped_terminal_over_gpt'],
            best=x['ratio_looped_terminal_over_gpt_best'],
            op='>=',
            target=1.0,
        )
        for x in res['equal_flops']
    ]
    gs += [
        dict(
            what=f'exit depth, {big} size: speed-up k=1 vs k=4 / FLOP ratio (chunked readout CE)',
            measured=e['efficiency_k1'],
            best=e['efficiency_k1_best'],
            op='>=',
            target=0.9,
        ),
        dict(
            what=f'{big}, vocab {r["vocab_size"]}, chunked CE: peak memory per-loop / terminal',
            measured=r['peak_ratio_perloop_over_terminal'],
            op='<=',
            target=1.3,
        ),
    ]
    for g in gs:
        g['met'] = bool(g['measured'] >= g['target'] if g['op'] == '>=' else g['measured'] <= g['target'])
    return gs


def write_results(res: dict, out: Path, t0: float):
    "Record the run's wall time and final load, write cpu.json and cpu.md, and print the report."
    res['wall_s'] = time.time() - t0
    res['machine']['load_average_1min_at_end'] = os.getloadavg()[0]
    res['machine']['busy_cores_at_end'] = busy_cores()
    write_json(out / 'cpu.json', res)
    (out / 'cpu.md').write_text(markdown(res))
    print(markdown(res))
    print(f"wrote {out / 'cpu.json'} and {out / 'cpu.md'} in {res['wall_s']:.0f} s")


def main():
    a = parse_args()
    if not a.memory_probe:
        set_threads(a.threads)
    if a.memory_probe:
        print(json.dumps(memory_probe(json.loads(a.memory_probe))))
        return
    out = Path(a.out) if a.out else (SCRATCH / 'quick' if a.quick else RESULTS)
    t0 = time.time()
    res = dict(
        machine={**machine(), 'busy_cores_at_start': busy_cores()},
        quick=a.quick,
        date=time.strftime('%Y-%m-%d %H:%M'),
        command=' '.join(['python', 'benchmarks/run_cpu.py', *sys.argv[1:]]),
    )
    print(res['machine'], flush=True)
    Q = a.quick
    small, big = ('smoke', 'smoke') if Q else ('cpu', 'paper-44m')  # --quick: the smoke preset's tiny model everywhere
    res['equal_flops'] = run_equal_flops(Q, small, big)
    res['exit_depth'] = run_exit_depth(Q, big)
    print('3. per-loop readout cost', flush=True)
    res['readout_cost'] = readout_cost(
        big, 32 if Q else 128, 4, ce_chunk=32 if Q else 128, steps=1, rounds=2 if Q else 3
    )
    res['goals'] = goal_records(res, big)
    write_results(res, out, t0)


if __name__ == '__main__':
    main()
