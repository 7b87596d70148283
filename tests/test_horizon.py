"""The horizon study (nbs/06c_horizon.ipynb; its clock, grids and plans in nbs/06c_horizon.ipynb), the three
analyses on synthetic tables whose answer is known (nbs/06c_horizon.ipynb), the record file, and the tiny
grid end to end.

The tiny grid trains 8 runs of 32 steps in segments to log-spaced checkpoints, keeps and measures each; segmented
training gives the weights of one uninterrupted run; a rerun trains and measures nothing; a record of another
checkpoint is measured again, never read; a step passed without a kept copy is skipped, not invented.
"""

import json, math
import numpy as np, pandas as pd
import pytest
from looped_lm.core.config import ConfigError, load_preset
from looped_lm.training.train import train
from looped_lm.training.rundir import latest_checkpoint
from looped_lm.studies.variants import AT_RISK
from looped_lm.extensions.horizon import (
    HORIZON_GRIDS,
    RECORDS,
    HorizonGrid,
    check_horizon,
    checkpoint_steps,
    clock_of,
    horizon_key,
    run_horizon,
)
from looped_lm.studies.kept import cached_record, put_record, read_records
from looped_lm.extensions.horizon import (
    CLOCKS,
    PAPER_CLOCK,
    PAPER_DRIFT_RMS,
    collapse_test,
    dose_response,
    drift_law,
    synthetic_horizon,
)


def test_paper_clock():
    "The official recipe's steps x lr: 100,000 x 3e-4 = 30 (44M), 200,000 x 3e-4 = 60 (129M); RMS = L2 / sqrt(d)."
    assert PAPER_CLOCK['lr_steps']['44M'] == pytest.approx(30.0)
    assert PAPER_CLOCK['lr_steps']['129M'] == pytest.approx(60.0)
    assert PAPER_CLOCK['tokens']['44M'] == PAPER_CLOCK['tokens']['129M'] == 1_638_400_000
    assert PAPER_DRIFT_RMS['44M'] == pytest.approx(39207 / math.sqrt(512))
    cfg = load_preset('cpu', schedule='constant', warmup_steps=0, lr=1e-2)
    assert clock_of(cfg, 3000) == dict(lr_steps=pytest.approx(30.0), steps=3000.0, tokens=3000.0 * 16 * 64)
    cos = load_preset('cpu-cosine')
    assert 3.0 < clock_of(cos, cos.steps)['lr_steps'] < 3.6  # the cosine preset: about a ninth of the paper's


def test_checkpoint_steps_and_arms(tmp_path):
    assert checkpoint_steps(50, 3000) == [50, 100, 200, 400, 800, 1600, 3000]
    assert checkpoint_steps(4, 32) == [4, 8, 16, 32]
    assert checkpoint_steps(1, 10, 1.5) == [1, 2, 3, 5, 8, 10]
    for args in [(0, 10), (20, 10), (1.5, 10)]:
        with pytest.raises(ConfigError, match='integers'):
            checkpoint_steps(*args)
    with pytest.raises(ConfigError, match='ratio'):
        checkpoint_steps(1, 10, 1.0)
    for arms, msg in [
        ((), 'non-empty'),
        (((-1, [AT_RISK]),), 'positive'),
        (((1e-3, ['perloop-raw']),), 'first arm'),
        (((1e-3, [AT_RISK]), (1e-3, ['perloop-raw'])), 'twice'),
    ]:
        with pytest.raises(ConfigError, match=msg):
            check_horizon(HorizonGrid('smoke', 100, arms, (0,)), out_dir=tmp_path / 'refused')
    assert not (tmp_path / 'refused').exists()


def test_cpu_plan(tmp_path):
    "The cpu grid: 7 official variants x 3 seeds at lr 1e-2, 2 x 3 at 3e-3; 3,000 constant-lr steps; nothing on disk."
    plan = check_horizon('cpu', out_dir=tmp_path / 'cpu')
    assert len(plan.jobs) == 27 and not (tmp_path / 'cpu').exists()
    assert {j.cfg.schedule for j in plan.jobs} == {'constant'} and {j.cfg.steps for j in plan.jobs} == {3000}
    low = [j for j in plan.jobs if j.cell == 3e-3]
    assert sorted({j.variant for j in low}) == ['perloop-raw', 'perloop-rmsnorm'] and len(low) == 6
    assert plan.jobs[0].steps == (50, 100, 200, 400, 800, 1600, 3000)
    hi = next(j for j in plan.jobs if j.cell == 1e-2)
    assert clock_of(hi.cfg, 3000)['lr_steps'] == pytest.approx(30.0)
    with pytest.raises(ConfigError, match='Unknown grid'):
        check_horizon('nope')
    with pytest.raises(ConfigError, match='workers'):
        check_horizon('tiny', out_dir=tmp_path / 't', workers=0)


def test_collapse_picks_the_clock_it_was_built_on():
    "Norms built on steps x lr collapse there (verdict supported); built on steps, they collapse on steps (refuted)."
    good = collapse_test(synthetic_horizon('lr_steps'))
    assert good.best.tolist() == ['lr_steps', 'lr_steps'] and (good.verdict == 'supported').all()
    assert good['spread steps'].iloc[0] == pytest.approx(0.6 * math.log(1e-2 / 3e-3), abs=0.03)
    bad = collapse_test(synthetic_horizon('steps'))
    assert bad.best.isin(['steps', 'tokens']).all() and (bad.verdict == 'refuted').all()
    assert np.allclose(bad['spread steps'], bad['spread tokens'])  # one batch size: tokens = steps x constant
    three = collapse_test(synthetic_horizon('lr_steps', lrs=(1e-2, 3e-3, 1e-3)))
    assert (three.best == 'lr_steps').all()
    assert collapse_test(synthetic_horizon('lr_steps', lrs=(1e-2,))).empty
    apart = collapse_test(synthetic_horizon('lr_steps', lrs=(1.0, 1e-4), steps=(10, 20)))
    assert apart.verdict.iloc[0] == 'undecided (no overlap)' and math.isnan(apart['spread lr_steps'].iloc[0])


def test_dose_response_fits_per_run_within_each_lr():
    """Issue 32: slopes per run (a run's checkpoints are not independent), read within each lr over its runs, C6 over
    the per-loop controls only, the gain fitted on ln s with every point; the built truths are recovered per lr."""
    syn = synthetic_horizon('lr_steps', variants=(AT_RISK,))
    rng = np.random.default_rng(1)
    s = syn.norm_rms
    syn = syn.assign(
        gain=0.05 / s - 0.1,  # negative at large s: kept
        **{'clamp freeze_loop1': np.exp(0.5 / s), 'clamp remove_radial': np.exp(0.2 * s**-0.3), 'halt loops': 4.0},
    )
    ctl = syn.assign(variant='perloop-raw', c6=0.9 * (s / 10) ** -0.2, s_at_risk=s)
    term = ctl.assign(variant='terminal-raw', c6=1e6 * s)  # a terminal variant is not a C6 control
    dr = dose_response(pd.concat([syn, ctl, term], ignore_index=True))
    assert sorted(set(dr.index.get_level_values('lr'))) == [3e-3, 1e-2]
    for lr in (3e-3, 1e-2):
        row = lambda name: dr.loc[(name, lr)]
        assert row('clamp freeze_loop1').verdict == 'falls as 1/s'
        assert row('clamp freeze_loop1').slope == pytest.approx(-1, abs=0.05)
        assert row('clamp remove_radial').verdict == 'falls, not as 1/s'
        assert row('clamp remove_radial').slope == pytest.approx(-0.3, abs=1e-6)
        assert row('c6').runs == 3 and row('c6').slope == pytest.approx(-0.2, abs=1e-6)  # perloop-raw's runs only
        assert row('c6').spearman == pytest.approx(-1.0)
        assert (row('gain').used, row('gain').points, row('gain').verdict) == (21, 21, 'falls with s')
        assert row('clamp freeze_loop1')['predicted (ours)'] == -1.0 and math.isnan(row('gain')['predicted (ours)'])
    # one run per lr gives a slope but no interval over runs: no verdict is drawn from it
    one = dose_response(syn[syn.seed == 0])
    assert (one.runs == 1).all() and (one.verdict == 'too few runs').all()
    # a slope spread over runs that holds both 0 and -1 decides nothing
    noisy = syn.assign(**{'clamp freeze_loop1': np.exp(0.5 / s * s ** (syn.seed.map({0: -1.5, 1: 0.0, 2: 1.2})))})
    assert dose_response(noisy).loc[('clamp freeze_loop1', 1e-2)].verdict.startswith('undecided')


def test_drift_law_out_of_sample_and_carry():
    law = drift_law(synthetic_horizon('lr_steps'), split_step=400)
    m, lo, hi = law['exponent']
    assert lo <= 0.6 <= hi and m == pytest.approx(0.6, abs=0.01)
    assert law['err_out'] < 0.03 and law['usable'] and list(law['seeds'].index) == [0, 1, 2]
    c = law['carry']
    assert c.loc['44M', 'l2_lo'] <= 2 * 30**0.6 <= c.loc['44M', 'l2_hi']
    assert c.loc['129M', 'l2'] == pytest.approx(2 * 60**0.6, rel=0.03)
    assert c.loc['44M', 'rms'] == pytest.approx(c.loc['44M', 'l2'] / 8)  # synthetic width 64
    on_steps = drift_law(synthetic_horizon('steps'), split_step=400, clock='steps')
    assert on_steps['carry'].loc['44M', 'clock'] == 100_000
    flat = synthetic_horizon('lr_steps')
    flat['norm'] = np.where(flat.step > 400, flat.norm * (flat.step / 400) ** -0.6, flat.norm)
    flat['norm_rms'] = flat.norm / 8
    bent = drift_law(flat, split_step=400)
    assert bent['err_out'] > math.log(2) and not bent['usable'] and bent['err_in'] < 0.05
    with pytest.raises(ValueError, match='two early checkpoints'):
        drift_law(synthetic_horizon('lr_steps'), split_step=10)


def test_record_file(tmp_path):
    "One record per step (a new one replaces the old), damaged lines skipped, a record read only under its key."
    p = tmp_path / RECORDS
    put_record(p, dict(step=8, checkpoint='a', x=1))
    put_record(p, dict(step=4, checkpoint='b', x=2))
    put_record(p, dict(step=8, checkpoint='c', x=3))
    assert [(r['step'], r['x']) for r in read_records(p)] == [(4, 2), (8, 3)]
    p.write_text(p.read_text() + '{"step": 16, "tor\n[1, 2]\n')
    assert [r['step'] for r in read_records(p)] == [4, 8]
    assert cached_record(p, dict(checkpoint='c'))['x'] == 3
    assert cached_record(p, dict(checkpoint='a')) is None
    assert read_records(tmp_path / 'missing.jsonl') == []


@pytest.fixture(scope='module')
def tiny(tmp_path_factory, test_env):
    out = tmp_path_factory.mktemp('horizon') / 'tiny'
    return out, run_horizon('tiny', out_dir=out, progress=False)


@pytest.mark.slow
@pytest.mark.corpus
def test_tiny_grid_end_to_end(tiny, smoke_data, tmp_path):
    out, res = tiny
    t = res.tables['runs']
    assert set(res.notes['states']) == {'done'} and len(res.plan.jobs) == 8
    assert len(t) == 8 * 4 and t.groupby(['lr', 'variant', 'seed']).step.apply(tuple).map((4, 8, 16, 32).__eq__).all()
    assert np.allclose(t.lr_steps, t.step * t.lr) and t.radial.between(0, 1).all() and (t.norm > 0).all()
    assert t[t.variant == AT_RISK].c6.isna().all() and t[t.variant != AT_RISK].c6.notna().all()
    assert (
        len(res.tables['collapse']) == 2
        and {'gain', 'c6'} <= set(res.tables['dose'].index.get_level_values(0))
        and res.notes['law'] is not None
    )
    for f in ('horizon.csv', 'horizon.md', 'collapse.md', 'dose.md', 'drift.md'):
        assert (out / f).stat().st_size > 0
    j = res.plan.jobs[0]
    whole = train(j.cfg, tmp_path / 'whole', data=smoke_data, progress=False)  # one uninterrupted run
    assert whole.status == 'done'
    kept = (j.keep_dir / 'ckpt-000032' / 'model.safetensors').read_bytes()
    assert kept == (latest_checkpoint(tmp_path / 'whole') / 'model.safetensors').read_bytes()


@pytest.mark.corpus
def test_tiny_rerun_stale_and_missing(tiny, smoke_data):
    out, res = tiny
    stamp = lambda: {p: p.stat().st_mtime_ns for n in ('model.safetensors', RECORDS) for p in out.rglob(n)}  # noqa
    before = stamp()
    again = run_horizon('tiny', out_dir=out, progress=False)
    assert stamp() == before
    pd.testing.assert_frame_equal(again.tables['runs'], res.tables['runs'])
    j, spec = res.plan.jobs[1], res.plan.spec
    p = j.keep_dir / RECORDS
    recs = read_records(p)
    recs[1]['checkpoint'] = 'ckpt-000008:0000000000000000'  # a record that claims other weights
    p.write_text(''.join(json.dumps(r) + '\n' for r in recs))
    key = horizon_key(j.keep_dir / 'ckpt-000008', j.cfg, smoke_data, spec.measure_tokens, spec.radial_tokens)
    assert cached_record(p, key) is None
    third = run_horizon('tiny', out_dir=out, progress=False)
    assert cached_record(p, key) is not None and len(read_records(p)) == 4
    pd.testing.assert_frame_equal(third.tables['runs'], res.tables['runs'])  # measured again to the same numbers
    for f in (j.keep_dir / 'ckpt-000008').iterdir():
        f.unlink()  # a kept copy lost after the run went past it: that step cannot be measured again
    (j.keep_dir / 'ckpt-000008').rmdir()
    fourth = run_horizon('tiny', out_dir=out, progress=False)
    assert set(fourth.notes['states']) == {'done'} and len(fourth.tables['runs']) == len(res.tables['runs']) - 1
    gone = fourth.tables['runs'][
        (fourth.tables['runs'].lr == j.cell)
        & (fourth.tables['runs'].variant == j.variant)
        & (fourth.tables['runs'].seed == j.seed)
    ]
    assert list(gone.step) == [4, 16, 32]
    assert set(CLOCKS) <= set(fourth.tables['runs'].columns) and HORIZON_GRIDS['tiny'].publish is False


@pytest.mark.corpus
def test_an_edit_to_the_measuring_code_measures_again(tiny, monkeypatch):
    "Issue 58.2: a record names the code that measured it; another code's record is never read as this code's."
    import looped_lm.extensions.horizon as hz

    out, res = tiny
    j = res.plan.jobs[0]
    first, prior = read_records(j.keep_dir / RECORDS), run_horizon('tiny', out_dir=out, progress=False).tables['runs']
    assert {r['code'] for r in first} == {hz.source_hash(hz.MEASURING_CODE)}  # every record names its code
    monkeypatch.setattr(hz, 'source_hash', lambda modules: 'edited-code')  # as if a percentile's code were edited
    again = run_horizon('tiny', out_dir=out, progress=False)
    recs = read_records(j.keep_dir / RECORDS)
    assert [r['code'] for r in recs] == ['edited-code'] * len(first)  # each kept step measured again, replaced
    assert [r['step'] for r in recs] == [r['step'] for r in first]
    pd.testing.assert_frame_equal(again.tables['runs'], prior)  # same weights, same numbers (the edit changed nothing)
