"""The GPU code path, run on the CPU, so that none of it runs for the first time on a GPU.

- bf16 autocast (`torch.autocast('cpu', bfloat16)` here, `'cuda'` there) trains the smoke preset with losses
  within a stated tolerance of float32;
- `torch.compile` of the shared stack gives the loss of eager mode to 1e-5 in float32;
- the chunked readout (`linear_ce` with `chunk`) under bf16 matches the plain one;
- every preset of settings.ini, the paper ones included, runs one training step with its own model shape
  (tiny batch, synthetic tokens: no WikiText-103 needed).
"""

import json, shutil, subprocess, warnings
from pathlib import Path
from types import SimpleNamespace
import numpy as np, pytest, torch
from looped_lm.core.config import load_preset, list_presets
from looped_lm.model.looped import linear_ce
from looped_lm.training.train import train, start_run, train_step, log_step
from looped_lm.training.rundir import read_metrics

BF16_TOL = 0.05  # nats: bf16 autocast vs float32, at every logged step of the smoke run (CE about 6.2 -> 4.5)


def _quiet():
    "bf16 / compile on the CPU warn that they are slow there: expected in this file."
    return warnings.catch_warnings(record=True)


def test_bf16_autocast_trains_like_float32(tmp_path, smoke_data):
    cfg = load_preset('smoke')
    train(cfg, tmp_path / 'fp32', data=smoke_data, progress=False)
    with _quiet() as w:
        warnings.simplefilter('always')
        train(cfg.replace(dtype='bfloat16'), tmp_path / 'bf16', data=smoke_data, progress=False)
    assert any('slowly' in str(x.message) for x in w)
    a, b = (read_metrics(tmp_path / d, 'train') for d in ('fp32', 'bf16'))
    assert [r['step'] for r in a] == [r['step'] for r in b]
    diff = np.abs(np.array([r['loss'] for r in a]) - np.array([r['loss'] for r in b]))
    assert diff.max() < BF16_TOL, diff.max()
    assert diff.max() > 0  # bf16 really ran: the losses are not bit-identical
    assert a[-1]['loss'][-1] < a[0]['loss'][-1] - 0.5 and b[-1]['loss'][-1] < b[0]['loss'][-1] - 0.5  # both learn


@pytest.mark.skipif(
    not (shutil.which('gcc') or shutil.which('cc') or shutil.which('clang')),
    reason='no C compiler on this machine: torch.compile (inductor) cannot build CPU kernels',
)
@pytest.mark.slow
def test_compiled_shared_stack_matches_eager(tmp_path, smoke_data):
    cfg = load_preset('smoke', train_tokens=1280)  # 5 steps: one train record, with every loop's loss
    train(cfg, tmp_path / 'eager', data=smoke_data, progress=False)
    with _quiet():
        train(cfg.replace(compile=True), tmp_path / 'compiled', data=smoke_data, progress=False)
    a, b = (read_metrics(tmp_path / d, 'train')[-1] for d in ('eager', 'compiled'))
    assert a['step'] == b['step'] == 5
    np.testing.assert_allclose(b['loss'], a['loss'], rtol=0, atol=1e-5)
    np.testing.assert_allclose(b['objective'], a['objective'], rtol=0, atol=1e-5)


def test_chunked_readout_under_bf16_matches_the_plain_one():
    g = torch.Generator().manual_seed(0)
    x0, w0 = torch.randn(96, 64, generator=g), 0.1 * torch.randn(300, 64, generator=g)
    t = torch.randint(0, 300, (96,), generator=g)
    res = {}
    for chunk in (0, 16):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            loss = linear_ce(x, w, t, chunk)
        loss.backward()
        res[chunk] = (loss.float().item(), x.grad, w.grad)
    (l0, gx0, gw0), (l1, gx1, gw1) = res[0], res[16]
    assert abs(l0 - l1) < 1e-2 * abs(l0), (l0, l1)
    rel = lambda a, b: (
        (a.float() - b.float()).norm() / b.float().norm()
    ).item()  # bf16 sums in another order: compare norms
    assert rel(gx1, gx0) < 1e-2 and rel(gw1, gw0) < 1e-2, (rel(gx1, gx0), rel(gw1, gw0))
    ref = torch.nn.functional.cross_entropy(x0 @ w0.T, t).item()  # and both are the float32 CE, to bf16 precision
    assert abs(l1 - ref) < 2e-2 * abs(ref), (l1, ref)


def _synthetic(cfg, n: int = 4096):
    "A TokenData-like object of random tokens: enough for a step of any preset without its corpus."
    g = np.random.default_rng(0)
    splits = {s: g.integers(0, cfg.vocab_size, n).astype(np.uint32) for s in ('train', 'validation', 'test')}
    return SimpleNamespace(
        **splits, split=splits.__getitem__, corpus=cfg.corpus, vocab_size=cfg.vocab_size, fingerprint='synthetic'
    )


@pytest.mark.slow
@pytest.mark.parametrize('preset', list_presets())
def test_every_preset_runs_one_training_step_on_cpu(preset, tmp_path):
    full = load_preset(preset)
    cfg = load_preset(
        preset, batch_size=1, seq_len=16, stride=8 if full.stride else 0, device='cpu', compile=False, log_every=1
    )
    with _quiet():
        run = start_run(cfg, tmp_path, _synthetic(cfg), torch.device('cpu'), 0, 1, None, False, preset)
        c = run.model.config
        assert (c.d_model, c.n_layers, c.n_heads, c.vocab_size, c.K) == (
            full.d_model,
            full.n_layers,
            full.n_heads,
            full.vocab_size,
            full.K,
        )
        before = run.model.tok_emb.weight.detach().clone()
        rec = log_step(run, *train_step(run))
    assert run.step == 1 and rec['step'] == 1
    assert len(rec['loss']) == cfg.K and all(np.isfinite(rec['loss'])) and np.isfinite(rec['grad_norm'])
    assert not torch.equal(before, run.model.tok_emb.weight)  # the optimiser stepped
    assert [r['step'] for r in read_metrics(tmp_path, 'train')] == [1]


@pytest.mark.slow
def test_gpu_check_dry_run_covers_every_paper_preset(tmp_path):
    "`benchmarks/gpu_check.sh --dry-run`: every code path of the four paper presets on the CPU, at smoke sizes."
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        ['bash', 'benchmarks/gpu_check.sh', '--dry-run', '--budget-s', '100000', '--out', str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / 'gpu.json').read_text())
    assert res['dry_run'] and set(res['presets']) == {'paper-44m', 'paper-129m', 'paper-exact-44m', 'paper-exact-129m'}
    for name, p in res['presets'].items():
        assert not p['errors'] and 'trainer' in p, (name, p['errors'])
