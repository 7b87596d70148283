"""The study's parameters, claims, workers and locks (issues 9, 11, 12, 13, 14, 22).

Parameters: every accepted form of `seeds`/`variants` gives the same list; every refused value fails before any
folder exists (the claims are tested in tests/test_claims.py).
Workers: two worker processes give the same tables as one (smoke, 2 variants x 1 seed).
Locks, with real processes: a run another process holds is trained after the others once free, or
reported as 'locked' after the wait; the study lock outwaits the kernel of a kill -9'd papermill job; a script that
starts a two-worker study without a `__main__` guard gets a clear error before any work, not a BrokenProcessPool.
"""

import os, signal, subprocess, sys, time
import pytest
from looped_lm.core.config import ConfigError
from looped_lm.core.files import LockedError, dir_lock
from looped_lm.studies.variants import GROUPS, VARIANTS, check_seeds, check_variants
from looped_lm.studies.ablation import check_params, is_main, run_ablation, run_dir_of, study_key
from looped_lm.studies.runner import check_spawn_guard, run_jobs, study_lock


@pytest.mark.parametrize('given', [[0, 1, 2], (0, 1, 2), '[0, 1, 2]', '0, 1, 2', '0,1,2', '[0,1,2]'])
def test_seed_forms(given):
    assert check_seeds(given, [7]) == [0, 1, 2]


def test_single_and_default_seeds():
    assert (
        check_seeds(3, [7]) == [3]
        and check_seeds('3', [7]) == [3]
        and check_seeds(None, [42, 101, 202]) == [42, 101, 202]
    )
    assert check_seeds(2**32 - 1, [0]) == [2**32 - 1]


@pytest.mark.parametrize(
    'bad', [1.5, '1.5', [0, 0], 2**64 - 1, 2**32, True, [True], -1, [], '[]', '[0, x]', 'zero', {'a': 1}]
)
def test_refused_seeds(bad):
    with pytest.raises(ConfigError, match='seed') as e:
        check_seeds(bad, [0])
    assert 'JSON/YAML list' in str(e.value) or 'repeat' in str(e.value)  # the message shows the accepted forms


def test_variant_forms_and_order():
    for given in (
        ['perloop-raw', 'perloop-rmsnorm'],
        '["perloop-raw", "perloop-rmsnorm"]',
        'perloop-raw, perloop-rmsnorm',
    ):
        assert check_variants(given) == ['perloop-rmsnorm', 'perloop-raw']
    assert check_variants('all') == list(VARIANTS) and check_variants(None) == check_variants('primary')
    assert check_variants(None) == [*check_variants('official'), 'one-pass']  # the default: the seven + the reference
    assert check_variants('official') == [
        'terminal-rmsnorm',
        'terminal-raw',
        'perloop-rmsnorm',
        'perloop-raw',
        'perloop-finalnorm',
        'terminal-penalty',
        'perloop-penalty',
    ]
    assert {VARIANTS[v].group for v in GROUPS['extension']} == {'extension'}


@pytest.mark.parametrize(
    'bad, msg',
    [
        ([], 'selects no variant'),
        ('[]', 'selects no variant'),
        ('norm-penalty', r'Unknown variant.*Valid variants: .*perloop-penalty'),
        ('batchnorm', 'Valid variants'),
        (['perloop-raw', 'perloop-raw'], 'twice'),
    ],
)
def test_refused_variants(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        check_variants(bad)


def test_paths_are_checked_before_anything_is_created(tmp_path):
    (tmp_path / 'f').write_text('x')
    with pytest.raises(ConfigError, match='is a file'):
        run_ablation('smoke', out_dir=tmp_path / 'f')
    with pytest.raises(ConfigError, match='is a file'):
        run_ablation('smoke', out_dir=tmp_path / 'out', fig_dir=tmp_path / 'f')
    with pytest.raises(ConfigError, match='seed'):
        run_ablation('smoke', seeds=2**64 - 1, out_dir=tmp_path / 'out')
    with pytest.raises(ConfigError, match='workers'):
        run_ablation('smoke', out_dir=tmp_path / 'out', workers=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['f']


def test_subsets_go_beside_the_main_study(tmp_path):
    main, sub = (
        check_params('smoke', out_dir=tmp_path),
        check_params('smoke', ['perloop-raw'], '[1, 2]', out_dir=tmp_path),
    )
    assert is_main(main) and main.study_dir == tmp_path and main.fig_dir == tmp_path / 'figures'
    assert (
        sub.study_dir == tmp_path / f"study-{study_key(['perloop-raw'], [1, 2])}"
        and sub.fig_dir == sub.study_dir / 'figures'
    )
    assert (
        len({study_key(['perloop-raw'], [1]), study_key(['perloop-raw'], [2]), study_key(['perloop-rmsnorm'], [1])})
        == 3
    )


# ---- workers ----


@pytest.mark.slow
def test_two_workers_give_the_same_tables(tmp_path, smoke_data):
    kw = dict(variants=['perloop-rmsnorm', 'perloop-raw'], seeds=[0], max_eval_batches=1, progress=False)
    one = run_ablation('smoke', out_dir=tmp_path / 'one', workers=1, **kw).records
    two = run_ablation('smoke', out_dir=tmp_path / 'two', workers=2, **kw).records
    sd = lambda o: o / f"study-{study_key(kw['variants'], [0])}"
    for t in ('table1', 'table2'):
        a, b = (sd(tmp_path / o) / 'tables' / f'{t}.csv' for o in ('one', 'two'))
        assert a.read_text() == b.read_text(), t
    assert [r['status'] for r in one] == [r['status'] for r in two] == ['done', 'done']


# ---- locks and workers from scripts ----

HOLD = """
import os, sys, time
from pathlib import Path
from looped_lm.core.files import dir_lock
folder, what, until = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with dir_lock(folder, what=what):
    print('held', flush=True)
    if until == 'parent-dies':  # an ipykernel: exits when its parent (papermill) is gone, polling every second
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(1.0)
    else:  # hold until the file `until` exists (or a minute passes), then a second more
        t0 = time.time()
        while not Path(until).exists() and time.time() - t0 < 60:
            time.sleep(0.1)
        time.sleep(1.0)
"""


def hold(folder, what, until, tmp_path) -> subprocess.Popen:
    "A real process holding `folder`'s lock; returns once it holds it."
    script = tmp_path / 'hold.py'
    script.write_text(HOLD)
    p = subprocess.Popen(
        [sys.executable, str(script), str(folder), what, str(until)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == 'held'
    return p


@pytest.mark.slow
def test_study_lock_outwaits_an_orphaned_kernel(tmp_path):
    "A kill -9'd papermill job: its kernel keeps the study lock ~1 s more; rerunning at once waits for it, not fails."
    out = tmp_path / 'study'
    script = tmp_path / 'papermill.py'  # the parent (papermill) starts the kernel, which takes the study lock
    script.write_text(
        "import subprocess, sys, time\n"
        f"k = subprocess.Popen([sys.executable, {str(tmp_path / 'hold.py')!r}, {str(out)!r}, 'study', 'parent-dies'])\n"
        "time.sleep(600)\n"
    )
    (tmp_path / 'hold.py').write_text(HOLD)
    papermill = subprocess.Popen([sys.executable, str(script)])
    while not (out / '.lock').exists() or not (out / '.lock').read_text():
        time.sleep(0.05)
    with pytest.raises(LockedError):  # the kernel holds it
        with dir_lock(out, what='study'):
            pass
    os.kill(papermill.pid, signal.SIGKILL)
    papermill.wait()
    with study_lock(out) as info:  # the orphaned kernel notices within a second and exits: the lock is ours
        assert info['pid'] == os.getpid()
    holder = hold(out, 'study', tmp_path / 'never', tmp_path)  # a holder that stays: refused after the wait
    try:
        with pytest.raises(LockedError, match=r'in use by another process.*\(waited'):
            with study_lock(out, timeout=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()


def toy_work(job):
    "Stands for `train_and_diagnose`: takes the run's lock, as the trainer does."
    with dir_lock(job['run_dir'], 'run'):
        return 'done'


def test_a_run_held_to_the_end_is_reported_and_the_others_run(tmp_path):
    jobs = [dict(label=n, run_dir=tmp_path / n) for n in ('a', 'b', 'c')]
    holder = hold(tmp_path / 'a', 'run', tmp_path / 'never', tmp_path)
    try:
        assert run_jobs(jobs, toy_work, lock_wait=0.5, poll=0.1) == ['locked', 'done', 'done']
    finally:
        holder.kill()
        holder.wait()
    assert run_jobs(jobs, toy_work) == ['done', 'done', 'done']


@pytest.mark.slow
def test_a_locked_run_is_trained_after_the_others(tmp_path, smoke_data, capsys):
    "Another process holds perloop-rmsnorm's run until perloop-raw is trained: the study trains raw, waits, then it."
    kw = dict(variants=['perloop-rmsnorm', 'perloop-raw'], seeds=[0], max_eval_batches=1, progress=False, workers=1)
    raw_done = run_dir_of(tmp_path, 'perloop-raw', 0) / 'diagnostics.json'
    holder = hold(run_dir_of(tmp_path, 'perloop-rmsnorm', 0), 'run', raw_done, tmp_path)
    try:
        records = run_ablation('smoke', out_dir=tmp_path, lock_wait=120, **kw).records
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out
    assert [r['status'] for r in records] == ['done', 'done']
    assert 'held by another process: perloop-rmsnorm seed 0' in out
    assert out.index('[2/2] perloop-raw seed 0: done') < out.index('[1/2] perloop-rmsnorm seed 0: done')


UNGUARDED = """
from looped_lm.studies.ablation import run_ablation
run_ablation('smoke', variants=['perloop-raw', 'perloop-rmsnorm'], seeds=[0], out_dir={out!r}, workers=2)
"""


def test_two_workers_from_an_unguarded_script_is_a_clear_error(tmp_path):
    script = tmp_path / 'study.py'
    script.write_text(UNGUARDED.format(out=str(tmp_path / 'out')))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "if __name__ == '__main__':" in r.stderr and 'workers=1' in r.stderr and 'line 3' in r.stderr, r.stderr
    assert 'BrokenProcessPool' not in r.stderr and not (tmp_path / 'out').exists()  # refused before any work
    assert check_spawn_guard(2) is None  # pytest's own __main__ is guarded


@pytest.mark.slow
def test_the_gpu_script_of_the_depth_worth_study_runs_its_tiny_grid_on_the_cpu(tmp_path):
    "scripts/depth_worth_gpu.py, dry run: the tiny grid on the CPU, as the GPU machine would run the whole one."
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, 'scripts/depth_worth_gpu.py', '--grid', 'worth-tiny', '--device', 'cpu', '--workers', '1']
    out = subprocess.run(cmd + ['--out-dir', str(tmp_path)], cwd=root, capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '24 records in' in out.stdout, out.stdout[-2000:]
    rules = json.loads((tmp_path / 'figures' / 'rules.json').read_text())
    assert list(rules['arms']) == ['B8', 'B12'] and all('R1' in a for a in rules['arms'].values())
    # after an interruption: --publish-only publishes what was measured and keeps what no run folder reproduces
    rec = tmp_path / 'figures' / 'records' / 'B8-one-pass-seed1.jsonl'
    published = rec.read_bytes()
    (tmp_path / 'kept' / 'B8-one-pass-seed1' / 'depth.jsonl').unlink()
    pub = cmd[:-2] + ['--publish-only', '--out-dir', str(tmp_path)]
    for extra in ([], ['--remove-stale']):  # 58.8: --remove-stale removes nothing that was not redone here
        out = subprocess.run(pub + extra, cwd=root, capture_output=True, text=True, env=os.environ)
        assert out.returncode == 0 and 'published 23 of 24' in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
        assert (
            'kept as published, no run folder here reproduces them: B8-one-pass-seed1.jsonl (steps [8])' in out.stdout
        )
        assert rec.read_bytes() == published  # nothing lost, nothing rewritten
    ck = tmp_path / 'runs' / 'B8-one-pass-seed1'
    ck = ck / (ck / 'latest').read_text().strip() / 'model.safetensors'
    os.utime(ck, (ck.stat().st_mtime + 60,) * 2)  # as if that run had been trained again here since
    out = subprocess.run(pub + ['--remove-stale'], cwd=root, capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0 and 'published 23 of 24' in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert 'B8-one-pass-seed1.jsonl: steps [8] removed' in out.stdout  # it says what it removed
    assert not (tmp_path / 'figures' / 'records' / 'B8-one-pass-seed1.jsonl').exists()
    rules = json.loads((tmp_path / 'figures' / 'rules.json').read_text())  # rebuilt from the 23 records left
    assert rules['arms']['B8']['R1']['verdict'] == 'not measured: missing one-pass seed 1'
