"""Every committed study that carries per-run records (`figures/<study>/runs.jsonl`) rebuilds its tables, `claims.json`
and `claims.md` from those records alone, byte-identical: each verdict of the README can be re-checked without
retraining. A study without records is listed, so that the gap stays visible."""

import shutil
from pathlib import Path
import pytest

FIGURES = Path(__file__).resolve().parents[1] / 'figures'
WITH_RECORDS = sorted(p.parent.name for p in FIGURES.glob('*/runs.jsonl'))
STUDIES = sorted(p.parent.name for p in FIGURES.glob('*/claims.json'))


def test_the_default_study_has_records():
    "The three-seed study of the default preset is the README's first column: it must be re-checkable."
    missing = f"figures/cpu-3seeds/runs.jsonl is missing; studies with records: {WITH_RECORDS}"
    assert 'cpu-3seeds' in WITH_RECORDS, missing


@pytest.mark.parametrize('study', WITH_RECORDS)
def test_tables_and_claims_rebuild_from_the_committed_records(study, tmp_path):
    from looped_lm.claims import rebuild

    src = FIGURES / study
    for name in ('runs.jsonl', 'throughput.json'):
        if (src / name).exists():
            shutil.copy(src / name, tmp_path / name)
    rebuild(tmp_path)
    committed = [src / 'claims.json', src / 'claims.md', *sorted((src / 'tables').glob('*'))]
    assert len(committed) > 3, f"{src} holds no tables"
    for p in committed:
        rebuilt = tmp_path / p.relative_to(src)
        assert rebuilt.exists(), f"rebuild() did not write {p.relative_to(src)}"
        assert rebuilt.read_bytes() == p.read_bytes(), f"{study}: {p.relative_to(src)} differs from its rebuild"


def test_studies_without_records_are_the_known_ones():
    "Studies made before records were kept; each says so in its README. A new study must commit its records."
    assert sorted(set(STUDIES) - set(WITH_RECORDS)) == ['cpu-cosine-3seeds']
    assert 'no per-run records' in (FIGURES / 'cpu-cosine-3seeds' / 'README.md').read_text()
