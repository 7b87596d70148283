"Trained models anyone can load: a `smoke` run -> from_run / save_pretrained / from_pretrained, and cached generation."

import json
import pytest, torch
from looped_lm.config import load_preset
from looped_lm.model import LoopedLM
from looped_lm.train import train, latest_checkpoint
from looped_lm.diagnostics import DIAG_VERSION, checkpoint_id
from safetensors.torch import load_file


@pytest.fixture(scope='module', params=['rmsnorm', 'raw', 'final_norm'])
def run(request, tmp_path_factory, smoke_data):
    "A trained smoke run directory per readout (the rmsnorm one with the whole smoke budget, the others with 12 steps)."
    budget = {} if request.param == 'rmsnorm' else dict(train_tokens=12 * 8 * 32)
    cfg = load_preset('smoke', readout=request.param, **budget)
    run_dir = tmp_path_factory.mktemp(f'perloop-{request.param}')
    train(cfg, run_dir, data=smoke_data, progress=False)
    return run_dir


def _tokens(data, n=4, t=24):
    return torch.as_tensor(data.validation[: n * t].astype('int64')).view(n, t)


def test_from_run_is_the_trained_model(run, smoke_data):
    model = LoopedLM.from_run(run)
    assert not model.training
    written = load_file(str(run / (run / 'latest').read_text().strip() / 'model.safetensors'))  # what the trainer wrote
    state = model.state_dict()
    assert set(written) <= set(state) and all(torch.equal(state[k], v) for k, v in written.items())
    assert model.card_info['preset'] == 'smoke' and model.card_info['variant'] == run.name
    assert model.card_info['fingerprint'] == smoke_data.fingerprint


def _write_report(run, **key):
    "A diagnostics.json with known final-loop numbers, keyed like `diagnose_run` keys it (overridden by `key`)."
    key = {**dict(version=DIAG_VERSION, checkpoint=checkpoint_id(latest_checkpoint(run))), **key}
    (run / 'diagnostics.json').write_text(
        json.dumps(
            {
                **key,
                'exits': {'validation': [{'k': 4, 'ppl': 321.5}]},
                'norms': [{'k': 4, 'mean': 7.25}],
                'radial': [{'k': 4, 'readout': 2.5e-7}],
            }
        )
    )


def test_card_ignores_stale_diagnostics(run):
    "A report of older diagnostics, or of another checkpoint, never reaches the model card."
    for stale in (dict(version=DIAG_VERSION - 1), dict(checkpoint='ckpt-000001:0123456789abcdef')):
        _write_report(run, **stale)
        assert LoopedLM.from_run(run).card_info['final_row'] == {}, stale
    (run / 'diagnostics.json').write_text('{"version": ')  # damaged: the model still loads, the card says nothing
    assert LoopedLM.from_run(run).card_info['final_row'] == {}
    _write_report(run)
    assert LoopedLM.from_run(run).card_info['final_row'] == dict(k=4, ppl=321.5, norm=7.25, radial=2.5e-7)


def test_pretrained_round_trip(run, smoke_data, tmp_path):
    _write_report(run)
    model = LoopedLM.from_run(run)
    model.save_pretrained(tmp_path / 'hub')
    card = (tmp_path / 'hub' / 'README.md').read_text()
    for s in (
        f'| variant | {run.name} |',
        '| preset | smoke |',
        f'| data fingerprint | {smoke_data.fingerprint} |',
        '| final loop: ppl | 321.5 |',
        '| final loop: norm | 7.25 |',
        '| final loop: radial | 2.5e-07 |',
    ):
        assert s in card, s
    back = LoopedLM.from_pretrained(tmp_path / 'hub')
    assert back.config == model.config and not back.training
    x = _tokens(smoke_data)
    with torch.no_grad():
        for k in range(1, model.config.K + 1):
            assert torch.equal(back(x, exit_k=k).logits, model(x, exit_k=k).logits)


@pytest.mark.parametrize('exit_k', [None, 2, 1])
def test_generate_same_tokens_with_and_without_cache(run, smoke_data, exit_k):
    model = LoopedLM.from_run(run)
    prompt = _tokens(smoke_data, n=3, t=8)
    a, b = (model.generate(prompt, 24, exit_k=exit_k, use_cache=uc) for uc in (True, False))
    assert torch.equal(a, b) and a.shape == (3, 32) and torch.equal(a[:, :8], prompt)
    with torch.no_grad():
        full = model(a[:, :-1], exit_k=exit_k).logits  # an independent path: one full forward
    assert torch.equal(full[:, 7:].argmax(-1), a[:, 8:])  # greedy = argmax of the full forward
    s1, s2 = (
        model.generate(
            prompt, 24, exit_k=exit_k, temperature=1.0, generator=torch.Generator().manual_seed(3), use_cache=uc
        )
        for uc in (True, False)
    )
    assert torch.equal(s1, s2)


def test_generate_with_halting(run, smoke_data):
    model = LoopedLM.from_run(run)
    prompt = _tokens(smoke_data, n=4, t=8)
    halting = lambda logits, k: (
        (torch.arange(len(logits)) + k) % 4 == 0
    )  # sequence r exits at loop 4 - r (3 -> 1, 0 -> K)
    (a, ea), (b, eb) = (
        model.generate(prompt, 16, halting=halting, return_exits=True, use_cache=uc) for uc in (True, False)
    )
    assert torch.equal(a, b) and torch.equal(ea, eb)
    K, t = model.config.K, prompt.shape[1]
    assert K == 4
    test_exits = torch.tensor([K, 3, 2, 1])[:, None].expand_as(ea)
    assert torch.equal(ea, test_exits), ea  # the first loop where the rule fires, else K
    assert torch.equal(
        a[:, t:],
        torch.stack([model(a[:, :-1], exit_k=k).logits[:, t - 1 :].argmax(-1) for k in range(1, K + 1)])
        .gather(0, (ea - 1)[None])
        .squeeze(0),
    )  # each token is the argmax of its exit loop's readout
    with pytest.raises(ValueError, match='max_seq_len=64'):
        model.generate(prompt, 64)
