# SPDX-License-Identifier: MIT
"""kvpool.loaders: what ``ChunkedLLM(model_path=...)`` loads a model
directory with. A loader is ``fn(path) -> (model, tokenizer)`` (or just the
model; None: not a directory it loads). ``ChunkedLLM(loader=fn)`` uses one;
otherwise the ones added with :func:`register_model_loader` are tried,
newest first, then transformers' AutoModelForCausalLM / AutoTokenizer."""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["register_model_loader", "load_model"]

_LOADERS: List[Callable[[str], Any]] = []


def register_model_loader(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Add a model loader (usable as a decorator); see the module doc."""
    _LOADERS.insert(0, fn)
    return fn


def unregister_model_loader(fn: Callable[[str], Any]) -> None:
    """Remove a loader register_model_loader added."""
    _LOADERS.remove(fn)


def load_model(path: str, loader: Optional[Callable[[str], Any]] = None) -> Tuple[Any, Any]:
    """(model, tokenizer or None) of a local model directory: ``loader(path)``
    when given, else the first registered loader that takes it, else
    transformers."""
    if not os.path.isdir(path):
        raise ValueError(f"model_path {path!r}: not a local directory (kvpool loads "
                         "local models only)")
    for fn in ([loader] if loader is not None else list(_LOADERS)):
        got = fn(path)
        if got is None and loader is None:
            continue
        if got is None:
            raise ValueError(f"model_path {path!r}: the loader {loader!r} returned nothing "
                             "(not a directory it loads)")
        return (got[0], got[1]) if isinstance(got, tuple) else (got, None)
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"model_path {path!r}: no registered loader takes it and "
                          f"HuggingFace transformers is not importable ({e}); install "
                          "transformers, pass loader=, or add one with "
                          "kvpool.llm.register_model_loader()") from e
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return model, tok
