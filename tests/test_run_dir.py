"""Run-directory guarantees (Reliability II): one writer per run directory, metrics that cannot be silently
shortened, `config.json` as part of a run's identity, checkpoint writes that fail with a message naming the
file and the fix, and a command line that takes preset overrides.

Each test failed on the trainer before these guarantees (two processes both trained one directory; truncated
metrics were accepted; a run without its config was reported `done`; a full disk surfaced as a raw OSError;
`--set` and `--data_dir` did not exist).
"""

import json, os, shutil, subprocess, sys, time
import pytest, torch
from safetensors import SafetensorError
import looped_lm.training.rundir as T  # the checkpoint writer's module: its save_model is patched
from looped_lm.core.files import dir_lock
from looped_lm.core.config import load_preset
from looped_lm.training.train import train
from looped_lm.training.rundir import load_run
from looped_lm.training.rundir import read_metrics, expected_records, RunDirError
from looped_lm.training.rundir import latest_checkpoint, restore_config
from _util import assert_same_run

OV = dict(ckpt_every=10)  # smoke: 96 steps, a train record every 5 steps, a checkpoint every 10
CFG = load_preset('smoke', **OV)
CLI = 'from looped_lm.training.train import train_cli; train_cli()'  # what the `looped-lm-train` entry point runs


def cli(*args) -> list:
    return [sys.executable, '-c', CLI, *map(str, args)]


def kinds_steps(rd) -> list:
    return [(r['kind'], r['step']) for r in read_metrics(rd)]


@pytest.fixture(scope='module')
def reference(tmp_path_factory, smoke_data):
    "An uninterrupted, finished run of the smoke preset."
    rd = tmp_path_factory.mktemp('reference') / 'run'
    train(CFG, rd, data=smoke_data, progress=False)
    return rd


@pytest.fixture
def done_copy(reference, tmp_path):
    rd = tmp_path / 'run'
    shutil.copytree(reference, rd)
    return rd


# ---- 2. two processes, one run directory --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_process_on_a_run_dir_stops_naming_the_holder(tmp_path, smoke_data):
    rd, sets = (
        tmp_path / 'run',
        ['--set', 'train_tokens=400000', '--set', 'ckpt_every=20'],
    )  # 1562 steps: long enough to overlap
    a = subprocess.Popen(cli('smoke', rd, *sets), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not (rd / 'metrics.jsonl').exists() or not read_metrics(rd, 'train'):  # A holds the lock and trains
            assert a.poll() is None, a.stderr.read()[-2000:]
            assert time.time() < deadline, 'the first process made no progress'
            time.sleep(0.05)
        b = subprocess.run(cli('smoke', rd, *sets), capture_output=True, text=True, timeout=240)
        assert b.returncode != 0, b.stdout
        assert f'pid {a.pid}' in b.stderr and 'is in use by another process' in b.stderr, b.stderr[-2000:]
        assert a.poll() is None  # the first process was not disturbed
    finally:
        a.kill()
        a.wait()
    # the holder died: the lock goes with it, and the run resumes with one record per logged step, none twice
    cfg = load_preset('smoke', train_tokens=400000, ckpt_every=20)
    ck = int(latest_checkpoint(rd).name.split('-')[1])
    r = train(cfg, rd, data=smoke_data, max_steps=ck + 10, progress=False)
    assert (r.status, r.steps) == ('running', ck + 10)
    assert kinds_steps(rd) == expected_records(cfg, ck + 10)


# ---- 3. metrics that cannot be silently shortened -----------------------------------------------------------------


def test_truncated_metrics_of_a_finished_run_are_an_error(done_copy, smoke_data):
    p = done_copy / 'metrics.jsonl'
    text = p.read_text()
    lines = text.splitlines(keepends=True)
    for damaged in (''.join(lines[:-3]), text[:-40]):  # cut at a line end, then in the middle of the last record
        p.write_text(damaged)
        with pytest.raises(
            RunDirError, match=r'metrics.jsonl is incomplete: the finished run wrote 21 records.*Delete '
        ):
            read_metrics(done_copy)
        with pytest.raises(RunDirError, match='metrics.jsonl is incomplete'):
            train(CFG, done_copy, data=smoke_data, progress=False)
    p.write_text(''.join(lines[:3] + ['{"kind": "tr\n'] + lines[4:]))  # a damaged line in the middle
    with pytest.raises(
        RunDirError, match=r'metrics.jsonl, line 4, is not a metrics record: the file is damaged. Delete '
    ):
        read_metrics(done_copy, 'train')


def _paused(tmp_path, smoke_data):
    rd = tmp_path / 'paused'
    r = train(CFG, rd, data=smoke_data, max_steps=37, progress=False)
    assert (r.status, r.steps, latest_checkpoint(rd).name) == ('running', 37, 'ckpt-000037')
    return rd, (rd / 'metrics.jsonl').read_text().splitlines(keepends=True)


def test_a_paused_run_whose_metrics_lost_their_tail_is_rebuilt(tmp_path, smoke_data, reference):
    rd, lines = _paused(tmp_path, smoke_data)
    (rd / 'metrics.jsonl').write_text(''.join(l for l in lines if json.loads(l)['step'] <= 20))  # steps 25..35 lost
    with pytest.warns(UserWarning, match='lost its records after step 20 .*training that run again from step 0'):
        r = train(CFG, rd, data=smoke_data, progress=False)
    assert (r.status, r.steps) == ('done', CFG.steps)
    assert_same_run(rd, reference)  # every record, and the same weights: rebuilding is deterministic


def test_metrics_with_a_hole_or_a_second_writer_are_refused(tmp_path, smoke_data):
    rd, lines = _paused(tmp_path, smoke_data)
    p = rd / 'metrics.jsonl'
    p.write_text(''.join(l for l in lines if json.loads(l)['step'] != 10))  # a record missing in the middle
    with pytest.raises(
        RunDirError,
        match=rf"{p} does not match its checkpoint ckpt-000037 \(missing \[\('train', 10\)\]\).*Delete {rd}",
    ):
        train(CFG, rd, data=smoke_data, progress=False)
    p.write_text(''.join(lines[:3] + lines[2:]))  # a record written twice
    with pytest.raises(RunDirError, match=r"unexpected or repeated \[\('train', 15\)"):
        train(CFG, rd, data=smoke_data, progress=False)


# ---- 4. config.json is part of a run's identity ---------------------------------------------------------------------


def test_a_run_without_its_config_is_refused_alike_by_train_and_load_run(done_copy, smoke_data):
    (done_copy / 'config.json').unlink()
    for cfg in (CFG, CFG.replace(lr=2 * CFG.lr)):  # the same preset, or a changed one: neither may pass as `done`
        with pytest.raises(
            RunDirError, match='config.json is missing, so whether it was trained with this preset cannot be checked'
        ):
            train(cfg, done_copy, data=smoke_data, progress=False)
    with pytest.raises(RunDirError, match='config.json is missing') as e:
        load_run(done_copy)
    assert 'train into it first' not in str(e.value) and 'restore_config' in str(e.value)
    assert restore_config(done_copy) == CFG.to_dict()  # the documented recovery works...
    assert train(CFG, done_copy, data=smoke_data, progress=False).status == 'done'
    with pytest.raises(
        RunDirError, match=r"another config \(differs in \['lr'\]\)"
    ):  # ...and the identity check is back
        train(CFG.replace(lr=2 * CFG.lr), done_copy, data=smoke_data, progress=False)
    assert load_run(done_copy)[0] == CFG


# ---- 6. a full disk while writing a checkpoint --------------------------------------------------------------------


@pytest.mark.parametrize('where', ['weights', 'state'])
def test_disk_full_while_writing_a_checkpoint(tmp_path, smoke_data, reference, monkeypatch, where):
    rd = tmp_path / 'run'
    real_model, real_save = T.save_model, torch.save

    def full_model(model, path):  # what safetensors really raises on a full disk (not an OSError)
        if '.ckpt-000020.' in path:
            raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
        real_model(model, path)

    def full_state(obj, f, *a, **k):  # what torch.save really raises on a full disk
        if '.ckpt-000020.' in str(f):
            raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 1152 vs 1040')
        return real_save(obj, f, *a, **k)

    if where == 'weights':
        monkeypatch.setattr(T, 'save_model', full_model)
    else:
        monkeypatch.setattr(torch, 'save', full_state)
    with pytest.raises(RunDirError) as e:
        train(CFG, rd, data=smoke_data, progress=False)
    msg, f = str(e.value), 'model.safetensors' if where == 'weights' else 'state.pt'
    assert isinstance(e.value, OSError), type(e.value)
    for part in (
        f'Could not write the checkpoint file {rd}/.ckpt-000020.',
        f,
        'the disk is full',
        'The previous checkpoint is kept',
        f'free space on {rd}',
        'run the same command again',
    ):
        assert part in msg, (part, msg)
    assert latest_checkpoint(rd).name == 'ckpt-000010' and not list(rd.glob('.ckpt-*'))  # nothing half-written is left
    monkeypatch.undo()
    assert train(CFG, rd, data=smoke_data, progress=False).status == 'done'  # space freed: the same call finishes
    assert_same_run(rd, reference)


# ---- 9. the command line -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_empty_arguments(tmp_path):
    p = subprocess.run(cli('', tmp_path / 'run'), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and 'PRESET is empty; choose one of smoke, cpu' in p.stderr, p.stderr[-2000:]
    p = subprocess.run(cli('smoke', ''), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and 'RUN_DIR is empty' in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / 'run').exists()


@pytest.mark.slow
@pytest.mark.corpus
def test_cli_overrides_and_data_dir_spellings(tmp_path):
    rd = tmp_path / 'run'
    p = subprocess.run(
        cli('smoke', rd, '--set', 'train_tokens=2560', '--set', 'lr=2e-3', '--data_dir', os.environ['LOOPED_LM_DATA']),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0 and f'{rd}: done at step 10' in p.stdout, p.stderr[-2000:]
    c = json.loads((rd / 'config.json').read_text())
    assert (c['train_tokens'], c['lr'], c['name']) == (2560, 0.002, 'smoke') and isinstance(c['lr'], float)
    p = subprocess.run(
        cli('smoke', rd, '--set', 'train_tokens=2560', '--set', 'lr=2e-3', '--data-dir', os.environ['LOOPED_LM_DATA']),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0 and 'done at step 10' in p.stdout, p.stderr[
        -2000:
    ]  # the other spelling: the same run, done
    for bad, says in [
        ('lr=fast', "`lr` = 'fast' in --set is not a valid float"),
        ('lr=100', 'outside its sensible range'),
        ('learning_rate=1', 'Unknown setting'),
        ('lr', 'expected key=value'),
    ]:
        p = subprocess.run(cli('smoke', tmp_path / 'bad', '--set', bad), capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and says in p.stderr, (bad, p.stderr[-2000:])
    assert not (tmp_path / 'bad').exists()  # refused before any folder is created


def _one_line_error(p, error: str) -> str:
    "The CLI's stderr: one line `looped-lm-train: <error>: ...`, no traceback; returns it."
    assert p.returncode != 0, p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'looped-lm-train: {error}: '), p.stderr[-3000:]
    return lines[0]


def test_cli_locked_run_dir_is_one_line(tmp_path):
    "Another process holds the run directory: one line naming the holder and the fix; the holder's folder untouched."
    rd = tmp_path / 'run'
    with dir_lock(rd, 'run') as holder:  # this process holds it: the CLI is the second process
        p = subprocess.run(cli('smoke', rd), capture_output=True, text=True, timeout=120)
        line = _one_line_error(p, 'LockedError')
    assert f"pid {holder['pid']}" in line and 'is in use by another process' in line and 'Wait for it' in line, line
    assert sorted(x.name for x in rd.iterdir()) == ['.lock']


def test_cli_missing_data_is_one_line_and_leaves_no_folder(tmp_path):
    env = {**os.environ, 'LOOPED_LM_DATA': str(tmp_path / 'nowhere')}
    rd = tmp_path / 'runs' / 'run'
    p = subprocess.run(cli('smoke', rd), capture_output=True, text=True, timeout=120, env=env)
    line = _one_line_error(p, 'DataNotFoundError')
    assert f'{tmp_path / "nowhere"} (from LOOPED_LM_DATA) does not exist. Point LOOPED_LM_DATA at' in line, line
    assert not (tmp_path / 'runs').exists()  # no empty folder left behind, neither the run's nor its parent


# ---- progress you can watch ------------------------------------------------------------------------------


def test_progress_lines(tmp_path, smoke_data, capsys):
    cfg = load_preset('smoke', train_tokens=5120)  # 20 steps: a line every 2 steps
    train(cfg, tmp_path / 'quiet', data=smoke_data, progress=False)
    assert capsys.readouterr().out == ''
    train(cfg, tmp_path / 'loud', data=smoke_data, progress=True, label='perloop-rmsnorm seed 0')
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith('perloop-rmsnorm seed 0 | ')]
    assert len(lines) == 10, lines
    last = read_metrics(tmp_path / 'loud', 'train')[-1]
    assert lines[-1].startswith(
        f"perloop-rmsnorm seed 0 | step 20/20 | loss {last['loss'][-1]:.4f} | "
        f"final-loop norm {last['norm'][-1]['mean']:.4g} | "
    ), lines[-1]
    assert lines[-1].endswith(' left') and 'elapsed' in lines[-1]


def test_a_folder_where_a_json_file_should_be_is_named(tmp_path):
    "An unreadable path is never a default or a recomputed cache: the error names it and the fix."
    from looped_lm.training.rundir import RunDirError, read_json

    (tmp_path / 'status.json').mkdir()
    with pytest.raises(RunDirError, match='status.json cannot be read.*readable file'):
        read_json(tmp_path / 'status.json', {}, damaged=lambda p, e: None)
