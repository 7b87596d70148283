"""A study folder never silently loses, mixes or keeps a stale record (issue 58): publishing into a committed folder
from a fresh clone, another grid or preset, a shortened record, a remove_stale that nothing redid."""

import json, shutil
from pathlib import Path
import pandas as pd
import pytest
from looped_lm.core.config import ConfigError
from looped_lm.core.files import StudyFolderError

FIGURES = Path(__file__).resolve().parents[1] / 'figures'


def test_an_unrun_scaling_grid_never_overwrites_the_committed_rows(tmp_path):
    "58.1: finishing the scaling grid where no run folder exists would turn 37 measured rows into 40 'missing' ones."
    from looped_lm.extensions.scaling import check_scaling, published_rows, scaling_result, write_results

    fig = tmp_path / 'fig'
    shutil.copytree(FIGURES / 'scaling-cpu', fig)
    before = {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()}  # the records too
    plan = check_scaling('cpu', out_dir=tmp_path / 'out', fig_dir=fig)
    unrun = published_rows(fig).assign(status='missing')
    with pytest.raises(ConfigError, match='37 measured row'):
        write_results(scaling_result(plan, unrun, {}, pd.DataFrame(), ''))
    assert {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()} == before  # nothing written
    assert not (tmp_path / 'out' / 'records').exists()


def test_a_committed_grid_folder_belongs_to_its_study(tmp_path):
    "58.5: the smoke-preset tiny grid published into a copy of figures/depth-worth is refused, nothing written."
    from looped_lm.extensions.worth import WORTH

    fig = tmp_path / 'depth-worth'
    shutil.copytree(FIGURES / 'depth-worth', fig)
    options = dict(max_batches=None, eval_tokens=8192)
    assert json.loads((fig / 'study.json').read_text()) == dict(
        kind='worth', grid='worth', preset='cpu-cosine', options=options
    )
    before = {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()}
    plan = WORTH.check('worth-tiny', tmp_path / 'out', fig, 'cpu', 1)
    with pytest.raises(StudyFolderError, match="grid 'worth' there, 'worth-tiny' here"):
        WORTH.finish(plan, WORTH.data(plan))
    assert {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()} == before


def test_another_evaluation_budget_is_refused_before_any_work(tmp_path, monkeypatch):
    "58, study.json's options: the worth grid published with 2 evaluation windows into its folder is refused first."
    import dataclasses
    import looped_lm.extensions.depth as depth
    from looped_lm.extensions.worth import WORTH

    fig = tmp_path / 'depth-worth'
    shutil.copytree(FIGURES / 'depth-worth', fig)
    before = {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()}
    plan = WORTH.check('worth', tmp_path / 'out', fig, 'cpu', 1)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, max_batches=2))
    monkeypatch.setattr(depth, 'plan_records', lambda *a: pytest.fail('measured before the folder was checked'))
    with pytest.raises(StudyFolderError, match="options .*'max_batches': None.* there, .*'max_batches': 2"):
        WORTH.finish(plan, None)
    assert {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()} == before


@pytest.mark.parametrize('study', ['depth-cpu', 'depth-worth'])
def test_every_committed_grid_folder_names_its_study(study):
    "Each committed kept-record grid names the grid and preset its records were made by (checked on publishing)."
    meta = json.loads((FIGURES / study / 'study.json').read_text())
    arms = {json.loads(line)['arm'] for f in (FIGURES / study / 'records').glob('*.jsonl') for line in open(f)}
    from looped_lm.extensions.worth import WORTH_GRIDS
    from looped_lm.extensions.depth import DEPTH_GRIDS

    spec = {**DEPTH_GRIDS, **WORTH_GRIDS}[meta['grid']]
    assert meta['preset'] == spec.preset and arms <= {a[0] for a in spec.arms}
    assert meta['options'] == dict(max_batches=spec.max_batches, eval_tokens=spec.eval_tokens)  # its evaluation


def test_a_folder_of_two_measuring_codes_says_so_in_every_table(tmp_path):
    "58.2: a record names its measuring code; a study folder whose records mix codes says so in its tables and rules."
    import json
    from looped_lm.extensions.worth import rebuild_worth

    fig = tmp_path / 'depth-worth'
    shutil.copytree(FIGURES / 'depth-worth', fig)
    before = {p.name: p.read_bytes() for p in fig.glob('*.md')}
    rebuild_worth(fig)
    assert {p.name: p.read_bytes() for p in fig.glob('*.md')} == before  # one code (not recorded): nothing said
    path = fig / 'records' / 'B1200-perloop-raw-seed2.jsonl'
    path.write_text(json.dumps(dict(json.loads(path.read_text()), code='ab12cd34')) + '\n')  # re-measured by other code
    rebuild_worth(fig)
    for name in ('rules.md', 'worth.md'):
        head = (fig / name).read_text().splitlines()[0]
        assert (
            head == '**Arm B1200 mixes records**, read together: code: not recorded (17 records), ab12cd34 (1 records).'
        )


@pytest.mark.corpus
def test_publishing_in_a_fresh_clone_without_run_folders_changes_nothing(tmp_path):
    "58, done when: the documented --publish-only, run where no run folder exists, keeps every committed byte."
    import os, subprocess, sys

    shutil.copytree(FIGURES / 'depth-worth', tmp_path / 'figures' / 'depth-worth')
    (tmp_path / 'settings.ini').write_bytes((FIGURES.parent / 'settings.ini').read_bytes())
    before = {p: p.read_bytes() for p in (tmp_path / 'figures').rglob('*') if p.is_file()}
    script = FIGURES.parent / 'scripts' / 'depth_worth_gpu.py'
    cmd = [sys.executable, str(script), '--grid', 'worth', '--device', 'auto', '--publish-only']
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert 'published 0 of 36' in out.stdout and 'kept as published' in out.stdout, out.stdout[-2000:]
    assert {p: p.read_bytes() for p in (tmp_path / 'figures').rglob('*') if p.is_file()} == before


def test_two_evaluation_budgets_in_one_folder_are_said_in_its_tables(tmp_path):
    "58.4: a record measured on 2 windows published beside whole-split ones: the table and rules say so."
    import json
    from looped_lm.extensions.worth import rebuild_worth

    fig = tmp_path / 'depth-worth'
    shutil.copytree(FIGURES / 'depth-worth', fig)
    path = fig / 'records' / 'B1200-perloop-penalty-seed3.jsonl'
    path.write_text(json.dumps(dict(json.loads(path.read_text()), max_batches=2)) + '\n')  # another study's budget
    rebuild_worth(fig)
    for name in ('rules.md', 'worth.md'):
        head = (fig / name).read_text().splitlines()[0]
        assert (
            head.startswith('**Arm B1200 mixes records**')
            and 'budget: all windows of 8192 tokens (17 records), 2 windows of 8192 tokens (1 records)' in head
        ), head


def test_a_scaling_folder_belongs_to_its_grid(tmp_path):
    "58.5 for the scaling study: the tiny grid's table published into a copy of figures/scaling-cpu is refused."
    from looped_lm.extensions.scaling import check_scaling, published_rows, scaling_result, write_results

    fig = tmp_path / 'fig'
    shutil.copytree(FIGURES / 'scaling-cpu', fig)
    spec = check_scaling('cpu', out_dir=tmp_path / 'cpu').spec
    options = dict(measure_tokens=spec.measure_tokens, radial_tokens=spec.radial_tokens)
    assert json.loads((fig / 'study.json').read_text()) == dict(
        kind='scaling', grid='cpu', preset=spec.preset, options=options
    )
    before = {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()}  # the records too
    plan = check_scaling('tiny', out_dir=tmp_path / 'out', fig_dir=fig)
    table = published_rows(fig)
    with pytest.raises(StudyFolderError, match="grid 'cpu' there, 'tiny' here"):
        write_results(scaling_result(plan, table, {}, pd.DataFrame(), ''))
    assert {p: p.read_bytes() for p in fig.rglob('*') if p.is_file()} == before  # nothing written


def test_an_ablation_never_publishes_over_another_studys_records(tmp_path):
    """Issue 57 (a second reader's finding): the ablation's records are one file per run in `records/`, so publishing
    the main study into a copy of another study's folder would delete that study's files. A folder of another kind is
    refused before anything is written; a folder of the same study that holds finished runs this call could not read
    keeps them (the published study stays, with a warning)."""
    import warnings
    from looped_lm.core.files import StudyFolderError
    from looped_lm.studies.ablation import check_params, publish
    from looped_lm.studies.tables import synthetic_study

    worth, cpu = tmp_path / 'depth-worth', tmp_path / 'cpu-3seeds'
    shutil.copytree(FIGURES / 'depth-worth', worth)
    shutil.copytree(FIGURES / 'cpu-3seeds', cpu)
    before = {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()}
    st = check_params('smoke', out_dir=worth)
    with pytest.raises(StudyFolderError, match="kind 'worth' there, 'ablation' here"):
        publish(synthetic_study(tuple(st.spec.seeds), variants=st.spec.variants), st)
    st = check_params('cpu', out_dir=cpu)
    assert st.study_dir == cpu  # the main study of that folder
    missing = [dict(variant=v, seed=s, status='missing', message='') for v in st.spec.variants for s in st.spec.seeds]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert publish(missing, st).published is False
    assert 'keeps its published records' in str(w[-1].message)
    assert {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()} == before  # nothing written, nothing lost
