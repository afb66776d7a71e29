# SPDX-License-Identifier: MIT
"""Seed 001 (shared/seeds/001_2816b6f03ca65da6.txt, the chunk API) as the
acceptance test: every code block of the seed, copied as the seed writes it,
runs against a real kvpoold.

Replaced, and nothing else: the model -- ``model_path="path/to/model"`` is a
directory this test writes at that path (a TinyDecoder's weights, read by
the stand-in loader of conftest.py: transformers is not installed here) --
and the placeholders the seed leaves for ids it does not have
(``"a7b9c2d4e6..."``, ``"python_expert_id"``, ``"..."``: substituted with
the ids of chunks registered in the same block, see ``PLACEHOLDERS``).
Names the seed uses without defining them (``documents``,
``search_engine``, ``messages``, ...) are given values by the test.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from conftest import run_seed, tiny_model_dir
from kvpool.llm import ChunkType

# ---------------------------------------------------------------- the seed
INIT = '''
from nanovllm import ChunkedLLM, ChunkType

# Initialize the model with chunk support
llm = ChunkedLLM(
    model_path="path/to/model",
    max_chunks=1000,           # Maximum chunks to cache
    chunk_memory_ratio=0.5,    # Fraction of KV cache for chunks
    enable_deduplication=True  # Auto-deduplicate by content hash
)
'''

REGISTER = '''
# Register a system prompt
system_id = llm.register_chunk(
    content="You are a helpful AI assistant specialized in Python.",
    chunk_type=ChunkType.SYSTEM_PROMPT,
    metadata={"name": "python_expert", "version": "1.0"}
)

# Register context chunks
doc_id = llm.register_chunk(
    content="Python is a high-level programming language...",
    chunk_type=ChunkType.CONTEXT,
    metadata={"source": "python_docs", "section": "intro"}
)

# Register query
query_id = llm.register_chunk(
    content="What are Python decorators?",
    chunk_type=ChunkType.QUERY
)
'''

LIST = '''
# List all chunks
chunks = llm.list_chunks()

# List by type
system_chunks = llm.list_chunks(chunk_type=ChunkType.SYSTEM_PROMPT)

# List with metadata filter
python_chunks = llm.list_chunks(metadata_filter={"source": "python_docs"})
'''

ROWS = '''
[{
    "chunk_id": "a7b9c2d4e6...",
    "chunk_type": "system_prompt",
    "content_preview": "You are a helpful...",
    "token_count": 25,
    "metadata": {"name": "python_expert"},
    "created_at": "2024-01-01T00:00:00Z",
    "last_accessed": "2024-01-01T00:01:00Z",
    "access_count": 5
}]
'''

GET = '''
chunk = llm.get_chunk(chunk_id)
# Returns full chunk details including content
'''

DELETE = '''
llm.delete_chunk(chunk_id)
# Removes chunk and frees KV cache memory
'''

SIMPLE = '''
# Compose chunks for inference
output = llm.generate_from_chunks(
    system_chunk_id="a7b9c2d4e6...",
    context_chunk_ids=["b8c3d5e7f1...", "c9d4e6f8a2..."],
    query_chunk_id="d1e5f7a9b3...",
    sampling_params={"temperature": 0.7, "max_tokens": 200}
)
'''

BATCH = '''
# Multiple requests with different chunk combinations
requests = [
    {
        "system_chunk_id": "python_expert_id",
        "context_chunk_ids": ["python_docs_id"],
        "query_chunk_id": "query1_id"
    },
    {
        "system_chunk_id": "python_expert_id",  # Reuses KV cache
        "context_chunk_ids": ["django_docs_id"], # Different context
        "query_chunk_id": "query2_id"
    }
]

outputs = llm.batch_generate_from_chunks(
    requests=requests,
    sampling_params={"temperature": 0.7, "max_tokens": 200}
)
'''

PREVIEW = '''
# Preview how chunks will be composed without running inference
composition = llm.preview_composition(
    system_chunk_id="...",
    context_chunk_ids=["...", "..."],
    query_chunk_id="..."
)

print(f"Total tokens: {composition['total_tokens']}")
print(f"Cascade levels: {composition['num_levels']}")
print(f"Memory usage: {composition['memory_bytes'] / 1024**2:.1f} MB")
'''

DIRECT = '''
# Convenience method that registers chunks and runs inference
output = llm.generate(
    system_prompt="You are a helpful assistant.",
    context=[
        "Document 1 content...",
        "Document 2 content..."
    ],
    query="What do the documents say about X?",
    sampling_params={"temperature": 0.7},
    persist_chunks=True  # Keep chunks for reuse
)

# Returns output and chunk IDs for future reuse
print(output['text'])
print(output['chunk_ids'])  # {"system": "...", "context": [...], "query": "..."}
'''

STATS = '''
stats = llm.get_chunk_stats()
print(f"Total chunks: {stats['total_chunks']}")
print(f"Memory used: {stats['memory_used_mb']} MB")
print(f"Cache hits: {stats['cache_hits']}")
print(f"Cache hit rate: {stats['hit_rate']:.1%}")
'''

MEMORY = '''
# Clear all chunks
llm.clear_chunks()

# Clear chunks by type
llm.clear_chunks(chunk_type=ChunkType.CONTEXT)

# Clear unused chunks (not accessed in last N seconds)
llm.evict_unused_chunks(max_age_seconds=3600)
'''

ERRORS = '''
try:
    output = llm.generate_from_chunks(...)
except ChunkNotFoundError:
    # Chunk was evicted or doesn't exist
    pass
except IncompatibleChunksError:
    # Chunks have incompatible dimensions
    pass
except OutOfMemoryError:
    # Not enough KV cache memory
    llm.evict_unused_chunks()
'''

MIGRATION = '''
# Before (standard API)
output = llm.generate(
    prompt="System: You are helpful.\\nUser: Hello",
    sampling_params={...}
)

# After (chunk API with persistence)
system_id = llm.register_chunk("You are helpful.", ChunkType.SYSTEM_PROMPT)
query_id = llm.register_chunk("Hello", ChunkType.QUERY)
output = llm.generate_from_chunks(
    system_chunk_id=system_id,
    query_chunk_id=query_id,
    sampling_params={...}
)
# Subsequent calls reuse the KV caches
'''

RAG = '''
# Register document chunks
for doc in documents:
    llm.register_chunk(
        content=doc['content'],
        chunk_type=ChunkType.CONTEXT,
        metadata={"source": doc['url'], "title": doc['title']}
    )

# Query with relevant documents
relevant_docs = search_engine.search(query)
output = llm.generate_from_chunks(
    system_chunk_id=rag_system_prompt_id,
    context_chunk_ids=[doc['chunk_id'] for doc in relevant_docs],
    query_chunk_id=llm.register_chunk(query, ChunkType.QUERY)
)
'''

MULTI_TURN = '''
# Register conversation history as context
history_id = llm.register_chunk(
    content=format_conversation(messages),
    chunk_type=ChunkType.CONTEXT,
    metadata={"conversation_id": conv_id}
)

# Generate response with history
output = llm.generate_from_chunks(
    system_chunk_id=assistant_prompt_id,
    context_chunk_ids=[history_id],
    query_chunk_id=llm.register_chunk(user_message, ChunkType.QUERY)
)
'''

MULTI_AGENT = '''
# Different agents with different system prompts
agents = {
    "researcher": llm.register_chunk("You are a research assistant...", ChunkType.SYSTEM_PROMPT),
    "coder": llm.register_chunk("You are an expert programmer...", ChunkType.SYSTEM_PROMPT),
    "reviewer": llm.register_chunk("You are a code reviewer...", ChunkType.SYSTEM_PROMPT)
}

# Shared context across agents
shared_context_id = llm.register_chunk(project_description, ChunkType.CONTEXT)

# Each agent processes with their own prompt but shared context
for agent_name, system_id in agents.items():
    output = llm.generate_from_chunks(
        system_chunk_id=system_id,
        context_chunk_ids=[shared_context_id],
        query_chunk_id=task_query_id
    )
'''


def sub(code: str, ids: dict) -> str:
    """The seed's placeholder ids replaced by real ones (in order of
    appearance for the repeated "...")."""
    for k, v in ids.items():
        if k == '"..."':
            for x in v:
                code = code.replace(k, f'"{x}"', 1)
        else:
            code = code.replace(k, f'"{v}"')
    return code


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def seed_ns(kd, tiny_loader, tmp_path, monkeypatch):
    """The seed's initialization block, run as written in a directory that
    has path/to/model (the stand-in model)."""
    monkeypatch.chdir(tmp_path)
    tiny_model_dir(Path("path/to/model"))
    ns: dict = {}
    run_seed(INIT, ns)
    llm = ns["llm"]
    from kvpool.llm import ChunkNotFoundError, IncompatibleChunksError, OutOfMemoryError
    ns.update(ChunkNotFoundError=ChunkNotFoundError,
              IncompatibleChunksError=IncompatibleChunksError,
              OutOfMemoryError=OutOfMemoryError)
    llm.clear_chunks()
    yield ns
    llm.clear_chunks()
    llm.close()


# ---------------------------------------------------------------- tests
def test_init_loads_the_model_path_with_the_loader(seed_ns):
    llm = seed_ns["llm"]
    assert llm.adapter.model_path == "path/to/model"
    assert llm.enable_deduplication is True
    assert llm.limits["max_chunks"] == 1000
    # the stand-in model directory holds the same weights as tiny_llm_parts()
    from kvpool.tiny import tiny_llm_parts
    model, _, _ = tiny_llm_parts()
    for k, v in model.state_dict().items():
        assert (llm.adapter.model.state_dict()[k] == v).all(), k


def test_chunk_management(seed_ns, capsys):
    ns = run_seed(REGISTER, seed_ns)
    llm = ns["llm"]
    assert ns["system_id"] == sha("You are a helpful AI assistant specialized in Python.")
    assert ns["doc_id"] == sha("Python is a high-level programming language...")
    assert ns["query_id"] == sha("What are Python decorators?")
    run_seed(LIST, ns)
    assert {r["chunk_id"] for r in ns["chunks"]} == {ns["system_id"], ns["doc_id"],
                                                       ns["query_id"]}
    assert [r["chunk_id"] for r in ns["system_chunks"]] == [ns["system_id"]]
    assert [r["chunk_id"] for r in ns["python_chunks"]] == [ns["doc_id"]]
    row = ns["system_chunks"][0]
    shown = eval(ROWS)[0]                      # the seed's example row: the same fields
    assert set(row) == set(shown)
    assert all(type(row[k]) is type(v) for k, v in shown.items())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["created_at"])
    assert row["chunk_type"] == "system_prompt"
    assert row["token_count"] == len(b"You are a helpful AI assistant specialized in Python.")
    assert row["metadata"] == {"name": "python_expert", "version": "1.0"}
    ns["chunk_id"] = ns["doc_id"]
    run_seed(GET, ns)
    assert ns["chunk"]["content"] == "Python is a high-level programming language..."
    used = llm.client.stats()["device"]["frames_used"]
    run_seed(DELETE, ns)
    assert ns["doc_id"] not in {r["chunk_id"] for r in llm.list_chunks()}
    assert llm.client.stats()["device"]["frames_used"] < used


def test_inference_batch_preview(seed_ns, capsys):
    ns = run_seed(REGISTER, seed_ns)
    llm = ns["llm"]
    django = llm.register_chunk("Django is a web framework.", "context")
    q2 = llm.register_chunk("What is Django?", "query")
    run_seed(sub(SIMPLE, {'"a7b9c2d4e6..."': ns["system_id"],
                          '"b8c3d5e7f1..."': ns["doc_id"], '"c9d4e6f8a2..."': django,
                          '"d1e5f7a9b3..."': ns["query_id"]}), ns)
    out = ns["output"]
    assert 1 <= len(out["token_ids"]) <= 200 and isinstance(out["text"], str)
    assert out["chunk_ids"] == {"system": ns["system_id"], "context": [ns["doc_id"], django],
                                "query": ns["query_id"]}
    run_seed(sub(BATCH, {'"python_expert_id"': ns["system_id"],
                         '"python_docs_id"': ns["doc_id"], '"query1_id"': ns["query_id"],
                         '"django_docs_id"': django, '"query2_id"': q2}), ns)
    assert [o["chunk_ids"]["query"] for o in ns["outputs"]] == [ns["query_id"], q2]
    run_seed(sub(PREVIEW, {'"..."': [ns["system_id"], ns["doc_id"], django,
                                     ns["query_id"]]}), ns)
    comp = ns["composition"]
    assert comp["num_levels"] == 4
    assert comp["total_tokens"] == sum(len(t) for t in (
        "You are a helpful AI assistant specialized in Python.",
        "Python is a high-level programming language...", "Django is a web framework.",
        "What are Python decorators?"))
    assert "Cascade levels: 4" in capsys.readouterr().out


def test_direct_stats_memory_errors(seed_ns, capsys):
    ns = run_seed(DIRECT, seed_ns)
    llm = ns["llm"]
    ids = ns["output"]["chunk_ids"]
    assert ids["system"] == sha("You are a helpful assistant.")
    assert ids["context"] == [sha("Document 1 content..."), sha("Document 2 content...")]
    assert ids["query"] == sha("What do the documents say about X?")
    run_seed(STATS, ns)
    assert ns["stats"]["total_chunks"] == 4
    out = capsys.readouterr().out
    assert "Total chunks: 4" in out and "Cache hit rate:" in out
    run_seed(ERRORS, ns)                         # generate_from_chunks(...): not found
    run_seed(MEMORY, ns)
    assert llm.list_chunks() == []


def test_migration_from_the_standard_api(seed_ns):
    llm = seed_ns["llm"]
    ns = run_seed(MIGRATION.split("# After")[0], seed_ns)
    before = ns["output"]
    # the standard call: a generation from the prompt, nothing registered
    assert isinstance(before, dict) and 1 <= len(before["token_ids"]) <= 64
    assert before["prompt_tokens"] == len("System: You are helpful.\nUser: Hello")
    assert llm.list_chunks() == []
    run_seed(MIGRATION, ns)
    created = llm.counters["links_created"]
    assert ns["output"]["chunk_ids"]["query"] == ns["query_id"]
    run_seed(MIGRATION, ns)                      # "Subsequent calls reuse the KV caches"
    assert llm.counters["links_created"] == created
    assert llm.counters["root_hits"] >= 2


def test_use_cases(seed_ns):
    ns = seed_ns
    llm = ns["llm"]
    documents = [{"content": f"Document {i}: kvpool keeps KV pages {i}.",
                  "url": f"https://example.org/{i}", "title": f"Doc {i}"} for i in range(3)]

    class SearchEngine:
        def search(self, q):
            return [{"chunk_id": r["chunk_id"]} for r in
                    llm.list_chunks(metadata_filter={"source": documents[1]["url"]})]

    ns.update(documents=documents, search_engine=SearchEngine(),
              query="Where are the KV pages?",
              rag_system_prompt_id=llm.register_chunk("Answer from the documents.",
                                                      ChunkType.SYSTEM_PROMPT))
    run_seed(RAG, ns)
    assert ns["output"]["chunk_ids"]["context"] == [sha(documents[1]["content"])]
    ns.update(format_conversation=lambda ms: "\n".join(f"{m['role']}: {m['content']}"
                                                       for m in ms),
              messages=[{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello!"}],
              conv_id="c1", user_message="And now?",
              assistant_prompt_id=llm.register_chunk("You are an assistant.",
                                                     ChunkType.SYSTEM_PROMPT))
    run_seed(MULTI_TURN, ns)
    assert llm.get_chunk(ns["history_id"])["content"] == "user: Hi\nassistant: Hello!"
    ns.update(project_description="A KV cache daemon in C.",
              task_query_id=llm.register_chunk("Review the design.",
                                               ChunkType.QUERY))
    before = llm.counters["links_created"]
    run_seed(MULTI_AGENT, ns)
    # three system prompts: the shared context linked under each, the query after each
    assert llm.counters["links_created"] - before == 6
    assert len(ns["agents"]) == 3


def test_enable_deduplication_false_keeps_duplicates(kd, tiny_loader, tmp_path):
    """The seed's option turned off: the same content registered twice is
    two chunks, each with its own id and its own KV pages."""
    from kvpool.llm import ChunkedLLM, ChunkType
    d = tiny_model_dir(tmp_path / "m")
    with ChunkedLLM(model_path=str(d), enable_deduplication=False) as llm:
        llm.clear_chunks()
        a = llm.register_chunk("You are helpful.", ChunkType.SYSTEM_PROMPT, {"v": 1})
        b = llm.register_chunk("You are helpful.", ChunkType.SYSTEM_PROMPT, {"v": 1})
        assert a != b
        rows = {r["chunk_id"]: r for r in llm.list_chunks()}
        assert set(rows) == {a, b}
        for cid in (a, b):
            assert rows[cid]["content_preview"] == "You are helpful."
            assert rows[cid]["metadata"] == {"v": 1}
            g = llm.get_chunk(cid)
            assert g["content"] == "You are helpful." and g["copy"] is True
            assert g["token_ids"] == list(b"You are helpful.")
        assert llm.get_chunk(a)["root"] != llm.get_chunk(b)["root"]
        assert llm.get_chunk_stats()["total_chunks"] == 2
        assert llm.counters["roots_created"] == 2
        llm.clear_chunks()
