"""The package imports one way: every module sits in a declared layer and imports only modules of its own layer or
below, with no cycle — function-level (lazy) imports included, since they hide a cycle rather than remove it.

A new module must be placed in `LAYERS` (lowest first) before this test passes. Select one module's checks with
`pytest tests/test_layers.py -k model` (the parameters are module names)."""

import ast
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parents[1] / 'looped_lm'
SKIP = ('_modidx',)  # nbdev's generated index: no imports of the package

# lowest first; a module may import its own layer and the layers before it (modules listed here may not exist yet)
LAYERS = [
    ['formats'],  # how a number is written (00b): the report, table and reading styles; imports no package module
    ['config', 'lemmas'],
    ['variants'],  # the ablation's variants (04b): named sets of config options; the seeds/variants parameters
    ['readout_ce'],  # the chunked readout cross-entropy (01a), below the model that reads out with it
    ['decoding', 'hub_folder'],  # generate and its KV cache (01c); a saved folder's card and checks (01d); no model
    ['model'],
    ['transformers_io'],  # the model as `transformers` classes (10): imports no package module (its folder code)
    ['files'],  # atomic writes, locks, content hashes (01b)
    ['tokenizer'],  # text to ids and back (02a): the BPE and the official regex tokenizer; writes with files
    ['corpus'],  # a corpus's text: the local copy or the Hub, its rows and article starts (01e), below data
    ['data'],
    ['batches'],  # training and evaluation windows of the ids, bits per byte (02e); imports no package module
    ['devices'],  # the device, bf16 autocast and the ranks of a DDP run (02c); imports config only
    ['objective'],  # the training objective, AdamW, the lr schedule and the training batch (02d), over data
    ['run_records'],  # a run folder's status and metrics records and read_json (02f), below its checkpoints
    ['checkpoints'],  # save, verify (hashes), find and load a run's checkpoints, restore_config (02g), below rundir
    ['rundir'],  # a run folder's lock, its config and data identity, load_run (02b); re-exports 02f and 02g's names
    ['progress'],  # the progress line and the divergence guard (03e), below the trainer that owns them
    ['train'],
    ['cli'],  # the `looped-lm-train` command (03d), above the trainer it runs
    ['protocol'],
    ['spec_checks'],  # the trust checks of a loop spec and the guard of every diagnostic (03b)
    ['hooks'],  # from_hooks: a spec read out of an outside model through forward hooks (03c)
    ['halting'],  # calibrated adaptive halting (04c), below the diagnostics that report it
    ['radial'],  # float64 radial fractions beside the lemma, angular updates and the 1/s law (04e), below diagnostics
    ['reports'],  # a diagnostics report, its tables and its cache (04d), below the diagnostics that measure it
    ['diagnostics'],
    ['tables'],  # a study's tables and per-run records (05b), read from diagnostics reports
    ['claims'],  # the pre-registered claims (05c), over the same records
    ['fixtures'],  # made-up finished runs for checks and tests (05d), over the claims' clamp modes
    ['hub'],
    ['lm_eval_io'],  # a run as a `transformers` folder, the lm-evaluation-harness task and comparison (10a)
    ['gpu_bench'],  # the H200 benchmark's training speeds (05g), which the jobs' plan costs runs with
    ['jobs'],  # one job per run (submitit), below the studies that submit them
    ['runner'],  # the studies' shared runner (05e): workers, locks, the __main__ guard, where results go
    ['growth'],  # power-law fits of the drift and their intervals (07b), shared by the scaling and horizon studies
    ['horizon_analysis'],  # the horizon table's three analyses (08a), below the horizon study that writes the table
    ['scaling_grid'],  # the scaling grid (07c): axes, points, named grids, their cost, Job and Plan; no study
    ['scaling_measure', 'horizon_grid'],  # a scaling run's light measurement (07d); the horizon grid and plan (08b)
    ['ablation', 'scaling', 'horizon'],  # studies
    ['depth'],  # the depth study (09): a dose of drift, a cooldown, a one-layer arm; reuses the horizon's kept folders
    ['results'],  # a study read back from its folder and the figures' shared pieces (05f), below the figures
    ['figures', 'scaling_figures'],  # figures from results folders (the scaling grid's from 07a)
]
LAYER = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def imported(node, package: str = PKG.name) -> list:
    "Package modules an import names: `from .x`, `from . import x`, `from pkg.x`, `from pkg import x`, `import pkg.x`."
    if isinstance(node, ast.ImportFrom):
        if node.level >= 1:
            return [node.module.split('.')[0]] if node.module else [a.name for a in node.names]
        if node.module and node.module.startswith(package + '.'):
            return [node.module.split('.')[1]]
        if node.module == package:
            return [a.name for a in node.names]
    if isinstance(node, ast.Import):
        return [a.name.split('.')[1] for a in node.names if a.name.startswith(package + '.')]
    return []


def import_graph(pkg: Path = PKG) -> dict:
    "{module: [(imported module, line), ...]} over every import of each module, top-level and inside functions."
    mods = sorted(p.stem for p in pkg.glob('*.py') if p.stem not in SKIP)
    graph = {}
    for m in mods:
        tree = ast.parse((pkg / f'{m}.py').read_text(), filename=f'{m}.py')
        graph[m] = sorted({(t, n.lineno) for n in ast.walk(tree) for t in imported(n) if t != m and t in mods})
    return graph


GRAPH = import_graph()
MODULES = [m for m in GRAPH if m != '__init__']


def cycles_through(module: str, graph: dict = GRAPH) -> list:
    "Every import path that leaves `module` and comes back to it (each as `a -> b -> ... -> module`)."
    found, stack = [], [(module, [module])]
    while stack:
        m, path = stack.pop()
        for t, _ in graph.get(m, []):
            if t == module:
                found.append(' -> '.join(path + [t]))
            elif t not in path:
                stack.append((t, path + [t]))
    return sorted(set(found))


def test_the_graph_sees_every_kind_of_import():
    src = 'from .a import x\nfrom . import b\nfrom looped_lm.c import y\nfrom looped_lm import d\nimport looped_lm.e\n'
    src += 'import os\nfrom pathlib import Path\ndef f():\n    from looped_lm.g import z\n'
    assert [t for n in ast.walk(ast.parse(src)) for t in imported(n)] == ['a', 'b', 'c', 'd', 'e', 'g']
    assert cycles_through('a', {'a': [('b', 1)], 'b': [('c', 2)], 'c': [('a', 3)]}) == ['a -> b -> c -> a']
    assert cycles_through('a', {'a': [('b', 1)], 'b': [('c', 2)], 'c': []}) == []


def test_the_package_file_imports_no_module():
    "Importing any module runs `__init__.py` first: an import there would load modules above the one asked for."
    assert GRAPH.get('__init__', []) == [], GRAPH['__init__']


@pytest.mark.parametrize('module', MODULES)
def test_module_is_placed(module):
    assert module in LAYER, f"looped_lm/{module}.py is in no layer: add it to LAYERS in tests/test_layers.py"


@pytest.mark.parametrize('module', MODULES)
def test_imports_go_down(module):
    if module not in LAYER:
        pytest.skip('not placed (test_module_is_placed fails)')
    up = [
        f"looped_lm/{module}.py:{line} imports {t} (layer {LAYER[t]} {LAYERS[LAYER[t]]}) from layer {LAYER[module]}"
        for t, line in GRAPH[module]
        if LAYER.get(t, -1) > LAYER[module]
    ]
    assert not up, 'upward import(s): move the code or the import down\n' + '\n'.join(up)


@pytest.mark.parametrize('module', MODULES)
def test_no_cycle(module):
    found = cycles_through(module)
    lines = {(m, t): line for m, edges in GRAPH.items() for t, line in edges}
    where = [', '.join(f"{a}.py:{lines[a, b]}" for a, b in zip(c.split(' -> '), c.split(' -> ')[1:])) for c in found]
    assert not found, 'import cycle(s):\n' + '\n'.join(f"{c}  ({w})" for c, w in zip(found, where))
