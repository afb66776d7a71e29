# SPDX-License-Identifier: MIT
"""What the GPU tests of the Python package need, and why they skip without
it: a CUDA device seen by torch, the real transformers >= 5, a kvpoold.
Shared by test_hf_gpu.py and test_llm_gpu.py (ctest runs them as scripts;
a skip is exit status 77)."""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Optional

SRC = Path(os.environ.get("KVPOOL_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def kvpoold() -> Optional[str]:
    for p in [os.environ.get("KVPOOLD")] + sorted(glob.glob(str(SRC / "build*" / "kvpoold"))):
        if p and os.access(p, os.X_OK):
            return p
    return None


def why_skip(what: str) -> Optional[str]:
    """None when the GPU test of ``what`` (a module name) can run."""
    try:
        import torch
    except ImportError as e:
        return f"no torch ({e})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import transformers
    except ImportError as e:
        return f"no transformers ({e}); {what} needs transformers >= 5"
    if getattr(transformers, "FAKE", False):
        return "only the tests' transformers stand-in is importable"
    if int(transformers.__version__.split(".")[0]) < 5:
        return f"transformers {transformers.__version__}; {what} needs >= 5"
    if not kvpoold():
        return "no kvpoold (build it, or set $KVPOOLD)"
    return None
