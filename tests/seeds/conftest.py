# SPDX-License-Identifier: MIT
"""Fixtures of the seed acceptance tests (tests/seeds): the seeds' own
example code (shared/seeds, copied into the tests) runs against a real
kvpoold with only the model and the tokenizer replaced by CPU stand-ins
(kvpool.tiny: TinyDecoder, the byte tokenizer).

- ``kd``: a kvpoold of the module's own with kvpool.tiny.LAYOUT, started by
  tests/python/conftest.py's Daemon (loaded here under another module name:
  both directories have a conftest.py); $KVPOOL_SOCKET points at it, so
  ``ChunkedLLM(...)`` as the seeds write it connects there.
- ``nanovllm``: the seeds import ``nanovllm`` (the fork they were written
  for); these modules name kvpool's classes, so the import lines run as
  written.
- ``tiny_model_dir(path)`` writes a model directory (a TinyDecoder's
  weights and config) and ``load_tiny_model`` is the loader that reads one:
  ``ChunkedLLM(model_path=...)`` on this machine, where transformers is not
  installed (registered with kvpool.llm.register_model_loader by the
  ``tiny_loader`` fixture).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest
import torch

_PY = Path(__file__).resolve().parents[1] / "python"
_spec = importlib.util.spec_from_file_location("kvpool_python_conftest", _PY / "conftest.py")
_base = importlib.util.module_from_spec(_spec)
sys.modules["kvpool_python_conftest"] = _base
_spec.loader.exec_module(_base)  # type: ignore[union-attr]
Daemon = _base.Daemon

TINY_CONFIG = "kvpool_tiny.json"


@pytest.fixture(scope="module")
def kd() -> Iterator[Any]:
    from kvpool.tiny import LAYOUT
    d = Daemon(layout=LAYOUT, device_mem="16M", host_mem="4M")
    old = os.environ.get("KVPOOL_SOCKET")
    os.environ["KVPOOL_SOCKET"] = d.sock
    yield d
    if old is None:
        os.environ.pop("KVPOOL_SOCKET", None)
    else:
        os.environ["KVPOOL_SOCKET"] = old
    d.stop()


@pytest.fixture(scope="session", autouse=True)
def nanovllm() -> Iterator[None]:
    """``from nanovllm import ChunkedLLM, ChunkType`` and
    ``from nanovllm.engine.virtual_sequence import VirtualSequence``."""
    import kvpool.llm
    try:
        import kvpool.vseq
        vseq = kvpool.vseq
    except ImportError as e:        # the module under test missing: its tests fail
        vseq = types.ModuleType("nanovllm.engine.virtual_sequence")
        vseq.__getattr__ = lambda name, e=e: (_ for _ in ()).throw(  # type: ignore
            ImportError(f"kvpool.vseq: {e}"))
    top = types.ModuleType("nanovllm")
    for n in ("ChunkedLLM", "ChunkType", "ChunkNotFoundError", "IncompatibleChunksError",
              "OutOfMemoryError", "SamplingParams"):
        setattr(top, n, getattr(kvpool.llm, n))
    engine = types.ModuleType("nanovllm.engine")
    top.engine = engine  # type: ignore[attr-defined]
    engine.virtual_sequence = vseq  # type: ignore[attr-defined]
    mods = {"nanovllm": top, "nanovllm.engine": engine,
            "nanovllm.engine.virtual_sequence": vseq}
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    yield
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


def tiny_model_dir(path: Path, seed: int = 0) -> Path:
    """A model directory: the weights of kvpool.tiny's TinyDecoder over
    the byte tokenizer, and a config naming them."""
    from kvpool.tiny import ByteTokenizer, TinyDecoder
    tok = ByteTokenizer()
    model = TinyDecoder(vocab=tok.vocab_size, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "weights.pt")
    (path / TINY_CONFIG).write_text(json.dumps({"model": "TinyDecoder",
                                                "vocab": tok.vocab_size,
                                                "weights": "weights.pt"}))
    return path


def load_tiny_model(path: str) -> Optional[Tuple[Any, Any]]:
    """The stand-in loader: (TinyDecoderAdapter, ByteTokenizer) of a
    directory tiny_model_dir wrote; None for any other directory."""
    from kvpool.tiny import ByteTokenizer, TinyDecoder, TinyDecoderAdapter
    cfg_path = Path(path) / TINY_CONFIG
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    tok = ByteTokenizer()
    model = TinyDecoder(vocab=int(cfg["vocab"]), seed=12345)   # other weights...
    model.load_state_dict(torch.load(Path(path) / cfg["weights"]))  # ...replaced
    model.eval()
    adapter = TinyDecoderAdapter(model, tok.eos_token_id)
    adapter.model_path = str(path)  # type: ignore[attr-defined]
    return adapter, tok


@pytest.fixture
def tiny_loader() -> Iterator[Any]:
    from kvpool.llm import register_model_loader
    register_model_loader(load_tiny_model)
    yield load_tiny_model
    import kvpool.loaders
    kvpool.loaders.unregister_model_loader(load_tiny_model)


def run_seed(code: str, ns: Dict[str, Any]) -> Dict[str, Any]:
    """Execute a code block of a seed in namespace ns (returned)."""
    exec(compile(textwrap.dedent(code), "<seed example>", "exec"), ns)  # noqa: S102
    return ns
