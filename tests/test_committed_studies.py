"""Every committed study rebuilds every table and verdict from its per-run records alone (`figures/<study>/records/`,
named by its `study.json`), byte-identical, through the one `ll.rebuild`: each verdict of the README can be re-checked
without retraining. A study without records is listed, so that the gap stays visible."""

import json
import shutil
from pathlib import Path
import pytest

FIGURES = Path(__file__).resolve().parents[1] / 'figures'
PUBLISHED = sorted(  # every study folder with records, as a path under figures/
    str(p.parent.relative_to(FIGURES))
    for p in FIGURES.rglob('study.json')
    if any((p.parent / 'records').glob('*.jsonl'))
)
WITH_RECORDS = sorted(
    s for s in PUBLISHED if json.loads((FIGURES / s / 'study.json').read_text())['kind'] == 'ablation'
)
STUDIES = sorted(p.parent.name for p in FIGURES.glob('*/claims.json'))
INPUTS = ('records', 'study.json', 'throughput.json')  # what a study is rebuilt from; the rest is what it rebuilds


def run_records(study: str) -> list:
    "An ablation's committed per-run records, in its row order."
    from looped_lm.studies.tables import read_run_records

    return read_run_records(FIGURES / study)


def test_the_default_study_has_records():
    "The three-seed study of the default preset is the README's first column: it must be re-checkable."
    assert 'cpu-3seeds' in WITH_RECORDS, f"figures/cpu-3seeds/records is missing; studies with records: {WITH_RECORDS}"


def test_no_study_keeps_the_old_record_files():
    "Issue 57: one layout, `records/<run>.jsonl`; the ablation's `runs.jsonl` and scaling's `scaling.csv` are gone."
    assert not [*FIGURES.rglob('runs.jsonl'), *FIGURES.rglob('scaling.csv')]


@pytest.fixture(scope='module')
def records_only(tmp_path_factory) -> Path:
    "Every committed study folder, copied with its records and `study.json` (and throughput) only."
    root = tmp_path_factory.mktemp('figures')
    for study in PUBLISHED:
        for name in INPUTS:
            src, dst = FIGURES / study / name, root / study / name
            if src.is_dir():
                shutil.copytree(src, dst)
            elif src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, dst)
    return root


def made_files(folder: Path) -> set:
    "The tables and verdicts a study folder holds: its files and `tables/`, less its inputs, README and figures."
    top = [p for p in folder.iterdir() if p.is_file() and p.name not in INPUTS and p.name != 'README.md']
    made = [p for p in top if p.suffix in ('.md', '.json', '.csv')] + sorted((folder / 'tables').glob('*'))
    return {str(p.relative_to(folder)) for p in made}


@pytest.mark.parametrize('study', PUBLISHED)
def test_every_committed_study_rebuilds_from_its_records(study, records_only):
    """`ll.rebuild` on a copy holding only the records and `study.json` writes every table and verdict the study's
    folder holds, byte-identical (R0 of a depth study reads the `cpu-3seeds` and `horizon-cpu` copies beside it); an
    ablation's tables are committed as Markdown, their CSV and LaTeX twins are not."""
    import looped_lm as ll

    src, dst = FIGURES / study, records_only / study
    ll.rebuild(dst)
    committed, rebuilt = made_files(src), made_files(dst)
    assert committed, f"{study} holds no tables"
    assert committed <= rebuilt, sorted(committed - rebuilt)  # no committed table or verdict without its rebuild
    assert all(n.startswith('tables/') and n.endswith(('.csv', '.tex')) for n in rebuilt - committed), study
    for name in sorted(committed):
        assert (dst / name).read_bytes() == (src / name).read_bytes(), f"{study}: {name} differs from its rebuild"


def test_studies_without_records_are_the_known_ones():
    "Studies made before records were kept; each says so in its README. A new study must commit its records."
    assert sorted(set(STUDIES) - set(WITH_RECORDS)) == ['cpu-cosine-3seeds']
    import looped_lm as ll

    assert 'no per-run records' in (FIGURES / 'cpu-cosine-3seeds' / 'README.md').read_text()
    with pytest.raises(ll.ConfigError, match='holds no records'):
        ll.rebuild(FIGURES / 'cpu-cosine-3seeds')


def test_the_horizon_drift_law_is_not_carried_to_the_papers_clocks():
    "Issue 32: the committed drift law is flagged not usable, so `drift.md` carries it to no clock of the paper."
    assert "not carried to the paper's clocks" in (FIGURES / 'horizon-cpu' / 'drift.md').read_text()


RULES_OF_WORTH = ('R1', 'R2', 'R2b', 'R5')


def test_worth_records_follow_the_preregistered_design():
    """figures/depth-worth/: the pre-registration's grid (6 variants x budgets of 1,200 and 4,800 steps x seeds 1-3),
    each record at its budget's last step and naming its machine; every run of a budget that has records is there."""
    import json
    from looped_lm.extensions.depth import read_depth_records
    from looped_lm.extensions.worth import WORTH_VARIANTS

    recs = read_depth_records(FIGURES / 'depth-worth')
    if not recs:
        pytest.skip('the depth-worth study has no records yet (its pre-registration is committed first)')
    budgets = {'B1200': 1200, 'B4800': 4800}
    assert {(r['arm'], r['step']) for r in recs} <= set(budgets.items())
    assert all(isinstance(r.get('machine'), dict) and r['machine'].get('cpu_capability') for r in recs)
    rules = json.loads((FIGURES / 'depth-worth' / 'rules.json').read_text())
    for arm in {r['arm'] for r in recs}:  # a budget still running (its records committed as they land) is no verdict
        have = {(r['variant'], r['seed']) for r in recs if r['arm'] == arm}
        assert {s for _, s in have} <= {1, 2, 3} and {v for v, _ in have} <= set(WORTH_VARIANTS), arm
        if have != {(v, s) for v in WORTH_VARIANTS for s in (1, 2, 3)}:
            assert all(rules['arms'][arm][r]['verdict'].startswith('not measured: missing ') for r in RULES_OF_WORTH)
    for arm, rs in rules['arms'].items():  # R1 is the one gate, recomputed here without the claims code
        if rs['R1']['verdict'].startswith('not measured'):
            continue
        runs = [dict(variant=r['variant'], seed=r['seed'], diag=r['diag']) for r in recs if r['arm'] == arm]
        assert (rs['R1']['verdict'] == 'holds') == gate_by_hand(runs), arm


def test_depth_records_hold_every_run_at_both_steps():
    "The pre-registered design (figures/depth-cpu/README.md): 2 arms x 8 variants x seeds 1-3, steps 800 and 1,000."
    if not (FIGURES / 'depth-cpu' / 'rules.json').exists():
        pytest.skip('the depth study has not been published yet')
    from looped_lm.extensions.depth import read_depth_records, DEPTH_VARIANTS

    have = {(r['arm'], r['variant'], r['seed'], r['step']) for r in read_depth_records(FIGURES / 'depth-cpu')}
    want = {(a, v, s, t) for a in ('L2', 'L1') for v in DEPTH_VARIANTS for s in (1, 2, 3) for t in (800, 1000)}
    assert sorted(want - have) == [], 'records missing from figures/depth-cpu/records'


def gate_by_hand(runs: list) -> bool:
    """C3/C7's testability recomputed without the claims code: a one-pass run beside the conditions, and on the seed
    mean and all seeds but one D = ln PPL(one-pass) - ln PPL@K(terminal-penalty) >= 0.02, perloop-raw's gain to its
    best exit >= 0.02 nats, at-risk final-loop RMS >= 10x perloop-raw's."""
    import math

    by = {(r['variant'], r['seed']): r['diag'] for r in runs if r.get('diag')}
    seeds = sorted({s for v, s in by if v != 'one-pass'})
    if not any(v == 'one-pass' for v, _ in by):
        return False
    ppl = lambda v, s: [e['ppl'] for e in by[v, s]['exits']['validation']]
    rms = lambda v, s: by[v, s]['clamp']['none'][-1]['norm_rms']
    d = [math.log(ppl('one-pass', s)[0]) - math.log(ppl('terminal-penalty', s)[-1]) for s in seeds]
    g = [math.log(ppl('perloop-raw', s)[0]) - min(map(math.log, ppl('perloop-raw', s))) for s in seeds]
    r = [rms('perloop-rmsnorm', s) / rms('perloop-raw', s) for s in seeds]
    mean_r = sum(rms('perloop-rmsnorm', s) for s in seeds) / sum(rms('perloop-raw', s) for s in seeds)
    most = lambda xs, t: sum(x >= t for x in xs) >= max(1, len(xs) - 1)
    return (
        sum(d) / len(d) >= 0.02
        and most(d, 0.02)
        and sum(g) / len(g) >= 0.02
        and most(g, 0.02)
        and mean_r >= 10
        and most(r, 10)
    )


@pytest.mark.parametrize('study', WITH_RECORDS)
def test_evidence_tags_and_margin_sensitivity_follow_the_records(study):
    """Recomputed here from the records alone: C3 and C7 are tagged not testable exactly when the one gate fails
    (`gate_by_hand`: a study without a one-pass run cannot pass it); each claim has verdicts at ½, 1 and 2× margin."""
    import json

    runs = run_records(study)
    claims = json.loads((FIGURES / study / 'claims.json').read_text())['primary']
    testable = gate_by_hand(runs)
    assert ('not testable' in claims['claims']['C3'].get('evidence', '')) != testable, study
    assert ('not testable' in claims['claims']['C7'].get('evidence', '')) != testable, study
    assert (claims['testability']['verdict'] == 'testable') == testable, study
    judged = {**claims['claims'], **claims['checks']}  # the claims and the numerical checks (L1)
    assert sorted(claims['margin_sensitivity']) == sorted(judged)
    for c, by_margin in claims['margin_sensitivity'].items():
        assert list(by_margin) == ['0.5', '1', '2'] and by_margin['1']['verdict'] == judged[c]['verdict']


@pytest.mark.parametrize('study', WITH_RECORDS)
def test_selected_for_and_transient_tags_follow_the_choice_record(study):
    """Recomputed here from the records without the claims code: a study of a preset chosen on the drift tags C1 and
    C5a *selected for*; its C6 is tagged *transient* (not reproduced there) exactly when it holds here on some seed and,
    at the last checkpoint of the longer runs of the same setting, some per-loop control is above 0.99x the at-risk PPL
    at some exit on every seed; and *transient* the other way when it fails here and holds there on some seed."""
    import json
    from looped_lm.studies.variants import VARIANTS

    choices = json.loads((FIGURES / 'preset-choice' / 'choice.json').read_text())
    preset = json.loads((FIGURES / study / 'study.json').read_text())['preset']
    claims = json.loads((FIGURES / study / 'claims.json').read_text())['primary']['claims']
    tag = lambda c: claims[c].get('evidence', '')
    choice = choices.get(preset)
    for c in ('C1', 'C5a'):
        assert ('selected for' in tag(c)) == bool(choice and 'drift' in choice['chosen_on']), (study, c, tag(c))
    if not choice:
        assert not any('transient' in tag(c) for c in claims), study
        return
    last = {}
    for f in (FIGURES.parent / choice['longer_runs']['records']).glob('*.jsonl'):
        for r in map(json.loads, f.read_text().splitlines()):
            if abs(r['lr'] - choice['longer_runs']['lr']) < 1e-12 and r['step'] >= last.get(r['seed'], {}).get(
                (r['variant']), {}
            ).get('step', -1):
                last.setdefault(r['seed'], {})[r['variant']] = r
    fails = []
    for seed, runs in last.items():
        ppl = {v: [e['ppl'] for e in r['diag']['exits']['validation']] for v, r in runs.items()}
        at = [v for v in ppl if VARIANTS[v].per_loop and not VARIANTS[v].scale_controlled]
        ctl = [v for v in ppl if VARIANTS[v].per_loop and VARIANTS[v].scale_controlled]
        ratio = max(max(ppl[c][k] for c in ctl) / min(ppl[a][k] for a in at) for k in range(len(ppl[at[0]])))
        fails.append(ratio > 0.99)
    reverses = all(fails) and claims['C6']['verdict'] in ('reproduced', 'partly')
    grows = not all(fails) and claims['C6']['verdict'] == 'not reproduced at this scale'  # the other way (54.4)
    assert ('does not reproduce it' in tag('C6')) == reverses, (study, fails, tag('C6'))
    assert not grows or 'transient' in tag('C6'), (study, fails, tag('C6'))


@pytest.mark.parametrize('study', WITH_RECORDS)
def test_clamp_verdicts_at_half_and_double_margin_follow_the_records(study):
    """Issue 32: C4a/C4b's margin sensitivity recomputed from the records without the claims code: per seed, the
    largest |PPL@K ratio - 1| over the at-risk per-loop official variants against 2%, 1% and 0.5%; the seed mean on
    the seed-averaged ratios; reproduced = mean and every seed, partly = some, else not reproduced."""
    import json
    from looped_lm.studies.variants import VARIANTS

    runs = run_records(study)
    ms = json.loads((FIGURES / study / 'claims.json').read_text())['primary']['margin_sensitivity']
    at = [
        v
        for v in {r['variant'] for r in runs}
        if VARIANTS[v].group == 'official' and VARIANTS[v].per_loop and not VARIANTS[v].scale_controlled
    ]
    for claim, mode in (('C4a', 'freeze_loop1'), ('C4b', 'remove_radial')):
        ratio = {
            (r['variant'], r['seed']): r['diag']['clamp'][mode][-1]['ppl'] / r['diag']['clamp']['none'][-1]['ppl']
            for r in runs
            if r['variant'] in at and r['status'] == 'done'
        }
        seeds = sorted({s for _, s in ratio})
        for strength, margin in (('0.5', 0.02), ('1', 0.01), ('2', 0.005)):
            held = sum(max(abs(ratio[v, s] - 1) for v in at) <= margin for s in seeds)
            mean = max(abs(sum(ratio[v, s] for s in seeds) / len(seeds) - 1) for v in at) <= margin
            want = (
                'reproduced'
                if mean and held == len(seeds)
                else 'partly'
                if mean or held
                else 'not reproduced at this scale'
            )
            got = ms[claim][strength]
            assert (got['verdict'], got['seeds_held']) == (want, f'{held}/{len(seeds)}'), (study, claim, strength)


def test_the_readme_quotes_the_depth_worth_numbers_its_records_give():
    """The README's depth-worth column and reading, recomputed from figures/depth-worth/records alone (validation
    split, seed means): D, the at-risk and weakest-control gains to exit K, C7's loops saved, C1's ratio."""
    import json, math
    from statistics import mean

    readme = (FIGURES.parent / 'README.md').read_text()
    rules = json.loads((FIGURES / 'depth-worth' / 'rules.json').read_text())['arms']['B1200']
    recs = [json.loads(x) for f in sorted((FIGURES / 'depth-worth' / 'records').glob('B1200-*.jsonl')) for x in open(f)]
    ppl = {(r['variant'], r['seed']): [e['ppl'] for e in r['diag']['exits']['validation']] for r in recs}
    seeds = sorted({s for _, s in ppl})
    d = mean(math.log(ppl['one-pass', s][0] / ppl['terminal-penalty', s][-1]) for s in seeds)
    g_k = lambda v: [math.log(ppl[v, s][0] / ppl[v, s][-1]) for s in seeds]
    at = mean(g_k('perloop-rmsnorm'))
    weakest = mean(min(g) for g in zip(*(g_k(v) for v in ('perloop-raw', 'perloop-finalnorm', 'perloop-penalty'))))
    assert f'depth is worth {d:.3f} nats' in readme and f'{d:.3f} nats' in readme, d
    assert f'the drifting model gains {at:.4f} nats, the weakest control {weakest:.3f}' in readme, (at, weakest)
    assert f"{rules['R5']['numbers']['loops saved']:.3f} loops earlier" in readme
    assert rules['R1']['verdict'] == 'holds' and '(R1 holds)' in readme
    # issue 54: the secondary reading's numbers, as the README, the study's README and the chapter quote them
    flat = lambda text: ' '.join(text.split())  # sentences read across line breaks
    study, readme = flat((FIGURES / 'depth-worth' / 'README.md').read_text()), flat(readme)
    cells = json.loads((FIGURES.parent / 'nbs' / '06e_worth.ipynb').read_text())['cells']
    chapter = flat(' '.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown'))
    controls = ('perloop-raw', 'perloop-finalnorm', 'perloop-penalty')
    g_best = lambda v, s: math.log(ppl[v, s][0] / min(ppl[v, s]))
    share = [g_best('perloop-rmsnorm', s) / min(g_best(v, s) for v in controls) for s in seeds]
    span = f"{100 * min(share):.0f}–{100 * max(share):.0f}% of the least control's"
    assert span in readme and span in study and span in chapter, span
    worst = [
        s
        for s in seeds
        if all(p > max(ppl[v, s][k] for v in controls) for k, p in enumerate(ppl['perloop-rmsnorm', s]))
    ]
    words = 'seeds ' + ' and '.join(map(str, worst))
    assert worst == [1, 3] and f'worst per-loop model at every exit on {words}' in readme, worst
    per_seed = ', '.join(f'{min(g):.4f}' for g in zip(*(g_k(v) for v in controls)))
    assert f'{weakest:.4f} ({per_seed})' in study and f"weakest control's {weakest:.4f}" in chapter


def test_the_claims_and_the_depth_study_share_one_gate():
    """depth-cpu: at the step its rules read, each arm's claims say C3 and C7 are testable exactly when its R1 holds
    (they once disagreed: the claims called C3 testable and failed where R1 said one pass is as good as four)."""
    import json
    from looped_lm.extensions.depth import official_claims, read_depth_records

    rules = json.loads((FIGURES / 'depth-cpu' / 'rules.json').read_text())
    recs = read_depth_records(FIGURES / 'depth-cpu')
    for arm, rs in rules['arms'].items():
        cl = official_claims(recs, arm, rules['steps']['after'])['primary']
        assert (cl['testability']['verdict'] == 'testable') == (rs['R1']['verdict'] == 'holds'), arm
        assert ('not testable' in cl['claims']['C3'].get('evidence', '')) == (rs['R1']['verdict'] != 'holds'), arm


def test_the_readme_quotes_the_tags_and_the_harness_numbers_their_records_give():
    """The `cpu` column's tags (C4a and C6 selected for by the lr the criterion turned down, C6 fragile from its edge),
    recomputed by the claims code from figures/cpu-3seeds and the horizon records; and the harness comparison at
    `cpu`, read from its committed record (which names its machine)."""
    import json, re
    from looped_lm.studies.claims import evaluate_claims
    from looped_lm.studies.tables import read_run_records

    readme = (FIGURES.parent / 'README.md').read_text()
    claims = evaluate_claims(read_run_records(FIGURES / 'cpu-3seeds'), 'cpu', FIGURES.parent)['primary']['claims']
    for c in ('C4a', 'C6'):
        held = re.search(r'at lr 0\.003, step 800 \(excluded by [^)]*\) [a-z ]+ \((\d/3)\)', claims[c]['evidence'])
        assert held and f"*selected for* (lr 3e-3: {held.group(1)[0]}/3)" in readme, (c, claims[c]['evidence'])
    edge = re.search(r'fires only from ([\d.]+)× to', claims['C6']['evidence']).group(1)
    assert f'fires from {edge}× its margin' in readme and 'transient' in claims['C6']['evidence']
    lo, hi = re.search(
        r'reads partly \(1/3\), here .*fires only from ([\d.]+)× to ([\d.]+)×', claims['C4b']['evidence']
    ).groups()
    assert f'*transient* the other way (partly at 3,000 steps, 1/3), *fragile* ({lo}–{hi}× its margin)' in readme
    assert 'powerless against chance' in claims['C2']['evidence']
    harness = json.loads((FIGURES.parent / 'benchmarks' / 'results' / 'lm_eval_cpu.json').read_text())
    ours, theirs = harness['rows'][0]['bpb'], harness['rows'][-1]['bpb']
    assert f'{theirs:.4f} vs {ours:.4f}' in readme, (theirs, ours)
    assert harness['preset'] == 'cpu' and harness['context'] == 64 and harness['machine']['cpu_capability']


# (claim, the measure the README's verdict table quotes first, how the table shows it, the measure's factor)
TABLE_NUMBERS = [
    ('C1', 'ratio', r'(\d[\d.]*)×', 1),
    ('C2', 'min radial raw / √(2/(πd))', r'raw (\d[\d.]*)× random', 1),
    ('C4a', 'max |PPL ratio - 1|', r'(\d[\d.]*)%', 100),
    ('C4b', 'max |PPL ratio - 1|', r'(\d[\d.]*)%', 100),
    ('C5a', 'ratio', r'(\d[\d.]*)×', 1),
    ('C5b', 'max Hill at-risk', r'Hill (\d[\d.]*)', 1),
    ('C6', 'max PPL ratio controlled/at-risk', r'(\d[\d.]*)×', 1),
]


def _shown_matches(shown: str, value: float) -> bool:
    "Whether `shown` (a number as the README prints it) is `value` rounded to the digits it shows."
    decimals = len(shown.split('.')[1]) if '.' in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10**-decimals + 1e-12


def test_the_readme_verdict_table_quotes_each_columns_records():
    """Every number the README's verdict table quotes for C1, C2, C4a, C4b, C5a, C5b and C6, in each of its four
    columns, is the seed mean the claims code computes from that column's committed records, and the verdict and
    seeds held are that column's."""
    import re
    from looped_lm.studies.claims import evaluate_claims
    from looped_lm.studies.tables import read_run_records
    from looped_lm.extensions.depth import official_claims, read_depth_records

    columns = [
        evaluate_claims(read_run_records(FIGURES / 'cpu-3seeds'), 'cpu', FIGURES.parent)['primary']['claims'],
        evaluate_claims(read_run_records(FIGURES / 'cpu-exact'), 'cpu-exact', FIGURES.parent)['primary']['claims'],
        official_claims(read_depth_records(FIGURES / 'depth-worth'), 'B1200', 1200)['primary']['claims'],
        official_claims(read_depth_records(FIGURES / 'depth-worth'), 'B4800', 4800)['primary']['claims'],
    ]
    rows = {}
    for line in (FIGURES.parent / 'README.md').read_text().splitlines():
        if m := re.match(r'\| (C\d\w?) ', line):
            rows[m.group(1)] = [c.strip() for c in line.strip('|').split(' | ')[1:]]
    for claim, key, shown, factor in TABLE_NUMBERS:
        for col, cell in zip(columns, rows[claim]):
            c = col[claim]
            got = re.search(shown, cell)
            assert got and _shown_matches(got.group(1), factor * c['numbers'][key]), (claim, cell, c['numbers'][key])
            assert f"{c['seeds_held']})" in cell or f"({c['seeds_held']}" in cell, (claim, cell, c['seeds_held'])
            word = {'reproduced': '**reproduced**', 'partly': 'partly', 'not reproduced at this scale': 'not'}
            assert cell.startswith(word[c['verdict']]), (claim, cell, c['verdict'])


def test_every_worth_rule_reads_not_measured_while_any_run_of_its_budget_is_missing():
    """Issue 54: with a per-loop control missing, R5 was computed over the controls present (against perloop-raw alone
    B1200 would read 'reproduced'). Each variant and each seed removed in turn, and each single run: every rule of the
    budget reads 'not measured', naming what is missing; the complete budget keeps its verdicts."""
    from looped_lm.extensions.depth import read_depth_records
    from looped_lm.extensions.worth import WORTH_VARIANTS, worth_rules

    recs = [r for r in read_depth_records(FIGURES / 'depth-worth') if r['arm'] == 'B1200']
    assert worth_rules(recs)['arms']['B1200']['R1']['verdict'] == 'holds'
    cuts = [('variant', v) for v in WORTH_VARIANTS] + [('seed', s) for s in (1, 2, 3)]
    cuts += [('run', (v, s)) for v in WORTH_VARIANTS for s in (1, 2, 3)]
    for what, gone in cuts:
        left = [r for r in recs if (r[what] if what != 'run' else (r['variant'], r['seed'])) != gone]
        rules = worth_rules(left)['arms']['B1200']
        named = gone if what == 'variant' else f"seed {gone}" if what == 'seed' else f"{gone[0]} seed {gone[1]}"
        for r in RULES_OF_WORTH:
            assert rules[r]['verdict'].startswith('not measured: missing ') and str(named) in rules[r]['verdict'], (
                what,
                gone,
                r,
                rules[r]['verdict'],
            )


def test_every_depth_rule_reads_not_measured_while_any_run_of_its_arm_is_missing():
    "The depth study's R0-R6 likewise: a run removed at one step, or a variant or a seed, and the arm is not measured."
    from looped_lm.extensions.depth import read_depth_records, depth_rules, DEPTH_VARIANTS

    recs = read_depth_records(FIGURES / 'depth-cpu')
    design = dict(variants=list(DEPTH_VARIANTS), seeds=[1, 2, 3])
    assert depth_rules(recs, **design)['arms']['L1']['R1']['verdict'] == 'fails'  # complete: judged
    cuts = [lambda r, v=v: r['arm'] == 'L1' and r['variant'] == v for v in DEPTH_VARIANTS]
    cuts += [lambda r, s=s: r['arm'] == 'L1' and r['seed'] == s for s in (1, 2, 3)]
    cuts += [lambda r: (r['arm'], r['variant'], r['seed'], r['step']) == ('L1', 'perloop-raw', 2, 800)]
    for cut in cuts:
        rules = depth_rules([r for r in recs if not cut(r)], **design)['arms']
        assert all(rules['L1'][f'R{i}']['verdict'].startswith('not measured: missing ') for i in range(1, 7))
        assert rules['L2']['R1']['verdict'] == 'fails'  # the other arm is complete: still judged


def test_no_committed_claim_is_both_not_testable_and_given_another_verdict():
    """Issue 56: a claim whose gate fails has the verdict 'not testable' (the gate's reason beside it), never 'not
    reproduced' with the reason only in its evidence text: every committed claims file and rules file is read."""
    import json

    files = [*FIGURES.glob('*/claims.json'), *FIGURES.glob('*/rules.json')]
    seen = 0
    for f in files:
        d = json.loads(f.read_text())
        sections = [d[s] for s in ('primary', 'extension') if isinstance(d.get(s), dict)]
        claims = [c for s in sections for c in s.get('claims', {}).values()]
        claims += [r for a in (d.get('arms') or {}).values() for r in a.values() if isinstance(r, dict)]
        for c in claims:
            tag, verdict = c.get('evidence', ''), c.get('verdict', '')
            if tag.startswith('not testable') or c.get('claim_verdict') == 'not testable':
                seen += 1
                assert verdict.startswith('not testable'), (f.name, c.get('title'), verdict)
            if verdict.startswith('not testable') and 'per_seed' in c and 'claim_verdict' not in c:
                assert set(c['per_seed'].values()) <= {None}, (f.name, c.get('title'))
    assert seen, 'no committed claim is not testable: the check read nothing'


def test_depth_worth_says_its_r2_was_foreseeable_from_the_choosing_seed():
    """Issue 54: B1200 was chosen from scaling-cpu's budget-2 point on seed 0, where C3 already failed (the at-risk
    gain from exit 1 to 4 above the penalty control's): the study's README tags R2 so, with the numbers recomputed."""
    from looped_lm.extensions.scaling import published_rows

    rows = {r.variant: r for r in published_rows(FIGURES / 'scaling-cpu').itertuples()
            if r.point == 'budget-2' and r.seed == 0}  # fmt: skip
    at, pen = (float(rows[v].gain) for v in ('perloop-rmsnorm', 'perloop-penalty'))
    assert pen < 3 * at  # C3 fails on the choosing seed
    text = ' '.join((FIGURES / 'depth-worth' / 'README.md').read_text().split())
    assert f'gained {at:.4f} nats from exit 1 to 4 and `perloop-penalty` {pen:.4f}' in text
    assert '*foreseeable from the choosing seed*' in text


def test_the_dose_curves_say_what_their_readme_quotes():
    """figures/depth-dose (issue 53, part 1): each curve's c = 1 point is its record's gain (the same weights), exit 1
    never moves, and the README's c*, predicted drift and 1/c numbers are recomputed from curves.json and records."""
    import json
    from looped_lm.extensions.depth import read_depth_records, depth_row
    from looped_lm.extensions.dose import dose_star

    out = json.loads((FIGURES / 'depth-dose' / 'curves.json').read_text())
    text = ' '.join((FIGURES / 'depth-dose' / 'README.md').read_text().split())
    recs = {
        (r['variant'], r['seed']): depth_row(r)
        for r in read_depth_records(FIGURES / 'depth-worth')
        if r['arm'] == 'B1200'
    }
    stars, drifts = [], []
    for c in out['curves']:
        rows = {r['c']: r for r in c['rows']}
        assert c['same_weights'] and abs(rows[1]['gain_K'] - recs['perloop-rmsnorm', c['seed']]['g_K']) < 1e-6
        assert max(r['exit_j_rel_diff'] for r in c['rows']) < 1e-9
        assert dose_star(c['rows'], c['weakest_control_g_K']) == c['c_star']
        stars.append(c['c_star'])
        drifts.append(c['c_star'] * recs['perloop-rmsnorm', c['seed']]['s'] / recs['perloop-raw', c['seed']]['s'])
        assert f"{16 * rows[16]['gain_K']:.3f} → {1024 * rows[1024]['gain_K']:.3f}" in text
    assert 'c\\* = ' + ', '.join(f'{s:.1f}' for s in stars[:2]) + f' and {stars[2]:.1f}' in text
    assert (
        'about ' + ', '.join(f'{round(d, -1):.0f}×' for d in drifts[:2]) + f' and {round(drifts[2], -1):.0f}×' in text
    )


def test_the_one_pass_penalty_reference_rebuilds_from_its_records(tmp_path):
    """figures/depth-worth/reference (issue 54.5, descriptive): `reference.md` rebuilt from its records and the worth
    study's, byte-identical; its D against the raw one pass is R1's, recomputed here from the PPLs."""
    import json, math
    from looped_lm.extensions.worth import reference_rows, write_reference
    from looped_lm.extensions.depth import read_depth_records

    src = FIGURES / 'depth-worth'
    if not (src / 'reference' / 'reference.md').is_file():
        pytest.skip('the one-pass-penalty reference is not published yet')
    dst = tmp_path / 'depth-worth'
    shutil.copytree(src / 'records', dst / 'records')
    shutil.copytree(src / 'reference' / 'records', dst / 'reference' / 'records')
    write_reference(dst / 'reference')
    assert (dst / 'reference' / 'reference.md').read_bytes() == (src / 'reference' / 'reference.md').read_bytes()
    rules = json.loads((src / 'rules.json').read_text())['arms']
    worth, refs = read_depth_records(src), read_depth_records(src / 'reference')
    ppl = {(r['arm'], r['variant'], r['seed']): [e['ppl'] for e in r['diag']['exits']['validation']] for r in worth}
    for row in reference_rows(worth, refs):
        if row['seed'] == 'mean' or row['D'] is None:
            continue
        arm, s = row['arm'], row['seed']
        assert math.isclose(row['D'], math.log(ppl[arm, 'one-pass', s][0] / ppl[arm, 'terminal-penalty', s][-1]))
        if 'per_seed' in rules[arm]['R1']:
            assert math.isclose(row['D'], rules[arm]['R1']['per_seed'][str(s)]['D'])
    readme = (src / 'README.md').read_text()  # the study's table quotes each budget's seed means
    for row in (r for r in reference_rows(worth, refs) if r['seed'] == 'mean'):
        shown = f"{row['D_penalty']:+.3f}".replace('-', '−')
        assert f"| {row['arm']} | " in readme and f"**{shown}**" in readme, (row['arm'], shown)


def test_the_dose_pilots_rebuild_from_their_records(tmp_path):
    """figures/depth-dose-trained/pilots (issue 53, part 2): each pilot's `pilot.json` and the choice (`pilots.md`,
    `choice.json`) rebuilt from the records alone, byte-identical."""
    import json
    from looped_lm.extensions.dose import write_choice, write_pilot

    src = FIGURES / 'depth-dose-trained' / 'pilots'
    if not (src / 'pilots.md').is_file():
        pytest.skip('no pilot is published yet')
    dst = tmp_path / 'pilots'
    for pilot in sorted(p.parent for p in src.glob('*/study.json')):
        shutil.copytree(pilot / 'records', dst / pilot.name / 'records')
        shutil.copy(pilot / 'study.json', dst / pilot.name / 'study.json')
        write_pilot(dst / pilot.name)
        made, committed = dst / pilot.name / 'pilot.json', pilot / 'pilot.json'
        assert made.is_file() == committed.is_file() and (
            not made.is_file() or made.read_bytes() == committed.read_bytes()
        )
    closed = json.loads((src / 'choice.json').read_text())['final']  # a search closed by hand stays closed
    write_choice(dst, closed=closed)
    for name in ('pilots.md', 'choice.json'):
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    readme = (src.parent / 'README.md').read_text()  # its table quotes each pilot's ratio, D and raw gain
    for p in json.loads((src / 'choice.json').read_text())['measured']:
        d = [f"{p['D']:.{n}f}".replace('-', '−') for n in (2, 3)]
        row = f"| {p['ratio']:,.0f}× | "
        assert row in readme and any(f"{row}{x} | {p['raw_gain']:.3f} |" in readme for x in d), (p['name'], row)
    # the descriptive table: each pilot's at-risk gain beside the dose prediction at its drift, and their ratio
    from looped_lm.extensions.depth import read_depth_records
    from looped_lm.extensions.dose import predicted_gains, trained_points

    curves = json.loads((FIGURES / 'depth-dose' / 'curves.json').read_text())['curves']
    b1200 = {s: r for s, (r, _) in trained_points(read_depth_records(FIGURES / 'depth-worth'))['B1200'].items()}
    for p in json.loads((src / 'choice.json').read_text())['measured']:
        pred = predicted_gains(curves, p['ratio'], b1200)['mean']
        row = f"| {p['ratio']:,.0f}× | {p['at_risk_g_K']:.4f} | {pred:.4f} | {p['at_risk_g_K'] / pred:.2g} |"
        assert row in readme, (p['name'], row)
    # the front README's dose sentence: the pilots' drift range, D range and trained-over-predicted range
    front = ' '.join((FIGURES.parent / 'README.md').read_text().split())
    pilots = json.loads((src / 'choice.json').read_text())['measured']
    ratios, ds = [p['ratio'] for p in pilots], [p['D'] for p in pilots]
    kept = [p['at_risk_g_K'] / predicted_gains(curves, p['ratio'], b1200)['mean'] for p in pilots]
    assert max(ds) < 0.02, 'the README says no pilot keeps depth worth anything'
    for said in (
        f"drift {min(ratios):,.0f}–{max(ratios):,.0f}×",
        f"D −{-max(ds):.2f} to −{-min(ds):.1f} nats",
        f"keeps {min(kept):.0f}–{max(kept):.0f}× the gain",
    ):
        assert said in front, said


def test_pilots_script_runs_the_named_pilots_alone(tmp_path, monkeypatch):
    """`pilots.py d256` ran d256 and nothing after it (it once went on to the cheapest unrun pilot); without names it
    runs the cheapest unrun pilot while the choice is not final, and none once it is."""
    import importlib.util, json, sys

    spec = importlib.util.spec_from_file_location('pilots', FIGURES / 'depth-dose-trained' / 'pilots.py')
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, 'argv', ['pilots.py'])
    named = ['dose-pilot-d256']
    assert script.next_pilot(tmp_path, named) == 'dose-pilot-d256' and script.next_pilot(tmp_path, named) is None
    pilot = {'name': 'dose-pilot-lr2', 'ratio': 10.0, 'D': 0.1, 'raw_gain': 0.1, 'cost': 1.0}  # below the floor
    (tmp_path / 'lr2').mkdir()
    (tmp_path / 'lr2' / 'pilot.json').write_text(json.dumps(pilot))
    assert script.next_pilot(tmp_path, None) == 'dose-pilot-lr4'  # the cheapest unrun (same cost, candidate order)
    (tmp_path / 'lr2' / 'pilot.json').write_text(json.dumps(dict(pilot, ratio=200.0)))  # the cheapest reaches it
    assert script.next_pilot(tmp_path, None) is None


def test_the_readme_quotes_the_b4800_numbers_its_records_give():
    """Issue 54: the README's B4800 sentence, recomputed from figures/depth-worth/records (validation, seed means): D,
    the drift ratio, the at-risk and weakest-control gains to exit 4, C7's loops saved; R1 holds, R2 and R5 as said."""
    import json, math
    from statistics import mean

    readme = ' '.join((FIGURES.parent / 'README.md').read_text().split())
    rules = json.loads((FIGURES / 'depth-worth' / 'rules.json').read_text())['arms']['B4800']
    recs = [json.loads(x) for f in sorted((FIGURES / 'depth-worth' / 'records').glob('B4800-*.jsonl')) for x in open(f)]
    assert len(recs) == 18, 'B4800 is not complete'
    ppl = {(r['variant'], r['seed']): [e['ppl'] for e in r['diag']['exits']['validation']] for r in recs}
    rms = {(r['variant'], r['seed']): r['diag']['clamp']['none'][-1]['norm_rms'] for r in recs}
    seeds = (1, 2, 3)
    d = mean(math.log(ppl['one-pass', s][0] / ppl['terminal-penalty', s][-1]) for s in seeds)
    ratio = mean(rms['perloop-rmsnorm', s] for s in seeds) / mean(rms['perloop-raw', s] for s in seeds)
    g_k = lambda v: [math.log(ppl[v, s][0] / ppl[v, s][-1]) for s in seeds]  # noqa: E731
    at = mean(g_k('perloop-rmsnorm'))
    weakest = mean(min(g) for g in zip(*(g_k(v) for v in ('perloop-raw', 'perloop-finalnorm', 'perloop-penalty'))))
    loops = rules['R5']['numbers']['loops saved']
    said = (
        f"D = {d:.3f} nats, the drift {ratio:.1f}×, the drifting model gains {at:.4f} nats against the weakest "
        f"control's {weakest:.3f} and halts {loops:.3f} loops earlier: R1 holds, R2 and R5 not reproduced"
    )
    assert said in readme, said
    assert rules['R1']['verdict'] == 'holds' and all(
        rules[r]['verdict'].startswith('not reproduced') for r in ('R2', 'R5')
    )
