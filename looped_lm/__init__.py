__version__ = "0.0.1"

import warnings as _warnings

# huggingface_hub and datasets import `tqdm.auto`, which warns inside Jupyter when ipywidgets is absent; our own
# progress is printed as text, so the warning (which prints the local site-packages path) says nothing to a reader.
_warnings.filterwarnings('ignore', message='IProgress not found')
