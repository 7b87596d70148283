"""The users' main command, `papermill nbs/05_ablation.ipynb`, run whole on the `smoke` preset into a temporary folder:
its study cells are `#| slow`, which `nbdev-test` skips, so this is where the chapter runs under the tests. Every cell
runs, each claim gets a verdict, the figures are drawn, and the study's folder holds what `ll.rebuild` reads."""

import json, subprocess, sys
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.corpus
def test_the_main_chapter_runs_whole_on_the_smoke_preset(tmp_path):
    study, figs, out = tmp_path / 'study', tmp_path / 'figs', tmp_path / '05_ablation.ipynb'
    params = dict(preset='smoke', out_dir=str(study), fig_dir=str(figs), max_eval_batches='2')
    cmd = [sys.executable, '-m', 'papermill', str(REPO / 'nbs' / '05_ablation.ipynb'), str(out), '--cwd', str(REPO)]
    cmd += [x for k, v in params.items() for x in ('-p', k, v)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads(out.read_text())['cells']
    text = ''.join(''.join(o.get('text', '')) for c in cells if c['cell_type'] == 'code' for o in c.get('outputs', []))
    assert 'verdicts, each one of 5 kinds; claims.json and claims.md in' in text, text[-2000:]
    assert sorted(p.name for p in figs.glob('*.png')) and (study / 'claims.json').is_file()
    assert json.loads((study / 'study.json').read_text())['kind'] == 'ablation' and any((study / 'records').iterdir())
