"""Exact resume and determinism.

A run killed at any instant (SIGKILL, in a real subprocess: mid-run, or in a fresh run's first instants), or stopped
in the middle of writing a checkpoint, resumes from its last complete checkpoint when the same command is run again,
and ends bit-identical — weights, optimizer state, every metrics record but the timing fields — to a run that was never
interrupted. Two runs of the same preset and seed are identical; another seed is not.
"""

import os, signal, subprocess, time, warnings
from pathlib import Path
import pytest
import looped_lm.training.rundir as T  # the checkpoint writer's module: its save_model and write_atomic are patched
from looped_lm.core.config import load_preset
from looped_lm.training.train import train
from looped_lm.training.rundir import read_metrics, run_status
from looped_lm.training.rundir import latest_checkpoint
from _util import train_cmd, train_subprocess, records, assert_same_run

OV = dict(ckpt_every=10)  # smoke: 96 steps, a train record every 5 steps, a checkpoint every 10
STEPS = load_preset('smoke', **OV).steps


@pytest.fixture(scope='module')
def reference(tmp_path_factory, smoke_data):
    "An uninterrupted run of the smoke preset, trained by the command line the kill test uses."
    rd = tmp_path_factory.mktemp('reference') / 'run'
    train_subprocess(rd, **OV)
    assert run_status(rd)['state'] == 'done' and run_status(rd)['step'] == STEPS
    return rd


def _ckpt_step(rd):
    return int(latest_checkpoint(rd).name.split('-')[1])


@pytest.mark.slow
def test_sigkill_resume_is_bit_identical(reference, tmp_path):
    rd = tmp_path / 'run'
    for kill_after in (25, 62):  # two kills: the second one hits an already-resumed run
        log = open(tmp_path / f'stderr-{kill_after}.txt', 'w')
        p = subprocess.Popen(train_cmd(rd, **OV), stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path)
        deadline = time.time() + 240
        while True:
            err = tmp_path / f'stderr-{kill_after}.txt'
            assert p.poll() is None, f"the run ended (rc={p.returncode}) before the kill: {err.read_text()[-2000:]}"
            assert time.time() < deadline, 'the run made no progress'
            steps = [r['step'] for r in read_metrics(rd, 'train')]
            if steps and steps[-1] >= kill_after:
                break
            time.sleep(0.005)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        log.close()
        assert p.returncode == -signal.SIGKILL
        # killed mid-run: past a checkpoint, not finished, status still `running`
        assert run_status(rd)['state'] == 'running'
        assert kill_after - 5 <= _ckpt_step(rd) < STEPS, _ckpt_step(rd)
        assert max(r['step'] for r in read_metrics(rd)) < STEPS
    train_subprocess(rd, **OV)  # the same command again: resumes and finishes
    assert_same_run(rd, reference)
    assert sorted(p.name for p in rd.iterdir() if 'ckpt' in p.name) == [
        f'ckpt-{STEPS:06d}'
    ]  # no stray checkpoint folders


@pytest.mark.slow
@pytest.mark.parametrize('first', ['.lock', 'config.json', 'metrics.jsonl'])
def test_a_fresh_run_killed_in_its_first_instants_reruns_to_the_same_run(first, reference, tmp_path):
    "SIGKILL as soon as the fresh run's lock, its identity or its first record exists: the same command finishes it."
    rd = tmp_path / 'run'
    p = subprocess.Popen(train_cmd(rd, **OV), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.time() + 240
    while not (rd / first).exists():
        assert p.poll() is None, f"the run ended (rc={p.returncode}) before {first} existed"
        assert time.time() < deadline, f'{first} never appeared'
        time.sleep(0.001)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL and run_status(rd).get('state') != 'done'
    train_subprocess(rd, **OV)  # the same command again
    assert_same_run(rd, reference)


class Killed(BaseException):
    "Stands for a kill at one precise instant (a BaseException, so nothing on the way catches it)."


def test_interrupted_checkpoint_write_keeps_the_previous_one(reference, tmp_path, smoke_data, monkeypatch):
    cfg, rd = load_preset('smoke', **OV), tmp_path / 'run'
    # 1. killed while writing the weights of checkpoint 30: a half-written file in the temporary folder
    real_save = T.save_model

    def save_half(model, path):
        if '000030' in path:
            Path(path).write_bytes(b'\0' * 100)
            raise Killed()
        real_save(model, path)

    monkeypatch.setattr(T, 'save_model', save_half)
    with pytest.raises(Killed):
        train(cfg, rd, data=smoke_data, progress=False)
    assert latest_checkpoint(rd).name == 'ckpt-000020'
    monkeypatch.setattr(T, 'save_model', real_save)
    # 2. killed after checkpoint 50 is complete but before `latest` names it
    real_write = T.write_atomic

    def write_no_latest(path, text):
        if Path(path).name == 'latest' and text == 'ckpt-000050':
            raise Killed()
        real_write(path, text)

    monkeypatch.setattr(T, 'write_atomic', write_no_latest)
    with pytest.raises(Killed):
        train(cfg, rd, data=smoke_data, progress=False)
    assert latest_checkpoint(rd).name == 'ckpt-000040' and (rd / 'ckpt-000050' / 'state.pt').exists()
    monkeypatch.setattr(T, 'write_atomic', real_write)
    # 3. the same call again finishes, exactly as the uninterrupted run
    res = train(cfg, rd, data=smoke_data, progress=False)
    assert (res.status, res.steps) == ('done', STEPS)
    assert_same_run(rd, reference)


def test_pause_with_max_steps_and_resume(reference, tmp_path, smoke_data):
    cfg, rd = load_preset('smoke', **OV), tmp_path / 'run'
    r = train(cfg, rd, data=smoke_data, max_steps=37, progress=False)
    assert (r.status, r.steps, latest_checkpoint(rd).name) == ('running', 37, 'ckpt-000037')
    assert not read_metrics(rd, 'eval')  # the final evaluation belongs to the end of the budget, not to a pause
    r = train(cfg, rd, data=smoke_data, progress=False)
    assert (r.status, r.steps) == ('done', STEPS)
    assert_same_run(rd, reference)


def test_same_seed_same_run_other_seed_differs(reference, tmp_path, smoke_data):
    "Same preset and seed in this process as in the reference's subprocess: identical; seed 1: different."
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        train(load_preset('smoke', **OV), tmp_path / 'a', data=smoke_data, progress=False)
    assert not [x for x in w if 'hidden norms' in str(x.message)]  # a healthy run: no overflow warning
    assert_same_run(tmp_path / 'a', reference)
    train(load_preset('smoke', seed=1, **OV), tmp_path / 'b', data=smoke_data, max_steps=5, progress=False)
    first = lambda rd: [r for r in records(rd) if r['kind'] == 'train'][0]
    assert first(tmp_path / 'b')['step'] == first(reference)['step'] == 5
    assert first(tmp_path / 'b')['loss'] != first(reference)['loss']
