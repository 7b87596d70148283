"Helpers of the test suite: training in a subprocess, and comparing two run directories bit for bit."

import json, subprocess, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from looped_lm.training.rundir import read_metrics
from looped_lm.training.rundir import latest_checkpoint

TIMING = ('tokens_per_s', 'mfu')  # wall-clock fields: the only ones allowed to differ between two runs

# `python -c TRAIN preset overrides-json run_dir`: what a user runs, as a separate process
TRAIN = """
import json, sys
from looped_lm.core.config import load_preset
from looped_lm.training.train import train
train(load_preset(sys.argv[1], **json.loads(sys.argv[2])), sys.argv[3], progress=False)
"""


def train_cmd(run_dir, preset='smoke', **overrides) -> list:
    return [sys.executable, '-c', TRAIN, preset, json.dumps(overrides), str(run_dir)]


def train_subprocess(run_dir, preset='smoke', timeout=300, **overrides):
    "Train in a fresh Python process; raise with its stderr if it fails."
    p = subprocess.run(
        train_cmd(run_dir, preset, **overrides),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(run_dir).parent,
    )
    assert p.returncode == 0, p.stderr[-3000:]


def records(run_dir) -> list:
    "Every metrics record of a run, without the timing fields."
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run_dir)]


def weights(run_dir) -> dict:
    return load_file(str(latest_checkpoint(run_dir) / 'model.safetensors'))


def optimizer_state(run_dir) -> dict:
    return torch.load(latest_checkpoint(run_dir) / 'state.pt', weights_only=False)['optimizer']


def assert_same_tensors(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"tensor {k} differs"


def assert_same_run(a, b):
    "Two run directories hold bit-identical weights, optimizer states and metrics (timing fields aside)."
    ra, rb = records(a), records(b)
    assert len(ra) == len(rb), (len(ra), len(rb))
    for x, y in zip(ra, rb):
        assert x == y, (x, y)
    assert latest_checkpoint(a).name == latest_checkpoint(b).name
    assert_same_tensors(weights(a), weights(b))
    oa, ob = optimizer_state(a), optimizer_state(b)
    assert oa['param_groups'] == ob['param_groups']
    assert oa['state'].keys() == ob['state'].keys()
    for i in oa['state']:
        assert_same_tensors(oa['state'][i], ob['state'][i])
    assert json.loads((Path(a) / 'status.json').read_text()) == json.loads((Path(b) / 'status.json').read_text())


def inject_nan(monkeypatch, step, loop, when=lambda model: True):
    "Make loop `loop` of training step `step` (1-based) of models matching `when` put a NaN into one entry."
    from looped_lm.model.looped import LoopedLM

    real = LoopedLM.loop

    def loop_fn(self, h):
        h = real(self, h)
        if when(self):
            self._calls = getattr(self, '_calls', 0) + 1
            if self._calls == (step - 1) * self.config.K + loop:
                h = h + torch.where(torch.arange(h.numel()).view(h.shape) == 0, float('nan'), 0.0)
        return h

    monkeypatch.setattr(LoopedLM, 'loop', loop_fn)
