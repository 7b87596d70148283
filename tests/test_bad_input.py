"""Bad input is refused loudly: an exception that names the problem and the fix, raised before any expensive work,
and no half-written result that a later run could take for a complete one."""

import configparser, contextlib, errno, os, re, shutil, socket, subprocess, sys
from pathlib import Path
from unittest import mock
import numpy as np, pytest, torch
from looped_lm.studies.ablation import check_params, run_ablation
from looped_lm.core.config import ConfigError, load_preset, settings_path
import looped_lm.training.text as D  # the corpus reader: its Hub probe is patched
from looped_lm.training.data import prepare_data, tokenizer_path
from looped_lm.training.text import DataNotFoundError
from looped_lm.model.looped import LoopedLM, LoopedLMConfig
from looped_lm.training.train import train
from looped_lm.training.rundir import load_run
from looped_lm.training.rundir import run_status, RunDirError
from looped_lm.training.rundir import load_checkpoint, latest_checkpoint
from conftest import REPO


# ---- presets, settings.ini and papermill parameters ------------------------------------------------------------


def test_unknown_preset():
    with pytest.raises(ConfigError, match=r"Unknown preset 'no-such'. Valid presets: .*smoke"):
        load_preset('no-such')
    with pytest.raises(ConfigError, match='Valid presets'):
        run_ablation('no-such', out_dir='/nonexistent/never-created')
    assert not Path('/nonexistent').exists()


def _settings_with(tmp_path, **bad) -> Path:
    "A settings.ini holding the repository's presets plus [bad]: the smoke preset with the `bad` raw values."
    p = configparser.ConfigParser(inline_comment_prefixes=('#', ';'))
    p.optionxform = str
    p.read(settings_path())
    p['bad'] = {**{k: v for k, v in p['smoke'].items()}, **bad}
    f = tmp_path / 'settings.ini'
    with open(f, 'w') as fh:
        p.write(fh)
    return f


BAD_VALUES = [  # key, raw value in settings.ini, what the message says
    ('K', '0', '`K` must be > 0'),
    ('K', 'four', '`K` = \'four\' in settings.ini is not a valid int'),
    ('lr', '0', '`lr` must be > 0'),
    ('lr', '-1e-3', '`lr` must be > 0'),
    ('lr', 'nan', '`lr` must be finite'),
    ('batch_size', '0', '`batch_size` must be > 0'),
    ('batch_size', '2.5', 'is not a valid int'),
    ('norm_penalty', '-1', '`norm_penalty` must be >= 0'),
    ('control_norm_penalty', '-1e-3', 'must be >= 0'),
    ('seq_len', '65', 'above the model\'s context `max_seq_len` (64)'),
    ('readout', 'batchnorm', 'choose one of rmsnorm'),
    ('loss', 'everywhere', 'choose one of perloop'),
    ('tie_weights', 'maybe', 'not a valid bool'),
    ('n_heads', '3', 'must be divisible by `n_heads`'),
    ('loops', '3', 'Unknown setting'),
]


@pytest.mark.parametrize('key,value,says', BAD_VALUES, ids=[f'{k}={v}' for k, v, _ in BAD_VALUES])
def test_bad_value_in_settings_ini(tmp_path, monkeypatch, key, value, says):
    f = _settings_with(tmp_path, **{key: value})
    with pytest.raises(ConfigError) as e:
        load_preset('bad', path=f)
    assert says in str(e.value) and (key in str(e.value)), str(e.value)
    monkeypatch.setenv('LOOPED_LM_SETTINGS', str(f))  # the ablation (papermill's entry point) reads the same file
    out = tmp_path / 'out'
    with pytest.raises(ConfigError, match=says.replace('(', r'\(').replace(')', r'\)').replace('`', '.')):
        run_ablation('bad', out_dir=out)
    assert not out.exists()  # refused before anything was created


@pytest.mark.parametrize(
    'text,says',
    [
        ('lr = 1\n[bad]\n', 'no section headers'),
        ('[bad]\nlr = 1\nlr = 2\n', "option 'lr' in section 'bad' already exists"),
    ],
)
def test_malformed_settings_ini(tmp_path, text, says):
    "A syntax error in the file is reported with the file and the line (by configparser)."
    f = tmp_path / 'settings.ini'
    f.write_text(text)
    with pytest.raises(Exception, match=f"{says}") as e:
        load_preset('bad', path=f)
    assert 'settings.ini' in str(e.value) and 'line' in str(e.value)


@pytest.mark.parametrize(
    'override,says',
    [
        (dict(K=0), '`K` must be > 0'),
        (dict(norm_penalty=-0.1), '`norm_penalty` must be >= 0'),
        (dict(lr=-1.0), '`lr` must be > 0'),
        (dict(batch_size=0), '`batch_size` must be > 0'),
        (dict(seq_len=128), 'above the model'),
        (dict(readout='batchnorm'), 'choose one of'),
        (dict(batch_size=8.0), 'must be of type int'),
        (dict(loops=3), 'Unknown setting'),
    ],
)
def test_bad_override(override, says):
    with pytest.raises(ConfigError, match=says.replace('(', r'\(')):
        load_preset('smoke', **override)


def test_bad_ablation_parameters(tmp_path):
    "The notebook's papermill parameters, checked by run_ablation before any data is read."
    out = tmp_path / 'out'
    for kw, says in [
        (
            dict(variants=['perloop-rmsnorm', 'batchnorm']),
            r"Unknown variant\(s\) \['batchnorm'\]. Valid variants: terminal-rmsnorm",
        ),
        (dict(variants='all', seeds=[-1]), r'non-negative integers below 2\*\*32.*\(bad: \[-1\]\)'),
        (dict(seeds=[]), r'seeds = \[\].*non-negative integers'),
        (dict(seeds=['zero']), r"bad: \['zero'\]"),
        (dict(seeds=1.5), r'bad: \[1.5\]'),
        (dict(seeds=[0, 0]), 'repeats a seed'),
        (dict(variants=[]), 'selects no variant'),
        (dict(device='tpu'), "device must be one of 'auto', 'cpu', 'cuda'"),
    ]:
        with mock.patch(
            'looped_lm.training.data.prepare_data', side_effect=AssertionError('read data before checking')
        ):
            with pytest.raises(ConfigError, match=says):
                run_ablation('smoke', out_dir=out, **kw)
    assert not out.exists()  # refused before any folder was created


@pytest.mark.slow
def test_papermill_refuses_a_bad_parameter(tmp_path):
    "The real entry point: `papermill nbs/05_ablation.ipynb ... -p preset no-such` fails, naming preset and choices."
    p = subprocess.run(
        [
            sys.executable,
            '-m',
            'papermill',
            str(REPO / 'nbs' / '05_ablation.ipynb'),
            str(tmp_path / 'out.ipynb'),
            '-p',
            'preset',
            'no-such',
            '-p',
            'out_dir',
            str(tmp_path / 'results'),
            '--cwd',
            str(REPO / 'nbs'),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0
    assert "ConfigError: Unknown preset 'no-such'. Valid presets:" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    assert not (tmp_path / 'results').exists()


def test_exit_depth_and_context_of_the_model():
    m = LoopedLM(LoopedLMConfig.from_experiment(load_preset('smoke')))
    idx = torch.zeros(1, 8, dtype=torch.long)
    for k in (0, 5, 1.5):
        with pytest.raises(ValueError, match=r'exit_k must be an integer in 1..4'):
            m(idx, exit_k=k)
    with pytest.raises(ValueError, match='longer than the model.s context max_seq_len=64'):
        m(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ConfigError, match="readout.* 'batchnorm'.*choose one of rmsnorm"):
        LoopedLMConfig(readout='batchnorm')
    with pytest.raises(ConfigError, match='`K` must be > 0'):
        LoopedLMConfig(K=0)


# ---- data -------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _no_local_copy_and_no_hub(tmp_path):
    "No LOOPED_LM_DATA, the Hub switched off, and empty datasets / Hub caches (so no earlier download can answer)."
    import datasets, huggingface_hub

    with (
        mock.patch.dict(os.environ, {'LOOPED_LM_DATA': '', 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'}),
        mock.patch.object(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path / 'hf-datasets')),
        mock.patch.object(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hf-hub')),
    ):
        yield


def test_missing_data_without_network(tmp_path, monkeypatch):
    "No local copy and the Hub switched off: a `DataNotFoundError` naming both fixes, without trying the network."
    cfg = load_preset('smoke')
    with mock.patch.dict(os.environ, {'LOOPED_LM_DATA': str(tmp_path / 'nowhere')}):
        with pytest.raises(DataNotFoundError, match='does not exist. Point LOOPED_LM_DATA at a folder'):
            prepare_data(cfg, verbose=False)
    (tmp_path / 'empty').mkdir()
    with pytest.raises(DataNotFoundError, match='no complete copy of wikitext-2-v1: missing .*train.txt'):
        prepare_data(cfg, data_dir=tmp_path / 'empty', verbose=False)
    tried = []

    def no_network(*a, **k):  # (recorded, not raised: load_corpus reports any exception of `datasets` as its own)
        tried.append(a)
        raise OSError(errno.ENETUNREACH, 'the test forbids the network')

    monkeypatch.setattr(D, '_hub_reachable', no_network)
    monkeypatch.setattr(socket, 'create_connection', no_network)
    with _no_local_copy_and_no_hub(tmp_path):
        rd = tmp_path / 'run'
        with pytest.raises(DataNotFoundError) as e:
            train(cfg, rd, cache_dir=tmp_path / 'fresh-cache', progress=False)
    assert tried == []  # it failed fast: the Hub is off, so the network was not even tried
    assert 'set LOOPED_LM_DATA (or pass data_dir=)' in str(e.value) and 'connect to the Hugging Face Hub' in str(
        e.value
    )
    assert not rd.exists()  # no half-started run, not even an empty folder


@pytest.fixture
def cache_copy(tmp_path, smoke_data):
    "A private copy of the session's smoke cache, to damage (never shorten a file the session has memory-mapped)."
    dst = tmp_path / 'cache'
    shutil.copytree(smoke_data.cache_dir.parent, dst)
    return dst


def _damage(p: Path, f):
    "Replace file `p` by `f(its bytes)`, as a new file."
    b = p.read_bytes()
    p.unlink()
    p.write_bytes(f(b))


@pytest.mark.parametrize('what', ['truncated', 'flipped byte', 'garbage sidecar', 'missing sidecar'])
def test_corrupted_token_cache_is_detected_and_rebuilt(cache_copy, smoke_data, what):
    cfg = load_preset('smoke')
    bin_path = cache_copy / cfg.corpus / f"train-{smoke_data.split_fingerprints['train']}.bin"
    side = bin_path.with_suffix('.json')
    if what == 'truncated':
        _damage(bin_path, lambda b: b[: len(b) // 3])
    if what == 'flipped byte':
        _damage(bin_path, lambda b: b[:1000] + bytes([b[1000] ^ 0xFF]) + b[1001:])
    if what == 'garbage sidecar':
        side.write_text('{"format": 1, "n_tok')
    if what == 'missing sidecar':
        side.unlink()
    with pytest.warns(UserWarning, match=f'Token cache {bin_path} is incomplete or corrupt: .*Rebuilding it'):
        td = prepare_data(cfg, cache_dir=cache_copy, verbose=False)
    assert (
        td.built == ('train',)
        and np.array_equal(td.train, smoke_data.train)
        and td.fingerprint == smoke_data.fingerprint
    )


def test_corrupted_tokenizer_is_retrained(cache_copy, smoke_data):
    cfg = load_preset('smoke')
    tp = tokenizer_path(cache_copy, cfg.corpus, cfg.vocab_size, cfg.max_train_lines)
    _damage(tp, lambda b: b[: len(b) // 2])
    with pytest.warns(UserWarning, match='is unreadable .*training it again'):
        td = prepare_data(cfg, cache_dir=cache_copy, verbose=False)
    assert td.tokenizer_trained and td.fingerprint == smoke_data.fingerprint and td.built == ()


# ---- checkpoints and token data of a run ----------------------------------------------------------------------


@pytest.fixture(scope='module')
def paused_run(tmp_path_factory, smoke_data):
    "A smoke run stopped after 10 steps, with its checkpoint: the pristine copy the tests below damage copies of."
    rd = tmp_path_factory.mktemp('paused') / 'run'
    train(load_preset('smoke', ckpt_every=10), rd, data=smoke_data, max_steps=10, progress=False)
    return rd


@pytest.fixture
def run_copy(paused_run, tmp_path):
    rd = tmp_path / 'run'
    shutil.copytree(paused_run, rd)
    return rd


def _files(rd):
    return {str(p.relative_to(rd)): p.read_bytes() for p in rd.rglob('*') if p.is_file()}


@pytest.mark.parametrize(
    'what,says',
    [
        ('truncated weights', 'is a damaged checkpoint: .*model.safetensors has SHA-256'),
        ('garbage state', 'is a damaged checkpoint: .*state.pt has SHA-256'),
        ('truncated state', 'is a damaged checkpoint: .*state.pt has SHA-256'),
        ('missing checkpoint', 'missing or incomplete'),
    ],
)
def test_corrupted_checkpoint(run_copy, smoke_data, what, says):
    ck = run_copy / 'ckpt-000010'
    if what == 'truncated weights':
        _damage(ck / 'model.safetensors', lambda b: b[: len(b) // 2])
    if what == 'garbage state':
        (ck / 'state.pt').write_bytes(b'not a checkpoint')
    if what == 'truncated state':
        _damage(ck / 'state.pt', lambda b: b[: len(b) // 2])
    if what == 'missing checkpoint':
        shutil.rmtree(ck)
    before = _files(run_copy)
    with pytest.raises(RunDirError, match=says) as e:
        train(load_preset('smoke', ckpt_every=10), run_copy, data=smoke_data, progress=False)
    assert re.search(rf'Delete (the run folder )?{re.escape(str(run_copy))} ', str(e.value)), str(e.value)
    assert _files(run_copy) == before  # nothing written: the damage stays visible, no half-resumed run
    with pytest.raises(RunDirError, match=says):
        load_run(run_copy)


def test_incompatible_checkpoint(paused_run, smoke_data):
    ck = latest_checkpoint(paused_run)
    cfg = load_preset('smoke', ckpt_every=10)
    with pytest.raises(RunDirError, match=r"was written with another config \(differs in \['K'\]\)"):
        load_checkpoint(ck, LoopedLM(LoopedLMConfig.from_experiment(cfg.replace(K=2))), cfg=cfg.replace(K=2))
    with pytest.raises(RunDirError, match='does not fit this model .*size mismatch|does not fit this model'):
        load_checkpoint(
            ck, LoopedLM(LoopedLMConfig.from_experiment(cfg.replace(vocab_size=1024)))
        )  # another vocabulary


@pytest.fixture(scope='module')
def other_tokenizer_data(smoke_data):
    "Token data of another tokenizer of the same corpus (a 400-token BPE): what a changed cache would hand a run."
    return prepare_data(load_preset('smoke', vocab_size=400), verbose=False)


def test_tokenizer_and_vocabulary_mismatch(run_copy, smoke_data, other_tokenizer_data, tmp_path):
    cfg = load_preset('smoke', ckpt_every=10)
    before = _files(run_copy)
    with pytest.raises(
        RunDirError, match=r"was trained on other token data \(fingerprint .*vocab_size 512 then, 400 now\)"
    ):
        train(cfg, run_copy, data=other_tokenizer_data, progress=False)
    (run_copy / 'data.json').unlink()
    before.pop('data.json')  # the checkpoint's own record refuses it too
    with pytest.raises(RunDirError, match=r'Checkpoint .*ckpt-000010 was trained on other token data'):
        train(cfg, run_copy, data=other_tokenizer_data, progress=False)
    assert _files(run_copy) == before
    # data that cannot fit the preset at all: a tokenizer larger than the model's vocabulary, another corpus
    rd = tmp_path / 'fresh'
    with pytest.raises(ConfigError, match='the tokenizer has 512 tokens but the model only 300'):
        train(cfg.replace(vocab_size=300), rd, data=smoke_data, progress=False)
    with pytest.raises(ConfigError, match='the token data is wikitext-2-v1 but the preset trains on wikitext-103-v1'):
        train(cfg.replace(corpus='wikitext-103-v1'), rd, data=smoke_data, progress=False)
    assert not rd.exists()  # refused before the run directory was even created


def test_a_finished_run_refuses_other_token_data(tmp_path, smoke_data, other_tokenizer_data):
    rd = tmp_path / 'run'
    train(load_preset('smoke', train_tokens=2560), rd, data=smoke_data, progress=False)  # 10 steps
    assert run_status(rd)['state'] == 'done'
    with pytest.raises(RunDirError, match='was trained on other token data'):
        train(load_preset('smoke', train_tokens=2560), rd, data=other_tokenizer_data, progress=False)


# ---- where the results go, and on what hardware ----------------------------------------------------------------


def test_unwritable_output_folder(tmp_path, smoke_data):
    blocker = tmp_path / 'a-file'
    blocker.write_text('')  # (tests run as root: chmod would not stop a write)
    for where in (blocker / 'run', Path('/proc/looped-lm-test/run')):
        with pytest.raises(RunDirError, match=f'Cannot write to the run directory {where} .*Choose a writable'):
            train(load_preset('smoke'), where, data=smoke_data, progress=False)
    with pytest.raises(
        ConfigError, match=f'out_dir {blocker}/results: {blocker} is a file, not a folder. Pass a folder path'
    ):
        run_ablation('smoke', out_dir=blocker / 'results')


def test_gpu_only_options_without_a_gpu(tmp_path, monkeypatch, smoke_data):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    rd = tmp_path / 'run'
    for cfg, says in [
        (load_preset('smoke', device='cuda'), "device='cuda' but no GPU is visible"),
        (
            load_preset('paper-44m'),
            r"no GPU is visible. Run on a GPU machine, or override device='cpu' \(e.g. `--set device=cpu`\)",
        ),
    ]:
        with pytest.raises(ConfigError, match=says):
            train(cfg, rd, data=smoke_data, progress=False)
    assert not rd.exists()  # refused before the run directory was even created
    with pytest.raises(ConfigError, match='no GPU is visible'):
        check_params('smoke', device='cuda', out_dir=tmp_path / 'out')
    with pytest.raises(ConfigError, match='no GPU is visible'):
        run_ablation('paper-44m', out_dir=tmp_path / 'out')
    assert not (tmp_path / 'out').exists()
