"""The book's order is the package's dependency order. `looped_lm/` is a few parts (subpackages), each a group of
chapters; every chapter exports one module (or none: `05_ablation` is the experiment, run by papermill), and a chapter
or module uses only what a reader has met before it — function-level imports included, since they hide a cycle rather
than remove it. No cycle, nothing upward, nothing forward.

A new module gets its chapter in `CHAPTERS` (in reading order) before this test passes. Select one chapter's checks
with `pytest tests/test_layers.py -k diagnostics`."""

import ast, json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG, NBS = ROOT / 'looped_lm', ROOT / 'nbs'

# the parts, in reading order, and what a reader finds in each
PARTS = {
    'core': 'presets and the number formats; atomic files, locks and hashes',
    'model': 'the looped model, generation and saved folders; the two lemmas, checked on it',
    'training': 'the corpus and tokenizers, token data, run folders and checkpoints, the trainer',
    'measure': 'the loop spec of any looped model and its checks, halting, radial fractions, the diagnostics, hooks',
    'studies': 'variants, the runner (one plan, job, result), tables, claims, the ablation, figures, kept checkpoints',
    'extensions': 'our studies beyond the paper: growth laws, scaling, horizon, depth, depth-worth, the dose of drift',
    'interop': 'the model outside the repository: run folders as models, transformers, lm-evaluation-harness',
}
# (chapter, module it exports or None), in reading order; a chapter's number is its part's (00 = core, ...), except
# `05_ablation`, the users' main command, which keeps its path and reads the studies part's results
CHAPTERS = [
    ('00_config', 'core.config'),
    ('00a_files', 'core.files'),
    ('00b_formats', 'core.formats'),
    ('01_model', 'model.looped'),
    ('01a_lemmas', 'model.lemmas'),
    ('02_text', 'training.text'),
    ('02a_data', 'training.data'),
    ('02b_rundir', 'training.rundir'),
    ('02c_train', 'training.train'),
    ('03_protocol', 'measure.protocol'),
    ('03_spec_checks', 'measure.spec_checks'),
    ('03a_halting', 'measure.halting'),
    ('03b_radial', 'measure.radial'),
    ('03c_diagnostics', 'measure.diagnostics'),
    ('03d_hooks', 'measure.hooks'),
    ('03d_outside', 'measure.outside'),
    ('04_variants', 'studies.variants'),
    ('04a_runner', 'studies.runner'),
    ('04b_tables', 'studies.tables'),
    ('04c_claims', 'studies.claims'),
    ('04d_ablation', 'studies.ablation'),
    ('04e_figures', 'studies.figures'),
    ('04f_kept', 'studies.kept'),
    ('05_ablation', None),
    ('06_growth', 'extensions.growth'),
    ('06a_scaling', 'extensions.scaling'),
    ('06c_horizon', 'extensions.horizon'),
    ('06d_depth', 'extensions.depth'),
    ('06e_worth', 'extensions.worth'),
    ('06f_dose', 'extensions.dose'),
    ('07_hub', 'interop.hub'),
    ('07a_transformers', 'interop.transformers_io'),
    ('07b_lm_eval', 'interop.lm_eval'),
]
ORDER = {m: i for i, (_, m) in enumerate(CHAPTERS) if m}
PLACE = {nb: i for i, (nb, _) in enumerate(CHAPTERS)}


def modules(pkg: Path = PKG) -> list:
    "Every module of the package as `part.module` (the parts' `__init__` files and nbdev's index left out)."
    found = [p.relative_to(pkg).with_suffix('').parts for p in pkg.glob('*/*.py') if p.stem != '__init__']
    return sorted('.'.join(parts) for parts in found)


def imported(node, package: str = PKG.name, here: str = '') -> list:
    "Package modules an import names (`part.module`): absolute or relative, top level or inside a function."
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split('.')[: max(0, len(here.split('.')) - node.level)]
            mod = '.'.join([*base, *(node.module.split('.') if node.module else [])])
        elif node.module and (node.module == package or node.module.startswith(package + '.')):
            mod = node.module[len(package) + 1 :]
        else:
            return []
        if not mod:
            return [a.name for a in node.names]
        return [f'{mod}.{a.name}' if '.' not in mod else mod for a in node.names]
    if isinstance(node, ast.Import):
        return [a.name[len(package) + 1 :] for a in node.names if a.name.startswith(package + '.')]
    return []


def module_imports(module: str) -> list:
    "[(imported module, line)] over every import of `module`."
    tree = ast.parse((PKG / (module.replace('.', '/') + '.py')).read_text())
    return sorted({(t, n.lineno) for n in ast.walk(tree) for t in imported(n, here=module) if t != module})


def chapter_imports(nb: str) -> list:
    "[(imported module, cell)] over every code cell of chapter `nb`, checks and prose code included."
    cells = json.loads((NBS / f'{nb}.ipynb').read_text())['cells']
    found = set()
    for i, c in enumerate(cells):
        if c['cell_type'] != 'code':
            continue
        src = '\n'.join(line for line in ''.join(c['source']).splitlines() if not line.lstrip().startswith(('%', '!')))
        for n in ast.walk(ast.parse(src)):
            found.update((t, i) for t in imported(n))
    return sorted(found)


def test_the_import_reader_sees_every_kind_of_import():
    src = 'from .b import x\nfrom ..c.d import y\nfrom looped_lm.e.f import z\n'
    src += 'from looped_lm.g import h\nimport looped_lm.i.j\n'
    src += 'import os\ndef f():\n    from looped_lm.k.l import w\n'
    found = [t for n in ast.walk(ast.parse(src)) for t in imported(n, here='a.m')]
    assert found == ['a.b', 'c.d', 'e.f', 'g.h', 'i.j', 'k.l']


def test_the_parts_are_the_folders():
    folders = sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != '__pycache__')
    assert folders == sorted(PARTS), f"looped_lm/ holds {folders}; PARTS declares {sorted(PARTS)}"
    assert not [p.name for p in PKG.glob('*.py') if p.stem not in ('__init__', '_modidx')], 'a module outside the parts'
    seq = [list(PARTS).index(m.split('.')[0]) for m in ORDER]
    assert seq == sorted(seq), 'the chapters of a part come together, parts in their order'


def test_every_module_has_its_chapter_and_every_chapter_is_listed():
    assert sorted(ORDER) == modules(), 'a module without its chapter in CHAPTERS, or a chapter without its module'
    chapters = sorted(p.stem for p in NBS.glob('*.ipynb') if p.stem != 'index')
    assert chapters == [nb for nb, _ in CHAPTERS], "the chapters' names sort in reading order, each one listed once"
    for nb, mod in CHAPTERS:
        src = (NBS / f'{nb}.ipynb').read_text()
        found = re.findall(r'#\| default_exp (\S+?)\\n|#\| default_exp (\S+?)"', src)
        assert [a or b for a, b in found] == ([mod] if mod else []), f'{nb} exports {found}, declared {mod}'


@pytest.mark.parametrize('module', sorted(ORDER, key=ORDER.get))
def test_a_module_imports_only_what_comes_before_it(module):
    bad = [
        f"looped_lm/{module.replace('.', '/')}.py:{line} imports {t}, which comes later (or is unknown)"
        for t, line in module_imports(module)
        if ORDER.get(t, len(ORDER)) > ORDER[module]
    ]
    assert not bad, 'forward import(s): move the code or the import down\n' + '\n'.join(bad)


@pytest.mark.parametrize('nb', [nb for nb, _ in CHAPTERS])
def test_a_chapter_uses_only_what_a_reader_has_met(nb):
    place = {m: PLACE[c] for c, m in CHAPTERS if m}
    bad = [
        f"nbs/{nb}.ipynb cell {i} imports {t}, from a later chapter (or no chapter)"
        for t, i in chapter_imports(nb)
        if place.get(t, len(CHAPTERS)) > PLACE[nb]
    ]
    assert not bad, '\n'.join(bad)


def test_no_module_imports_the_package_file():
    "`looped_lm/__init__.py` gathers the users' names from every part: a module importing it would import a cycle."
    bad = [(m, t) for m in ORDER for t, _ in module_imports(m) if t not in ORDER]
    assert not bad, bad


def test_the_users_import_names_each_thing_from_its_home():
    import importlib.util
    import looped_lm as ll

    extra = all(importlib.util.find_spec(m) for m in ('transformers', 'lm_eval'))
    for name in ll.__all__:
        if name in ll._OPTIONAL and not extra:  # the `eval` extra's names: their home is there, not imported
            assert (PKG / 'interop' / f'{ll._OPTIONAL[name]}.py').is_file(), name
            continue
        obj = getattr(ll, name)
        home = getattr(obj, '__module__', '')
        assert home.startswith('looped_lm.') and home.count('.') == 2, (name, home)


def exported_names(module: str) -> set:
    "The names in `__all__` of package module `part.module`, read from its file (no import: extras may be absent)."
    tree = ast.parse((PKG / (module.replace('.', '/') + '.py')).read_text())
    lists = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == '__all__']
    return set(ast.literal_eval(lists[0])) if lists else set()


def imports_from_modules(tree, here: str = '') -> list:
    "[(package module, name)] of every `from <package module> import name` in `tree` (not `from <part> import <mod>`)."
    found = []
    for n in ast.walk(tree):
        targets = set(imported(n, here=here)) if isinstance(n, ast.ImportFrom) else set()
        if (
            len(targets) == 1
            and targets <= set(ORDER)
            and (n.module or '').split('.')[-1] == min(targets).split('.')[-1]
        ):
            found += [(min(targets), a.name) for a in n.names]
    return found


def test_what_crosses_a_module_is_in_its_all():
    """A name another module, a chapter, a test, a script, a benchmark or a study's script imports from a package
    module is in that module's `__all__` (nbdev's `#| export`, not `#| exporti`), and no `_` name crosses a module."""
    crossing = set()
    for f in [p for d in ('looped_lm', 'tests', 'scripts', 'benchmarks', 'figures') for p in (ROOT / d).rglob('*.py')]:
        here = '.'.join(f.relative_to(PKG).with_suffix('').parts) if PKG in f.parents else ''
        if f.name != '_modidx.py':
            crossing.update(
                (m, name, f.relative_to(ROOT).as_posix())
                for m, name in imports_from_modules(ast.parse(f.read_text()), here)
            )
    for nb, module in CHAPTERS:
        for c in json.loads((NBS / f'{nb}.ipynb').read_text())['cells']:
            src = '\n'.join(s for s in ''.join(c['source']).splitlines() if not s.lstrip().startswith(('%', '!')))
            if c['cell_type'] == 'code' and not src.startswith('#| export'):
                crossing.update((m, name, nb) for m, name in imports_from_modules(ast.parse(src)) if m != module)
    assert {(m, f) for m, _, f in crossing} >= {
        ('extensions.depth', 'looped_lm/extensions/worth.py'),
        ('studies.tables', '04c_claims'),
    }
    here_of = lambda f: f[:-3].replace('/', '.').removeprefix('looped_lm.')
    bad = sorted(
        c for c in crossing if c[0] != here_of(c[2]) and (c[1].startswith('_') or c[1] not in exported_names(c[0]))
    )
    assert not bad, f"imported across modules but not in the home module's __all__ (make its cell #| export): {bad}"


SELF_NAME = r'(?<![/\w]){}(?![\w.-])'  # a chapter's name as prose names a chapter, not as a path in a command


@pytest.mark.parametrize('nb', [nb for nb, _ in CHAPTERS])
def test_a_chapter_never_names_itself_as_another_chapter(nb):
    "One voice: a chapter's prose says 'above', 'below' or 'this chapter', never its own name as if it were another's."
    cells = json.loads((NBS / f'{nb}.ipynb').read_text())['cells']
    said = [
        (c['id'], m.group(0))
        for c in cells
        if c['cell_type'] == 'markdown'
        for m in re.finditer(SELF_NAME.format(re.escape(nb)), ''.join(c['source']))
    ]
    assert not said, f"{nb} names itself in its prose (cells {[i for i, _ in said]}): say 'above', 'below', 'here'"


@pytest.mark.parametrize('nb,module', [(nb, m) for nb, m in CHAPTERS if m])
def test_a_chapter_never_names_its_own_module_as_another(nb, module):
    "Nor its own module path (`looped_lm.<its module>`): what the chapter defines is named, not its file's address."
    cells = json.loads((NBS / f'{nb}.ipynb').read_text())['cells']
    path = re.compile(rf'looped_lm\.{re.escape(module)}(?![\w.])')
    said = [c['id'] for c in cells if c['cell_type'] == 'markdown' and path.search(''.join(c['source']))]
    assert not said, f"{nb} names its own module looped_lm.{module} in its prose (cells {said}): say 'here', 'below'"


@pytest.mark.parametrize('nb,module', [(nb, m) for nb, m in CHAPTERS if m])
def test_a_chapter_never_borrows_its_own_names_from_the_package(nb, module):
    """A chapter defines before it uses: no check cell takes a name from the module the chapter itself exports
    (`from looped_lm.<its module> import ...`, the seam of a chapter using its code 'defined below'). Importing the
    module object, to hand the exported file to another process, is allowed."""
    cells = json.loads((NBS / f'{nb}.ipynb').read_text())['cells']
    own = f'looped_lm.{module}'
    borrowed = []
    for c in cells:
        src = ''.join(c['source'])
        if c['cell_type'] != 'code' or src.lstrip().startswith('#| export'):
            continue
        try:
            tree = ast.parse('\n'.join(s for s in src.splitlines() if not s.lstrip().startswith(('%', '!'))))
        except SyntaxError:
            continue
        borrowed += [c['id'] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == own]
    assert not borrowed, f"{nb}: cells {borrowed} import from {own}: define the names before the cells that use them"


def _top_level_prints(src: str) -> bool:
    "Whether a code cell calls `print` outside any function, condition or loop guard (so it always prints)."
    body = [s for s in src.splitlines() if not s.lstrip().startswith(('%', '!'))]
    try:
        tree = ast.parse('\n'.join(body))
    except SyntaxError:
        return False
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.For, ast.With, ast.Try)):
            todo += node.body
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            if getattr(node.value.func, 'id', None) == 'print':
                return True
    return False


@pytest.mark.parametrize('nb', [nb for nb, _ in CHAPTERS])
def test_every_printing_check_shows_what_it_printed(nb):
    "A chapter is committed with its outputs: a check cell that always prints has its printed output in the book."
    cells = json.loads((NBS / f'{nb}.ipynb').read_text())['cells']
    silent = [
        c['id']
        for c in cells
        if c['cell_type'] == 'code'
        and not ''.join(c['source']).lstrip().startswith(('#| export', '#| exporti'))
        and _top_level_prints(''.join(c['source']))
        and not c.get('outputs')
    ]
    assert not silent, f"{nb}: cells {silent} print but have no committed output: re-execute the chapter"


@pytest.mark.parametrize('nb', [nb for nb, _ in CHAPTERS])
def test_only_the_chapter_opens_with_a_summary_quote(nb):
    "A section opens with prose: a `> summary` under a section heading is a former chapter's subtitle left behind."
    cells = json.loads((NBS / f'{nb}.ipynb').read_text())['cells'][1:]
    quoted = [
        c['id'] for c in cells if c['cell_type'] == 'markdown' and re.match(r'#{2,4} .*\n+> ', ''.join(c['source']))
    ]
    assert not quoted, f"{nb}: sections {quoted} open with a quoted subtitle: write it as the section's first paragraph"
