import os

import torch

# The Triton interpreter is read when kernels are decorated, so it must be set before any
# kernels module is imported. With a GPU the real compiler runs instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from support import FIXTURES  # noqa: E402,F401  (kept importable from conftest)
