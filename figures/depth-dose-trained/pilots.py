"""Issue 53, part 2: the pilots, run by the cause's rule (`nbs/06f_dose.ipynb`) and committed as they land.

    python figures/depth-dose-trained/pilots.py            # the next pilot, cheapest first, until the choice is final
    python figures/depth-dose-trained/pilots.py lr2 lr4    # these pilots (names of DOSE_CANDIDATES)
    python figures/depth-dose-trained/pilots.py --choose [--closed]   # only `choice.json` and `pilots.md`

Each pilot publishes into `pilots/<candidate>/` (records, `pilot.json`); `--closed` ends the search short of the
150x floor (after about two hours of pilots): the largest ratio is then the regime, said so in `pilots.md`.
"""

import sys

from looped_lm.extensions.dose import DOSE_CANDIDATES, PILOTS, run_pilot, write_choice
from looped_lm.studies.runner import repo_root


def next_pilot(folder, named: list | None) -> str | None:
    "The next pilot: the next one named (None: none were), else the cheapest unrun while the choice is not final."
    if named is not None or '--choose' in sys.argv:
        return named.pop(0) if named else None
    state = write_choice(folder)
    return None if state['final'] or not state['next'] else state['next'][0]


if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    if bad := [a for a in args if a not in DOSE_CANDIDATES]:
        sys.exit(f"unknown pilot(s) {bad}: choose from {list(DOSE_CANDIDATES)}.")
    folder = repo_root() / PILOTS
    folder.mkdir(parents=True, exist_ok=True)
    named, tried = [f'dose-pilot-{a}' for a in args] or None, set()  # named: those alone
    while (name := next_pilot(folder, named)) is not None:
        if name in tried:  # run, yet not measured (a run failed or diverged): a person reads its folder and decides
            sys.exit(f"{name} ran but has no pilot.json: read results/depth-{name}/runs/*/status.json; nothing chosen.")
        tried.add(name)
        run_pilot(name, workers=2)
    write_choice(folder, closed='--closed' in sys.argv)
    print((folder / 'pilots.md').read_text())
