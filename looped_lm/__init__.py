"""looped_lm: looped language models and the readout blind spot. `import looped_lm as ll` gives what the chapters tell a
user to call, each imported from its home; the parts (`ll.core`, `ll.model`, `ll.training`, `ll.measure`, `ll.studies`,
`ll.extensions`, `ll.interop`) hold the rest. The book's reading order is `nbs/index.ipynb`."""

__version__ = "0.0.1"

import warnings as _warnings

# huggingface_hub and datasets import `tqdm.auto`, which warns inside Jupyter when ipywidgets is absent; our own
# progress is printed as text, so the warning (which prints the local site-packages path) says nothing to a reader.
_warnings.filterwarnings('ignore', message='IProgress not found')

from .core.config import ConfigError, ExperimentConfig, list_presets, load_preset  # noqa: E402
from .model.looped import LoopedLM, LoopedLMConfig  # noqa: E402
from .training.data import prepare_data  # noqa: E402
from .training.train import train  # noqa: E402
from .training.rundir import load_run  # noqa: E402
from .measure.protocol import LoopSpec, LoopSpecError, PaddedTokens, run_loops  # noqa: E402
from .measure.spec_checks import check_spec  # noqa: E402
from .measure.hooks import from_hooks  # noqa: E402
from .measure.diagnostics import DiagnosticReport, diagnose, diagnose_run  # noqa: E402
from .studies.ablation import run_ablation, table_markdown  # noqa: E402
from .studies.claims import claims_markdown  # noqa: E402
from .studies.runner import StudyResult, rebuild  # noqa: E402
from .studies.figures import make_figures  # noqa: E402
from .studies.runner import run_grid  # noqa: E402
from .extensions.scaling import run_scaling  # noqa: E402
from .extensions.horizon import run_horizon  # noqa: E402
from .extensions.depth import run_depth  # noqa: E402
from .extensions.worth import run_worth  # noqa: E402
from .extensions.dose import dose_response, dose_star  # noqa: E402
from .interop.hub import from_run  # noqa: E402

# The `transformers` and lm-evaluation-harness bridges need the `eval` extra: imported when first asked for.
_OPTIONAL = {
    'save_transformers': 'transformers_io',
    'fast_tokenizer': 'transformers_io',
    'LoopedLMForCausalLM': 'transformers_io',
    'save_run': 'lm_eval',
    'compare_bpb': 'lm_eval',
}


def __getattr__(name):
    if name in _OPTIONAL:
        import importlib

        return getattr(importlib.import_module(f'{__name__}.interop.{_OPTIONAL[name]}'), name)
    raise AttributeError(f"module 'looped_lm' has no attribute {name!r}")


__all__ = [
    'ConfigError',
    'ExperimentConfig',
    'list_presets',
    'load_preset',
    'LoopedLM',
    'LoopedLMConfig',
    'prepare_data',
    'train',
    'load_run',
    'LoopSpec',
    'run_loops',
    'check_spec',
    'LoopSpecError',
    'PaddedTokens',
    'from_hooks',
    'DiagnosticReport',
    'diagnose',
    'diagnose_run',
    'run_ablation',
    'table_markdown',
    'StudyResult',
    'claims_markdown',
    'rebuild',
    'make_figures',
    'run_grid',
    'run_scaling',
    'run_horizon',
    'run_depth',
    'run_worth',
    'dose_response',
    'dose_star',
    'from_run',
    *_OPTIONAL,
]
