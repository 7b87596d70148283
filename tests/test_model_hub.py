"""Trained models anyone can load: a `smoke` run -> from_run / save_pretrained / from_pretrained, and cached
generation; damaged model folders and bad `generate` arguments refused with the file and the fix."""

import json, math, shutil
import pytest, torch
import huggingface_hub.hub_mixin
from looped_lm.interop.hub import from_run
from looped_lm.core.config import load_preset
from looped_lm.model.looped import HubFolderError, LoopedLM, LoopedLMConfig
from looped_lm.training.train import train
from looped_lm.training.rundir import latest_checkpoint
from looped_lm.measure.diagnostics import DIAG_VERSION, MEASURING_CODE, checkpoint_id
from looped_lm.core.files import source_hash
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
    model = from_run(run)
    assert not model.training
    written = load_file(str(run / (run / 'latest').read_text().strip() / 'model.safetensors'))  # what the trainer wrote
    state = model.state_dict()
    assert set(written) <= set(state) and all(torch.equal(state[k], v) for k, v in written.items())
    assert model.card_info['preset'] == 'smoke' and model.card_info['variant'] == run.name
    assert model.card_info['fingerprint'] == smoke_data.fingerprint


def _write_report(run, **key):
    "A diagnostics.json with known final-loop numbers, keyed like `diagnose_run` keys it (overridden by `key`)."
    ckpt = checkpoint_id(latest_checkpoint(run))
    key = {**dict(version=DIAG_VERSION, code=source_hash(MEASURING_CODE), checkpoint=ckpt), **key}
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
    "A report of older diagnostics, other measuring code or another checkpoint never reaches the model card."
    stales = (
        dict(version=DIAG_VERSION - 1),
        dict(code='0123456789abcdef'),
        dict(checkpoint='ckpt-000001:0123456789abcdef'),
    )
    for stale in stales:
        _write_report(run, **stale)
        assert from_run(run).card_info['final_row'] == {}, stale
    (run / 'diagnostics.json').write_text('{"version": ')  # damaged: the model still loads, the card says nothing
    assert from_run(run).card_info['final_row'] == {}
    _write_report(run)
    assert from_run(run).card_info['final_row'] == dict(k=4, ppl=321.5, norm=7.25, radial=2.5e-7)


def test_pretrained_round_trip(run, smoke_data, tmp_path):
    _write_report(run)
    model = from_run(run)
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
    model = from_run(run)
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
    model = from_run(run)
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


# ---- without a trained run: a tiny model, saved and damaged; bad generate arguments ---------------------------------


@pytest.fixture(scope='module')
def tiny():
    "An untrained tiny model (vocabulary 300, K = 4)."
    torch.manual_seed(0)
    return LoopedLM(LoopedLMConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, max_seq_len=16, K=4)).eval()


@pytest.fixture
def saved(tiny, tmp_path, monkeypatch):
    "The tiny model saved to tmp_path/ok, with every Hub download made an error (tests never reach the network)."

    def no_network(*a, **kw):
        raise AssertionError(f"hf_hub_download called: {a} {kw}")

    monkeypatch.setattr(huggingface_hub.hub_mixin, 'hf_hub_download', no_network)
    tiny.save_pretrained(tmp_path / 'ok')
    return tmp_path / 'ok'


def _broken(saved, name, change):
    "A copy of the saved folder with one fault made by `change(folder)`."
    shutil.copytree(saved, saved.parent / name)
    change(saved.parent / name)
    return saved.parent / name


def _config_edit(**kw):
    def change(folder):
        p = folder / 'config.json'
        p.write_text(json.dumps({**json.loads(p.read_text()), **kw}))

    return change


def _truncate(folder):
    p = folder / 'model.safetensors'
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


@pytest.mark.parametrize(
    'name, change, msg',
    [
        ('no-config', lambda f: (f / 'config.json').unlink(), 'no-config/config.json is missing'),
        ('not-json', lambda f: (f / 'config.json').write_text('{"K": '), 'not-json/config.json is not valid JSON'),
        ('not-object', lambda f: (f / 'config.json').write_text('[1, 2]'), 'must hold a JSON object'),
        ('bad-vocab', _config_edit(vocab_size=-5), 'bad-vocab/config.json: LoopedLMConfig: `vocab_size` must be > 0'),
        ('bad-readout', _config_edit(readout='batchnorm'), "`readout` = 'batchnorm' is not valid; choose one of"),
        ('heads', _config_edit(n_heads=3), '`d_model` (32) must be divisible by `n_heads` (3)'),
        ('string-K', _config_edit(K='4'), "`K` must be of type int, got '4'"),
        ('typo-key', _config_edit(vocab_sise=300), "typo-key/config.json: unknown key(s) ['vocab_sise']"),
        ('no-weights', lambda f: (f / 'model.safetensors').unlink(), 'no-weights/model.safetensors is missing'),
        ('truncated', _truncate, 'truncated/model.safetensors is damaged or truncated'),
    ],
)
def test_damaged_folder_names_the_file_and_fix(saved, name, change, msg):
    folder = _broken(saved, name, change)
    with pytest.raises(HubFolderError) as e:
        LoopedLM.from_pretrained(folder)
    assert msg in str(e.value) and ('save_pretrained' in str(e.value) or 'Fix the file' in str(e.value)), str(e.value)


def test_mistyped_path_is_not_sent_to_the_hub(saved):
    for where in (saved.parent / 'okk', str(saved.parent / 'okk'), 'okk', './okk', 'a/b/c'):
        with pytest.raises(HubFolderError, match='No model folder at .*okk|No model folder at a/b/c'):
            LoopedLM.from_pretrained(where)
    with pytest.raises(HubFolderError, match='No model folder at'):
        LoopedLM.from_pretrained(saved / 'config.json')  # a file, not a folder
    with pytest.raises(HubFolderError, match="neither a model folder nor a Hub repository id"):
        LoopedLM.from_pretrained('name space/model!')


def test_saved_folder_still_loads(tiny, saved):
    back = LoopedLM.from_pretrained(saved)
    assert back.config == tiny.config and not back.training
    x = torch.randint(0, 300, (2, 8))
    with torch.no_grad():
        assert torch.equal(back(x).logits, tiny(x).logits)


@pytest.mark.parametrize(
    'kw, err, msg',
    [
        (dict(idx=torch.tensor([[1, 300]])), ValueError, "token id 300, outside the model's vocabulary 0..299"),
        (dict(idx=torch.tensor([[-1, 2]])), ValueError, "token id -1, outside the model's vocabulary 0..299"),
        (dict(idx=torch.zeros(0, 4, dtype=torch.long)), ValueError, 'non-empty (B, T) int64 tensor'),
        (dict(halting='banana'), TypeError, 'halting must be None or a callable'),
        (dict(exit_k=True), ValueError, 'exit_k must be an integer in 1..4, got True'),
        (dict(temperature=math.nan), ValueError, 'temperature must be finite and >= 0'),
        (dict(temperature=math.inf), ValueError, 'temperature must be finite and >= 0'),
        (dict(temperature=-0.5), ValueError, 'temperature must be finite and >= 0'),
        (dict(temperature='1'), TypeError, 'temperature must be a number'),
        (dict(max_new_tokens=-1), ValueError, 'max_new_tokens must be >= 0, got -1'),
        (dict(max_new_tokens=2.0), TypeError, 'max_new_tokens must be an int >= 0, got 2.0'),
        (dict(max_new_tokens=True), TypeError, 'max_new_tokens must be an int >= 0, got True'),
    ],
)
def test_generate_refuses_bad_arguments_before_any_work(tiny, kw, err, msg):
    calls = []
    hook = tiny.tok_emb.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(err) as e:
            tiny.generate(**{**dict(idx=torch.randint(0, 300, (2, 4)), max_new_tokens=3), **kw})
    finally:
        hook.remove()
    assert msg in str(e.value), str(e.value)
    assert calls == []  # refused before the prompt was embedded


def test_looped_lm_is_built_in_its_own_module():
    "Every method of `LoopedLM` is written in `model/looped.py`: importing the rest of the package attaches nothing."
    import importlib, inspect, pkgutil, looped_lm

    for mod in pkgutil.walk_packages(looped_lm.__path__, 'looped_lm.'):
        try:
            importlib.import_module(mod.name)
        except ImportError:  # an optional extra that is not installed
            pass
    methods = {name: getattr(LoopedLM, name) for name in vars(LoopedLM) if not name.startswith('_orig_')}
    methods = {name: getattr(m, '__func__', getattr(m, 'fget', m)) for name, m in methods.items()}  # its function
    own = {name: f.__module__ for name, f in methods.items() if inspect.isfunction(f)}
    # (fastcore's @patch keeps the mixin's method it replaces as `_orig_<name>`)
    assert {'forward', 'generate', 'from_pretrained', 'save_pretrained'} <= set(own), sorted(own)
    assert set(own.values()) == {'looped_lm.model.looped'}, {n: m for n, m in own.items() if 'model.looped' not in m}
    assert not hasattr(LoopedLM, 'from_run')  # a run folder's model: looped_lm.from_run (interop.hub)
