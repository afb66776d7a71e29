# SPDX-License-Identifier: MIT
"""The small plain-torch models of the tests and examples (TinyDecoder,
TinyHSTU, the byte tokenizer, tiny_llm_parts). They ship in the package as
:mod:`kvpool.tiny`, so ``python3 -m kvpool.chat --tiny`` works from an
installed tree; this name stays for the examples and tests that import it.
"""
from kvpool.tiny import *  # noqa: F401,F403
