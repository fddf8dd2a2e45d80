"""tfm_course: the companion package of tfm-course, an executable course on Transformers.

One module per idea; open any of them and read it top to bottom. What runs experiments (timing,
benches, harnesses, stored runs) lives in :mod:`tfm_course.experiments`.
"""

import os as _os

from ._moved import install as _install_moved

_install_moved()  # `import tfm_course.bench` and the other old paths say where they went

__version__ = "0.1.0"

# Nobody watches a book build or a test run (their kernels see none of these front ends). There,
# Hugging Face's loading bars (tqdm.auto) would be saved as notebook widgets, and the built page
# would then load require.js and the widget manager from a CDN: switch those bars off, as
# tfm_course.train does with its own. A reader's Jupyter or Colab keeps them.
_FRONT_ENDS = ("JPY_SESSION_NAME", "COLAB_RELEASE_TAG", "VSCODE_PID")
if _os.environ.get("CI") or not any(name in _os.environ for name in _FRONT_ENDS):
    _os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
