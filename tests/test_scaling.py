"""The scaling study (nbs/06a_scaling.ipynb; its grid: nbs/06a_scaling.ipynb): points, bad grids, the power-law
fit, and a tiny grid end to end.

A tiny grid trains and measures every run; a rerun trains nothing and measures nothing; an interrupted point is resumed
by the study; a measurement of another checkpoint is measured again; bad grids fail before any folder exists.
"""

import json, math
import numpy as np, pandas as pd
import pytest
from looped_lm.core.config import ConfigError, load_preset
from looped_lm.training.train import train
from looped_lm.training.rundir import run_status
from looped_lm.training.rundir import latest_checkpoint
from looped_lm.studies.variants import AT_RISK
from looped_lm.extensions.scaling import Grid, estimate_seconds, scaling_points
from looped_lm.extensions.scaling import check_scaling, grid_points, measure_key, measure_run, read_measure, run_scaling
from looped_lm.extensions.growth import PAPER_TOKENS, fit_growth, local_slopes, t_quantile
from looped_lm.extensions.scaling import draw_scaling

SMALL = Grid(
    'smoke',
    dict(budget=[0.5, 1], K=[2]),
    overrides=dict(train_tokens=2048, warmup_steps=2),
    variants=(AT_RISK, 'perloop-raw'),
    measure_tokens=1024,
    radial_tokens=256,
    publish=False,
)


def stamps(folder) -> dict:
    return {p: p.stat().st_mtime_ns for n in ('model.safetensors', 'scaling.json') for p in folder.rglob(n)}


def test_centre_is_listed_once():
    base = load_preset('smoke')
    pts = scaling_points(base, dict(budget=[1, 0.5], width=[64, 32], lr_wd=['preset', 'low-lr'], K=[4, 2]))
    assert [p.name for p in pts] == ['centre', 'budget-0.5', 'width-32', 'lr_wd-low-lr', 'K-2']
    assert pts[0].overrides == {} and pts[0].config(base) == base
    assert pts[1].config(base).steps == base.steps // 2 and pts[3].config(base).lr == 3e-4


@pytest.mark.parametrize(
    'axes, msg',
    [
        (dict(depth=[1]), 'Unknown axis'),
        (dict(budget=[]), 'non-empty list'),
        (dict(budget=[0]), 'positive number'),
        (dict(budget=[-0.5]), 'positive number'),
        (dict(budget=[float('nan')]), 'positive number'),
        (dict(width=[65]), 'divisible'),
        (dict(K=[1.5]), 'positive integer'),
        (dict(lr_wd=['sgd']), 'unknown recipe'),
        ({}, 'non-empty dict'),
    ],
)
def test_bad_grids_fail_before_anything_exists(tmp_path, axes, msg):
    with pytest.raises(ConfigError, match=msg):
        run_scaling(Grid('smoke', axes), out_dir=tmp_path / 'out', progress=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_grid_names_and_variants(tmp_path):
    with pytest.raises(ConfigError, match='Unknown grid'):
        run_scaling('enormous', out_dir=tmp_path / 'out')
    with pytest.raises(ConfigError, match='Valid variants'):
        run_scaling(Grid('smoke', dict(K=[2]), variants=(AT_RISK, 'perloop-batchnorm')), out_dir=tmp_path / 'out')
    with pytest.raises(ConfigError, match='at-risk'):
        run_scaling(Grid('smoke', dict(K=[2]), variants=('perloop-raw',)), out_dir=tmp_path / 'out')
    with pytest.raises(ConfigError, match='radial_tokens'):
        run_scaling(Grid('smoke', dict(K=[2]), measure_tokens=64, radial_tokens=128), out_dir=tmp_path / 'out')
    with pytest.raises(
        ConfigError, match='warm-up'
    ):  # smoke: 96 steps, 10 of warm-up; x0.1 would never reach the peak lr
        run_scaling(Grid('smoke', dict(budget=[0.1])), out_dir=tmp_path / 'out')
    with pytest.raises(ConfigError, match='needs its own out_dir'):
        run_scaling(Grid('smoke', dict(K=[2])))
    assert list(tmp_path.iterdir()) == []


def test_variants_and_seeds_in_every_accepted_form(tmp_path):
    plan = check_scaling(
        Grid('smoke', dict(K=[2]), variants=f'{AT_RISK},perloop-raw', seeds=3), out_dir=tmp_path / 'out'
    )
    assert plan.spec.variants == (AT_RISK, 'perloop-raw') and plan.spec.seeds == (3,)
    assert {(j.variant, j.seed) for j in plan.jobs} == {(v, 3) for v in (AT_RISK, 'perloop-raw')}


def test_cpu_grid_plan(tmp_path):
    "40 runs with distinct folders, the official recipe's optimiser, and 38.4 centre runs' worth of training FLOPs."
    plan = check_scaling('cpu', out_dir=tmp_path / 'out')
    assert len(grid_points(plan)) == 10 and len(plan.jobs) == 40 and len({j.run_dir for j in plan.jobs}) == 40
    assert {j.cfg.readout for j in plan.jobs} == {'rmsnorm', 'raw', 'final_norm'}
    official = [j.cfg for j in plan.jobs if j.cell.name == 'lr_wd-official']
    assert all(
        (c.lr, c.schedule, c.warmup_steps, c.weight_decay, c.decay_all, c.beta2)
        == (3e-4, 'constant', 0, 0.01, True, 0.999)
        for c in official
    )
    centre = next(j.cfg for j in plan.jobs if j.cell.name == 'centre' and j.variant == AT_RISK)
    assert abs(estimate_seconds([j.cfg for j in plan.jobs]) / estimate_seconds([centre]) - 38.43) < 0.01
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('b', [0.3, 0.8, 1.7])
def test_fit_growth_recovers_power_laws(b):
    t = np.array([1, 2, 4, 8]) * 1e5
    f = fit_growth(t, 5.0 * t**b)
    assert abs(f['exponent'] - b) < 1e-10 and f['stderr'] < 1e-8 and abs(math.exp(f['intercept']) - 5.0) < 1e-6
    rng = np.random.default_rng(1)
    noisy = [fit_growth(t, 5.0 * t**b * np.exp(rng.normal(0, 0.2, 4))) for _ in range(2000)]
    z = np.array([(g['exponent'] - b) / g['stderr'] for g in noisy])
    for x in (1, 3):  # t with 2 dof: P(|T| <= x) = x/sqrt(x^2 + 2); binomial sd < 0.012
        assert abs(np.mean(np.abs(z) <= x) - x / math.sqrt(x * x + 2)) < 0.04, x
    mid, lo, hi = noisy[0]['predict'](PAPER_TOKENS)
    assert lo < mid < hi


def test_fit_growth_95_percent_interval_uses_t_and_covers():
    "With 4 budgets (2 dof) the 95% interval is 4.30 s.e. each side, and holds the true exponent ~95% of the time."
    assert abs(t_quantile(0.975, 2) - 4.302653) < 1e-5 and abs(t_quantile(0.975, 30) - 2.042272) < 1e-4
    t, rng = np.array([1, 2, 4, 8]) * 1e5, np.random.default_rng(2)
    fits = [fit_growth(t, 5.0 * t**0.5 * np.exp(rng.normal(0, 0.2, 4))) for _ in range(2000)]
    assert abs(np.mean([f['ci95'][0] <= 0.5 <= f['ci95'][1] for f in fits]) - 0.95) < 0.015
    f = fits[0]
    assert np.allclose(f['ci95'], (f['exponent'] - f['t95'] * f['stderr'], f['exponent'] + f['t95'] * f['stderr']))
    _, lo95, hi95 = f['predict'](PAPER_TOKENS, f['t95'])
    _, lo, hi = f['predict'](PAPER_TOKENS)
    assert lo95 < lo < hi < hi95
    assert np.allclose(local_slopes([4e5, 1e5, 2e5], [4.0, 1.0, 2.0]), [1.0, 1.0])


def test_fit_growth_refuses_what_it_cannot_fit():
    for t, y in [
        ([1e5], [1.0]),
        ([1e5, 1e5], [1.0, 2.0]),
        ([1e5, 2e5], [1.0, -1.0]),
        ([0, 2e5], [1.0, 2.0]),
        ([1e5, 2e5], [1.0]),
    ]:
        with pytest.raises(ValueError):
            fit_growth(t, y)


@pytest.mark.slow
def test_tiny_grid_trains_once_and_reruns_nothing(tmp_path, smoke_data):
    res = run_scaling('tiny', out_dir=tmp_path, progress=False)
    t = res.tables['runs']
    assert len(t) == len(res.plan.jobs) == 12 and set(t.status) == {'done'}
    assert t.norm.gt(0).all() and t.radial.between(0, 1).all()
    assert (t[t.variant == AT_RISK].radial < 1e-3).all() and (t[t.variant == 'perloop-raw'].radial > 1e-2).all()
    assert set(t[t.point == 'K-2']['ppl@2'].notna()) == {True} and t[t.point == 'K-2']['ppl@3'].isna().all()
    assert sorted(p.name for p in draw_scaling(res)) == ['axes.pdf', 'axes.png', 'drift.pdf', 'drift.png']
    assert len(list((tmp_path / 'records').glob('*.jsonl'))) == 12
    assert (tmp_path / 'reading.md').read_text() == res.notes['reading'] + '\n' and AT_RISK in res.notes['fits']
    before = stamps(tmp_path)
    again = run_scaling('tiny', out_dir=tmp_path, progress=False)
    assert stamps(tmp_path) == before  # no checkpoint written, no measurement made
    cols = [c for c in t.columns if c not in ('train_s', 'measure_s')]
    pd.testing.assert_frame_equal(again.tables['runs'][cols], t[cols])
    assert again.tables['runs'].train_s.equals(t.train_s)  # a rerun adds no training time


def test_interrupted_point_resumes_and_stale_measurements_are_redone(tmp_path, smoke_data):
    plan = check_scaling(SMALL, out_dir=tmp_path)
    job = next(j for j in plan.jobs if j.cell.name == 'centre' and j.variant == AT_RISK)
    train(job.cfg, job.run_dir, data=smoke_data, max_steps=1, progress=False)  # interrupted after its first step
    assert run_status(job.run_dir)['state'] == 'running'
    m1 = measure_run(job.run_dir, smoke_data, SMALL.measure_tokens, SMALL.radial_tokens)
    res = run_scaling(SMALL, out_dir=tmp_path, progress=False)
    st = run_status(job.run_dir)
    assert st['state'] == 'done' and st['step'] == job.cfg.steps
    assert set(res.tables['runs'].status) == {'done'} and len(res.tables['runs']) == 3 * 2
    m2 = json.loads((job.run_dir / 'scaling.json').read_text())
    assert m2['checkpoint'] != m1['checkpoint'] and m2['checkpoint'].startswith(latest_checkpoint(job.run_dir).name)
    assert m2['norms'][-1]['mean'] != m1['norms'][-1]['mean']  # the finished model was measured, not the 1-step one
    key = measure_key(job.run_dir, smoke_data, SMALL.measure_tokens, SMALL.radial_tokens)
    assert read_measure(job.run_dir, key) is not None
    assert read_measure(job.run_dir, dict(key, version=key['version'] + 1)) is None
    assert read_measure(job.run_dir, dict(key, tokens=2048)) is None
    (job.run_dir / 'scaling.json').write_text('{"trunc')  # damaged: measured again, not an error
    assert measure_run(job.run_dir, smoke_data, SMALL.measure_tokens, SMALL.radial_tokens)['exits'] == m2['exits']


def test_the_committed_cpu_grid_reads_back_and_refits():
    """figures/scaling-cpu/records (3 digits) refit within rounding of the fit made on the unrounded norms (b = 0.479,
    quoted in its README), and the 95% band is wider than ±1 s.e. (growth.csv itself: the rebuild test)."""
    from looped_lm.studies.runner import repo_root
    from looped_lm.extensions.scaling import growth_table, published_table

    folder, plan = repo_root() / 'figures' / 'scaling-cpu', check_scaling('cpu')
    table = published_table(plan, folder)
    assert len(table) == 40 and (table.status == 'done').sum() == 37
    fits, growth = growth_table(table, plan)
    f = fits[AT_RISK]
    assert abs(f['exponent'] - 0.479) < 0.005 and 'b = 0.479 and 16,835' in (folder / 'README.md').read_text()
    assert 0.2 < f['ci95'][0] < f['exponent'] < f['ci95'][1] < 0.8
    assert growth.loc[AT_RISK, '95% from'] < growth.loc[AT_RISK, '-1 s.e.'] < growth.loc[AT_RISK, '+1 s.e.']
    assert growth.loc[AT_RISK, '+1 s.e.'] < growth.loc[AT_RISK, '95% to']
