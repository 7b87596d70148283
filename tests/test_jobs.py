"""The study's fan-out through submitit (`looped_lm.studies.runner`).

- the plan of the paper-exact study (2 presets x 7 official conditions x 3 seeds = 42 runs) prints without a GPU,
  from the throughput measured in benchmarks/results/gpu.json; a plan knows done, paused and new runs;
- the token data is prepared once, and a job only reads it (a job that cannot see it stops with the fix);
- local jobs of `ablation.train_and_diagnose`: a job that fails for good is reported, the others finish;
- a job preempted mid-run the way SLURM does it (USR2 to its task) is requeued by submitit and ends with weights,
  optimizer state and metrics identical to a run that was never interrupted; one preempted in its first instant (before
  submitit's handler exists, so it leaves no result) is submitted again by the runner and ends the same;
- the SLURM executor's sbatch script carries the GPUs, partition, time limit and the USR2 warning; bad input is
  refused before anything is prepared or submitted;
- the study itself through the executor (`run_ablation(executor='local')`): tables and claims byte-identical to the
  in-process study; a failed job is a failed run with its log; `plan_only` plans a GPU study on a machine without one.
"""

import re, shutil
from pathlib import Path
from unittest import mock
import pytest
import looped_lm.studies.runner as J
import looped_lm.studies.ablation as A
from looped_lm.studies.variants import VARIANTS, GROUPS
from looped_lm.studies.ablation import run_dir_of, train_and_diagnose, run_ablation, study_key
from looped_lm.core.config import ConfigError, load_preset
from looped_lm.training.train import train
from looped_lm.training.rundir import run_status
from looped_lm.training.rundir import latest_checkpoint
from _util import assert_same_run

SMOKE = load_preset('smoke')


def study_jobs(preset, variants, out_dir, seeds=None, **overrides) -> list:
    "Job dicts as `run_ablation` builds them for `train_and_diagnose` (without the token arrays)."
    cfg = load_preset(preset, **overrides)
    runs = [(v, s) for v in variants for s in (seeds or cfg.seed_list)]
    return [
        dict(
            label=f"{v} seed {s}",
            head=f"[{i + 1}/{len(runs)}] {v} seed {s}",
            variant=v,
            seed=s,
            cfg=VARIANTS[v].config(cfg).replace(seed=s),
            run_dir=run_dir_of(out_dir, v, s),
            data_dir=None,
            device='cpu',
            max_eval_batches=1,
            progress=False,
        )
        for i, (v, s) in enumerate(runs)
    ]


def test_plan_of_the_paper_exact_study(tmp_path, capsys):
    jobs = [j for p in ('paper-exact-44m', 'paper-exact-129m') for j in study_jobs(p, GROUPS['official'], tmp_path / p)]
    plan = J.cost_plan(jobs)
    t = plan.table
    assert len(t) == 42 and len(plan.to_submit) == 42 and (t.state == 'new').all() and t.submit.all()
    assert t.speed.str.startswith('measured').all() and t.peak_gib.notna().all()
    hours = t.groupby('preset').gpu_h.sum()
    assert 30 < hours['paper-exact-44m'] < 45 < hours['paper-exact-129m'] < 100  # about 37 and 83 on one H200
    per_loss = t[t.preset == 'paper-exact-44m'].groupby(t.run.str.startswith('perloop')).gpu_h.max()
    assert per_loss[True] > per_loss[False]  # K readouts cost more than one
    print(plan)
    out = capsys.readouterr().out
    assert 'perloop-penalty-seed202' in out and '42 runs: 0 done, 42 to submit' in out and 'NVIDIA H200' in out


def test_plan_knows_done_paused_and_new_runs(tmp_path, smoke_data):
    jobs = study_jobs('smoke', ['terminal-rmsnorm', 'perloop-rmsnorm', 'perloop-raw'], tmp_path, seeds=[0])
    train(jobs[0]['cfg'], jobs[0]['run_dir'], data=smoke_data, progress=False)
    train(
        jobs[1]['cfg'], jobs[1]['run_dir'], data=smoke_data, progress=False, max_steps=60
    )  # paused, with a checkpoint
    plan = J.cost_plan(jobs)
    assert list(plan.table.state) == ['done', 'resumes at 60', 'new']
    assert list(plan.table.steps_left) == [0, SMOKE.steps - 60, SMOKE.steps]
    assert [j['variant'] for j in plan.to_submit] == ['perloop-rmsnorm', 'perloop-raw']
    assert list(plan.table.submit) == [False, True, True]
    assert plan.table.speed.str.startswith('extrapolated from').all() and plan.table.peak_gib.isna().all()
    with pytest.raises(ConfigError, match='gpu_check.sh'):
        J.cost_plan(jobs, bench=tmp_path / 'missing.json')


def test_data_is_prepared_once_and_only_read(tmp_path, smoke_data):
    jobs = study_jobs('smoke', ['perloop-rmsnorm', 'perloop-raw'], tmp_path, seeds=[0, 1])
    with mock.patch.object(J, 'prepare_data', wraps=J.prepare_data) as prep:
        prepared = J.prepare_once(jobs, verbose=False)
    assert prep.call_count == 1 and len(prepared) == 1  # four runs, one recipe
    rec = prepared[J.data_key(SMOKE)]
    data = J.read_prepared(SMOKE, rec)
    assert data.fingerprint == smoke_data.fingerprint and data.built == () and not data.tokenizer_trained
    gone = dict(rec, files=[str(tmp_path / 'not-shared' / 'train.bin')])
    with pytest.raises(J.DataNotReady, match='shared'):
        J.read_prepared(SMOKE, gone)


def test_bad_input_is_refused_before_any_work(tmp_path):
    jobs = study_jobs('smoke', ['perloop-rmsnorm'], tmp_path, seeds=[0])
    with mock.patch.object(J, 'prepare_once', side_effect=AssertionError('prepared before checking')):
        for kw, match in [
            (dict(work=lambda job: 'done'), 'module-level'),
            (dict(executor='pbs'), 'one of local, slurm, debug'),
            (dict(gpus_per_job=-1), 'gpus_per_job'),
            (dict(timeout_min=0), 'timeout_min'),
            (dict(jobs=jobs + jobs), 'twice'),
            (dict(jobs=[dict(run_dir='x')]), "ExperimentConfig 'cfg'"),
        ]:
            with pytest.raises(ConfigError, match=match):
                J.submit_jobs(**dict(dict(jobs=jobs, work=train_and_diagnose, folder=tmp_path / 'jobs'), **kw))
        if shutil.which('sbatch') is None:
            with pytest.raises(ConfigError, match='sbatch'):
                J.submit_jobs(jobs, train_and_diagnose, 'slurm', folder=tmp_path / 'jobs')


def test_slurm_script(tmp_path):
    with mock.patch('shutil.which', return_value='/usr/bin/sbatch'):
        ex = J.make_executor(
            'slurm', tmp_path, gpus_per_job=2, timeout_min=720, partition='h200', slurm_options=dict(mem='64GB')
        )
    lines = ex._make_submission_file_text('python -m job', 'uid').splitlines()
    flags = {line.split()[1] for line in lines if line.startswith('#SBATCH')}
    assert {'--gpus-per-node=2', '--partition=h200', '--time=720', '--signal=USR2@90', '--mem=64GB'} <= flags


@pytest.mark.slow
def test_a_failed_job_is_reported_and_the_others_finish(tmp_path, smoke_data):
    jobs = study_jobs('smoke', ['perloop-rmsnorm', 'perloop-raw'], tmp_path / 'study', seeds=[0])
    Path(jobs[0]['run_dir']).parent.mkdir(parents=True)
    Path(jobs[0]['run_dir']).write_text('a file where the run folder should be')
    out = J.submit_jobs(
        jobs,
        train_and_diagnose,
        'local',
        folder=tmp_path / 'jobs',
        gpus_per_job=0,
        timeout_min=10,
        max_parallel=2,
        poll_s=0.2,
    )
    assert [o.state for o in out] == ['failed', 'done'] and [o.name for o in out] == [
        'perloop-rmsnorm-seed0',
        'perloop-raw-seed0',
    ]
    assert 'RunDirError' in out[0].error and 'Cannot write to the run directory' in out[0].error
    assert out[0].stderr.is_file() and 'RunDirError' in out[0].stderr.read_text()
    assert (
        run_status(jobs[1]['run_dir'])['state'] == 'done' and (Path(jobs[1]['run_dir']) / 'diagnostics.json').exists()
    )


@pytest.mark.slow
def test_a_preempted_job_resumes_to_identical_weights(tmp_path, smoke_data):
    "SLURM preempts by sending the job's task USR2; submitit requeues it; it resumes from its last checkpoint."
    ov = dict(train_tokens=SMOKE.train_tokens * 2, ckpt_every=10)  # 192 steps, a checkpoint every 10
    job = study_jobs('smoke', ['perloop-rmsnorm'], tmp_path / 'study', seeds=[0], **ov)[0]
    prepared = J.prepare_once([job], verbose=False)
    ex = J.make_executor('local', tmp_path / 'jobs', gpus_per_job=0, timeout_min=60)  # USR2 before 48 min: preempted
    sub = ex.submit(J.SubmittedWork(train_and_diagnose, job, prepared[J.data_key(job['cfg'])]))
    J.wait_for(lambda: latest_checkpoint(job['run_dir']) is not None or sub.done())
    assert not sub.done(), f'the job ended before its first checkpoint was seen: {sub.stderr()}'
    assert J.preempt(sub)
    outcome = J.outcome(job, sub)
    assert outcome.state == 'done', outcome.error
    log = sub.stdout()
    resumed = re.findall(r'requeued to resume from ckpt-(\d+)', log)
    assert len(resumed) == 1 and 0 < int(resumed[0]) < job['cfg'].steps and log.count('starting on') == 2, log
    assert 'this job is preempted' in sub.stderr()  # submitit's handler saw a preemption, not a time-out
    reference = tmp_path / 'uninterrupted'
    train(job['cfg'], reference, data=smoke_data, progress=False)
    assert_same_run(job['run_dir'], reference)  # every weight and optimizer tensor (torch.equal), every record


@pytest.mark.slow
def test_a_job_preempted_at_its_start_is_submitted_again(tmp_path, smoke_data, capsys):
    "USR2 in a job's first instant kills it before submitit can requeue it (no result): the runner submits it again."
    job = study_jobs('smoke', ['perloop-rmsnorm'], tmp_path / 'study', seeds=[0])[0]
    make, hit = J.make_executor, []

    def make_preempting(*args, **kw):
        ex = make(*args, **kw)
        submit = ex.submit

        def submit_and_preempt(call):
            sub = submit(call)
            if not hit:  # the first submission only: its task gets USR2 as soon as it exists
                task = Path(f'/proc/{sub._process.pid}/task/{sub._process.pid}/children')
                J.wait_for(lambda: task.read_text().split(), poll_s=0.001)
                hit.append(J.preempt(sub))
            return sub

        ex.submit = submit_and_preempt
        return ex

    with mock.patch.object(J, 'make_executor', make_preempting):
        out = J.submit_jobs(
            [job], train_and_diagnose, 'local', tmp_path / 'jobs', gpus_per_job=0, timeout_min=60, verbose=False
        )
    assert hit and out[0].state == 'done', out[0].error
    assert 'ended before it could run' in capsys.readouterr().out  # the runner resubmitted it, not submitit
    assert run_status(job['run_dir'])['state'] == 'done'
    reference = tmp_path / 'uninterrupted'
    train(job['cfg'], reference, data=smoke_data, progress=False)
    assert_same_run(job['run_dir'], reference)


@pytest.mark.skipif(shutil.which('sbatch') is None, reason='needs a SLURM cluster (sbatch on PATH)')
def test_slurm_jobs(tmp_path, smoke_data):
    "On a SLURM login node: two smoke runs as a job array, on CPU nodes (set LOOPED_LM_CACHE to a shared folder)."
    jobs = study_jobs('smoke', ['perloop-rmsnorm', 'perloop-raw'], Path.cwd() / 'slurm-test-runs', seeds=[0])
    out = J.submit_jobs(
        jobs, train_and_diagnose, 'slurm', folder=Path.cwd() / 'slurm-test-jobs', gpus_per_job=0, timeout_min=30
    )
    assert [o.state for o in out] == ['done', 'done'], [o.error for o in out]


# ---- the study through the executor: run_ablation(executor=...) ----

STUDY = dict(variants=['perloop-rmsnorm', 'perloop-raw'], seeds=[0], max_eval_batches=1, progress=False)


def study_dir(out_dir, variants=STUDY['variants']) -> Path:
    return out_dir / f"study-{study_key(variants, STUDY['seeds'])}"


def study_files(out_dir) -> dict:
    "claims.json and every table's CSV and Markdown, by name; not the throughput (timing) nor the list of skipped ones."
    sd = study_dir(out_dir)
    files = [sd / 'claims.json', *(sd / 'tables').glob('*.csv'), *(sd / 'tables').glob('*.md')]
    return {p.name: p.read_bytes() for p in files if not p.name.startswith(('throughput', 'skipped'))}


@pytest.mark.slow
def test_the_study_through_local_jobs_equals_the_inprocess_study(tmp_path, smoke_data):
    inproc = run_ablation('smoke', out_dir=tmp_path / 'inprocess', workers=1, **STUDY).records
    jobs = dict(executor='local', gpus_per_job=0, timeout_min=10)
    local = run_ablation('smoke', out_dir=tmp_path / 'local', **jobs, **STUDY).records
    assert [r['status'] for r in inproc] == [r['status'] for r in local] == ['done', 'done']
    a, b = study_files(tmp_path / 'inprocess'), study_files(tmp_path / 'local')
    assert len(a) >= 19 and {'table1.csv', 'table1.md', 'claims.json'} <= a.keys() and a.keys() == b.keys()
    assert [n for n in a if a[n] != b[n]] == []
    assert (study_dir(tmp_path / 'local') / 'jobs').is_dir()  # submitit's pickles and logs
    assert 'throughput' in (study_dir(tmp_path / 'local') / 'tables' / 'skipped.md').read_text()  # not measured
    again = run_ablation('smoke', out_dir=tmp_path / 'local', **jobs, **STUDY).records  # done runs return at once
    assert [r['status'] for r in again] == ['done', 'done'] and study_files(tmp_path / 'local') == b


@pytest.mark.slow
def test_a_failed_job_is_a_failed_run_with_its_log(tmp_path, smoke_data):
    run_dir = run_dir_of(tmp_path, 'perloop-rmsnorm', 0)
    run_dir.parent.mkdir(parents=True)
    run_dir.write_text('a file where the run folder should be')
    kw = dict(STUDY, variants=['perloop-rmsnorm'])
    (rec,) = run_ablation('smoke', out_dir=tmp_path, executor='local', gpus_per_job=0, timeout_min=10, **kw).records
    assert rec['status'] == 'failed' and 'RunDirError' in rec['message'] and 'job log: ' in rec['message']
    assert Path(rec['message'].split('job log: ')[1].rstrip(')')).is_file()
    table1 = (study_dir(tmp_path, ['perloop-rmsnorm']) / 'tables' / 'table1.csv').read_text()
    assert 'perloop-rmsnorm,failed,0' in table1


def test_plan_only_plans_the_paper_exact_study_without_a_gpu(tmp_path, capsys):
    spend = mock.Mock(side_effect=AssertionError('spent'))
    with (
        mock.patch('torch.cuda.is_available', return_value=False),
        mock.patch.multiple(A, submit_jobs=spend, prepare_once=spend, prepare_data=spend, train=spend),
    ):
        plan = run_ablation('paper-exact-44m', 'official', out_dir=tmp_path, executor='slurm', plan_only='True').notes[
            'cost_plan'
        ]
        with pytest.raises(ConfigError, match='no GPU is visible'):  # in process, the device is still checked
            run_ablation('paper-exact-44m', 'official', out_dir=tmp_path)
    assert len(plan.table) == len(plan.to_submit) == 21 and list(tmp_path.iterdir()) == []
    assert '21 runs: 0 done, 21 to submit' in capsys.readouterr().out
