"""Shared set-up of the test suite (`pytest -q tests`).

- the local WikiText copy: `$LOOPED_LM_DATA`, else `../shared/data/wikitext` beside the repository. Only the tests
  marked `corpus` read it — every test that uses the `smoke_data` fixture is marked so here, the others that read it
  carry the marker themselves — and each of them fails at once, naming the folder, when it is missing.
  `pytest -m "not corpus"` runs the rest, which need no corpus at all;
- the Hugging Face Hub is off: nothing is downloaded;
- a fresh token cache (`$LOOPED_LM_CACHE`) for the whole session, deleted at the end;
- `slow`: the tests that take 4 s or more (measured with `pytest --durations=0`); the quick tier is
  `pytest -m "not slow" tests`, the full suite (the README's command) runs every test;
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


def pytest_configure(config):
    "Register the `corpus` and `slow` markers (pyproject.toml's pytest settings do not list them)."
    config.addinivalue_line('markers', 'corpus: the test reads the local WikiText-2 copy in $LOOPED_LM_DATA')
    config.addinivalue_line(
        'markers',
        'slow: takes 4 s or more on 2 idle cores (processes, training, jobs); `pytest -m "not slow" tests` leaves '
        'them out for a quick answer, the README\'s test command runs them',
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    "Mark `corpus` every test that uses `smoke_data` (directly or through another fixture), before `-m` selects."
    for item in items:
        if 'smoke_data' in getattr(item, 'fixturenames', ()):
            item.add_marker(pytest.mark.corpus)


def missing_corpus() -> list:
    "The split files of the local WikiText-2 copy that are not on disk."
    corpus = Path(os.environ['LOOPED_LM_DATA']) / 'wikitext-2-v1'
    return [str(corpus / f'{s}.txt') for s in ('train', 'validation', 'test') if not (corpus / f'{s}.txt').is_file()]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    "A `corpus` test fails at once, with the fix, when the local WikiText-2 copy is not there."
    if item.get_closest_marker('corpus') and (missing := missing_corpus()):
        pytest.fail(
            f"This test reads the local WikiText-2 copy, which is missing ({', '.join(missing)}). "
            "Set LOOPED_LM_DATA to the folder that holds wikitext-2-v1/, or run only the tests that need no corpus: "
            "pytest -m 'not corpus'.",
            pytrace=False,
        )


@pytest.fixture(scope='session', autouse=True)
def test_env():
    "Points LOOPED_LM_CACHE at a fresh folder for the session, and uses one thread."
    import torch

    torch.set_num_threads(1)
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
    "The smoke preset's token data, built once per session in the session's cache (the test is marked `corpus`)."
    from looped_lm.core.config import load_preset
    from looped_lm.training.data import prepare_data

    return prepare_data(load_preset('smoke'), verbose=False)
