"""A model left in training mode (issue 55.5): measured in eval mode, the report says so, and the caller's mode and
every stateful buffer (a spectral norm's power iteration) are restored bit for bit; its numbers equal the eval ones."""

import numpy as np
import torch, torch.nn as nn
from looped_lm.measure.protocol import LoopSpec
from looped_lm.measure.diagnostics import diagnose

V, D = 23, 8


class Spectral(nn.Module):
    "A weight-tied block with a spectral-normed layer and dropout, read out through RMSNorm."

    def __init__(s):
        super().__init__()
        s.emb, s.drop = nn.Embedding(V, D), nn.Dropout(0.3)
        s.lin = nn.utils.parametrizations.spectral_norm(nn.Linear(D, D))
        s.norm, s.head = nn.RMSNorm(D), nn.Linear(D, V, bias=False)

    def forward(s, t, k: int = 3):
        "The model's own logits at exit k."
        h = s.emb(t)
        for _ in range(k):
            h = h + s.drop(torch.tanh(s.lin(h)))
        return s.head(s.norm(h))

    def spec(s):
        return LoopSpec(lambda t: (s.emb(t), None), lambda h, c, k: h + s.drop(torch.tanh(s.lin(h))),
                        lambda h, c, k: s.head(s.norm(h)), 3, 'spectral', 'the state after loop k', modules=(s,),
                        readout_norm=s.norm, exits=lambda t, k: s(t, k))  # fmt: skip


def test_a_model_in_training_mode_is_measured_in_eval_mode_and_left_as_it_was():
    torch.manual_seed(0)
    m = Spectral().train()
    toks = np.random.default_rng(0).integers(0, V, 2048)
    buffers = {n: b.clone() for n, b in m.named_buffers()}
    kw = dict(batch_size=4, seq_len=16, max_batches=2, few_tokens=64, subset_tokens=64, lemma_loops=5)
    rep = diagnose(m.spec(), toks, **kw)
    assert m.training and m.drop.training  # the caller's mode back
    assert all(torch.equal(b, buffers[n]) for n, b in m.named_buffers()) and buffers  # every buffer bit for bit
    assert rep['mode'].startswith('eval (the model was in training mode')
    again = diagnose(m.eval().spec(), toks, **kw)  # the same model in eval mode: the same numbers
    assert again['mode'] == 'eval' and again['exits'] == rep['exits'] and again['radial'] == rep['radial']
