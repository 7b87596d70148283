"""One-off (issue 57), kept to show how the committed studies reached one layout: every study folder under `figures/`
holds `records/<run>.jsonl` (one file per run) beside a `study.json` that names its kind, so `ll.rebuild(folder)`
rebuilds any of them. The ablation's `runs.jsonl` and the scaling grid's `scaling.csv` become `records/`; the depth
studies' kinds name the study that publishes them; the horizon grid gets its `study.json`. Run from the repository
root; a second run changes nothing. Only `figures/` is migrated: a `results/` folder published before has no
`records/` (`ll.rebuild` says so) or, for a worth grid, `kind: depth` (publishing refuses it, saying so); rerun its
study on it (a worth grid's after deleting its `study.json`): its run folders are read back, nothing is retrained."""

import json
from pathlib import Path
import pandas as pd
from looped_lm.studies.runner import write_records
from looped_lm.extensions.horizon import check_horizon, horizon_identity

FIGURES = Path('figures')
KINDS = {  # the depth studies' folders, by the study that publishes them (`depth_study`'s name)
    'depth-worth': 'worth',
    'depth-worth/reference': 'worth-reference',
    **{str(p.parent.relative_to(FIGURES)): 'dose-pilot' for p in FIGURES.glob('depth-dose-trained/pilots/*/study.*')},
}


def name_kind(folder: Path, kind: str, newline: bool):
    "`study.json` of `folder` with `kind` as its first key (written as the study that publishes it writes it)."
    p = folder / 'study.json'
    identity = {'kind': kind, **{k: v for k, v in json.loads(p.read_text()).items() if k != 'kind'}}
    p.write_text(json.dumps(identity, indent=1) + ('\n' if newline else ''))


for folder in sorted(p.parent for p in FIGURES.glob('*/study.json') if 'variants' in p.read_text()):
    runs = folder / 'runs.jsonl'
    if runs.is_file():  # one line per run, each line kept byte for byte
        lines = [x for x in runs.read_text().splitlines() if x.strip()]
        write_records(folder, {'{variant}-seed{seed}'.format(**json.loads(x)): [json.loads(x)] for x in lines})
        runs.unlink()
    name_kind(folder, 'ablation', newline=False)  # as `publish` (04d_ablation) writes it

for rel, kind in KINDS.items():
    name_kind(FIGURES / rel, kind, newline=True)  # as `own_folder` (00a_files) writes it

scaling = FIGURES / 'scaling-cpu'
if (scaling / 'scaling.csv').is_file():  # one row per run: the row as the table holds it (no NaN in JSON)
    rows = pd.read_csv(scaling / 'scaling.csv').astype(object).to_dict('records')
    rows = [{k: None if isinstance(v, float) and v != v else v for k, v in r.items()} for r in rows]
    write_records(scaling, {f"{r['point']}-{r['variant']}-seed{r['seed']}": [r] for r in rows})
    (scaling / 'scaling.csv').unlink()

horizon = FIGURES / 'horizon-cpu'
if not (horizon / 'study.json').is_file():
    plan = check_horizon('cpu', horizon, horizon, 'cpu', 1)
    (horizon / 'study.json').write_text(json.dumps(horizon_identity(plan), indent=1) + '\n')
print('every study folder holds records/ and a study.json naming its kind')
