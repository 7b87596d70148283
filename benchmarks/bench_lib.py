"""Shared pieces of the looped-lm benchmarks: the machine description, the equal-FLOPs GPT baseline,
one training step built from the trainer's own parts, and interleaved timing.

Imported by `run_cpu.py` and `gpu_check.py` (run them as scripts from the repository root; this folder is
then on `sys.path`)."""

from __future__ import annotations
import json, math, os, resource, time
from pathlib import Path
import torch, torch.nn as nn, torch.nn.functional as F
from looped_lm.core.config import ExperimentConfig, load_preset
from looped_lm.core.files import machine_record
from looped_lm.model.looped import LoopedLMConfig, forward_flops_per_token
from looped_lm.model.looped import LoopedLM, train_flops_per_token, num_params  # noqa: F401 (for run_cpu, gpu_check)
from looped_lm.training.train import training_objective, make_optimizer
from looped_lm.training.train import autocast

HERE = Path(__file__).resolve().parent
RESULTS, SCRATCH = HERE / 'results', HERE / '_out'

# ---------------------------------------------------------------------------------------------------------
# The machine


def machine() -> dict:
    "The package's machine record (CPU model, vector ISA, threads, versions, GPU), plus the load at the start."
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    m = machine_record(dev)
    m['load_average_1min'] = os.getloadavg()[0]
    if dev == 'cuda':
        m['gpu_mem_gib'] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return m


# ---------------------------------------------------------------------------------------------------------
# The equal-FLOPs baseline: a plain GPT of L*K unshared layers, nanoGPT-style


class GPTAttention(nn.Module):
    def __init__(self, d, n_heads):
        super().__init__()
        self.n_heads, self.c_attn, self.c_proj = n_heads, nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, D))


class GPTBlock(nn.Module):
    def __init__(self, d, n_heads, mlp_ratio, eps):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.RMSNorm(d, eps=eps), GPTAttention(d, n_heads), nn.RMSNorm(d, eps=eps)
        h = int(mlp_ratio * d)
        self.c_fc, self.c_proj = nn.Linear(d, h, bias=False), nn.Linear(h, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """A plain decoder-only GPT (nanoGPT-style) with `n_layers` distinct pre-norm blocks, RMSNorm, no biases,
    tied embeddings and one cross-entropy on the last layer: the equal-FLOPs baseline of a `LoopedLM` with
    `n_layers/K` shared layers applied K times (terminal loss). Same width, heads, sequence and vocabulary."""

    def __init__(self, c: LoopedLMConfig, n_layers: int):
        super().__init__()
        self.config, self.n_layers = c, n_layers
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)  # named like the looped model's: same AdamW groups
        self.pos_emb = nn.Embedding(c.max_seq_len, c.d_model)
        self.blocks = nn.ModuleList([GPTBlock(c.d_model, c.n_heads, c.mlp_ratio, c.norm_eps) for _ in range(n_layers)])
        self.out_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        for n, p in self.named_parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers) if n.endswith('c_proj.weight') else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.out_norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def gpt_flops_per_token(c: LoopedLMConfig, n_layers: int, seq_len: int) -> float:
    "Forward FLOPs per token of `GPT(c, n_layers)` by the looped model's own count (one loop of n_layers, one readout)."
    return forward_flops_per_token(LoopedLMConfig(**{**c.__dict__, 'n_layers': n_layers, 'K': 1}), seq_len)


# ---------------------------------------------------------------------------------------------------------
# Configurations and training steps


def bench_config(preset: str, **overrides) -> ExperimentConfig:
    "A preset for benchmarking: the preset's architecture, with `overrides` (seq_len, batch_size, loss, ...)."
    return load_preset(preset, **overrides)


def cpu_config(preset: str, **overrides) -> ExperimentConfig:
    "`bench_config` as the CPU benchmarks run it: on the CPU, in float32, eager (no torch.compile), then `overrides`."
    return bench_config(preset, **(dict(device='cpu', dtype='float32', compile=False) | overrides))


def shape_record(preset: str, c: LoopedLMConfig, seq_len: int, batch_size: int) -> dict:
    "The shape of a measured model and batch, as a results record begins."
    return dict(
        preset=preset,
        d_model=c.d_model,
        n_layers=c.n_layers,
        K=c.K,
        vocab_size=c.vocab_size,
        seq_len=seq_len,
        batch_size=batch_size,
    )


def make_step(model, cfg: ExperimentConfig, device, baseline: bool = False):
    """One training step as the trainer takes it: autocast, objective (per-loop or terminal CE, chunked as
    `cfg.ce_chunk` says), backward, gradient clipping, AdamW (fused on CUDA). No host sync inside.
    On the CPU (where every op is synchronous) the step also records `step.phases`: one (forward+backward,
    clip+AdamW) pair of seconds per call."""
    opt = make_optimizer(model, cfg, device)
    timed = torch.device(device).type == 'cpu'

    def step(x, y):
        t0 = time.perf_counter()
        with autocast(cfg, device):
            obj = model(x, y) if baseline else training_objective(model, x, y, cfg)[0]
        opt.zero_grad(set_to_none=True)
        obj.backward()
        t1 = time.perf_counter()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if timed:
            step.phases.append((t1 - t0, time.perf_counter() - t1))
        return obj

    step.phases, step.opt = [], opt
    return step


def synthetic_batch(cfg: ExperimentConfig, device, seed: int = 0):
    "A random (x, y) batch of the config's shape (throughput does not depend on the token values)."
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), generator=g)
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
    if torch.device(device).type == 'cuda':
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def sync(device):
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize()


def interleaved_times(fns: dict, rounds: int, reps: int, warmup: int = 1, device='cpu') -> dict:
    """Seconds per call of each function in `fns`, measured in `rounds` rounds that alternate between them
    (so drifts of the machine's speed hit every contestant alike); `reps` calls per round, `warmup` calls first.
    Returns, per name, the list of per-call times of every round."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    sync(device)
    out = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for k in order:
            sync(device)
            t = time.perf_counter()
            for _ in range(reps):
                fns[k]()
            sync(device)
            out[k].append((time.perf_counter() - t) / reps)
    return out


def peak_rss_mib() -> float:
    "This process's peak resident set size so far, in MiB (ru_maxrss is in KiB on Linux)."
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    try:
        for line in Path('/proc/self/status').read_text().splitlines():
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float('nan')


def write_json(path: Path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'.{path.name}.tmp')
    tmp.write_text(json.dumps(obj, indent=1) + '\n')
    os.replace(tmp, path)
