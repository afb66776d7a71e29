# SPDX-License-Identifier: MIT
"""ctest's entry to the Python tests: pytest with the given arguments, or
exit 77 (skip) with the reason when torch, numpy or pytest cannot be imported
by this interpreter (scripts/deps.sh installs Debian's python3-torch,
python3-numpy and python3-pytest)."""
import sys

missing = []
for mod in ("pytest", "numpy", "torch"):
    try:
        __import__(mod)
    except ImportError as e:  # pragma: no cover - depends on the machine
        missing.append(f"{mod} ({e})")
if missing:
    print(f"skip: {sys.executable} cannot import {', '.join(missing)}; "
          "install python3-pytest python3-numpy python3-torch (scripts/deps.sh)")
    sys.exit(77)

import pytest  # noqa: E402

sys.exit(pytest.main(["-p", "no:cacheprovider", *sys.argv[1:]]))
