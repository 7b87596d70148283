"""The visibility lemma per token (claim C2): through an RMSNorm or LayerNorm readout the radial fraction of
the CE gradient is predicted exactly, token by token, from the gradient at the norm's output (`radial_exact`), and
`radial_fractions` records that prediction (`exact`, the quantiles of measured/exact over tokens, the median |cot|)
beside the measurement, in float64. Reports older than DIAG_VERSION 5 lack those fields and are recomputed.
"""

import dataclasses
import json
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from looped_lm.measure.radial import radial_fractions, radial_scale
from looped_lm.measure.diagnostics import DIAG_VERSION, cached_report
from looped_lm.model.lemmas import radial_exact, radial_fraction
from looped_lm.measure.protocol import LoopSpec

NORMS = {'rmsnorm': nn.RMSNorm, 'layernorm': nn.LayerNorm}


def _norm(kind, d=24, eps=1e-4, seed=0):
    "A norm readout with a weight that is not 1 (so the lemma's G = weight * dL/dy is tested, not dL/dy)."
    n = NORMS[kind](d, eps=eps)
    with torch.no_grad():
        n.weight.copy_(torch.linspace(0.5, 1.5, d)[torch.randperm(d, generator=torch.Generator().manual_seed(seed))])
    return n


@pytest.mark.parametrize('kind', list(NORMS))
def test_exact_matches_measured_per_token_through_autograd(kind):
    gen = torch.Generator().manual_seed(1)
    n = _norm(kind, 32, 1e-5).double()
    W = torch.randn(40, 32, generator=gen, dtype=torch.float64)
    for scale in (1e-2, 1.0, 30.0):  # eps felt strongly, a little, hardly at all
        H = (scale * torch.randn(3, 7, 32, generator=gen, dtype=torch.float64) + scale / 3).requires_grad_()
        out = n(H)
        ce = F.cross_entropy((out @ W.T).flatten(0, 1), torch.randint(0, 40, (21,), generator=gen))
        gH, gy = torch.autograd.grad(ce, [H, out])
        rho, t = radial_exact(n.weight * gy, H, kind, n.eps)
        measured = radial_fraction(gH, H, reduce=None)
        assert torch.allclose(measured / rho, torch.ones_like(rho), rtol=0, atol=1e-6), (scale, measured / rho)
        assert (t > 0).all() and rho.shape == H.shape[:-1]


def test_exact_refuses_bad_input():
    with pytest.raises(ValueError, match="'rmsnorm' or 'layernorm'"):
        radial_exact(torch.ones(2, 4), torch.ones(2, 4), 'batchnorm', 1e-5)
    with pytest.raises(ValueError, match='same shape'):
        radial_exact(torch.ones(2, 4), torch.ones(2, 5), 'rmsnorm', 1e-5)


def _spec(norm, K=2, seed=0, **kw):
    torch.manual_seed(seed)
    emb, mlp, head = nn.Embedding(64, 24), nn.Linear(24, 24), nn.Linear(24, 64)
    return LoopSpec(
        init=lambda x: (emb(x) + 0.3, None),  # off-centre: LayerNorm's |H - mean| / |H| factor matters
        step=lambda h, ctx, k: h + 0.1 * torch.tanh(mlp(h)),
        readout=lambda h, ctx, k: head(norm(h)),
        K=K,
        state='the residual stream after loop k',
        modules=(emb, mlp, head, norm),
        readout_norm=norm,
        **kw,
    )


@pytest.fixture(scope='module')
def ids():
    return np.random.default_rng(0).integers(0, 64, 3000)


@pytest.mark.parametrize('kind', list(NORMS))
@pytest.mark.parametrize('chunk', [0, 16])
def test_radial_fractions_record_the_exact_lemma_per_token(kind, chunk, ids):
    norm = _norm(kind)
    rows = radial_fractions(_spec(norm), ids, 4, 16, max_batches=2, ce_chunk=chunk)
    assert norm.weight.dtype == torch.float32  # put back after the float64 pass
    for r in rows:
        assert r['dtype'] == 'float64'
        for q in ('ratio_p05', 'ratio_p50', 'ratio_p95'):
            assert r[q] == pytest.approx(1.0, abs=1e-6), r
        assert r['exact'] == pytest.approx(r['readout'], rel=1e-6)  # token means of the same per-token numbers
        assert 0 < r['readout_whole'] <= 1 and r['cot_median'] > 0
        assert r['scale'] > 0 and 'predicted' not in r
        assert r['readout'] == pytest.approx(r['scale'] * r['cot_median'], rel=1.0)  # the scale: the order only


def test_a_declared_tuple_norm_gives_the_scale_only_and_a_raw_readout_nothing(ids):
    sp = _spec(_norm('rmsnorm'))
    declared = radial_fractions(dataclasses.replace(sp, readout_norm=('rmsnorm', 1e-4)), ids, 4, 16, max_batches=1)
    assert all(r['scale'] > 0 and r['exact'] is None and r['ratio_p50'] is None for r in declared)
    raw = radial_fractions(dataclasses.replace(sp, readout_norm=None), ids, 4, 16, max_batches=1)
    assert all(r['scale'] is None and r['exact'] is None and r['cot_median'] is None for r in raw)


def test_old_reports_are_recomputed_never_read(tmp_path):
    assert DIAG_VERSION >= 5  # the exact fields came with version 5
    assert radial_scale(torch.full((2, 8), 2.0), 'rmsnorm', 1e-6) == pytest.approx(0.25e-6)
    p = tmp_path / 'diagnostics.json'
    key = dict(version=DIAG_VERSION, checkpoint='ckpt-000010:abc', max_batches=None)
    p.write_text(json.dumps({**key, 'version': 4, 'radial': [{'k': 1, 'readout': 1e-7, 'predicted': 2e-7}]}))
    assert cached_report(p, key) is None  # a version-4 report is recomputed, not read
    p.write_text(json.dumps({**key, 'radial': []}))
    assert cached_report(p, key) is not None
