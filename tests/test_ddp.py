"""Data-parallel training: `torchrun` + PyTorch DDP through the same `train` entry point.

Under `torchrun` every rank draws the same global batch and trains on its own contiguous slice, DDP averages the
gradients, and rank 0 alone writes the run directory. So 2 ranks with global batch B must train the same model
as 1 process with batch B: the same losses, gradient norms, evaluation and final weights, up to float rounding
(the gradient is summed in another order). On CPU the ranks talk through gloo.

This file is also the training script both runs execute: `python tests/test_ddp.py RUN_DIR OVERRIDES_JSON` (one
process) and `torchrun --standalone --nproc_per_node 2 tests/test_ddp.py RUN_DIR OVERRIDES_JSON` (two ranks).
"""

import json, os, subprocess, sys
from pathlib import Path
import pytest

# smoke preset, 12 steps of a global batch of 8 sequences: a train record every 3 steps, a checkpoint every 6;
# chunked readout CE (2 chunks per rank, 4 in the single process)
OV = dict(train_tokens=12 * 8 * 32, log_every=3, ckpt_every=6, eval_batches=2, ce_chunk=64)


def _env():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')
    }
    return {**env, 'OMP_NUM_THREADS': '1', 'PYTHONWARNINGS': 'ignore'}


def _run(cmd, tmp_path, timeout=180):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=_env())
    return p


def _single(run_dir, tmp_path, **ov):
    return _run([sys.executable, __file__, str(run_dir), json.dumps({**OV, **ov})], tmp_path)


def _ddp(run_dir, tmp_path, nproc=2, **ov):
    return _run(
        [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            f'--nproc_per_node={nproc}',
            __file__,
            str(run_dir),
            json.dumps({**OV, **ov}),
        ],
        tmp_path,
    )


@pytest.mark.slow
def test_two_ranks_train_like_one_process(smoke_data, tmp_path):
    import torch
    from safetensors.torch import load_file
    from looped_lm.training.rundir import read_metrics, run_status
    from looped_lm.training.rundir import latest_checkpoint

    one, two = tmp_path / 'one', tmp_path / 'two'
    p = _single(one, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _ddp(two, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    # both ranks ran, in a world of 2
    worlds = sorted(json.loads(f.read_text())['rank'] for f in two.glob('world-*.json'))
    assert worlds == [0, 1], worlds
    assert all(json.loads(f.read_text())['world_size'] == 2 for f in two.glob('world-*.json'))
    assert json.loads((one / 'world-0.json').read_text())['world_size'] == 1
    # the same run, record by record: losses (averaged over the ranks before they are logged), gradient norm (of the
    # all-reduced gradient), learning rate, evaluation. Not compared: `objective`, `norm`, `radial` and
    # `overflow_margin`, which the trainer computes on rank 0's half of the batch only.
    for rd in (one, two):
        assert run_status(rd)['state'] == 'done' and run_status(rd)['step'] == 12
    ra, rb = read_metrics(one), read_metrics(two)
    assert (
        [(r['kind'], r['step']) for r in ra]
        == [(r['kind'], r['step']) for r in rb]
        == [('train', s) for s in (3, 6, 9, 12)] + [('eval', 12)]
    )  # rank 0 alone wrote: no duplicates
    for a, b in zip(ra, rb):
        assert a['loss'] == pytest.approx(b['loss'], rel=1e-5, abs=1e-6), (a['step'], a['loss'], b['loss'])
        if a['kind'] == 'train':
            grads = (a['step'], a['grad_norm'], b['grad_norm'])
            assert a['grad_norm'] == pytest.approx(b['grad_norm'], rel=1e-5), grads
            assert a['lr'] == b['lr']
    assert ra[0]['loss'][-1] - ra[-2]['loss'][-1] > 0.1  # it trained
    wa, wb = (load_file(str(latest_checkpoint(rd) / 'model.safetensors')) for rd in (one, two))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert latest_checkpoint(one).name == latest_checkpoint(two).name == 'ckpt-000012'


@pytest.mark.slow
def test_batch_that_does_not_split_is_refused(smoke_data, tmp_path):
    p = _ddp(tmp_path / 'run', tmp_path, batch_size=7)
    assert p.returncode != 0
    assert 'does not split over 2 ranks' in p.stderr, p.stderr[-3000:]


if __name__ == '__main__':  # the training script of both runs
    from looped_lm.core.config import load_preset
    from looped_lm.training.train import train
    from looped_lm.training.train import ddp_world
    import torch.distributed as dist

    run_dir, ov = Path(sys.argv[1]), json.loads(sys.argv[2])
    train(load_preset('smoke', **ov), run_dir, progress=False)
    rank, world_size = ddp_world()
    (run_dir / f'world-{rank}.json').write_text(json.dumps(dict(rank=rank, world_size=world_size)))
    if dist.is_initialized():
        dist.destroy_process_group()
