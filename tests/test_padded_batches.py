"""Batches of the user's own: sequences padded to one length with a mask, read by every diagnostic.

What a padded batch reports must be what the same sequences report run one by one, unpadded: each number here is
recomputed on each sequence alone through the model's own forward (no `PaddedTokens`, no protocol; the clamps' by
`run_loops` on each sequence alone, the one place the library's own loop is the reference). A model that
reads its padding is refused before any measurement, and accepted once it takes the mask.
"""

import math

import numpy as np
import pytest
import torch, torch.nn as nn, torch.nn.functional as F

from looped_lm.model.lemmas import angle_between, radial_fraction
from looped_lm.model.looped import LoopedLM, LoopedLMConfig
from looped_lm.measure.protocol import LoopSpec, LoopSpecError, PaddedTokens, run_loops
from looped_lm.measure.diagnostics import (
    clamp_modes,
    diagnose,
    eval_exits,
    lemma2,
    scale_sensitivity,
    token_norms,
)
from looped_lm.measure.radial import angular_updates, radial_fractions
from looped_lm.measure.halting import halting_speed

V, K, PAD = 64, 3, 0
LENGTHS = (20, 7, 13, 33, 2, 17, 9, 30)  # real tokens per row; rows are padded to 33


def sequences(seed=0):
    "The rows' real tokens (ids 1..V-1: the pad id 0 is never a real token)."
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (n,), generator=g) for n in LENGTHS]


def padded(seqs, side='right', width=33):
    "`seqs` padded with PAD to `width` on `side`, with their mask (every number below is compared with `seqs` alone)."
    return PaddedTokens.pad(seqs, side, PAD, width)


@pytest.fixture(scope='module')
def lm():
    torch.manual_seed(0)
    return LoopedLM(LoopedLMConfig(vocab_size=V, d_model=32, n_heads=2, n_layers=1, K=K, max_seq_len=32)).eval()


def alone(model, s, k):
    "(states H_1..H_k, logits at exit k) of the sequence `s` alone, through the model's own forward."
    out = model(s[None, :-1], exit_k=k, return_logits=True)
    return out.hidden, out.logits


def test_every_diagnostic_equals_the_rows_run_alone(lm):
    seqs, pad = sequences(), padded(sequences())
    n = sum(len(s) - 1 for s in seqs)
    with torch.no_grad():
        ce = [
            sum(F.cross_entropy(alone(lm, s, k)[1][0].double(), s[1:], reduction='sum') for s in seqs) / n
            for k in (1, 2, 3)
        ]
        states = [lm(s[None, :-1]).hidden for s in seqs]  # the scored positions: every input but the last token
    ex = eval_exits(lm, pad, batch_size=3)
    assert [e['tokens'] for e in ex] == [n] * K
    np.testing.assert_allclose([e['ce'] for e in ex], [c.item() for c in ce], rtol=1e-6)
    norms = token_norms(lm, pad, batch_size=3)
    want = np.stack([torch.cat([st[k][0].double().norm(dim=-1) for st in states]).numpy() for k in range(K)])
    np.testing.assert_allclose(norms, want, rtol=1e-5)  # the same tokens in the same order, padding left out
    cl = clamp_modes(lm, pad, batch_size=3, modes=('none', 'freeze_loop1'))
    np.testing.assert_allclose([r['norm_l2'] for r in cl['none']], want.mean(1), rtol=1e-5)
    frozen = [run_loops(lm, s[None, :-1], K, clamp='freeze_loop1')[0] for s in seqs]  # the clamp on each row alone
    np.testing.assert_allclose(
        [r['norm_l2'] for r in cl['freeze_loop1']],
        [torch.cat([f[k][0].double().norm(dim=-1) for f in frozen]).mean().item() for k in range(K)],
        rtol=1e-5,
    )
    sc = scale_sensitivity(lm, pad, batch_size=3, alphas=(1, 2))
    with torch.no_grad():
        two = sum(
            F.cross_entropy(lm.readout(2 * st[-1], K)[0].double(), s[1:], reduction='sum')
            for s, st in zip(seqs, states)
        )
    np.testing.assert_allclose([r['ce'] for r in sc], [ce[-1].item(), (two / n).item()], rtol=1e-6)


def hand_geometry(lm64, seqs, penalty: float) -> dict:
    """Per loop, over every real token of every sequence alone (float64): the radial fraction of its readout CE's
    gradient and of the per-loop objective's (CE summed over loops, plus `penalty` x the summed squared state / d),
    and per transition the angle, the previous state's norm and the norm of the update's part orthogonal to it."""
    out = {name: {k: [] for k in range(K)} for name in ('readout', 'objective', 'angle', 's_prev', 'b_perp')}
    for s in seqs:
        hs = lm64(s[None, :-1]).hidden  # the states the forward feeds on: the objective's gradient runs through them
        ces = [F.cross_entropy(lm64.readout(h, k + 1)[0], s[1:], reduction='sum') for k, h in enumerate(hs)]
        total = sum(ces) + penalty * sum(h.pow(2).sum() for h in hs) / hs[0].shape[-1]
        g_obj = torch.autograd.grad(total, hs, retain_graph=True)
        for k, h in enumerate(hs):
            g = torch.autograd.grad(ces[k], h, retain_graph=True)[0]
            out['readout'][k].append(radial_fraction(g, h, reduce=None)[0])
            out['objective'][k].append(radial_fraction(g_obj[k], h, reduce=None)[0])
        for k in range(1, K):
            a, b = hs[k - 1].detach()[0], hs[k].detach()[0]
            unit = a / a.norm(dim=-1, keepdim=True)
            out['angle'][k].append(angle_between(a, b))
            out['s_prev'][k].append(a.norm(dim=-1))
            out['b_perp'][k].append(((b - a) - ((b - a) * unit).sum(-1, keepdim=True) * unit).norm(dim=-1))
    return {name: {k: torch.cat(v).mean().item() for k, v in per.items() if v} for name, per in out.items()}


@pytest.mark.parametrize('penalty', [0.0, 0.5])
def test_geometry_in_float64_equals_the_rows_run_alone(lm, penalty):
    """Radial fractions (readout, and the objective with and without the norm penalty), angles and Lemma 2 over
    batches of 3, 3 and 2 rows of different lengths: token means of the sequences alone, in float64."""
    seqs, pad = sequences(), padded(sequences())
    lm64 = LoopedLM(lm.config).double().eval()
    lm64.load_state_dict(lm.state_dict())
    want = hand_geometry(lm64, seqs, penalty)
    rows = radial_fractions(lm, pad, batch_size=3, norm_penalty=penalty)
    assert [r['zero_grad_tokens'] for r in rows] == [0] * K  # padding is not a token without a gradient
    np.testing.assert_allclose([r['readout'] for r in rows], list(want['readout'].values()), rtol=1e-9)
    # the penalty's gradient is taken in float32 (training's own formula, `train.norm_penalty`): 1e-6, not 1e-9
    np.testing.assert_allclose([r['objective'] for r in rows], list(want['objective'].values()), rtol=1e-6)
    ang = angular_updates(lm, pad, batch_size=3)
    for name in ('angle', 's_prev', 'b_perp'):
        np.testing.assert_allclose([a[name] for a in ang], list(want[name].values()), rtol=1e-9)
    lem = lemma2(lm, pad, loops=K, batch_size=3)
    with torch.no_grad():
        runs = [lm64(s[None, :-1]).hidden for s in seqs]
    hid = [torch.cat([r[k][0] for r in runs]) for k in range(K)]
    u = [h / h.pow(2).mean(-1, keepdim=True).sqrt() for h in hid]
    du = [(u[k + 1] - u[k]).norm(dim=-1).mean().item() for k in range(K - 1)]
    np.testing.assert_allclose([r['du'] for r in lem], du, rtol=1e-6)


def test_halting_speed_exits_each_sequence_on_its_real_tokens(lm):
    "Sequence-level halting on padded rows: each sequence exits on the mean score of its real targets, as alone."
    seqs, pad = sequences(), padded(sequences())
    with torch.no_grad():
        logits = [[alone(lm, s, k)[1][0] for k in range(1, K + 1)] for s in seqs]
    score = [[lg.softmax(-1).max(-1).values.mean().item() for lg in per] for per in logits]
    threshold = float(np.median([sc[0] for sc in score]))  # half the sequences exit at loop 1
    exit_k = [next((k for k in range(K - 1) if sc[k] >= threshold), K - 1) for sc in score]
    ce = sum(F.cross_entropy(per[k].double(), s[1:], reduction='sum').item() for per, k, s in zip(logits, exit_k, seqs))
    n = sum(len(s) - 1 for s in seqs)
    got = halting_speed(lm, pad, 'max_prob', threshold, batch_size=3, repeats=1)
    assert got['tokens'] == n
    assert got['avg_loops'] == pytest.approx(np.mean(exit_k) + 1)
    assert got['dynamic_ppl'] == pytest.approx(math.exp(ce / n), rel=1e-6)


def test_diagnose_on_padded_rows_counts_only_real_targets(lm):
    seqs, pad = sequences(), padded(sequences())
    rep = diagnose(lm, pad, batch_size=4)
    n = sum(len(s) - 1 for s in seqs)
    assert rep['exits']['validation'][-1]['tokens'] == n
    assert rep['norms'][-1]['n_tokens'] == n
    assert rep['spec_check']['padding_rel_diff'] < 1e-5  # the data's check, reported with the spec's
    # halting: calibrated on rows 0-3, scored on rows 4-7; its fixed depth is the loop-K CE of those rows' targets
    with torch.no_grad():
        tail = seqs[len(seqs) // 2 :]
        ce_k = sum(F.cross_entropy(alone(lm, s, K)[1][0].double(), s[1:], reduction='sum') for s in tail)
    fixed = math.exp(ce_k.item() / sum(len(s) - 1 for s in tail))
    for row in rep['halting']:
        assert row['n_scored'] == 4
        assert row['fixed_ppl'] == pytest.approx(fixed, rel=1e-6)


def test_a_model_that_reads_its_padding_is_refused_before_measuring(lm):
    left = padded(
        sequences(), side='left'
    )  # learned positions count from the row's first entry, and it attends to pads
    for fn in (eval_exits, token_norms, radial_fractions):
        with pytest.raises(LoopSpecError, match='the model reads its padding'):
            fn(lm, left, batch_size=4)
    with pytest.raises(LoopSpecError, match='pad on the right'):
        diagnose(lm, left, batch_size=4)
    # one row padded on the left among rows padded on the right, neither the shortest nor the longest: still checked
    ids, mask = padded(sequences()).ids.clone(), padded(sequences()).mask.clone()
    ids[2], mask[2] = ids[2].roll(33 - LENGTHS[2]), mask[2].roll(33 - LENGTHS[2])
    with pytest.raises(LoopSpecError, match='row 2 of the padded batch'):
        eval_exits(lm, PaddedTokens(ids, mask), batch_size=4)
    eval_exits(lm, torch.cat(sequences()), batch_size=4, seq_len=16)  # refused for that padding, not for a stream


class MaskedBlock(nn.Module):
    "Pre-norm causal attention that skips padded keys (each position still sees itself), then an MLP."

    def __init__(s, d=32, heads=2):
        super().__init__()
        s.heads, s.n1, s.n2 = heads, nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        s.qkv, s.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(s, x, allowed):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, s.heads, d // s.heads).transpose(1, 2) for z in s.qkv(s.n1(x)).split(d, -1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        x = x + s.o(a.transpose(1, 2).reshape(b, t, d))
        return x + s.mlp(s.n2(x))


class MaskedLooped(nn.Module):
    "A looped LM that takes padding: positions counted over real tokens, padded keys masked; `model(ids, k)`: logits."

    def __init__(s, d=32, max_len=64):
        super().__init__()
        s.emb, s.pos, s.block = nn.Embedding(V, d), nn.Embedding(max_len, d), MaskedBlock(d)
        s.norm, s.head = nn.RMSNorm(d, eps=1e-6), nn.Linear(d, V, bias=False)

    def embed(s, ids, use_mask=True):
        "(H_0, allowed (B, T, T)) of `ids`: real tokens are those that are not PAD."
        real = ids != PAD if use_mask else torch.ones_like(ids, dtype=torch.bool)
        pos = (real.long().cumsum(1) - 1).clamp_min(0)
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = (causal & real[:, None, :]) | torch.eye(t, dtype=torch.bool)
        return s.emb(ids) + s.pos(pos), allowed

    def forward(s, ids, k=K):
        h, allowed = s.embed(ids)
        for _ in range(k):
            h = s.block(h, allowed)
        return s.head(s.norm(h))


def masked_spec(model, use_mask=True):
    "The LoopSpec of `MaskedLooped`: init builds the mask from the ids (`use_mask=False`: a model that ignores it)."
    return LoopSpec(
        init=lambda x: model.embed(x, use_mask),
        step=lambda h, allowed, k: model.block(h, allowed),
        readout=lambda h, allowed, k: model.head(model.norm(h)),
        K=K,
        name='MaskedLooped' + ('' if use_mask else ' (mask ignored)'),
        state='the residual stream after loop k, before the readout norm',
        modules=(model,),
        readout_norm=model.norm,
        exits=(lambda x, k: model(x, k) if k <= K else None) if use_mask else None,
    )


def test_a_model_that_takes_the_mask_is_diagnosed_on_left_padding():
    torch.manual_seed(1)
    model = MaskedLooped().eval()
    seqs, left = sequences(2), padded(sequences(2), side='left')
    with pytest.raises(LoopSpecError, match='the model reads its padding'):
        eval_exits(masked_spec(model, use_mask=False), left, batch_size=4)
    spec = masked_spec(model)
    n = sum(len(s) - 1 for s in seqs)
    with torch.no_grad():
        want = [
            sum(F.cross_entropy(model(s[None, :-1], k)[0].double(), s[1:], reduction='sum') for s in seqs) / n
            for k in (1, 2, 3)
        ]
    np.testing.assert_allclose(
        [e['ce'] for e in eval_exits(spec, left, batch_size=4)], [w.item() for w in want], rtol=1e-6
    )
    rows = radial_fractions(spec, left, batch_size=4)
    assert [r['zero_grad_tokens'] for r in rows] == [0] * K
    assert all(0.999 < r['ratio_p50'] < 1.001 for r in rows)  # the lemma's exact prediction, at real tokens only
    assert token_norms(spec, left, batch_size=4).shape == (K, n)


def test_register_tokens_beside_a_padded_batch_are_refused():
    "A state with more positions than tokens: which are padding cannot be told, so it is refused with the fix."
    torch.manual_seed(2)
    emb, mix, reg = nn.Embedding(V, 8), nn.Linear(8, 8), torch.randn(1, 1, 8)
    spec = LoopSpec(
        init=lambda x: (torch.cat([reg.expand(len(x), 1, 8), emb(x)], 1), None),
        step=lambda h, c, k: h + torch.tanh(mix(h)),
        readout=lambda h, c, k: h[:, 1:] @ emb.weight.T,
        K=2,
        state='register then token states',
    )
    with pytest.raises(LoopSpecError, match='which of them are padding cannot be told'):
        eval_exits(spec, padded(sequences()), batch_size=4)
    eval_exits(spec, torch.cat(sequences()), batch_size=4, seq_len=16)  # a stream: every position, as before


def test_bad_padded_input_is_refused_with_the_fix():
    ids = torch.ones(3, 6, dtype=torch.long)
    with pytest.raises(LoopSpecError, match='one entry per token'):
        PaddedTokens(ids, torch.ones(3, 5))
    with pytest.raises(LoopSpecError, match='has a hole'):
        PaddedTokens(ids, [[1, 1, 0, 1, 1, 0]] * 3)
    with pytest.raises(LoopSpecError, match='1 real token'):
        PaddedTokens(ids, [[1] * 6, [0, 0, 0, 0, 0, 1], [1] * 6])
    with pytest.raises(LoopSpecError, match='must be integers'):
        PaddedTokens(ids.float(), torch.ones(3, 6))
    with pytest.raises(ValueError, match='at least 2 sequences'):
        diagnose(
            LoopSpec(lambda x: (x, None), lambda h, c, k: h, lambda h, c, k: h, K=1), PaddedTokens(ids[:1], [[1] * 6])
        )
    with pytest.raises(LoopSpecError, match='Pass PaddedTokens'):  # a (B, T) array without its mask
        eval_exits(LoopSpec(lambda x: (x, None), lambda h, c, k: h, lambda h, c, k: h, K=1), ids.numpy())
