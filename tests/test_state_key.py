"""A state of several tensors: `LoopSpec(state_key=...)` names the one to measure.

A loop that carries an answer y and a latent z is described twice: with `state_key='y'` (init and step return the
pair, readout takes it) and by hand in the pattern the chapters used before (y is the state, each loop's z is kept in
the context). Every diagnostic must give the same numbers for both, clamps and gradients through later loops included.
"""

import dataclasses

import numpy as np
import pytest
import torch, torch.nn as nn

from looped_lm.measure.protocol import LoopSpec, LoopSpecError, run_loops
from looped_lm.measure.spec_checks import check_spec
from looped_lm.measure.diagnostics import diagnose

V, D, K = 37, 12, 3


class AnswerLatent(nn.Module):
    "y and z per token; z reads y and the running mean of the earlier tokens' y (causal), y reads z; RMSNorm readout."

    def __init__(s):
        super().__init__()
        s.emb, s.to_z, s.to_y = nn.Embedding(V, D), nn.Linear(3 * D, D), nn.Linear(D, D)
        s.norm, s.head = nn.RMSNorm(D), nn.Linear(D, V, bias=False)

    def refine(s, y, z):
        past = y.cumsum(1) / torch.arange(1, y.shape[1] + 1, dtype=y.dtype)[:, None]
        z = z + torch.tanh(s.to_z(torch.cat([y, z, past], -1)))
        return y + s.to_y(z), z

    def logits(s, y):
        return s.head(s.norm(y))


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return AnswerLatent().eval()


def keyed(m, key='y'):
    "The spec with the pair as its state and y named."
    return LoopSpec(
        init=lambda t: (dict(y=m.emb(t), z=torch.zeros(*t.shape, D)), None),
        step=lambda s, c, k: dict(zip(('y', 'z'), m.refine(s['y'], s['z']))),
        readout=lambda s, c, k: m.logits(s['y']),
        K=K,
        name='keyed',
        state='the answer y after loop k; z beside it',
        modules=(m,),
        readout_norm=m.norm,
        state_key=key,
    )


def by_hand(m):
    "The same loop with y as the state and each loop's z kept in the context, as the chapters wrote it before."

    def init(t):
        return m.emb(t), dict(z=[torch.zeros(*t.shape, D)])

    def step(y, c, k):
        y, z = m.refine(y, c['z'][k - 1])
        c['z'][k:] = [z]
        return y

    return LoopSpec(init, step, lambda y, c, k: m.logits(y), K, 'by hand', 'y; z in the context', modules=(m,),
                    readout_norm=m.norm)  # fmt: skip


def numbers(rep) -> list:
    "The report's numbers, in a fixed order (names and versions left out)."
    out = []

    def walk(v):
        if isinstance(v, dict):
            for key in sorted(v):
                if key not in ('name', 'state', 'answer'):
                    walk(v[key])
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))

    walk({k: v for k, v in rep.items() if k not in ('version', 'spec_check')})
    return out


def test_a_keyed_state_gives_every_number_of_the_hand_written_spec(model):
    ids = torch.randint(0, V, (2000,), generator=torch.Generator().manual_seed(1))
    kw = dict(batch_size=4, seq_len=16, max_batches=3, lemma_loops=6, few_tokens=128, subset_tokens=192)
    kw.update(
        unchecked=True
    )  # two descriptions of one loop compared with each other, neither with a forward of its own
    a, b = diagnose(keyed(model), ids, **kw), diagnose(by_hand(model), ids, **kw)
    assert sorted(a) == sorted(b) and not a['skipped']
    got, want = numbers(a), numbers(b)
    assert len(got) == len(want) > 100
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert a['radial'][-1]['ratio_p50'] == pytest.approx(1.0, abs=1e-6)  # the lemma holds on y through the pair


def test_clamps_reach_the_next_loop_through_the_pair(model):
    x = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(2))
    for clamp in ('freeze_loop1', 'remove_radial'):
        got, _ = run_loops(keyed(model), x, K, clamp=clamp)
        want, _ = run_loops(by_hand(model), x, K, clamp=clamp)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert not torch.equal(got[-1], run_loops(keyed(model), x, K)[0][-1])  # the clamp changed the later loops


def test_a_key_the_state_does_not_hold_is_refused_before_measuring(model):
    ids = torch.randint(0, V, (500,))
    with pytest.raises(LoopSpecError, match=r"state_key='w' names no tensor .*it holds \['y', 'z'\]"):
        diagnose(keyed(model, 'w'), ids, batch_size=2, seq_len=8)
    pair_without_key = dataclasses.replace(keyed(model), state_key=None)
    with pytest.raises(LoopSpecError, match=r'name the one to measure with LoopSpec\(state_key=...\)'):
        run_loops(pair_without_key, ids[:16], K)


def test_a_key_the_readout_does_not_read_is_named_as_the_cause(model):
    "Issue 55.6: measuring z, which the readout ignores, was blamed on a readout that changes with k."
    ids = torch.randint(0, V, (2, 9))
    with pytest.raises(LoopSpecError, match='does not read the measured tensor; name with state_key'):
        check_spec(keyed(model, 'z'), ids)
    assert check_spec(keyed(model, 'y'), ids)['readout_uses_k'] is False  # the key the readout reads passes


def test_a_tuple_state_of_k_plus_one_tensors_is_not_taken_for_hugging_face_hidden_states():
    "Three same-shaped tensors at K=2 with the first measured: the states kept per loop are not a K+1 state list."
    torch.manual_seed(3)
    emb, lin, head = nn.Embedding(V, D), nn.Linear(3 * D, D), nn.Linear(D, V)

    def step(s, c, k):
        a, b, e = s
        b = b + torch.tanh(lin(torch.cat([a, b, e], -1)))
        return a + b, b, e

    spec = LoopSpec(lambda t: ((emb(t), torch.zeros(*t.shape, D), emb(t)), None), step, lambda s, c, k: head(s[0]),
                    2, 'triple', state='a', modules=(emb, lin, head), state_key=0)  # fmt: skip
    assert len(check_spec(spec, torch.randint(0, V, (2, 6)))['ce']) == 2


def test_a_state_with_a_counter_and_the_users_slice_ctx(model):
    "A state holding a plain number beside the tensors, and a slice_ctx of the user's own: sliced, and checked."
    base = keyed(model)
    spec = dataclasses.replace(
        base,
        init=lambda t: (dict(base.init(t)[0], n=0), None),
        step=lambda s, c, k: dict(base.step(s, c, k), n=s['n'] + 1),
        slice_ctx=lambda c, rows: c,  # the user's context is None: nothing of it to cut
    )
    res = check_spec(spec, torch.randint(0, V, (3, 9)))
    assert res['slice_rel_diff'] < 1e-6


def test_a_trace_of_whole_states_is_read_at_the_key(model):
    "A trace (the model's own forward) may give whole states, as init and step do: compared at state_key."
    base = keyed(model)

    def trace(t):
        y, z, out = model.emb(t), torch.zeros(*t.shape, D), []
        for _ in range(K):
            y, z = model.refine(y, z)
            out.append(dict(y=y, z=z))
        return out

    res = check_spec(dataclasses.replace(base, trace=trace), torch.randint(0, V, (2, 9)))
    assert res['forward_rel_diff'] == 0.0
