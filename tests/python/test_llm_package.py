# SPDX-License-Identifier: MIT
"""The shape of the kvpool package (issue 27 item 3): no source file over
800 lines, and kvpool.llm a package in layers with no import cycle --
kvpool.hf_llm imports only kvpool.llm.adapter (not the chunk, decode and
block code), and nothing of kvpool.llm imports kvpool.hf_llm until a
transformers model is given to ChunkedLLM. Each import check runs in a
fresh interpreter, so what it finds in sys.modules is what that import
loaded."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(os.environ.get("KVPOOL_SOURCE_DIR", Path(__file__).resolve().parents[2]))
MAX_LINES = 800

# Every name kvpool.llm had when it was one file, that the package, the
# tests and the tools import from it (the private ones: kvpool.vseq's).
NAMES = ("ChunkType", "ModelAdapter", "ChunkedLLM", "Block", "SamplingParams",
         "ChunkNotFoundError", "IncompatibleChunksError", "OutOfMemoryError",
         "register_model_loader", "load_model", "_Seq", "_is_hex_id", "_is_sampling",
         "_iso")
# What only the chunk, decode and block layers load.
HEAVY = ("kvpool.llm.core", "kvpool.llm.chunks", "kvpool.llm.generate",
         "kvpool.llm.blocks", "kvpool.chunk_copy", "kvpool.loaders", "kvpool.cascade")


def run(code: str) -> None:
    """Run code in a fresh interpreter with the tests' PYTHONPATH; it fails
    the test with what the code printed when it does not exit 0."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stdout}\n{p.stderr}"


def test_no_source_file_over_800_lines():
    files = sorted((SRC / "python" / "kvpool").rglob("*.py"))
    assert len(files) > 10, f"no kvpool sources under {SRC}"
    long = {str(f.relative_to(SRC)): n for f in files
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}: split them by job"


@pytest.mark.parametrize("first", ["kvpool.llm", "kvpool.llm.adapter", "kvpool.llm.chunks",
                                   "kvpool.llm.generate", "kvpool.llm.blocks",
                                   "kvpool.llm.core"])
def test_llm_imports_without_hf_llm(first):
    # Any module of the package imported first, then every old name: no
    # cycle between the layers, and kvpool.hf_llm (transformers) untouched.
    run(f"""
        import sys
        import {first}
        import kvpool.llm
        from kvpool.llm import *
        names = {NAMES!r}
        got = {{n: getattr(kvpool.llm, n) for n in names}}
        assert set(kvpool.llm.__all__) <= set(names)
        for n in kvpool.llm.__all__:
            assert globals()[n] is got[n], n
        # the class is whole: its methods from every layer
        for m in ("register_chunk", "list_chunks", "get_chunk_stats", "_errs", "_name",
                  "_fill", "_generate", "_sample", "generate", "generate_from_chunks",
                  "batch_generate_from_chunks", "preview_composition", "_chain",
                  "get_all_active_blocks", "infer_from_blocks", "_free_seq", "close"):
            assert callable(getattr(got["ChunkedLLM"], m, None)), m
        assert got["_is_hex_id"]("ab" * 32) and not got["_is_hex_id"]("ab")
        import kvpool
        assert kvpool.ChunkedLLM is got["ChunkedLLM"]
        assert kvpool.ModelAdapter is got["ModelAdapter"]
        import kvpool.vseq
        assert "kvpool.hf_llm" not in sys.modules, "kvpool.llm imported kvpool.hf_llm"
        assert "transformers" not in sys.modules, "kvpool.llm imported transformers"
        try:
            kvpool.llm.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("kvpool.llm.no_such_name did not raise AttributeError")
    """)


# A transformers whose every module and name exists (kvpool.hf_llm only
# binds names at import): the test needs no transformers >= 5.
STUB_TRANSFORMERS = """
    import importlib.abc, importlib.machinery, sys, types

    class _Any(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "transformers" or name.startswith("transformers."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__ = []
            m.__getattr__ = lambda n: type(n, (), {})
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Any())
"""


def test_hf_llm_imports_only_the_adapter():
    run(STUB_TRANSFORMERS + f"""
    import kvpool.hf_llm
    heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
    assert not heavy, f"kvpool.hf_llm loaded {{heavy}}: it needs only kvpool.llm.adapter"
    assert "kvpool.llm.adapter" in sys.modules
    assert "ChunkedLLM" not in vars(sys.modules["kvpool.llm"])
    # and then the rest, in the other order than ChunkedLLM's own lazy import
    from kvpool.llm import ChunkedLLM, ModelAdapter
    assert kvpool.hf_llm.ModelAdapter is ModelAdapter
    assert issubclass(kvpool.hf_llm.HFAdapter, ModelAdapter)
    """)
