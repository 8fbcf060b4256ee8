"""Whether Triton can compile for NVIDIA GPUs here: its NVIDIA backend with the bundled ptxas
(no GPU needed), which the ahead-of-time compile tests require."""
from __future__ import annotations

import importlib.util
import os


def nvidia_backend() -> bool:
    spec = importlib.util.find_spec("triton")
    return spec is not None and os.path.exists(
        os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "ptxas"))
