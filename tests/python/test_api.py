# SPDX-License-Identifier: MIT
"""The Python API over libkvpool: every call, its results as Python values,
and its errors as the kvpool exception hierarchy with the daemon's message."""
from __future__ import annotations

import errno
import json
import pydoc

import numpy as np
import pytest
import torch

import kvpool
from conftest import LAYOUT, SRC, run_py


def test_connect_reads_kvpool_socket_and_layout(daemon, monkeypatch):
    monkeypatch.setenv("KVPOOL_SOCKET", daemon.sock)
    with kvpool.connect() as c:
        assert c.layout_spec == LAYOUT
        L = c.layout
        assert (L["layers"], L["kv_heads"], L["head_dim"], L["dtype"], L["page_tokens"]) \
            == (2, 2, 16, "fp32", 16)
        assert L["page_bytes"] == 2 * 2 * 16 * 2 * 16 * 4
        assert c.device_frames == 8 * 2**20 // L["page_bytes"]
        assert c.cuda_device == -1 and c.device == torch.device("cpu")
    assert c.closed


def test_connect_to_nothing_raises_connect_error(tmp_path):
    with pytest.raises(kvpool.ConnectError) as e:
        kvpool.connect(str(tmp_path / "none.sock"))
    assert isinstance(e.value, ConnectionError) and isinstance(e.value, kvpool.KvpoolError)
    assert "none.sock" in str(e.value)


def test_info_of_an_unknown_user_is_empty(client, user):
    info = client.info(user)
    assert isinstance(info, kvpool.UserInfo)
    assert (info.user, info.len, info.pages_device, info.leases) == (user, 0, 0, 0)


def test_prepare_append_commit_grows_the_history(client, user):
    n = 20
    kv = torch.randn(n, 2, 2, 2, 16)
    with client.prepare(user, 0, n) as lease:
        assert (lease.user, lease.len, lease.n_new, lease.npages) == (user, 0, n, 2)
        assert lease.last_page_len == 4 and len(lease.indices) == 2
        assert client.info(user).leases == 1
        lease.append(kv)
        assert lease.commit() >= 0
    assert lease.released
    info = client.info(user)
    assert (info.start, info.len, info.pages_device, info.leases) == (0, n, 2, 0)
    with client.prepare(user, n, 5) as lease2:
        assert lease2.len == n
        k, v = lease2.gather(1, n)
        assert torch.equal(k, kv[:, 1, 0]) and torch.equal(v, kv[:, 1, 1])


def test_lease_released_on_exit_without_commit(client, user):
    with client.prepare(user, 0, 8) as lease:
        lease.append(torch.ones(8, 2, 2, 2, 16))
    assert client.info(user).len == 0 and client.info(user).leases == 0


def test_lease_released_when_an_exception_leaves_the_block(client, user):
    with pytest.raises(RuntimeError):
        with client.prepare(user, 0, 8):
            raise RuntimeError("model failed")
    assert client.info(user).leases == 0


def test_gap_error_carries_the_range_and_seed_sentence(client, user):
    with client.prepare(user, 0, 10) as lease:
        lease.commit()
    with pytest.raises(kvpool.GapError) as e:
        client.prepare(user, 20, 10)
    err = e.value
    assert (err.first, err.last) == (10, 19) and err.range == (10, 19)
    assert err.errno == errno.EINVAL and err.user == user
    assert isinstance(err, ValueError) and isinstance(err, kvpool.ContinuityError)
    assert "missing tokens from 10 to 19 (both inclusive)" in str(err)
    assert client.info(user).len == 10  # nothing changed


def test_overlap_error_carries_the_range(client, user):
    with client.prepare(user, 0, 10) as lease:
        lease.commit()
    with pytest.raises(kvpool.OverlapError) as e:
        client.prepare(user, 5, 20)
    assert (e.value.first, e.value.last) == (5, 9)
    assert "overlapping tokens from 5 to 9 (both inclusive)" in str(e.value)


def test_error_classes_by_errno():
    f = kvpool.errors.from_code
    assert type(f(errno.ENOMEM, "full")) is kvpool.PoolFullError
    assert isinstance(f(errno.ENOMEM, "full"), MemoryError)
    assert type(f(errno.ENOENT, "chunk abab is not registered")) is kvpool.NotFoundError
    assert type(f(errno.ESTALE, "lease 3 is released")) is kvpool.StaleLeaseError
    assert type(f(errno.EBUSY, "leased")) is kvpool.BusyError
    assert isinstance(f(errno.EACCES, "uid 1001"), PermissionError)
    assert isinstance(f(errno.EPERM, "admin only"), kvpool.PermissionDeniedError)
    assert type(f(errno.EALREADY, "committed")) is kvpool.AlreadyError
    assert type(f(errno.EINVAL, "bad")) is kvpool.InvalidArgumentError
    # the class and range come from kvpoold's detail (test_errors.py); the
    # cache's range is read from the message for people
    e = f(errno.EINVAL, "The input sequence has overlapping tokens from 5 to 9 "
                        "(both inclusive). For user 3 the cache holds tokens [0, 10)",
          kind=kvpool.errors.ERROR_OVERLAP, first=5, last=9)
    assert type(e) is kvpool.OverlapError and e.range == (5, 9) and e.cached == (0, 10)
    assert str(e).startswith("The input sequence has overlapping tokens")


def test_append_after_commit_or_release_raises_stale(client, user):
    lease = client.prepare(user, 0, 4)
    lease.commit(2)
    with pytest.raises(kvpool.StaleLeaseError):
        lease.append(torch.zeros(1, 2, 2, 2, 16), first=2)
    with pytest.raises(kvpool.KvpoolError):  # AlreadyError, or StaleLeaseError
        kvpool.Client.commit(client, lease.id, 1)
    lease.release()
    with pytest.raises(kvpool.StaleLeaseError):
        lease.append(torch.zeros(1, 2, 2, 2, 16))
    lease.release()  # twice is harmless
    assert client.info(user).len == 2


def test_append_checks_range_shape_dtype(client, user):
    with client.prepare(user, 0, 4) as lease:
        with pytest.raises(IndexError):
            lease.append(torch.zeros(5, 2, 2, 2, 16))
        with pytest.raises(TypeError):
            lease.append(torch.zeros(4, 2, 2, 2, 16, dtype=torch.float16))
        with pytest.raises(ValueError):
            lease.append(torch.zeros(4, 2, 2, 16, 2))
        with pytest.raises(ValueError):
            lease.append(torch.zeros(4, 2, 2, 2, 32)[..., ::2])
        lease.append(np.zeros((4, 2, 2, 2, 16), dtype=np.float32))  # buffer protocol


def test_leases_stay_valid_across_other_calls(client, user):
    """Two leases prepared one after the other: appends through the first
    still land in the first's pages (its table is the Lease's own copy)."""
    a, b = user, user + 100000
    la = client.prepare(a, 0, 16)
    lb = client.prepare(b, 0, 16)
    client.info(a)
    kva, kvb = torch.full((16, 2, 2, 2, 16), 1.0), torch.full((16, 2, 2, 2, 16), 2.0)
    la.append(kva)
    lb.append(kvb)
    la.commit(), lb.commit()
    assert torch.equal(la.gather(0, 16)[0], kva[:, 0, 0])
    assert torch.equal(lb.gather(0, 16)[0], kvb[:, 0, 0])
    la.release(), lb.release()


def test_offload_evict_and_onload(client, user):
    kv = torch.randn(32, 2, 2, 2, 16)
    with client.prepare(user, 0, 32) as lease:
        lease.append(kv)
        lease.commit()
    assert client.offload(user) == 2
    assert client.info(user).pages_host == 2
    assert client.evict(user, tier="device") >= 0
    info = client.info(user)
    assert (info.pages_device, info.pages_host, info.len) == (0, 2, 32)
    with client.prepare(user, 32, 1) as lease:  # brings the pages back
        assert lease.onloaded_pages == 2
        k, v = lease.gather(1, 32)
        assert torch.equal(k, kv[:, 1, 0]) and torch.equal(v, kv[:, 1, 1])
    assert client.evict(user) >= 1
    assert client.info(user).len == 0


def test_evict_of_a_leased_user_is_busy(client, user):
    with client.prepare(user, 0, 4) as lease:
        lease.commit()
        with pytest.raises(kvpool.BusyError):
            client.evict(user)


def test_latency_counts_prepares_after_it_was_asked(client, user):
    if not client.is_admin:
        pytest.skip("latency() is an admin's")
    before = client.latency()  # the first call turns the histograms on
    with client.prepare(user, 0, 3) as lease:
        lease.commit()
    after = client.latency()
    assert set(after) == {"prepare", "commit", "offload", "onload"}
    p = after["prepare"]
    assert p["count"] >= before["prepare"]["count"] + 1
    assert sum(n for _, n in p["buckets"]) == p["count"]
    assert p["buckets"][-1][0] is None and p["buckets"][0][0] == 1000


def test_stats_users_clients_are_dicts(client, user):
    with client.prepare(user, 0, 3) as lease:
        lease.commit()
    st = client.stats()
    assert st["device"]["frames_total"] == client.device_frames
    assert st["commits"] >= 1 and "prefix_hit_tokens" in st and "ns_d2h" in st
    rows = {r["user"]: r for r in client.users()}
    assert rows[user]["len"] == 3
    if client.is_admin:
        me = [r for r in client.clients() if r["client_id"] == client.client_id]
        assert me and me[0]["name"] == "pytest"


def test_async_queue_submit_reap(client, user):
    u1, u2 = user, user + 200000
    client.queue_prepare(u1, 0, 4, 1)
    client.queue_prepare(u2, 0, 4, 2)
    client.queue_info(u1, 3)
    assert client.submit() == 3
    got = {}
    while len(got) < 3:
        for cq in client.reap():
            got[cq.tag] = cq
    assert got[1].op == "prepare" and got[1].error is None and got[1].lease.n_new == 4
    assert got[3].info.leases == 1
    with pytest.raises(kvpool.BusyError):  # not while reaped? after: fine
        client.queue_info(u1, 9)
        client.submit()
        client.info(u1)
    client.reap()
    got[1].lease.append(torch.ones(4, 2, 2, 2, 16))
    client.queue_commit(got[1].lease, 4, release=True, tag=4)
    client.queue_commit(got[2].lease, 0, release=True, tag=5)
    client.queue_prepare(u1, 99, 1, 6)  # a gap: the error is carried, not raised
    client.submit()
    done = {}
    while len(done) < 3:
        for cq in client.reap():
            done[cq.tag] = cq
    assert done[4].res >= 0 and done[5].res >= 0
    assert isinstance(done[6].error, kvpool.GapError) and done[6].error.first == 4
    assert client.info(u1).len == 4 and client.info(u2).len == 0


def test_chunks_register_fill_seal_acquire_list(client):
    toks = list(range(500, 540))
    kv = torch.randn(40, 2, 2, 2, 16)
    reg = client.chunk_register(toks, "context", {"doc": "faq", "lang": "en", "rev": 3},
                                content="What is kvpool? A KV cache daemon.")
    cid, name = reg["id"], reg["name"]
    assert len(cid) == 64 and len(name) == 64 and cid != name
    assert reg["start"] == 0 and reg["tokens"] == 40
    if reg["created"]:
        assert reg["state"] == "filling"
        with reg["lease"] as fill:
            assert fill.chunk_id == cid and fill.start == 0
            fill.append(kv)
    again = client.chunk_register(toks, "context", content="What is kvpool? A KV cache daemon.")
    assert again["id"] == cid and not again["created"] and again["lease"] is None
    info = client.chunk_get(name)
    assert info["state"] == "ready" and info["tokens"] == 40 and info["root"] == cid
    assert json.loads(info["meta"]) == {"doc": "faq", "lang": "en", "rev": 3}
    assert info["preview"] == "What is kvpool? A KV cache daemon." and info["entries"] == 1
    assert client.chunk_get(cid)["id"] == name  # an entry id gives its name's row
    assert client.chunk_content(name) == b"What is kvpool? A KV cache daemon."
    assert client.chunk_tokens(name) == toks
    assert any(r["id"] == name for r in client.chunk_list("context", {"lang": "en"}))
    assert any(r["id"] == name for r in client.chunk_list("context", {"rev": 3}))
    assert not client.chunk_list("context", {"rev": "3"})  # JSON values compare typed
    assert not [r for r in client.chunk_list("context", "lang=xx")]
    with pytest.raises(kvpool.InvalidArgumentError, match="not valid JSON"):
        client.chunk_list("context", "{bad")
    with client.chunk_acquire(cid) as rd:
        assert rd.kind == "chunk_read" and rd.len == 40
        k, v = rd.gather(0, 40)
        assert torch.equal(k, kv[:, 0, 0])
    client.chunk_delete(name)
    with pytest.raises(kvpool.NotFoundError):
        client.chunk_get(cid)
    with pytest.raises(ValueError):
        client.chunk_get("xyz")


def _fill(client, reg, n):
    if reg["created"]:
        with reg["lease"] as fill:
            fill.append(torch.zeros(n, 2, 2, 2, 16))
    return reg


def test_compose_and_preview(client):
    sys_r = _fill(client, client.chunk_register(list(range(1, 33)), "system"), 32)
    ctx_name = _fill(client, client.chunk_register(list(range(40, 60)), "context"), 20)["name"]
    ctx = _fill(client, client.chunk_link(ctx_name, sys_r["id"]), 20)
    q_name = _fill(client, client.chunk_register(list(range(70, 75)), "query"), 5)["name"]
    q = _fill(client, client.chunk_link(q_name, ctx["id"]), 5)
    req = {"system": sys_r["id"], "contexts": [ctx["id"]], "query": q["id"]}
    pv = client.compose_preview([req])
    assert pv.lease == 0 and pv.tokens == 32 + 20 + 5 and pv.nlevels == 3
    assert pv.preview()["total_tokens"] == 57
    with client.compose([req, req]) as comp:
        assert comp.lease != 0 and comp.nrequests == 2
        lv0 = comp.levels[0]
        assert lv0["kv_indptr"].dtype == torch.int32 and int(lv0["kv_indptr"][-1]) == 2
        assert [lv["ngroups"] for lv in comp.levels] == [1, 1, 1]  # shared at every level
    with pytest.raises(kvpool.NotFoundError):
        client.compose_preview([{"system": "0" * 64, "query": q["id"]}])
    with pytest.raises(kvpool.InvalidArgumentError, match="chain is broken"):
        client.compose_preview([{"system": sys_r["id"], "query": q["id"]}])
    client.chunk_clear()


def test_chunk_link_entries_and_limits(client):
    sys_a = _fill(client, client.chunk_register(list(range(1, 17)), "system"), 16)
    sys_b = _fill(client, client.chunk_register(list(range(101, 121)), "system"), 20)
    doc = _fill(client, client.chunk_register(list(range(40, 50)), "context",
                                              content="doc"), 10)
    la = client.chunk_link(doc["name"], sys_a["id"])
    lb = client.chunk_link(doc["name"], sys_b["id"], wait_ms=100)
    assert la["created"] and la["start"] == 16 and la["lease"].start == 16
    assert lb["start"] == 20 and la["id"] != lb["id"] and la["name"] == doc["name"]
    client.chunk_seal(la)
    client.chunk_seal(lb["lease"])
    e = client.chunk_entry(la["id"])
    assert e["parent"] == sys_a["id"] and e["start"] == 16 and e["state"] == "ready"
    assert client.chunk_entry(sys_a["id"])["children"] == 1
    ents = client.chunk_entries(doc["name"])
    assert {x["id"] for x in ents} == {doc["id"], la["id"], lb["id"]}
    assert client.chunk_get(doc["name"])["entries"] == 3
    lim = client.chunk_limits()
    assert lim["names"] >= 3 and lim["memory_ratio"] == 1.0
    assert client.chunk_limits(max_chunks=50)["max_chunks"] == 50
    client.chunk_limits(max_chunks=0)
    client.chunk_delete(sys_a["name"])
    with pytest.raises(kvpool.NotFoundError):
        client.chunk_entry(la["id"])  # deleted with its parent
    assert client.chunk_get(doc["name"])["entries"] == 2
    client.chunk_clear()


def test_prefix_cache_and_sequences(client):
    prompt = list(range(2000, 2040))
    with client.seq_alloc(77001, prompt) as lease:
        assert lease.kind == "seq" and lease.seq == 77001 and lease.len == 0
        lease.append(torch.randn(40, 2, 2, 2, 16))
        lease.commit()
    hit = client.prefix_lookup(np.array(prompt, dtype=np.uint32))
    assert hit["tokens"] == 32 and hit["npages"] == 2 and len(hit["indices"]) == 8
    with client.seq_alloc(77002, torch.tensor(prompt + [1, 2])) as lease:
        assert lease.len == 32 and lease.n_new == 10
    with client.seq_extend(77001, 2, [5, 6]) as ext:
        assert ext.len == 40 and ext.n_new == 2
        ext.commit()
    with client.seq_create(77003, [kvpool.src_seq(77001)], 3) as vs:
        assert vs.len == 42 and vs.n_new == 3
    for s in (77001, 77002, 77003):
        client.seq_free(s)
    with pytest.raises(kvpool.KvpoolError):
        client.seq_free(77001)


def test_closed_client_raises(daemon):
    c = kvpool.connect(daemon.sock)
    c.close()
    c.close()
    with pytest.raises(kvpool.ClientClosedError):
        c.info(1)
    with pytest.raises(kvpool.ClientClosedError):
        c.tier()


def test_help_reads_like_the_man_page():
    doc = pydoc.render_doc(kvpool.Client.prepare, renderer=pydoc.plaintext)
    assert "prepare(self, user, start_pos, n_new, /)" in doc
    assert "missing tokens" in doc and "PoolFullError" in doc and "Lease" in doc
    for name in ("info", "prepare", "offload", "evict", "evict_all", "stats", "users",
                 "clients", "queue_info", "queue_prepare", "queue_commit", "queue_release",
                 "submit", "reap", "prefix_lookup", "seq_alloc", "seq_create", "seq_extend",
                 "seq_free", "chunk_register", "chunk_link", "chunk_seal", "chunk_acquire",
                 "chunk_get", "chunk_entry", "chunk_entries", "chunk_content", "chunk_tokens",
                 "chunk_limits", "chunk_list",
                 "chunk_delete", "chunk_clear", "chunk_evict_unused", "compose", "evict_tenant",
                 "compose_preview", "move", "chunk_copy", "close"):
        assert getattr(kvpool.Client, name).__doc__, name
    for name in ("append", "append_layers", "append_layer", "commit", "release", "seal"):
        assert getattr(kvpool.Lease, name).__doc__, name


def test_pybench_measures_python_against_c(daemon, tmp_path):
    out = tmp_path / "python.json"
    run_py(str(SRC / "tools" / "pybench.py"), "--socket", daemon.sock, "--iterations", "300",
           "--round", "100", "--json", str(out), timeout=120)
    import json
    r = json.loads(out.read_text())
    assert r["c"]["p50_ns"] > 0 and r["py"]["p50_ns"] > 0
    assert r["py_over_c_p50"] == round(r["py"]["p50_ns"] / r["c"]["p50_ns"], 3)
    assert {"command", "machine", "date"} <= set(r)


def test_user_info_shows_the_disk_copy(tmp_path):
    """pages_disk / tokens_disk: attributes past UserInfo's 7-tuple (code
    that unpacks it keeps working) and keys of users()' dicts."""
    import kvpool
    from conftest import Daemon
    d = Daemon(extra=[f"--disk_dir={tmp_path}", "--disk_size=1M"])
    try:
        with kvpool.connect(d.sock, "pytest-disk") as c:
            with c.prepare(7, 0, 40) as lease:
                lease.commit()
            info = c.info(7)
            assert len(info) == 7 and (info.pages_disk, info.tokens_disk) == (0, 0)
            assert c.evict(7, tier=8) == 3  # KVP_SEL_TO_DISK: 40 tokens, 3 pages
            info = c.info(7)
            assert (info.len, info.pages_device, info.pages_host) == (40, 0, 0)
            assert (info.pages_disk, info.tokens_disk) == (3, 40)
            row = [r for r in c.users() if r["user"] == 7][0]
            assert (row["pages_disk"], row["tokens_disk"]) == (3, 40)
    finally:
        d.stop()
