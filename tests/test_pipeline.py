"""The ablation pipeline: a diverged variant is reported, not fatal; a rerun redoes nothing; a changed config is
refused.

One small study on the smoke preset: `perloop-rmsnorm` (trained) and `perloop-raw`, made to diverge by a NaN put
into its hidden state at step 2. It is a subset, so its records and tables go into its own study folder.
"""

import configparser, hashlib, json
from pathlib import Path
import pytest
import looped_lm.measure.diagnostics, looped_lm.training.train
from looped_lm.studies.ablation import check_params, run_ablation
from looped_lm.core.config import load_preset, settings_path
from looped_lm.training.train import train
from looped_lm.training.rundir import RunDirError, run_status
from _util import inject_nan

VARIANTS = ['perloop-rmsnorm', 'perloop-raw']
KW = dict(max_eval_batches=1, progress=False)  # (run_ablation makes no figures: 04e_figures's make_figures does)


def snapshot(root) -> dict:
    "path -> (mtime, sha256) of every file under `root` but the lock files (who holds a folder, not what it holds)."
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(Path(root).rglob('*'))
        if p.is_file() and 'lock' not in p.name
    }


@pytest.fixture(scope='module')
def study(tmp_path_factory, smoke_data):
    out = tmp_path_factory.mktemp('ablation')
    with pytest.MonkeyPatch.context() as mp:
        inject_nan(mp, step=2, loop=2, when=lambda m: m.config.readout == 'raw' and m.training)
        recs = run_ablation('smoke', VARIANTS, out_dir=out, **KW).records
    return out, recs, check_params('smoke', VARIANTS, out_dir=out).study_dir


@pytest.mark.slow
def test_a_diverged_variant_is_recorded_and_the_study_goes_on(study):
    out, recs, sdir = study
    by = {r['variant']: r for r in recs}
    assert {v: r['status'] for v, r in by.items()} == {'perloop-rmsnorm': 'done', 'perloop-raw': 'failed'}
    msg = by['perloop-raw']['message']
    assert 'perloop-raw-seed' in msg and 'hidden state of loop 2' in msg and 'at step 2' in msg, msg
    assert run_status(Path(by['perloop-raw']['run_dir']))['state'] == 'failed'
    assert '| perloop-raw | failed |' in (sdir / 'tables' / 'table1.md').read_text()
    assert '| perloop-rmsnorm | done | 1 |' in (sdir / 'tables' / 'table1.md').read_text()
    assert json.loads((sdir / 'records.json').read_text())[1]['status'] == 'failed'
    assert not (out / 'records.json').exists()  # a subset never writes over the main study's records
    claims = json.loads((sdir / 'claims.json').read_text())['primary']['claims']  # the paper's claims, judged
    assert {'C1', 'C2', 'C3', 'C6'} <= set(claims), sorted(claims)


def test_rerun_retrains_and_reevaluates_nothing(study, monkeypatch):
    out, recs, sdir = study
    before = snapshot(out)

    def forbidden(*a, **k):
        raise AssertionError('the rerun computed something')

    monkeypatch.setattr(looped_lm.training.train, 'get_batch', forbidden)  # no training step
    monkeypatch.setattr(looped_lm.measure.diagnostics, 'diagnose', forbidden)  # no diagnostic
    again = run_ablation(
        'smoke', VARIANTS, out_dir=out, **KW
    ).records  # (no NaN injection now: the failed run is not retried)
    assert again == recs
    after = snapshot(out)
    changed = sorted(k for k in after if after[k][1] != before.get(k, (0, None))[1])
    assert changed == [] and after.keys() == before.keys(), changed  # identical records and tables, byte for byte
    runs = {k: v for k, v in before.items() if k.startswith('runs')}
    assert {k: after[k] for k in runs} == runs  # and no file of a run was even rewritten


def test_a_changed_config_is_refused(study, tmp_path, monkeypatch):
    "The same study under a settings.ini whose smoke preset has another lr: refused before any work, nothing touched."
    out, _, _ = study
    p = configparser.ConfigParser(inline_comment_prefixes=('#', ';'))
    p.optionxform = str
    p.read(settings_path())
    p['smoke']['lr'] = str(2 * float(p['smoke']['lr']))
    with open(tmp_path / 'settings.ini', 'w') as f:
        p.write(f)
    monkeypatch.setenv('LOOPED_LM_SETTINGS', str(tmp_path / 'settings.ini'))
    before = snapshot(out / 'runs')
    with pytest.raises(RunDirError, match=r"holds a run with another config \(differs in \['lr'\]\).*delete"):
        run_ablation('smoke', VARIANTS, out_dir=out, **KW)
    with pytest.raises(RunDirError, match='another config'):  # and train() itself, on a finished run
        train(load_preset('smoke'), out / 'runs' / 'perloop-rmsnorm-seed0', progress=False)
    assert snapshot(out / 'runs') == before
