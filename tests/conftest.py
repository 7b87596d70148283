"""Shared set-up of the test suite (`pytest -q tests`).

- the local WikiText copy: `$LOOPED_LM_DATA`, else `../shared/data/wikitext` beside the repository; it must exist;
- the Hugging Face Hub is off: nothing is downloaded;
- a fresh token cache (`$LOOPED_LM_CACHE`) for the whole session, deleted at the end;
- one CPU thread, here and in every subprocess: the models are tiny (more threads only add contention on a
  2-core machine), and bit-for-bit comparisons between processes need the same thread count.
"""

import os, shutil, tempfile
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ['LOOPED_LM_DATA'] = os.environ.get('LOOPED_LM_DATA') or str(REPO.parent / 'shared' / 'data' / 'wikitext')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ['OMP_NUM_THREADS'] = '1'
os.environ.pop('IN_TEST', None)  # nbdev-test's switch: the notebooks must behave as under papermill


@pytest.fixture(scope='session', autouse=True)
def test_env():
    "Checks the data is there, points LOOPED_LM_CACHE at a fresh folder for the session, and uses one thread."
    import torch

    torch.set_num_threads(1)
    corpus = Path(os.environ['LOOPED_LM_DATA']) / 'wikitext-2-v1'
    missing = [s for s in ('train', 'validation', 'test') if not (corpus / f'{s}.txt').is_file()]
    assert not missing, (
        f"The tests need the local WikiText-2 copy: {corpus}/{{train,validation,test}}.txt "
        f"(missing: {missing}). Set LOOPED_LM_DATA to the folder that holds wikitext-2-v1/."
    )
    cache = tempfile.mkdtemp(prefix='looped-lm-test-cache-')
    old = os.environ.get('LOOPED_LM_CACHE')
    os.environ['LOOPED_LM_CACHE'] = cache
    yield Path(cache)
    if old is None:
        os.environ.pop('LOOPED_LM_CACHE', None)
    else:
        os.environ['LOOPED_LM_CACHE'] = old
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope='session')
def smoke_data(test_env):
    "The smoke preset's token data, built once per session in the session's cache."
    from looped_lm.config import load_preset
    from looped_lm.data import prepare_data

    return prepare_data(load_preset('smoke'), verbose=False)
