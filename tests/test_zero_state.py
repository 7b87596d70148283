"""A state that is exactly zero at some loop (issue 55): a slow half that starts at zeros and a loop that passes it on
unchanged. Every number is either recomputed here, or reads undefined (None, with the reason), or the part is skipped
with its reason; the report is never lost, and 0/0 is never printed as 0.0, pi/2 or inf."""

import math
import numpy as np
import pytest
import torch, torch.nn as nn

from looped_lm.measure.protocol import LoopSpec, LoopSpecError, run_loops, token_windows
from looped_lm.measure.radial import angular_updates, radial_fractions
from looped_lm.measure.diagnostics import clamp_modes, diagnose, hill_estimator, lemma2, norm_stats

V, D, K = 29, 8, 4


class Intermittent(nn.Module):
    "A state that starts at zero, updated only at even loops (odd loops pass it on unchanged); read with the input."

    def __init__(s):
        super().__init__()
        s.emb, s.lin = nn.Embedding(V, D), nn.Linear(D, D)
        s.norm, s.head = nn.RMSNorm(D), nn.Linear(D, V, bias=False)

    def step(s, h, e, k):
        return h + torch.tanh(s.lin(h + e)) if k % 2 == 0 else h  # zero until loop 2

    def logits(s, h, e):
        return s.head(s.norm(h + e))

    def forward(s, t, k: int = K):
        "The model's own logits at exit k."
        h, e = torch.zeros(*t.shape, D), s.emb(t)
        for j in range(1, k + 1):
            h = s.step(h, e, j)
        return s.logits(h, e)


@pytest.fixture(scope='module')
def spec():
    torch.manual_seed(0)
    m = Intermittent().eval()
    return LoopSpec(
        init=lambda t: (torch.zeros(*t.shape, D), m.emb(t)),
        step=lambda h, e, k: m.step(h, e, k),
        readout=lambda h, e, k: m.logits(h, e),
        K=K,
        name='intermittent',
        state='a state zero until loop 2, updated at even loops',
        modules=(m,),
        exits=lambda t, k: m(t, k),
    )


TOKENS = np.random.default_rng(0).integers(0, V, 4096)


def test_fractions_and_angles_of_a_zero_state_are_undefined_never_zero(spec):
    rad = radial_fractions(spec, TOKENS, batch_size=4, seq_len=16, max_batches=2)
    assert rad[0]['readout'] is None and 'loop 1' in rad[0]['undefined'], rad[0]
    assert all(r['readout'] is not None and 0 < r['readout'] <= 1 for r in rad[1:]), rad
    ang = angular_updates(spec, TOKENS, batch_size=4, seq_len=16, max_batches=1)
    assert ang[0]['k'] == 2 and ang[0]['angle'] is None and ang[0]['undefined_tokens'] == 64, ang[0]
    x, _ = next(iter(token_windows(TOKENS, 4, 16, 1, 'cpu')))  # the first window batch, recomputed by hand
    hid = [h.double() for h in run_loops(spec, x, K)[0]]
    assert ang[1]['angle'] == 0 and ang[1]['undefined_tokens'] == 0  # loop 3 passes H_2 on: a defined angle of 0
    cos = torch.nn.functional.cosine_similarity(hid[2], hid[3], dim=-1).clamp(-1, 1)  # H_3 -> H_4: both non-zero
    assert ang[2]['angle'] == pytest.approx(torch.acos(cos).mean().item(), rel=1e-6)
    assert ang[2]['angle'] != pytest.approx(math.pi / 2)


def test_clamps_lemma2_and_the_hill_index_say_undefined(spec):
    with pytest.raises(LoopSpecError, match='H_1 is zero'):
        clamp_modes(spec, TOKENS, batch_size=4, seq_len=16, max_batches=1, modes=('none', 'freeze_loop1'))
    rows = clamp_modes(spec, TOKENS, batch_size=4, seq_len=16, max_batches=1, modes=('none',))['none']
    assert rows[0]['norm_l2'] == 0 and all(r['norm_ratio_vs_loop1'] is None for r in rows)
    l2 = lemma2(spec, TOKENS, loops=6, batch_size=4, seq_len=16, max_batches=1)
    assert l2[0]['s'] is None and 'state zero' in l2[0]['undefined'] and l2[1]['s'] > 0
    assert hill_estimator(np.zeros(1000)) is None and hill_estimator(np.ones(1000)) is None
    assert norm_stats(np.ones(500))['tail'] == 'undefined'


def test_diagnose_keeps_the_report_and_names_what_it_skipped(spec):
    rep = diagnose(spec, TOKENS, batch_size=4, seq_len=16, max_batches=2, few_tokens=128, subset_tokens=128)
    assert 'clamp' in rep['skipped'] and 'H_1 is zero' in rep['skipped']['clamp']
    assert rep['radial'][0]['readout'] is None and rep['angular'][0]['angle'] is None
    assert rep['norms'][0]['hill'] is None and rep['norms'][0]['tail'] == 'undefined'
    text = repr(rep)
    assert 'undefined' in text and 'inf' not in text.split('Skipped')[0]


def test_a_model_that_computes_in_float32_inside_is_measured_in_float32_and_says_so():
    "Issue 55.6: a step with a .float() inside cannot run in float64; it lost the radial and angular parts before."
    import warnings

    torch.manual_seed(0)
    emb, f, norm, head = nn.Embedding(31, 8), nn.Linear(8, 8), nn.RMSNorm(8), nn.Linear(8, 31)
    step = lambda h: h + torch.tanh(f(h.float()))  # noqa: E731  computes in float32 whatever it is given

    def run(t, k):
        h = emb(t)
        for _ in range(k):
            h = step(h)
        return h

    spec = LoopSpec(lambda t: (emb(t), None), lambda h, c, k: step(h), lambda h, c, k: head(norm(h)), 3, state='h',
                    modules=(emb, f, norm, head), exits=lambda t, k: head(norm(run(t, k))))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        rep = diagnose(spec, torch.randint(0, 31, (600,)), batch_size=2, seq_len=16, max_batches=2, lemma_loops=4)
    assert 'radial' not in rep.get('skipped', {}) and 'angular' not in rep.get('skipped', {})
    assert all(r['dtype'] == 'float32' and 'float64 impossible' in r['measured_in'] for r in rep['radial'])
    assert all('float64 impossible' in r['measured_in'] for r in rep['angular'])
    assert 'NOT float64' in repr(rep) and any('cast to the state' in str(w.message) for w in caught)
    assert f.weight.dtype == torch.float32  # the weights as they were
