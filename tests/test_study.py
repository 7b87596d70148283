"""The study's parameters, claims and workers (issues 9, 11, 12, 13, 14).

Parameters: every accepted form of `seeds`/`variants` gives the same list; every refused value fails before any
folder exists. Claims: a group claim is not reported as reproduced when one member of the group fails it.
Workers: two worker processes give the same tables as one (smoke, 2 variants x 1 seed).
"""

import math
from pathlib import Path
import pytest
from looped_lm.config import ConfigError
from looped_lm.ablation import (
    GROUPS,
    CLAIMS,
    VARIANTS,
    check_params,
    check_seeds,
    check_variants,
    claims,
    run_ablation,
    study_key,
)


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
    assert check_variants(None) == check_variants('all') == list(VARIANTS)
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
        ('norm-penalty', 'perloop-penalty'),
        ('final-norm', 'perloop-finalnorm'),
        ('scale-clamp', 'Table 4'),
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
    assert main.is_main and main.study_dir == tmp_path and main.fig_dir == tmp_path / 'figures'
    assert (
        sub.study_dir == tmp_path / f"study-{study_key(['perloop-raw'], [1, 2])}"
        and sub.fig_dir == sub.study_dir / 'figures'
    )
    assert (
        len({study_key(['perloop-raw'], [1]), study_key(['perloop-raw'], [2]), study_key(['perloop-rmsnorm'], [1])})
        == 3
    )


# ---- claims over whole groups, on synthetic records ----


def record(variant, seed, norm, radial, ppl, clamp_ratio=1.0, hill=5.0):
    ex = [dict(k=k + 1, ppl=p, ce=math.log(p)) for k, p in enumerate(ppl)]
    cl = {
        m: [dict(k=k + 1, ppl=p * (r if k == len(ppl) - 1 else 1), ce=0, norm_l2=1) for k, p in enumerate(ppl)]
        for m, r in (('none', 1.0), ('freeze_loop1', clamp_ratio), ('remove_radial', clamp_ratio))
    }
    return dict(
        variant=variant,
        seed=seed,
        status='done',
        run_dir='',
        message='',
        radial_train=radial,
        diag=dict(
            exits=dict(validation=ex, test=ex),
            norms=[dict(mean=norm, median=norm, hill=hill, p99=norm, max=norm)],
            radial=[dict(readout=radial, predicted=None)],
            clamp=cl,
        ),
    )


def study(seed, **change):
    at_risk, ok = (
        dict(norm=1e4, radial=1e-9, ppl=[50, 49.9, 49.9, 49.8]),
        dict(norm=10.0, radial=1e-9, ppl=[45, 43, 42, 41]),
    )
    spec = {v: (at_risk if not VARIANTS[v].scale_controlled else ok) for v in VARIANTS}
    for v in ('terminal-raw', 'perloop-raw'):
        spec[v] = {**ok, 'radial': 0.1}
    return [record(v, seed, **{**spec[v], **change.get(v, {})}) for v in VARIANTS]


def test_all_claims_reproduced_when_every_member_holds():
    cl = claims(study(0) + study(1) + study(2))
    assert {c: v['verdict'] for c, v in cl.items()} == {c: 'reproduced' for c in CLAIMS}
    assert (
        cl['C1']['at_risk'] == ['terminal-rmsnorm', 'perloop-rmsnorm', 'layernorm']
        and 'internorm' in cl['C1']['controlled']
    )


@pytest.mark.parametrize(
    'claim, member, change',
    [
        ('C1', 'perloop-finalnorm', dict(norm=5e3)),  # one controlled variant drifts too
        ('C2', 'terminal-penalty', dict(radial=1e-3)),  # one normalized readout is not blind
        ('C3', 'internorm', dict(ppl=[45, 45, 45, 45])),  # one controlled variant does not use depth
        ('C4', 'layernorm', dict(clamp_ratio=1.2)),  # the clamp hurts one at-risk variant
        ('C5', 'perloop-rmsnorm', dict(hill=40.0)),  # one at-risk variant has a light tail
        (
            'C6',
            'perloop-raw',
            dict(ppl=[60, 60, 60, 60], radial=0.1),
        ),  # one controlled variant is worse than the at-risk ones
    ],
)
def test_one_failing_member_is_not_reproduced(claim, member, change):
    every_seed = claims(study(0, **{member: change}) + study(1, **{member: change}))[claim]
    assert every_seed['verdict'] == 'not reproduced at this scale' and every_seed['seeds_held'] == '0/2', every_seed
    one_seed = claims(study(0) + study(1, **{member: change}))[claim]
    assert one_seed['verdict'] != 'reproduced' and one_seed['seeds_held'] == '1/2', one_seed


def test_a_failed_member_is_not_a_pass():
    recs = study(0)
    for r in recs:
        if r['variant'] == 'perloop-penalty':
            r.update(status='failed', diag={})
    cl = claims(recs)
    assert cl['C3']['verdict'] == cl['C6']['verdict'] == 'not measured'
    assert cl['C2']['verdict'] == 'not measured'


# ---- workers ----


def test_two_workers_give_the_same_tables(tmp_path, smoke_data):
    kw = dict(variants=['perloop-rmsnorm', 'perloop-raw'], seeds=[0], max_eval_batches=1, progress=False, figures=False)
    one = run_ablation('smoke', out_dir=tmp_path / 'one', workers=1, **kw)
    two = run_ablation('smoke', out_dir=tmp_path / 'two', workers=2, **kw)
    sd = lambda o: o / f"study-{study_key(kw['variants'], [0])}"
    for t in ('table1', 'table2'):
        a, b = (sd(tmp_path / o) / 'tables' / f'{t}.csv' for o in ('one', 'two'))
        assert a.read_text() == b.read_text(), t
    assert [r['status'] for r in one] == [r['status'] for r in two] == ['done', 'done']
