"""Issue 57: one plan, one job, one result. Every study the package offers (`ll.run_*`) plans a `Plan` of `Job`s and
returns a `StudyResult`, each run here on the smallest grid of its kind (a few smoke-preset steps, in a temporary
folder), so that a study added later without that shape fails here."""

import dataclasses
import pytest
import looped_lm as ll
from looped_lm.studies.runner import Job, Plan, StudyResult
from looped_lm.studies.variants import AT_RISK
from looped_lm.extensions.depth import DEPTH_GRIDS
from looped_lm.extensions.horizon import HorizonGrid
from looped_lm.extensions.scaling import Grid
from looped_lm.extensions.worth import WORTH_GRIDS

RUNS = sorted(n for n in ll.__all__ if n.startswith('run_') and n != 'run_loops')  # run_loops runs a model, not a study
ONE = dict(progress=False)
SMALLEST = {  # (the call, the kind its plan must say)
    'run_ablation': (
        lambda d: ll.run_ablation('smoke', ['perloop-raw'], [0], d, max_eval_batches=1, **ONE),
        'ablation',
    ),
    'run_scaling': (
        lambda d: ll.run_scaling(
            Grid(
                'smoke',
                dict(K=[2]),
                overrides=dict(train_tokens=1024, warmup_steps=0),
                variants=(AT_RISK,),
                measure_tokens=256,
                radial_tokens=128,
                publish=False,
            ),
            out_dir=d,
            **ONE,
        ),
        'scaling',
    ),
    'run_horizon': (
        lambda d: ll.run_horizon(
            HorizonGrid(
                'smoke',
                4,
                ((3e-3, (AT_RISK,)),),
                (0,),
                dict(log_every=2),
                first=2,
                measure_tokens=256,
                radial_tokens=128,
                publish=False,
            ),
            out_dir=d,
            **ONE,
        ),
        'horizon',
    ),
    'run_depth': (
        lambda d: ll.run_depth(
            dataclasses.replace(DEPTH_GRIDS['tiny'], steps=8, seeds=(1,), variants=('perloop-raw',)), out_dir=d, **ONE
        ),
        'depth',
    ),
    'run_worth': (
        lambda d: ll.run_worth(
            dataclasses.replace(WORTH_GRIDS['worth-tiny'], seeds=(1,), arms=(('B8', 1, 8),), variants=('perloop-raw',)),
            out_dir=d,
            **ONE,
        ),
        'worth',
    ),
}


def test_every_study_of_the_package_is_tested_here():
    "A new `ll.run_*` must say here how to run it smallest; `run_grid` is the runner all but the ablation go through."
    assert sorted(set(RUNS) - {'run_grid'}) == sorted(SMALLEST), RUNS


@pytest.mark.corpus
@pytest.mark.parametrize('name', sorted(SMALLEST))
def test_every_study_returns_a_study_result(name, tmp_path):
    run, kind = SMALLEST[name]
    res = run(tmp_path / name)
    assert type(res) is StudyResult, type(res)
    assert type(res.plan) is Plan and res.plan.kind == kind
    assert res.plan.jobs and all(type(j) is Job for j in res.plan.jobs)
    assert res.records and res.tables and res.published, (name, len(res.records), list(res.tables))
