"""The dose intervention (nbs/06f_dose.ipynb) on depth-worth's B1200 at-risk runs, seeds 1-3: the depth gain against
the dose c applied after loop 1, on the whole validation split, and c* against each seed's weakest control (records).

    python figures/depth-dose/dose_b1200.py RUNS_DIR     # the worth grid's runs/ (B1200-perloop-rmsnorm-seed*)
    python figures/depth-dose/dose_b1200.py --rebuild    # curves.md and the figures again, from curves.json

The runs are retrained where their checkpoints are not at hand (`run_worth('worth', arms=['B1200'])`, or the three
at-risk jobs of its plan): each curve names its checkpoint, compared with the committed record's (same weights or not).
Writes curves.json, curves.md, gain_vs_dose.png and gain_vs_drift.png beside this file (the second: the curves against
the drift ratio, with depth-worth's trained arms as points, from its records as they are when it runs, and the
regime's pilots of figures/depth-dose-trained/ as open markers).
"""

import json, sys
from pathlib import Path
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from looped_lm.core.files import machine_record, code_record, write_atomic  # noqa: E402
from looped_lm.extensions.depth import read_depth_records, depth_row, PER_LOOP_CONTROLS  # noqa: E402
from looped_lm.extensions.dose import DOSES, dose_response, dose_star, draw_gain_vs_drift, trained_points  # noqa: E402
from looped_lm.extensions.worth import WORTH  # noqa: E402
from looped_lm.measure.diagnostics import EVAL_TOKENS, checkpoint_id  # noqa: E402
from looped_lm.training.rundir import latest_checkpoint, load_run  # noqa: E402

HERE = Path(__file__).resolve().parent
WORTH_DIR = HERE.parent / 'depth-worth'
PILOTS = HERE.parent / 'depth-dose-trained' / 'pilots' / 'choice.json'  # the regime's pilots, drawn as they stand


def pilots() -> list:
    "The measured pilots of the dose study's regime search (none before it began)."
    return json.loads(PILOTS.read_text())['measured'] if PILOTS.is_file() else []


def seed_curve(run_dir: Path, data, record: dict, weakest: float) -> dict:
    cfg, model = load_run(run_dir, 'cpu')
    ck = checkpoint_id(latest_checkpoint(run_dir))
    rows = dose_response(model, data.validation, DOSES, 1, EVAL_TOKENS // cfg.seq_len, cfg.seq_len)
    star = dose_star(rows, weakest)
    return dict(run=run_dir.name, checkpoint=ck, record_checkpoint=record['checkpoint'],
                same_weights=ck == record['checkpoint'], record_g_K=depth_row(record)['g_K'],
                weakest_control_g_K=weakest, c_star=star, rows=rows)  # fmt: skip


def markdown(out: dict) -> str:
    "The curves as a table: per dose, each seed's gain to exit K; then c* per seed against its weakest control / 3."
    cs = out['curves']
    lines = ['| c | ' + ' | '.join(f"seed {c['seed']} gain to exit 4 (nats)" for c in cs) + ' |']
    lines += ['|---:|' + '---:|' * len(cs)]
    for i, dose in enumerate(out['doses']):
        lines.append(f"| {dose:g} | " + ' | '.join(f"{c['rows'][i]['gain_K']:.4f}" for c in cs) + ' |')
    lines += [
        '',
        '| seed | weights as the record | gain at c = 1 (record) | weakest control / 3 | c* | max exit-1 rel. diff |',
    ]
    lines += ['|---:|---|---:|---:|---:|---:|']
    for c in cs:
        star = f"{c['c_star']:.1f}" if c['c_star'] else 'beyond the grid'
        diff = max(r['exit_j_rel_diff'] for r in c['rows'])
        same, gain, third = 'yes' if c['same_weights'] else 'NO', c['rows'][0]['gain_K'], c['weakest_control_g_K'] / 3
        lines.append(
            f"| {c['seed']} | {same} | {gain:.4f} ({c['record_g_K']:.4f}) | {third:.4f} | {star} | {diff:.1e} |"
        )
    return '\n'.join(lines) + '\n'


def figure(out: dict, path: Path):
    "The at-risk gain to exit 4 against the dose, per seed, with each seed's weakest control / 3 (C3's line)."
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for c in out['curves']:
        (line,) = ax.plot(
            [r['c'] for r in c['rows']], [r['gain_K'] for r in c['rows']], 'o-', ms=3, label=f"seed {c['seed']}"
        )
        ax.axhline(c['weakest_control_g_K'] / 3, color=line.get_color(), ls=':', lw=0.8)
    ax.set(xscale='log', xlabel='dose c (state x c after loop 1)', ylabel='at-risk gain, exit 1 to 4 (nats)')
    ax.axhline(0, color='grey', lw=0.5)
    ax.legend(fontsize=7, title="dotted: weakest control / 3", title_fontsize=7)
    fig.savefig(path, dpi=150, bbox_inches='tight', metadata={'Software': None})
    plt.close(fig)


if __name__ == '__main__' and sys.argv[1:] == ['--rebuild']:
    out = json.loads((HERE / 'curves.json').read_text())
    write_atomic(HERE / 'curves.md', markdown(out))
    figure(out, HERE / 'gain_vs_dose.png')
    draw_gain_vs_drift(out, trained_points(read_depth_records(WORTH_DIR)), HERE / 'gain_vs_drift.png', pilots=pilots())
elif __name__ == '__main__':
    runs = Path(sys.argv[1])
    plan = WORTH.check('worth', runs.parent, HERE / 'scratch', 'auto', 1, arms=['B1200'])
    data = WORTH.data(plan)
    recs = {(r['variant'], r['seed']): r for r in read_depth_records(WORTH_DIR) if r['arm'] == 'B1200'}
    curves = []
    for s in (1, 2, 3):
        weakest = min(depth_row(recs[v, s])['g_K'] for v in PER_LOOP_CONTROLS)
        run = runs / f'B1200-perloop-rmsnorm-seed{s}'
        curves.append(dict(seed=s, **seed_curve(run, data, recs['perloop-rmsnorm', s], weakest)))
        print(curves[-1]['run'], curves[-1]['same_weights'], curves[-1]['c_star'], flush=True)
    out = dict(machine=machine_record('cpu', 'float32'), code=code_record(['looped_lm.extensions.dose']),
               doses=list(DOSES), j=1, curves=curves)  # fmt: skip
    write_atomic(HERE / 'curves.json', json.dumps(out, indent=1))
    write_atomic(HERE / 'curves.md', markdown(out))
    figure(out, HERE / 'gain_vs_dose.png')
    draw_gain_vs_drift(out, trained_points(read_depth_records(WORTH_DIR)), HERE / 'gain_vs_drift.png', pilots=pilots())
