"The package reads like its notebooks: no line over 120 columns in `looped_lm/`, except nbdev's own `__all__` block."

from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / 'looped_lm'
MODULES = sorted(p for p in PKG.glob('*.py') if p.name != '_modidx.py')


def long_lines(path: Path, limit: int = 120) -> list:
    "(line number, width) of every line wider than `limit`, outside the `__all__ = [...]` block nbdev writes."
    out, in_all = [], False
    for i, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
        if line.startswith('__all__ = ['):
            in_all = True
        if not in_all and len(line) > limit:
            out.append((i, len(line)))
        if in_all and line.rstrip().endswith(']'):
            in_all = False
    return out


def test_long_lines_are_found(tmp_path):
    f = tmp_path / 'm.py'
    f.write_text("__all__ = ['a',\n           'b']\n" + 'x = 1  # ' + 'y' * 120 + '\n')
    assert long_lines(f) == [(3, 129)]


@pytest.mark.parametrize('path', MODULES, ids=lambda p: p.name)
def test_module_lines_fit(path):
    assert long_lines(path) == [], f"{path.name}: lines over 120 columns (edit the notebook, then nbdev-export)"
