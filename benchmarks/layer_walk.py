"""How the main job walks the package's layers (issue 57): every call and return between modules of `looped_lm`,
followed from `run_ablation(preset)` to its figures, then `make_figures` on the results folder alone.

    python benchmarks/layer_walk.py [--preset smoke]

Prints, for each walk: the module stays (each time execution moves to another module of the package), the climbs
(a move back up to a higher layer, after a call into a lower one returns), the longest run of moves back and forth
between two modules, and how often each module is entered. Layers are those of `../shared/tools/layers.py` (a
module's layer is 1 + the highest it imports); the tool is read, not copied. Counts, not times: nothing here is a
benchmark of speed."""

import argparse, collections, re, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layers() -> dict:
    "{module: layer} as the layers tool prints them (`looped_lm.` + the dotted name)."
    tool = ROOT.parent / 'shared' / 'tools' / 'layers.py'
    out = subprocess.run([sys.executable, str(tool)], cwd=ROOT, capture_output=True, text=True).stdout
    return {f"looped_lm.{m}": int(n) for n, m in re.findall(r'^layer\s+(\d+)\s+(\S+)', out, re.M)}


def walk(fn, *args, **kw):
    "(the module stays, in order; fn's result) of calling `fn` with the package's frames followed."
    stack, stays = [], []

    def prof(frame, event, arg):
        mod = frame.f_globals.get('__name__', '')
        if not mod.startswith('looped_lm') or event not in ('call', 'return'):
            return
        if event == 'call':
            stack.append(mod)
        elif stack:
            stack.pop()
        top = stack[-1] if stack else None
        if top and (not stays or stays[-1] != top):
            stays.append(top)

    sys.setprofile(prof)
    try:
        out = fn(*args, **kw)
    finally:
        sys.setprofile(None)
    return stays, out


def longest_alternation(stays: list) -> tuple:
    "(length, (a, b)): the longest run of stays that goes back and forth between two modules only."
    best, pair = 0, None
    for i in range(len(stays) - 1):
        a, b, n = stays[i], stays[i + 1], 2
        while i + n < len(stays) and stays[i + n] == (a if n % 2 == 0 else b):
            n += 1
        if n > best:
            best, pair = n, (a, b)
    return best - 1, pair  # moves, not stays


def report(name: str, stays: list, layer: dict):
    short = lambda m: m.removeprefix('looped_lm.')  # noqa: E731
    climbs = sum(layer.get(b, 0) > layer.get(a, 0) for a, b in zip(stays, stays[1:]))
    moves, pair = longest_alternation(stays)
    entered = collections.Counter(stays)
    print(f"{name}: {len(stays)} stays, {climbs} climbs back up a layer, longest back-and-forth {moves} moves "
          f"({' <-> '.join(map(short, pair)) if pair else '-'})")  # fmt: skip
    print('  entered: ' + ', '.join(f"{short(m)} {n}" for m, n in entered.most_common()))


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--preset', default='smoke')
    a = p.parse_args()
    import looped_lm as ll

    layer = layers()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / 'study'
        stays, res = walk(ll.run_ablation, a.preset, out_dir=out, workers=1, progress=False, max_eval_batches=1)
        more, _ = walk(ll.make_figures, res, verbose=False)
        report(f"run_ablation({a.preset!r}) and its figures", stays + more, layer)
        figs, _ = walk(ll.make_figures, out, Path(tmp) / 'figs', verbose=False)
        report('make_figures(results folder)', figs, layer)
