"""After the main job: the executed notebook, the tables, the claims and the figures of `preset` exist and are sound."""

import json, sys
from pathlib import Path

preset = sys.argv[1]
root = Path(__file__).resolve().parent.parent
res = root / 'results' / preset
problems = []


def need(paths, what):
    paths = [p for p in paths if p.is_file() and p.stat().st_size > 0]
    if not paths:
        problems.append(f"no {what}")
    return paths


need([root / 'results' / '05_ablation.ipynb'], 'executed notebook results/05_ablation.ipynb')
for t in ('table1', 'table2'):
    for ext in ('csv', 'md', 'tex'):
        need(list(res.rglob(f'{t}.{ext}')), f'{t}.{ext} under {res}')
claims = need(list(res.rglob('claims.json')), f'claims.json under {res}')
for c in claims:
    d = json.loads(c.read_text())
    if not d:
        problems.append(f'{c} is empty')
figs = need(
    [*res.rglob('*.png'), *(root / 'figures' / preset).rglob('*.png')], f'figure (PNG) under {res} or figures/{preset}'
)
nb = (
    json.loads((root / 'results' / '05_ablation.ipynb').read_text())
    if (root / 'results' / '05_ablation.ipynb').exists()
    else {'cells': []}
)
errs = [o for c in nb['cells'] for o in c.get('outputs', []) if o.get('output_type') == 'error']
if errs:
    problems.append(f'the executed notebook holds {len(errs)} error output(s)')
if problems:
    sys.exit('main job incomplete: ' + '; '.join(problems))
print(f"main job outputs: {len(claims)} claims file(s), {len(figs)} PNG figure(s), tables 1-2 in CSV/MD/TeX")
