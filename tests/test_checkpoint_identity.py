"""A checkpoint is what its folder says: its recorded step matches its name, and a finished run is read only
from its last checkpoint; `lock_wait` is checked with the other parameters, before any work."""

import shutil
import pytest
import torch
import looped_lm as ll
from looped_lm.core.config import ConfigError, load_preset
from looped_lm.training.rundir import DamagedCheckpointError, latest_checkpoint, load_run, run_status
from looped_lm.training.train import train
from looped_lm.measure.diagnostics import diagnose_run


@pytest.fixture(scope='module')
def finished(tmp_path_factory, smoke_data):
    "A finished smoke run of 12 steps, checkpointed every 4 (its older checkpoints are dropped as it goes)."
    cfg = load_preset('smoke', train_tokens=12 * 8 * 32, ckpt_every=4)
    run_dir = tmp_path_factory.mktemp('finished') / 'run'
    train(cfg, run_dir, data=smoke_data, progress=False)
    assert run_status(run_dir)['state'] == 'done' and latest_checkpoint(run_dir).name == 'ckpt-000012'
    return run_dir


def test_a_finished_run_pointed_at_another_checkpoint_is_refused(finished, tmp_path, smoke_data):
    run = tmp_path / 'run'
    shutil.copytree(finished, run)
    shutil.copytree(run / 'ckpt-000012', run / 'ckpt-000008')  # a restored backup's older checkpoint
    (run / 'latest').write_text('ckpt-000008')
    for read in (
        lambda: latest_checkpoint(run),
        lambda: load_run(run),
        lambda: ll.from_run(run),
        lambda: diagnose_run(run, smoke_data, max_batches=1),
    ):
        with pytest.raises(DamagedCheckpointError, match='finished at step 12'):
            read()


def test_a_checkpoint_under_another_name_is_refused(finished, tmp_path):
    run = tmp_path / 'run'
    shutil.copytree(finished, run)
    (run / 'ckpt-000012').rename(run / 'ckpt-000010')
    (run / 'latest').write_text('ckpt-000010')
    (run / 'status.json').write_text('{"state": "running", "step": 10}')  # as if it had stopped at step 10
    with pytest.raises(DamagedCheckpointError, match='holds step 12, its name says step 10'):
        load_run(run)


@pytest.mark.parametrize('bad', ['soon', -1, float('nan'), None])
def test_lock_wait_is_checked_before_any_work(bad, tmp_path, monkeypatch):
    import looped_lm.studies.ablation as A

    def spent(*a, **kw):
        raise AssertionError('work started before lock_wait was checked')

    monkeypatch.setattr(A, 'prepare_data', spent)
    with pytest.raises(ConfigError, match='lock_wait must be the seconds'):
        ll.run_ablation('smoke', out_dir=tmp_path / 'study', lock_wait=bad)
    assert not (tmp_path / 'study').exists()


def test_a_folder_with_no_checkpoint_and_no_records_is_empty(tmp_path, smoke_data):
    "What the old order left after a kill in a run's first seconds (records file, no config): rerunning trains."
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'metrics.jsonl').write_text('')
    (run / 'status.json').write_text('{"state": "running", "step": 0}')
    cfg = load_preset('smoke', train_tokens=4 * 8 * 32)
    assert train(cfg, run, data=smoke_data, progress=False).status == 'done'


def test_a_run_interrupted_at_once_writes_its_identity_first(tmp_path, smoke_data, monkeypatch):
    "Ctrl-C while the model is built: the folder already says whose run it is, and the same command finishes it."
    import looped_lm.training.train as T

    cfg, run = load_preset('smoke', train_tokens=4 * 8 * 32), tmp_path / 'run'
    real = T.restore_model

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(T, 'restore_model', interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run, data=smoke_data, progress=False)
    assert (run / 'config.json').is_file() and (run / 'data.json').is_file()
    monkeypatch.setattr(T, 'restore_model', real)
    assert train(cfg, run, data=smoke_data, progress=False).status == 'done'


def test_diagnostics_refuse_token_data_that_is_not_the_runs(finished, tmp_path, smoke_data):
    "Another tokenizer's ids of the same vocabulary size are refused before any measurement, and never cached."
    import dataclasses
    from looped_lm.training.rundir import RunDirError

    run = tmp_path / 'run'
    shutil.copytree(finished, run)
    other = dataclasses.replace(smoke_data, fingerprint='another-tokenizer')
    with pytest.raises(RunDirError, match='was trained on other token data'):
        diagnose_run(run, other, max_batches=1)
    assert not (run / 'diagnostics.json').exists()
    rep = diagnose_run(run, smoke_data, max_batches=1)
    assert rep['data'] == smoke_data.fingerprint


def test_a_resume_by_other_training_code_is_refused_or_recorded(tmp_path, smoke_data, monkeypatch):
    "A run paused by one version of the trainer is not finished by another unless asked, and then it says so."
    import json
    from looped_lm.training.rundir import CODE_OVERRIDE, RunDirError, record_hashes

    cfg, run = load_preset('smoke', train_tokens=8 * 8 * 32, ckpt_every=4), tmp_path / 'run'
    assert train(cfg, run, data=smoke_data, progress=False, max_steps=4).status == 'running'
    code, ck = json.loads((run / 'code.json').read_text()), latest_checkpoint(run)
    other = dict(code, source='0123456789abcdef', commit='an older commit')  # as an older trainer wrote it
    (run / 'code.json').write_text(json.dumps(other))
    state = torch.load(ck / 'state.pt', weights_only=False)
    torch.save(dict(state, code={k: other[k] for k in ('version', 'source', 'commit')}), ck / 'state.pt')
    record_hashes(ck)  # the checkpoint's own record of its code: what a resume compares
    with pytest.raises(RunDirError, match='by other training code .* set LOOPED_LM_RESUME_OTHER_CODE=1'):
        train(cfg, run, data=smoke_data, progress=False)
    assert latest_checkpoint(run).name == 'ckpt-000004'  # nothing was touched
    monkeypatch.setenv(CODE_OVERRIDE, '1')
    assert train(cfg, run, data=smoke_data, progress=False).status == 'done'
    rec = json.loads((run / 'code.json').read_text())
    assert rec['source'] == code['source'] and rec['earlier'][-1]['until_step'] == 4
