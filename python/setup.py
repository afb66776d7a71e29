# SPDX-License-Identifier: MIT
"""Build kvpool._kvpool (src/*.c) against an installed libkvpool.

Where libkvpool is: $KVPOOL_PREFIX (PREFIX/include, PREFIX/lib), else
``pkg-config kvpool``, else the system paths. The module gets an RPATH to
that lib directory, so it loads without LD_LIBRARY_PATH.
"""
import os
import shlex
import subprocess
from glob import glob

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
inc, libdirs, extra = [], [], []
prefix = os.environ.get("KVPOOL_PREFIX")
if prefix:
    inc.append(os.path.join(prefix, "include"))
    libdirs += [d for d in (os.path.join(prefix, "lib"), os.path.join(prefix, "lib64"))
                if os.path.isdir(d)]
else:
    try:
        cflags = subprocess.run(["pkg-config", "--cflags", "kvpool"], check=True,
                                capture_output=True, text=True).stdout
        libs = subprocess.run(["pkg-config", "--libs-only-L", "kvpool"], check=True,
                              capture_output=True, text=True).stdout
        inc += [f[2:] for f in shlex.split(cflags) if f.startswith("-I")]
        libdirs += [f[2:] for f in shlex.split(libs) if f.startswith("-L")]
    except (OSError, subprocess.CalledProcessError):
        pass  # the system's include and library paths

setup(
    ext_modules=[Extension(
        "kvpool._kvpool",
        sources=sorted(os.path.relpath(p, here) for p in glob(os.path.join(here, "src", "*.c"))),
        include_dirs=inc,
        library_dirs=libdirs,
        runtime_library_dirs=libdirs,
        libraries=["kvpool"],
        extra_compile_args=["-fvisibility=hidden", "-fno-strict-aliasing"],
    )],
)
