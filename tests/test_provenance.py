"""What made a number, with no silent holes: a report measured with other options is cached under its own key and
never read as the default one; a paused run resumes only under the training code its checkpoint records; the code
hashed for a run is every package module the trainer imports, read off the code, not a list kept by hand."""

import ast, importlib.util, json
from pathlib import Path
import pytest
import torch
from looped_lm.core.config import load_preset
from looped_lm.training.train import train
from looped_lm.training.rundir import RunDirError, TRAINING_CODE, latest_checkpoint, record_hashes
from looped_lm.measure.diagnostics import MEASURING_CODE, current_report, diagnose_run


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory, smoke_data):
    "A finished 10-step smoke run."
    rd = tmp_path_factory.mktemp('prov') / 'run'
    train(
        load_preset('smoke', train_tokens=10 * 8 * 32, log_every=5, ckpt_every=5), rd, data=smoke_data, progress=False
    )
    return rd


@pytest.mark.slow
def test_a_report_with_other_options_never_stands_for_the_default_one(smoke_run, smoke_data):
    default = diagnose_run(smoke_run, smoke_data, max_batches=5)
    small = diagnose_run(smoke_run, smoke_data, max_batches=5, subset_tokens=8192)
    assert small['norms'][-1]['n_tokens'] <= 8192 < default['norms'][-1]['n_tokens']
    again = diagnose_run(smoke_run, smoke_data, max_batches=5)  # read back, not the 8,192-token report
    assert again['norms'][-1]['n_tokens'] == default['norms'][-1]['n_tokens'] and 'options' not in again
    assert current_report(smoke_run)['norms'][-1]['n_tokens'] == default['norms'][-1]['n_tokens']
    assert small['options'] == {"subset_tokens": 8192} and 'options' not in default
    same = diagnose_run(smoke_run, smoke_data, max_batches=5, subset_tokens=40960)  # the default value: the default
    assert same['norms'][-1]['n_tokens'] == default['norms'][-1]['n_tokens'] and 'options' not in same


def _paused_run(tmp_path, smoke_data) -> Path:
    rd = tmp_path / 'paused'
    cfg = load_preset('smoke', train_tokens=20 * 8 * 32, log_every=5, ckpt_every=5)
    train(cfg, rd, data=smoke_data, max_steps=10, progress=False)
    return rd


def _rewrite_code(ckpt: Path, code):
    "The checkpoint's own record of the code that wrote it, replaced (None: removed); its hashes kept consistent."
    state = torch.load(ckpt / 'state.pt', weights_only=False)
    state.pop('code', None) if code is None else state.update(code=code)
    torch.save(state, ckpt / 'state.pt')
    record_hashes(ckpt)


@pytest.mark.parametrize('recorded', ['other code', 'no record'])
def test_a_paused_run_without_its_code_json_resumes_only_under_its_checkpoints_code(recorded, tmp_path, smoke_data):
    rd = _paused_run(tmp_path, smoke_data)
    (rd / 'code.json').unlink()  # deleted, or a run that predates it
    code = dict(version='0.0.0', source='0123456789abcdef', commit=None) if recorded == 'other code' else None
    _rewrite_code(latest_checkpoint(rd), code)
    cfg = load_preset('smoke', train_tokens=20 * 8 * 32, log_every=5, ckpt_every=5)
    with pytest.raises(RunDirError, match='other training code'):
        train(cfg, rd, data=smoke_data, progress=False)


def test_a_paused_run_whose_code_json_was_deleted_resumes_under_the_same_code(tmp_path, smoke_data):
    rd = _paused_run(tmp_path, smoke_data)
    (rd / 'code.json').unlink()
    cfg = load_preset('smoke', train_tokens=20 * 8 * 32, log_every=5, ckpt_every=5)
    train(cfg, rd, data=smoke_data, progress=False)  # the checkpoint's own record names this code: resumed
    assert json.loads((rd / 'code.json').read_text())['earlier'] == []


def _package_imports(module: str) -> set:
    "Package modules that `module` imports (any level, relative or absolute), by another reading of the source."
    src = Path(importlib.util.find_spec(module).origin).read_text()
    out = set()
    for node in ast.walk(ast.parse(src)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level:
            parent = module.rsplit('.', node.level)[0]
            names = [f'{parent}.{node.module}'] if node.module else [f'{parent}.{a.name}' for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('looped_lm.'):
            names = [node.module]
        out |= {'.'.join(n.split('.')[:3]) for n in names if n.count('.') >= 2}
    return out


@pytest.mark.parametrize(
    'hashed, root', [(TRAINING_CODE, 'looped_lm.training.train'), (MEASURING_CODE, 'looped_lm.measure.diagnostics')]
)
def test_the_hashed_code_is_every_module_the_code_uses(hashed, root):
    "The closure of `root`'s package imports, function-level ones included, is exactly what is hashed."
    seen, todo = set(), [root]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(_package_imports(m))
    assert 'looped_lm.model.lemmas' in seen  # the training step's radial metric: it was once left out
    assert set(hashed) == seen, sorted(seen ^ set(hashed))


def test_a_run_record_names_the_machines_that_trained_and_measured_it(smoke_run, smoke_data, tmp_path):
    """The ablation's run record (`collect` → `records/`) carries the machine of the checkpoint's own state and the
    one that measured it; the claims name them, and a record made before machines were kept says so."""
    import shutil
    from looped_lm.core.files import NO_MACHINE, machine_of
    from looped_lm.training.rundir import checkpoint_machine
    from looped_lm.studies.ablation import collect, run_dir_of
    from looped_lm.studies.tables import run_record
    from looped_lm.studies.claims import evaluate_claims, claims_markdown

    shutil.copytree(smoke_run, run_dir_of(tmp_path, 'perloop-rmsnorm', 0))
    diagnose_run(run_dir_of(tmp_path, 'perloop-rmsnorm', 0), smoke_data, max_batches=5)
    (rec,) = collect(tmp_path, ['perloop-rmsnorm'], [0])
    trained = checkpoint_machine(latest_checkpoint(smoke_run))
    assert rec['machine']['trained'] == trained and trained['torch'] == torch.__version__
    assert rec['machine']['measured']['device'] == 'cpu'
    line = json.loads(json.dumps(run_record(rec)))
    assert line['machine'] == rec['machine']
    where = evaluate_claims([line])['machines']
    assert where == {f"trained on {machine_of(dict(machine=trained))}": 1}, where
    old = {k: v for k, v in line.items() if k != 'machine'}
    assert claims_markdown(evaluate_claims([old])).startswith(f"Made on: {NO_MACHINE} (1 run).")


def test_a_run_folder_names_its_machine_in_json_and_a_resume_elsewhere_appends_it(tmp_path, smoke_data, capsys):
    """Issues 56 and 58: `machine.json` beside `config.json` names the CPU, the ISA torch dispatched to, torch and numpy
    versions, threads, device and dtype, written when the run starts; a resume on another machine appends it (the
    first is kept), the checkpoint and the report's `trained` name both, and training prints the machine first."""
    from looped_lm.core.files import machine_record, machine_of
    from looped_lm.training.rundir import checkpoint_machine

    cfg, rd = load_preset('smoke', train_tokens=8 * 8 * 32, log_every=4, ckpt_every=4), tmp_path / 'run'
    train(cfg, rd, data=smoke_data, max_steps=4, progress=True)
    first_lines = capsys.readouterr().out.splitlines()[:3]
    here = machine_record('cpu', cfg.dtype)
    assert any(here['cpu'] in line and here['cpu_capability'] in line for line in first_lines), first_lines
    machines = json.loads((rd / 'machine.json').read_text())
    assert len(machines) == 1 and machines[0]['from_step'] == 0
    for key in ('cpu', 'cpu_capability', 'torch', 'numpy', 'torch_threads', 'device', 'dtype'):
        assert machines[0][key] == here[key], key
    machines[0]['cpu_capability'] = 'AVX2' if here['cpu_capability'] != 'AVX2' else 'DEFAULT'  # paused elsewhere
    (rd / 'machine.json').write_text(json.dumps(machines))
    train(cfg, rd, data=smoke_data, progress=False)  # resumed here from step 4
    after = json.loads((rd / 'machine.json').read_text())
    assert [(m['cpu_capability'], m['from_step']) for m in after] == [
        (machines[0]['cpu_capability'], 0),
        (here['cpu_capability'], 4),
    ]
    trained = checkpoint_machine(latest_checkpoint(rd))
    assert trained['cpu_capability'] == here['cpu_capability'] and len(trained['earlier']) == 1
    assert 'earlier:' in machine_of(dict(machine=trained)) and machines[0]['cpu_capability'] in machine_of(
        dict(machine=trained)
    )
