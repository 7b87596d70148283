"""The Hub path of `load_corpus`, offline: `load_dataset('Salesforce/wikitext', corpus)` with no local copy.

A tiny WikiText-103 is written in the Hub repository's own layout: a huggingface_hub cache snapshot
`datasets--Salesforce--wikitext/{refs/main, snapshots/<commit>/README.md, snapshots/<commit>/wikitext-103-raw-v1/
{train-0000X-of-00002, validation-00000-of-00001, test-00000-of-00001}.parquet}` with a `text` column, as the
repository stores it since its conversion to parquet.

What the installed `datasets` (5.x) reads offline is not that snapshot: with HF_HUB_OFFLINE=1, `load_dataset` of a Hub
repository skips the Hub module (it needs the API to resolve the data files) and falls back to the *prepared* cache a
previous online load left in `HF_DATASETS_CACHE`: `Salesforce___wikitext/<config>/0.0.0/<commit>/wikitext-<split>.arrow`
plus `dataset_info.json`. The fixture therefore prepares that cache the way the online load does (datasets' parquet
builder over the snapshot's parquet files, dataset name `wikitext`, hash = the commit) and then only `load_corpus`
runs, offline. Not tested here: the online download itself (resolving the README's configs and the files through the
Hub's API), which needs the network.
"""

import shutil
from pathlib import Path

import pytest

CONFIG = 'wikitext-103-raw-v1'
COMMIT = 'b08601e04326c79dfdd32d625aee71d232d685c3'  # the commit that converted the repository to parquet
ROWS = {  # WikiText's shape: blank rows around ' = Title = ' rows, then paragraphs ending in '\n'
    'train': ['', ' = Alpha = \n', '', ' the cat sat on the mat . \n', '', ' = = Beta = = \n', '', ' a dog ran . \n']
    + ['', ' = Gamma = \n', '', ' café and naïve words , 12 @,@ 000 . \n', ' the cat ran . \n'],
    'validation': ['', ' = Delta = \n', '', ' the dog sat . \n'],
    'test': ['', ' = Epsilon = \n', '', ' a cat sat on a dog . \n'],
}
SHARDS = {'train': 2, 'validation': 1, 'test': 1}  # the repository's shard counts for this config


def write_hub_snapshot(hub_cache: Path) -> Path:
    "The tiny corpus as huggingface_hub's cache of Salesforce/wikitext at COMMIT; returns the config's folder."
    import pyarrow as pa, pyarrow.parquet as pq

    repo = hub_cache / 'datasets--Salesforce--wikitext'
    snap = repo / 'snapshots' / COMMIT
    for split, rows in ROWS.items():
        n = SHARDS[split]
        per = -(-len(rows) // n)
        for i in range(n):
            path = snap / CONFIG / f'{split}-{i:05d}-of-{n:05d}.parquet'
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({'text': rows[i * per : (i + 1) * per]}), path)
    (repo / 'refs').mkdir(parents=True)
    (repo / 'refs' / 'main').write_text(COMMIT)
    card = ''.join(f'  - split: {s}\n    path: {CONFIG}/{s}-*\n' for s in ROWS)
    (snap / 'README.md').write_text(f'---\nconfigs:\n- config_name: {CONFIG}\n  data_files:\n{card}---\n# WikiText\n')
    return snap / CONFIG


def prepare_datasets_cache(home: Path, work: Path) -> Path:
    "What an online `load_dataset('Salesforce/wikitext', CONFIG)` leaves in `home`/datasets, built from the snapshot."
    from datasets.packaged_modules.parquet.parquet import Parquet
    from datasets.utils import disable_progress_bars, enable_progress_bars

    config_dir = home / 'hub' / 'datasets--Salesforce--wikitext' / 'snapshots' / COMMIT / CONFIG
    files = {s: sorted(str(p) for p in config_dir.glob(f'{s}-*.parquet')) for s in ROWS}
    builder = Parquet(cache_dir=str(work), config_name=CONFIG, data_files=files, hash=COMMIT, dataset_name='wikitext')
    disable_progress_bars()
    try:
        builder.download_and_prepare()
    finally:
        enable_progress_bars()
    # online, the builder also gets repo_id='Salesforce/wikitext' (hence the namespace folder) and its config from the
    # README (hence no data-files suffix on the config folder); both only name the folder, so place it there
    dest = home / 'datasets' / 'Salesforce___wikitext' / CONFIG / '0.0.0' / COMMIT
    shutil.copytree(builder.cache_dir, dest)
    return dest


@pytest.fixture
def hub_home(tmp_path, monkeypatch):
    "An offline HF_HOME in `tmp_path` holding the Hub snapshot; no local copy of the corpus is configured."
    import datasets.config, huggingface_hub.constants

    home = tmp_path / 'hf'
    monkeypatch.delenv('LOOPED_LM_DATA', raising=False)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    monkeypatch.setenv('HF_HOME', str(home))
    # both libraries read these paths at import time: point the live values at the temporary home too
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', home / 'datasets')
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(home / 'hub'))
    write_hub_snapshot(home / 'hub')
    return home


def test_snapshot_alone_is_not_enough_offline(hub_home):
    "With only the Hub snapshot cached, offline loading is a DataNotFoundError that names the fix (datasets 5.x)."
    from looped_lm.training.text import DataNotFoundError, load_corpus

    with pytest.raises(DataNotFoundError, match='LOOPED_LM_DATA') as e:
        load_corpus(CONFIG, verbose=False)
    print(str(e.value).splitlines()[0])


def test_hub_cache_loads_offline_in_order(hub_home, tmp_path):
    "`load_corpus` reads the prepared Hub cache offline: every split, every row in order, blank rows kept."
    from looped_lm.training.text import SPLITS, iter_rows, load_corpus

    prepare_datasets_cache(hub_home, tmp_path / 'build')
    ds = load_corpus(CONFIG, verbose=False)
    assert set(ds) == set(SPLITS)
    for s in SPLITS:
        assert ds[s].column_names == ['text']
        assert ds[s]['text'][:] == ROWS[s], s  # shard order kept, blank rows ('') kept
        assert list(iter_rows(ds[s])) == [r if r.strip() else '' for r in ROWS[s]]
    print({s: len(ds[s]) for s in SPLITS})


def test_prepare_data_tokenizes_the_hub_copy(hub_home, tmp_path):
    "`prepare_data` on the smoke recipe with corpus wikitext-103-raw-v1 tokenizes the Hub copy, then reads its cache."
    from looped_lm.core.config import load_preset
    from looped_lm.training.data import prepare_data
    from looped_lm.training.text import SPLITS

    prepare_datasets_cache(hub_home, tmp_path / 'build')
    cfg = load_preset('smoke', corpus=CONFIG)
    td = prepare_data(cfg, cache_dir=tmp_path / 'tokens', verbose=False)
    assert td.corpus == CONFIG and td.source.startswith('hub-') and set(td.built) == set(SPLITS)
    kept = {s: [r for r in ROWS[s] if r.strip()] for s in SPLITS}
    for s in SPLITS:
        assert len(td.split(s)) > 0
        assert td.n_bytes[s] == sum(len(r.encode()) for r in kept[s])  # the BPE stream is the non-blank rows
        text = td.tokenizer.decode([int(i) for i in td.split(s) if i != td.eot_id])
        assert text == ''.join(kept[s])  # byte-level BPE: the ids decode back to exactly those rows
    assert int((td.train == td.eot_id).sum()) == 2  # one EOT before each article (Alpha, Gamma; Beta is a section)
    again = prepare_data(cfg, cache_dir=tmp_path / 'tokens', verbose=False)
    assert again.built == () and not again.tokenizer_trained and again.fingerprint == td.fingerprint
    print(td)
