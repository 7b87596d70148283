"""Models the field's tools load and score: a trained `smoke` run saved as a `transformers` folder loads
in a fresh interpreter with `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` (looped_lm never
imported) and gives `from_run`'s logits at every exit and its greedy tokens; lm-evaluation-harness scores it
on the local WikiText with its own `HFLM` and agrees with our code on the same windows. Skipped without the `eval`
extra (`pip install -e '.[eval]'`); offline."""

import inspect, json, math, os, re, subprocess, sys
import pytest, torch

EXTRA = "the `eval` extra is not installed (pip install -e '.[eval]', or scripts/setup.sh)"
transformers = pytest.importorskip('transformers', reason=EXTRA)
lm_eval = pytest.importorskip('lm_eval', reason=EXTRA)
pytest.importorskip('accelerate', reason=EXTRA)  # lm-eval's HFLM imports it (the `hf` extra of lm-eval)

from looped_lm.interop.hub import from_run  # noqa: E402
from looped_lm.core.config import load_preset  # noqa: E402
from looped_lm.model.looped import MLP, block_source  # noqa: E402
from looped_lm.training.train import train  # noqa: E402
from looped_lm.interop.lm_eval import harness_scores, rolling_nll, save_run, wikitext_pages  # noqa: E402

FRESH = r'''
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, x_path, text = sys.argv[1], sys.argv[2], sys.argv[3]
m = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(folder)
assert not [n for n in sys.modules if n == 'looped_lm' or n.startswith('looped_lm.')], 'looped_lm was imported'
x = torch.load(x_path)
with torch.no_grad():
    out = dict(exits=m(x, output_exit_logits=True).exit_logits, k2=m(x, exit_k=2).logits,
               greedy=m.generate(x[:1, :8], max_new_tokens=20, do_sample=False),
               greedy2=m.generate(x[:1, :8], max_new_tokens=20, do_sample=False, exit_k=2),
               ids=tok.encode(text), cls=type(m).__module__)
m.save_pretrained(x_path + '-again')  # the folder's own code, saved again
torch.save(out, x_path + '.out')
'''


@pytest.fixture(scope='module')
def run(tmp_path_factory, smoke_data):
    "A `smoke` run trained with its whole budget."
    run_dir = tmp_path_factory.mktemp('lm-eval') / 'perloop-rmsnorm'
    train(load_preset('smoke'), run_dir, data=smoke_data, progress=False)
    return run_dir


@pytest.fixture(scope='module')
def folder(run, tmp_path_factory):
    return save_run(run, tmp_path_factory.mktemp('hf') / 'smoke')


def test_folder_holds_code_config_weights_tokenizer(folder):
    names = {p.name for p in folder.iterdir()}
    assert {'config.json', 'model.safetensors', 'transformers_io.py', 'tokenizer.json'} <= names
    cfg = json.loads((folder / 'config.json').read_text())
    assert cfg['auto_map']['AutoModelForCausalLM'] == 'transformers_io.LoopedLMForCausalLM'
    assert cfg['model_type'] == 'looped-lm' and cfg['max_seq_len'] == 64
    code = (folder / 'transformers_io.py').read_text()
    assert not re.search(r'^\s*(from|import)\s+(looped_lm|\.)', code, re.M), 'the folder code must not need the package'
    assert block_source() in code and inspect.getsource(MLP) in code  # the model's own block, written in


@pytest.mark.slow
def test_fresh_interpreter_trust_remote_code_equals_from_run(run, folder, smoke_data, tmp_path):
    "The acceptance test: logits at every exit and greedy tokens, without importing looped_lm."
    model = from_run(run)
    x = torch.as_tensor(smoke_data.test[: 4 * 32].astype('int64')).view(4, 32)
    torch.save(x, tmp_path / 'x.pt')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    text = ' = Robert <unk> = \n Robert <unk> is an English film , television and theatre actor . \n'
    p = subprocess.run(
        [sys.executable, '-c', FRESH, str(folder), str(tmp_path / 'x.pt'), text],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = torch.load(tmp_path / 'x.pt.out')
    assert out['cls'].startswith('transformers_modules.'), out['cls']  # the folder's code, not the package
    with torch.no_grad():
        for k in range(1, model.config.K + 1):
            ref = model(x, exit_k=k).logits
            got = out['exits'][k - 1]
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (k, (got - ref).abs().max())
        assert torch.allclose(out['k2'], model(x, exit_k=2).logits, atol=1e-5, rtol=1e-5)
    assert out['greedy'].tolist() == model.generate(x[:1, :8], 20).tolist()
    assert out['greedy2'].tolist() == model.generate(x[:1, :8], 20, exit_k=2).tolist()
    assert out['ids'] == smoke_data.tokenizer.encode(text).ids
    again = (tmp_path / 'x.pt-again' / 'transformers_io.py').read_text(encoding='utf-8')
    assert again == (folder / 'transformers_io.py').read_text(encoding='utf-8')  # still standalone


def test_auto_classes_after_import(folder, run):
    "After `import looped_lm.interop.transformers_io`, the folder loads without trust_remote_code."
    import looped_lm.interop.transformers_io  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM

    assert AutoConfig.from_pretrained(folder).exit_k is None
    m = AutoModelForCausalLM.from_pretrained(folder, exit_k=3)
    assert type(m).__module__ == 'looped_lm.interop.transformers_io' and m.config.exit_k == 3
    x = torch.arange(1, 25)[None]
    with torch.no_grad():
        assert torch.allclose(m(x).logits, from_run(run)(x, exit_k=3).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_harness_scores_smoke_as_our_code_does(run, folder, smoke_data):
    "lm-evaluation-harness (HFLM, its own rolling windows) and our rolling_nll on LoopedLM agree on 3 test articles."
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_preset('smoke')
    pages = wikitext_pages(cfg.corpus, ('test',))['test']['page'][:3]
    model, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    h = harness_scores(model, tok, cfg.seq_len, split='test', limit=3)
    ours = rolling_nll(from_run(run), [tok.encode(p) for p in pages], tok.bos_token_id, cfg.seq_len)
    n_bytes = sum(len(p.encode('utf-8')) for p in pages)
    assert h['bits_per_byte'] == pytest.approx(sum(ours) / n_bytes / math.log(2), rel=1e-6)
    assert [-ll for ll in h['loglikelihoods']] == pytest.approx(ours, rel=1e-5)
    assert 1 < h['bits_per_byte'] < 8  # a trained smoke model: far from uniform over 512 tokens (9 bits / ~2 bytes)


def test_regex_tokenizer_as_fast_tokenizer_matches_on_wikitext():
    "The official regex tokenizer's fast twin gives our ids on a whole WikiText split (the test split, fitted on it)."
    from looped_lm.training.text import iter_rows, load_corpus
    from looped_lm.training.text import RegexTokenizer
    from looped_lm.interop.transformers_io import fast_tokenizer

    rows = [r for r in iter_rows(load_corpus('wikitext-2-v1', verbose=False)['test']) if r]
    rx = RegexTokenizer.fit([rows], 4096, min_freq=2)
    fast = fast_tokenizer(rx)
    bad = [r for r in rows if fast.encode(r) != rx.encode(r).ids]
    assert not bad, f"{len(bad)} rows differ, e.g. {bad[0][:80]!r}"


def test_bad_inputs_name_the_fix(folder, tmp_path):
    from looped_lm.interop.transformers_io import LoopedLMHFConfig, fast_tokenizer, from_looped
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match='integer in 1..4'):
        LoopedLMHFConfig(exit_k=0)
    with pytest.raises(TypeError, match=r'looped_lm.from_run\(run_dir\)'):
        from_looped(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match='TokenData.tokenizer'):
        fast_tokenizer(object())
    m = AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(ValueError, match='no padding mask'):
        m(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]))
    for save in (
        lambda: m.save_pretrained(tmp_path / 'up', push_to_hub=True),
        lambda: m.config.save_pretrained(tmp_path, True),
    ):
        with pytest.raises(ValueError, match=r'call push_to_hub\(repo_id\)'):  # the code would go before its rewrite
            save()
    m.save_pretrained(tmp_path / 'worker', is_main_process=False)  # another process of a multi-process save: no code
    assert not (tmp_path / 'worker' / 'transformers_io.py').exists()
    m.save_pretrained(tmp_path / 'again')  # saved again: the folder's code is still standalone
    assert (tmp_path / 'again' / 'transformers_io.py').read_text(encoding='utf-8') == (
        folder / 'transformers_io.py'
    ).read_text(encoding='utf-8')
