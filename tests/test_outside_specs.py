"""Diagnostics of looped models we did not write: no wrong diagnostic number without an error.

Two outside models, each described by a LoopSpec of about ten lines: a Huginn-style looped LM (rotary tables in the
loop context, the embedded input re-injected at every recurrence, a coda block with rotary attention in the readout)
and a LoopFormer-style one (one shared block conditioned on the loop's time step, a final RMSNorm readout).
"""

import copy, dataclasses

import pytest
import torch, torch.nn as nn, torch.nn.functional as F

from looped_lm.measure.protocol import LoopSpec, LoopSpecError, context_layout, run_loops
from looped_lm.measure.spec_checks import check_spec
from looped_lm.measure.hooks import from_hooks
from looped_lm.measure.diagnostics import DiagnosticReport
from looped_lm.measure.diagnostics import (
    clamp_modes,
    diagnose,
    eval_exits,
    exit_throughput,
    lemma2,
    scale_sensitivity,
    token_norms,
)
from looped_lm.measure.radial import angle_scaling, angular_updates, radial_fractions
from looped_lm.measure.halting import exit_outcome, halting_speed, loop_scores

V, D, HEADS, K, T, B = 61, 16, 2, 4, 12, 4


def rope(T, hd, dtype):
    "Rotary tables (T, hd/2): shared by every sequence, no batch dimension."
    ang = torch.arange(T, dtype=torch.float64)[:, None] * 1e4 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate(q, cos, sin):
    "Apply the rotary tables to queries or keys (B, heads, T, hd)."
    q1, q2 = q[..., ::2], q[..., 1::2]
    return torch.stack((q1 * cos - q2 * sin, q1 * sin + q2 * cos), -1).flatten(-2)


class RopeBlock(nn.Module):
    "Pre-norm causal attention with rotary positions, then an MLP."

    def __init__(s, d=D):
        super().__init__()
        s.n1, s.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        s.qkv, s.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(s, x, cos, sin):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in s.qkv(s.n1(x)).split(d, -1))
        a = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        x = x + s.o(a.transpose(1, 2).reshape(b, t, d))
        return x + s.mlp(s.n2(x))


class Core(nn.Module):
    "One recurrence: latent and embedded input joined by the adapter, then a rotary block."

    def __init__(s):
        super().__init__()
        s.adapter, s.block = nn.Linear(2 * D, D, bias=False), RopeBlock()

    def forward(s, h, e, cos, sin):
        return s.block(s.adapter(torch.cat((h, e), -1)), cos, sin)


class RopeHuginn(nn.Module):
    "Huginn-style: embed to e, iterate the core from a zero latent re-injecting e, coda block + RMSNorm + head."

    def __init__(s):
        super().__init__()
        s.emb, s.core, s.coda = nn.Embedding(V, D), Core(), RopeBlock()
        s.norm, s.head = nn.RMSNorm(D, eps=1e-6), nn.Linear(D, V, bias=False)

    def rope(s, t):
        return rope(t, D // HEADS, s.emb.weight.dtype)

    def forward(s, ids, num_steps=K):
        cos, sin = s.rope(ids.shape[1])
        e = s.emb(ids)
        h = torch.zeros_like(e)
        for _ in range(num_steps):
            h = s.core(h, e, cos, sin)
        return s.head(s.norm(s.coda(h, cos, sin)))


def huginn_spec(m, **kw):
    "The latent-state LoopSpec of a RopeHuginn: the context is (e, cos, sin); the readout needs the tables too."

    def init(t):
        e = m.emb(t)
        return torch.zeros_like(e), (e, *m.rope(t.shape[1]))

    def readout(h, ctx, k):
        return m.head(m.norm(m.coda(h, *ctx[1:])))

    return LoopSpec(
        init, lambda h, ctx, k: m.core(h, *ctx), readout, K, name='RopeHuginn', state='latent after recurrence k', **kw
    )


def coda_spec(m, **kw):
    "A RopeHuginn described by its coda output: the latent rides in the context, so the step ignores the state."
    lat = huginn_spec(m)

    def init(t):
        h, ctx = lat.init(t)
        return None, dict(ctx=ctx, latent=h)

    def step(y, c, k):
        c['latent'] = lat.step(c['latent'], c['ctx'], k)
        return m.coda(c['latent'], *c['ctx'][1:])

    return LoopSpec(init, step, lambda y, c, k: m.head(m.norm(y)), K, state='coda output', readout_norm=m.norm, **kw)


class LoopFormer(nn.Module):
    "LoopFormer-style: one shared block, its input shifted by an embedding of the time step k/K; RMSNorm readout."

    def __init__(s):
        super().__init__()
        s.emb, s.pos, s.time = nn.Embedding(V, D), nn.Embedding(T, D), nn.Linear(1, D)
        s.block = nn.Sequential(nn.RMSNorm(D, eps=1e-6), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        s.norm, s.head = nn.RMSNorm(D, eps=1e-5), nn.Linear(D, V, bias=False)


def loopformer_spec(m, **kw):
    "LoopSpec of a LoopFormer: the residual stream after loop k, read through the final RMSNorm."
    return LoopSpec(
        lambda t: (m.emb(t) + m.pos(torch.arange(t.shape[1])), None),
        lambda h, ctx, k: h + m.block(h + m.time(torch.tensor([k / K], dtype=h.dtype))),
        lambda h, ctx, k: m.head(m.norm(h)),
        K,
        name='LoopFormer',
        state='the residual stream after loop k, before the final RMSNorm',
        **kw,
    )


@pytest.fixture(scope='module')
def ids():
    torch.manual_seed(0)
    return torch.randint(0, V, (8 * B * T + 1,))


def huginn():
    torch.manual_seed(1)
    return RopeHuginn().eval()


def loopformer():
    torch.manual_seed(2)
    return LoopFormer().eval()


kw = dict(batch_size=B, seq_len=T)


# 1. context slicing
def test_rope_tables_are_shared_context(ids):
    spec = huginn_spec(huginn())
    assert context_layout(spec, T) == [True, False, False]  # e per sequence; cos, sin shared
    assert context_layout(huginn_spec(huginn()), B) == [True, False, False]  # also where T equals the batch


def test_chunked_exits_equal_unchunked_with_rope_context(ids):
    m = huginn()
    spec = huginn_spec(m)
    whole, chunked = (eval_exits(spec, ids, ce_chunk=c, max_batches=2, **kw) for c in (0, T))
    for a, b in zip(whole, chunked):
        assert a['ce'] == pytest.approx(b['ce'], rel=1e-6)
    x, y = ids[: 2 * B * T].view(2 * B, T), ids[1 : 2 * B * T + 1].view(2 * B, T)
    with torch.no_grad():
        direct = [F.cross_entropy(m(x, k).flatten(0, 1), y.flatten()).item() for k in range(1, K + 1)]
    assert [r['ce'] for r in chunked] == pytest.approx(direct, rel=1e-5)


def test_halting_drops_some_sequences_with_rope_context(ids):
    spec = huginn_spec(huginn())
    ce, scores, *_ = loop_scores(spec, ids, max_batches=4, **kw)
    seq = sorted(scores['max_prob'][0].mean(-1).tolist())
    th = (seq[len(seq) // 2 - 1] + seq[len(seq) // 2]) / 2  # half of the sequences exit at loop 1
    want = exit_outcome(ce, scores['max_prob'], th, 'sequence')
    for chunk in (0, T):
        got = halting_speed(spec, ids, 'max_prob', th, max_batches=4, repeats=1, ce_chunk=chunk, **kw)
        assert 1 < got['avg_loops'] < K
        assert got['avg_loops'] == pytest.approx(want['avg_loops'])
        assert got['dynamic_ppl'] == pytest.approx(want['ppl'], rel=1e-5)


def test_context_not_batch_first_is_refused(ids):
    m = huginn()
    spec = huginn_spec(m)

    def init(t):  # the embedded input as (B*T, d): it follows the batch, but not along its first dimension
        h, (e, cos, sin) = spec.init(t)
        return h, (e.flatten(0, 1), cos, sin)

    flat = dataclasses.replace(spec, init=init, step=lambda h, c, k: m.core(h, c[0].view_as(h), *c[1:]))
    with pytest.raises(LoopSpecError, match='not along its first dimension'):
        eval_exits(flat, ids, ce_chunk=T, max_batches=1, **kw)


# 2. one guard for every entry point
def _entry_points(spec, ids):
    x = ids[: 2 * T].view(2, T)
    small = dict(kw, max_batches=1)
    return {
        'eval_exits': lambda: eval_exits(spec, ids, **small),
        'loop_scores': lambda: loop_scores(spec, ids, **small),
        'token_norms': lambda: token_norms(spec, ids, **small),
        'radial_fractions': lambda: radial_fractions(spec, ids, **small),
        'angular_updates': lambda: angular_updates(spec, ids, **small),
        'angle_scaling': lambda: angle_scaling(spec, x),
        'clamp_modes': lambda: clamp_modes(spec, ids, **small),
        'scale_sensitivity': lambda: scale_sensitivity(spec, ids, **small),
        'lemma2': lambda: lemma2(spec, ids, 6, **small),
        'halting_speed': lambda: halting_speed(spec, ids, 'max_prob', 0.5, repeats=1, **small),
        'exit_throughput': lambda: exit_throughput(spec, ids, repeats=1, warmup=0, **small),
        'diagnose': lambda: diagnose(spec, ids, max_batches=1, lemma_loops=6, **kw),
    }


def test_every_entry_point_refuses_a_step_that_ignores_its_input(ids):
    m = huginn()
    good = huginn_spec(m)
    frozen = dataclasses.replace(good, step=lambda h, ctx, k: good.step(torch.zeros_like(ctx[0]), ctx, 1))
    for name, call in _entry_points(frozen, ids).items():
        with pytest.raises(LoopSpecError, match='all 4 states are identical'):
            call()


def test_every_entry_point_refuses_a_hand_spec_on_hf_hidden_states(ids):
    m = huginn()

    def hidden_states(t):  # what a Hugging Face forward returns: K+1 states, the embedding first
        e, cos, sin = m.emb(t), *m.rope(t.shape[1])
        hs = [e]
        for _ in range(K):
            hs.append(m.core(hs[-1] if len(hs) > 1 else torch.zeros_like(e), e, cos, sin))
        return tuple(hs)

    walk = LoopSpec(
        lambda t: (None, hidden_states(t)),
        lambda h, hs, k: hs[k - 1],
        lambda h, ctx, k: m.head(m.norm(m.coda(h, *m.rope(h.shape[1])))),
        K,
        state='latent',
    )
    for name, call in _entry_points(walk, ids).items():
        with pytest.raises(LoopSpecError, match='embedding output first') as e:
            call()
        assert 'differentiable' not in str(e.value), name


def test_a_clamp_that_never_reaches_the_next_loop_is_refused_with_its_cause(ids):
    coda = coda_spec(huginn())
    with pytest.raises(LoopSpecError, match='ignores the state it is given') as e:
        clamp_modes(coda, ids, max_batches=1, **kw)
    assert 'differentiable' not in str(e.value)
    assert check_spec(coda, ids[: 2 * T].view(2, T))['steps_carry_state'] is False
    with pytest.raises(LoopSpecError, match='ignores the state it is given'):
        run_loops(coda, ids[:T], 3, clamp='freeze_loop1')  # the verdict is kept on the spec object


def test_a_spec_is_checked_once_per_object(ids):
    spec = huginn_spec(huginn())
    calls = []
    counted = dataclasses.replace(spec, init=lambda t: (calls.append(1), spec.init(t))[1])
    eval_exits(counted, ids, max_batches=1, **kw)
    first = len(calls)
    eval_exits(counted, ids, max_batches=1, **kw)
    scale_sensitivity(counted, ids, max_batches=1, **kw)
    assert len(calls) - first == 2  # one run each, no second check
    counted.K = 3  # a changed field is a new description: checked again
    eval_exits(counted, ids, max_batches=1, **kw)
    assert len(calls) - first > 3


# 3. float64 for outside specs
def test_float64_for_a_spec_of_callables(ids):
    m = loopformer()
    params = {n: p for n, p in m.named_parameters()}
    ptrs = {n: p.data_ptr() for n, p in params.items()}
    rows = radial_fractions(loopformer_spec(m, modules=m, readout_norm=m.norm), ids, **kw)
    assert all(r['dtype'] == 'float64' for r in rows)
    assert all(p is params[n] for n, p in m.named_parameters())  # the same tensors put back, in float32
    assert all(p.data_ptr() == ptrs[n] and p.dtype == torch.float32 for n, p in params.items())
    ref = radial_fractions(loopformer_spec(copy.deepcopy(m).double()), ids, **kw)
    for r, q in zip(rows, ref):
        assert r['readout'] == pytest.approx(q['readout'], rel=1e-9)
        assert r['objective'] == pytest.approx(q['objective'], rel=1e-9)
        assert 0.1 < r['readout'] / r['scale'] < 10  # of the order eps/mean(H^2), from the norm's own eps
        assert r['ratio_p05'] == pytest.approx(1, abs=1e-6) and r['ratio_p95'] == pytest.approx(1, abs=1e-6)  # exact
    plain = radial_fractions(loopformer_spec(m), ids, **kw)
    assert all(r['dtype'] == 'float32' and r['scale'] is None and r['exact'] is None for r in plain)
    title = next(iter(DiagnosticReport(radial=plain).tables()))
    assert 'NOT float64' in title
    assert next(iter(DiagnosticReport(radial=rows).tables())) == 'Radial gradient fractions (float64)'


def test_a_declared_norm_that_is_not_applied_to_the_state_is_refused(ids):
    m = huginn()
    with pytest.raises(LoopSpecError, match='not scale-invariant'):
        eval_exits(huginn_spec(m, readout_norm=m.norm), ids, max_batches=1, **kw)  # the coda sits before the norm


# 4. diagnose does every row it can
def test_diagnose_skips_what_the_spec_cannot_do_with_the_reason(ids):
    m = huginn()
    why = 'its state, the coda output, is not what the loop feeds back'
    coda = coda_spec(m, no_clamp=why, modules=m)
    with pytest.raises(LoopSpecError, match='unchecked=True'):  # neither trace nor exits: refused, unless said
        diagnose(coda, ids, max_batches=2, lemma_loops=6, **kw)
    rep = diagnose(coda, ids, max_batches=2, lemma_loops=6, unchecked=True, **kw)
    assert rep['spec_check']['checked_against'].startswith('unchecked') and 'checked against unchecked' in repr(rep)
    assert 'clamp' not in rep and rep['skipped']['clamp'] == coda.no_clamp
    assert all(r['objective'] is None and r['ratio_p50'] == pytest.approx(1, abs=1e-6) for r in rep['radial'])
    assert set(rep['skipped']) == {'clamp', 'radial objective', 'lemma2'}
    assert 'Skipped, and why' in repr(rep) and len(rep['exits']['validation']) == K and rep['halting']
    readout = lambda h, ctx, k: m.head(m.norm(m.coda(h, *m.rope(h.shape[1]))))
    hooked = from_hooks(m, m.core, readout, K, steppable=False, state='latent (recorded)')
    rep = diagnose(hooked, ids, max_batches=2, lemma_loops=6, **kw)
    assert set(rep['skipped']) == {'clamp', 'radial objective', 'lemma2'}
    assert 'ignores the state it is given' in rep['skipped']['clamp'] + rep['skipped']['lemma2']
    assert rep['halting'] and rep['angular'] and rep['scale']


def test_from_hooks_on_a_module_whose_first_argument_is_not_the_state(ids):
    m = huginn()
    spec = from_hooks(m, m.core.adapter, lambda h, ctx, k: m.head(m.norm(h)), K, state='latent')
    with pytest.raises(LoopSpecError, match='first argument is not the state'):
        eval_exits(spec, ids, max_batches=1, **kw)


class UpdateLoop(nn.Module):
    """A looped model whose loop body is two layers, each returning an *update* the forward adds to the state:
    h = h + f1(h); h = h + f2(h), K times; logits = head(norm(h)). The state is h, never what f1 or f2 return."""

    def __init__(s):
        super().__init__()
        s.emb, s.norm, s.head = nn.Embedding(V, D), nn.RMSNorm(D), nn.Linear(D, V, bias=False)
        s.f1, s.f2 = (nn.Sequential(nn.RMSNorm(D), nn.Linear(D, D), nn.GELU()) for _ in range(2))

    def forward(s, x):
        h = s.emb(x)
        for _ in range(K):
            h = h + s.f1(h)
            h = h + s.f2(h)
        return (F.cross_entropy(s.head(s.norm(h))[:, :-1].flatten(0, 1), x[:, 1:].flatten()), s.head(s.norm(h)))


def test_from_hooks_checks_its_readout_against_the_models_output(ids):
    "A hooked module that returns an update, or the first of several looped layers: the readout reads the wrong tensor."
    torch.manual_seed(0)
    m = UpdateLoop().double()
    readout = lambda h, ctx, k: m.head(m.norm(h))
    for spec in (
        from_hooks(m, m.f2, readout, K, steppable=False, state='f2 output (an update)'),
        from_hooks(m, [m.f1, m.f2], readout, K, steppable=False, state='the two updates'),
    ):
        with pytest.raises(LoopSpecError, match='returns an update rather than the next state'):
            check_spec(spec, ids)
    # the same model described right: the states are the sums the forward keeps, read from its output (loss, logits)
    spec = LoopSpec(
        lambda t: (m.emb(t), None),
        lambda h, c, k: (h + m.f1(h)) + m.f2(h + m.f1(h)),
        readout,
        K,
        state='the residual state after loop k',
        exits=lambda t, k: m(t)[1] if k == K else None,
    )
    assert check_spec(spec, ids)['exit_rel_diff'] < 1e-12
    # its output holds no logits where from_hooks looks: the error names output=
    plain = from_hooks(m, m.f2, readout, K, steppable=False, state='x', output=lambda out: out[0])
    with pytest.raises(LoopSpecError, match='exits must return the logits'):
        check_spec(plain, ids)
    assert from_hooks(m, m.f2, readout, K, steppable=False, state='x', output=False).exits is None
