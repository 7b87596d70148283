"""Checkpoints carry the SHA-256 of their files.

Each checkpoint records the content hash of its weights and its trainer state in `hashes.json` when it is written.
Resuming, `load_run` and the diagnostics (which load through `load_run`) check them first: a swapped weights file,
or a few flipped bytes in the tensor data, is a `DamagedCheckpointError` naming the file and the fix, not a run that
silently resumes to `done`, or one that "diverges" and is marked failed for good. A checkpoint without its hashes
(one written before they were recorded, too) is refused the same way. A checkpoint that cannot be written
(here: a real file-size limit, which safetensors reports as its own error type) is a `CheckpointWriteError`, and the
previous checkpoint still loads.
"""

import hashlib, json, shutil, subprocess, sys
from pathlib import Path
import pytest, torch
from looped_lm.core.config import load_preset
from looped_lm.measure.diagnostics import diagnose_run
from looped_lm.training.train import train
from looped_lm.training.rundir import load_run
from looped_lm.training.rundir import RunDirError, run_status
from looped_lm.training.rundir import DamagedCheckpointError, latest_checkpoint, verify_checkpoint

pytestmark = pytest.mark.corpus  # the runs train on the smoke preset's WikiText-2 tokens
CFG = load_preset('smoke', ckpt_every=10)


@pytest.fixture(scope='module')
def paused(tmp_path_factory, smoke_data):
    "A smoke run paused after 10 steps (checkpoint ckpt-000010), and the same for seed 1: pristine copies."
    root = tmp_path_factory.mktemp('paused')
    for name, seed in (('run', 0), ('other-seed', 1)):
        train(CFG.replace(seed=seed), root / name, data=smoke_data, max_steps=10, progress=False)
    return root


@pytest.fixture
def run(paused, tmp_path):
    rd = tmp_path / 'run'
    shutil.copytree(paused / 'run', rd)
    return rd


def _files(rd) -> dict:
    return {str(p.relative_to(rd)): p.read_bytes() for p in rd.rglob('*') if p.is_file() and p.name != '.lock'}


def _flip_tensor_bytes(p: Path, n=64):
    "Flip `n` bytes in the middle of the tensor data of the safetensors file `p` (its header left intact)."
    b = bytearray(p.read_bytes())
    start = 8 + int.from_bytes(b[:8], 'little')  # 8 bytes of header length, the JSON header, then the data
    mid = start + (len(b) - start) // 2
    for i in range(mid, mid + n):
        b[i] ^= 0xFF
    p.write_bytes(bytes(b))


def _refused_alike(rd, smoke_data, says):
    "Resuming, `load_run` and `diagnose_run` all raise the same DamagedCheckpointError, and write nothing."
    before = _files(rd)
    for call in (
        lambda: train(CFG, rd, data=smoke_data, progress=False),
        lambda: load_run(rd),
        lambda: diagnose_run(rd, smoke_data, max_batches=1),
    ):
        with pytest.raises(DamagedCheckpointError, match=says) as e:
            call()
        msg = str(e.value)
        assert isinstance(e.value, RunDirError) and 'is a damaged checkpoint' in msg, msg
        assert f'Delete the run folder {rd} and run the same command again' in msg, msg
    assert _files(rd) == before and run_status(rd)['state'] == 'running'  # not marked failed, not half-resumed


def test_every_checkpoint_records_its_hashes(run):
    ck = latest_checkpoint(run)
    hashes = json.loads((ck / 'hashes.json').read_text())
    assert sorted(hashes) == ['model.safetensors', 'state.pt']
    for name, sha in hashes.items():
        assert sha == hashlib.sha256((ck / name).read_bytes()).hexdigest(), name
    assert verify_checkpoint(ck) == hashes


def test_swapped_weights_are_refused(run, paused, smoke_data):
    "Weights of the same shapes from another run (seed 1): before hashes, this resumed to `done` without a word."
    weights = 'ckpt-000010/model.safetensors'
    shutil.copyfile(paused / 'other-seed' / weights, run / weights)
    _refused_alike(run, smoke_data, r'ckpt-000010/model.safetensors has SHA-256')


def test_flipped_tensor_bytes_are_refused_not_a_divergence(run, smoke_data):
    "64 flipped bytes in the weights: before hashes, the run 'diverged', was marked failed ('lower lr') for good."
    _flip_tensor_bytes(run / 'ckpt-000010' / 'model.safetensors')
    _refused_alike(run, smoke_data, r'ckpt-000010/model.safetensors has SHA-256')


def test_flipped_state_bytes_are_refused(run, smoke_data):
    p = run / 'ckpt-000010' / 'state.pt'
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))
    _refused_alike(run, smoke_data, r'ckpt-000010/state.pt has SHA-256')


def test_lost_or_garbled_hashes_are_refused(run, smoke_data):
    h = run / 'ckpt-000010' / 'hashes.json'
    h.write_text('{"model.safetensors": ')
    _refused_alike(run, smoke_data, 'its hashes.json is unreadable')
    h.unlink()  # a checkpoint of the current format without its hashes is not taken for an old one
    _refused_alike(run, smoke_data, 'hashes.json is missing')


def test_a_checkpoint_from_before_hashes_is_refused_with_the_fix(run, smoke_data):
    "A checkpoint from before hashes (no hashes.json, no `format`): refused like a damaged one, nothing written."
    ck = run / 'ckpt-000010'
    state = torch.load(ck / 'state.pt', weights_only=False)
    state.pop('format')
    torch.save(state, ck / 'state.pt')
    (ck / 'hashes.json').unlink()
    _refused_alike(run, smoke_data, 'hashes.json is missing')
    assert not (ck / 'hashes.json').exists()


# `python -c LIMITED run_dir limit`: train on, with files larger than `limit` bytes refused by the kernel (EFBIG)
LIMITED = """
import resource, signal, sys
from looped_lm.core.config import load_preset
from looped_lm.training.train import train_cli
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
train_cli(['smoke', sys.argv[1], '--set', 'ckpt_every=10'])
"""


@pytest.mark.slow
def test_a_real_safetensors_write_failure_is_a_checkpoint_write_error(run, smoke_data):
    "The weights file outgrows a real file-size limit: safetensors raises its own error, not an OSError."
    size = (run / 'ckpt-000010' / 'model.safetensors').stat().st_size
    p = subprocess.run(
        [sys.executable, '-c', LIMITED, str(run), str(size // 2)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('looped-lm-train: CheckpointWriteError: '), p.stderr[-3000:]
    assert '.ckpt-000020.' in lines[0] and 'model.safetensors' in lines[0] and 'File too large' in lines[0], lines[0]
    assert 'The previous checkpoint is kept' in lines[0], lines[0]
    # the state stays sound: the previous checkpoint is the latest, it verifies and loads, no temporary folder is left
    assert latest_checkpoint(run).name == 'ckpt-000010' and not list(run.glob('.ckpt-*'))
    verify_checkpoint(latest_checkpoint(run))
    assert load_run(run)[0] == CFG
    assert train(CFG, run, data=smoke_data, progress=False).status == 'done'  # no limit: the same call finishes
