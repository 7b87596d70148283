"""The divergence guard and the overflow warning.

A NaN/Inf in the hidden states or the loss stops training with a `TrainingError` that names the run, the step and
the loop; the run is marked failed, the last finite checkpoint stays, nothing is written from the diverged model,
and training the failed run again repeats the verdict without training. Hidden norms that approach the float32
range are reported by a warning while everything is still finite; norms that overflow it stop the run.
"""

import pytest, torch
import looped_lm.training.train as T
import looped_lm.training.train as O
from looped_lm.core.config import load_preset
from looped_lm.model.looped import LoopedLM
from looped_lm.training.train import train, TrainingError
from looped_lm.training.rundir import read_metrics, run_status
from looped_lm.training.rundir import latest_checkpoint
from _util import weights, inject_nan

pytestmark = pytest.mark.corpus  # every test trains on the smoke preset's WikiText-2 tokens


def _finite(rd):
    return all(torch.isfinite(t).all() for t in weights(rd).values())


def test_nan_in_a_hidden_state(tmp_path, smoke_data, monkeypatch):
    cfg, rd = load_preset('smoke', ckpt_every=5), tmp_path / 'perloop-rmsnorm-seed0'
    inject_nan(monkeypatch, step=7, loop=3)
    with pytest.raises(TrainingError) as e:
        train(cfg, rd, data=smoke_data, progress=False)
    msg = str(e.value)
    for part in (
        'Run perloop-rmsnorm-seed0',
        'preset smoke',
        'readout=rmsnorm',
        'loss=perloop',
        'hidden state of loop 3 (of 4',
        'at step 7',
        'ckpt-000005',
        'marked failed',
        'Lower lr',
    ):
        assert part in msg, (part, msg)
    assert run_status(rd) == dict(state='failed', step=7, message=msg)
    # the NaN was detected at the log step 10, before checkpoint 10: only checkpoint 5, finite, and no record past it
    assert latest_checkpoint(rd).name == 'ckpt-000005' and _finite(rd)
    assert [r['step'] for r in read_metrics(rd)] == [5]
    # a failed run is not trained again: the same verdict, without building a model or a step, and nothing changes
    monkeypatch.undo()
    files = lambda: {p.name: p.stat().st_mtime_ns for p in rd.rglob('*') if p.name != '.lock'}  # the lock is no result
    before = files()

    def no_training(*a, **k):
        raise AssertionError('a failed run was trained again')

    monkeypatch.setattr(T, 'start_run', no_training)
    monkeypatch.setattr(T, 'prepare_data', no_training)
    with pytest.raises(TrainingError) as again:
        train(cfg, rd, progress=False)  # no data passed: it is not even read
    assert str(again.value) == msg
    assert files() == before


class OverflowingGradient(LoopedLM):
    "A LoopedLM whose embedding gradient is infinite in the third backward pass (the loss and states stay finite)."

    def __init__(self, c):
        super().__init__(c)
        self.backwards = 0
        self.tok_emb.weight.register_hook(self.overflow)

    def overflow(self, g):
        self.backwards += 1
        return g * float('inf') if self.backwards == 3 else g


def test_overflowing_gradient(tmp_path, smoke_data, monkeypatch):
    """The guard also watches the gradient norm: when only the gradient overflows (as an absurd learning rate can make
    it; whether lr=10 does within the budget depends on the machine's kernels, so it makes no test), the weights that
    update produces are never checkpointed: the checkpoint of the step before stays, finite."""
    rd = tmp_path / 'grad-inf'
    monkeypatch.setattr(T, 'LoopedLM', OverflowingGradient)
    with pytest.raises(
        TrainingError, match=r'Run grad-inf .*diverged: non-finite values in the gradient norm at step 3\.'
    ):
        train(load_preset('smoke', ckpt_every=1), rd, data=smoke_data, progress=False)
    st = run_status(rd)
    assert (st['state'], st['step']) == ('failed', 3) and 'the gradient norm at step 3.' in st['message']
    assert latest_checkpoint(rd).name == 'ckpt-000002' and _finite(rd)


def test_non_finite_loss(tmp_path, smoke_data, monkeypatch):
    "A loss that overflows while the hidden states stay finite is named as the loss."
    calls = []

    def penalty(hidden):
        calls.append(1)
        return torch.tensor(float('inf') if len(calls) == 3 else 0.0)

    monkeypatch.setattr(O, 'norm_penalty', penalty)  # the objective reads it from its own module
    with pytest.raises(TrainingError, match='non-finite values in the loss at step 3'):
        train(load_preset('smoke', norm_penalty=1e-3), tmp_path / 'run', data=smoke_data, progress=False)


def _big_embeddings(monkeypatch, scale):
    "Models whose token embeddings are multiplied by `scale`: hidden norms of about 0.16*scale from the first step."

    class Big(LoopedLM):
        def __init__(self, c):
            super().__init__(c)
            with torch.no_grad():
                self.tok_emb.weight.mul_(scale)

    monkeypatch.setattr(T, 'LoopedLM', Big)


def test_overflow_is_reported_before_it_happens(tmp_path, smoke_data, monkeypatch):
    cfg = load_preset('smoke', tie_weights=False)  # an untied head, so the big embeddings leave the logits sane
    _big_embeddings(monkeypatch, 1e19)  # squared norms ~1e-2 of the float32 range: close, still finite
    with pytest.warns(
        UserWarning, match=r'step 5: hidden norms reach \d\.\de-0[12] of the float32 range; they will overflow'
    ):
        r = train(cfg, tmp_path / 'close', data=smoke_data, max_steps=5, progress=False)
    assert r.status == 'running'  # not stopped: nothing has overflowed yet
    rec = read_metrics(tmp_path / 'close', 'train')[-1]
    assert 1e-3 < rec['overflow_margin'] < 1 and all(map(torch.isfinite, torch.tensor(rec['loss'])))
    _big_embeddings(monkeypatch, 1e20)  # squared norms beyond float32: RMSNorm would read them as zero
    with pytest.raises(TrainingError, match='hidden state of loop 1 .*squared norm in float32.* at step 1'):
        train(cfg, tmp_path / 'over', data=smoke_data, max_steps=5, progress=False)
