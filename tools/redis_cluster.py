# SPDX-License-Identifier: MIT
"""A throwaway Redis Cluster on loopback for kvpool's remote tier, and a
kvpoold's remote-tier figures from its /metrics. The cluster: n
redis-server --cluster-enabled nodes (the flags tools/common/redis_local.c
gives the C tests), formed with ``redis-cli --cluster create``, all masters.
Used by tests/python/test_remote.py and tools/remote_llm_proof.py."""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import re
import tempfile
import time
import urllib.request
from typing import Callable, Dict, List, Optional


class RedisMissing(RuntimeError):
    """redis-server or redis-cli is not installed."""


def _pdeathsig() -> None:
    # The node dies with the process that started it, even on SIGKILL.
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _port_free(p: int) -> bool:
    """p and p + 10000 (the cluster bus) free on loopback now."""
    for q in (p, p + 10000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", q))
            except OSError:
                return False
    return True


def _cli(port: int, *args: str, timeout: float = 5) -> str:
    """redis-cli's output ("" when it did not answer in time)."""
    try:
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                           capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ""
    return r.stdout


class RedisCluster:
    """n redis-server --cluster-enabled nodes on loopback, all masters,
    formed by redis-cli --cluster create; stop() kills them and removes
    their directory. Ports (and their cluster bus ports, + 10000) are taken
    below the kernel's ephemeral range, where no connection's local port
    lands; a node that still finds its port taken (another test's cluster
    started between the check and the bind) makes a new attempt on others."""

    ATTEMPTS = 3

    def __init__(self, n: int = 3) -> None:
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                raise RedisMissing(f"{tool} is not installed: apt-get install "
                                   "redis-server redis-tools (scripts/deps.sh)")
        rng = random.Random(os.getpid() ^ time.monotonic_ns())
        for attempt in range(self.ATTEMPTS):
            self.dir = tempfile.mkdtemp(prefix="kvpool-redis-py-")
            self.procs: List[Optional[subprocess.Popen]] = []
            p = 10000 + rng.randrange(12000)   # buses below 32768
            self.ports: List[int] = []
            while len(self.ports) < n:
                if _port_free(p):
                    self.ports.append(p)
                p += 1
            try:
                self._start()
                return
            except RuntimeError:
                self.stop()
                if attempt == self.ATTEMPTS - 1:
                    raise
            except BaseException:
                self.stop()
                raise

    def _start(self) -> None:
        for p in self.ports:
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes",
                 "--cluster-config-file", f"{self.dir}/nodes-{p}.conf",
                 "--dir", self.dir, "--save", "", "--appendonly", "no",
                 "--logfile", f"{self.dir}/redis-{p}.log", "--protected-mode", "no"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, preexec_fn=_pdeathsig))
        self._wait(lambda p: _cli(p, "ping").strip() == "PONG", "answer PING")
        r = subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           capture_output=True, text=True, timeout=30, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create exited {r.returncode}:\n"
                               f"{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
        self._wait(lambda p: "cluster_state:ok" in _cli(p, "cluster", "info"),
                   "reach cluster_state:ok")

    def _wait(self, pred: Callable[[int], bool], what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not all(pred(p) for p in self.ports):
            for i, pr in enumerate(self.procs):
                if pr is not None and pr.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.ports[i]} exited "
                                       f"{pr.returncode}: {self._log(self.ports[i])}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster nodes did not {what} within "
                                   f"{timeout:.0f} s: " +
                                   " | ".join(self._log(p) for p in self.ports))
            time.sleep(0.05)

    def _log(self, port: int) -> str:
        try:
            with open(f"{self.dir}/redis-{port}.log") as f:
                return " / ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "(no log)"

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def daemon_args(self, timeout_ms: int = 2000) -> List[str]:
        return [f"--remote={self.url}", f"--remote_timeout_ms={timeout_ms}",
                "--metrics=127.0.0.1:0"]

    def dbsize(self) -> int:
        """Keys in the store (every live node's)."""
        n = 0
        for i, p in enumerate(self.ports):
            if self.procs[i] is not None:
                n += int(_cli(p, "dbsize").strip() or 0)
        return n

    def flushall(self) -> None:
        for i, p in enumerate(self.ports):
            if self.procs[i] is not None:
                _cli(p, "flushall")

    def keys(self, i: int) -> List[str]:
        """Every key on node i (redis-cli --scan)."""
        return _cli(self.ports[i], "--scan", timeout=10).split()

    def chunk_nodes(self) -> Dict[str, set]:
        """Chunk name id (hex) -> the nodes holding a key of it (its pages
        kvp1:c:<layout>:<tenant>:<name id>:<page> and its record ':r')."""
        out: Dict[str, set] = {}
        for i in range(len(self.ports)):
            if self.procs[i] is None:
                continue
            for k in self.keys(i):
                f = k.split(":")
                if len(f) == 6 and f[1] == "c":
                    out.setdefault(f[4], set()).add(i)
        return out

    def chunk_records(self) -> set:
        """Ids with a chunk record (':r') in the store: chunk name ids and
        root entry ids. A chunk's record goes with its last pages."""
        out = set()
        for i in range(len(self.ports)):
            if self.procs[i] is not None:
                for k in self.keys(i):
                    f = k.split(":")
                    if len(f) == 6 and f[1] == "c" and f[5] == "r":
                        out.add(f[4])
        return out

    def pause(self, i: int) -> None:
        """SIGSTOP node i (a store machine hung: connections open, no
        replies); kill() ends it."""
        pr = self.procs[i]
        if pr is not None:
            pr.send_signal(signal.SIGSTOP)

    def kill(self, i: int) -> None:
        """SIGKILL node i (a store machine lost)."""
        pr = self.procs[i]
        if pr is not None:
            pr.send_signal(signal.SIGKILL)
            pr.wait()
            self.procs[i] = None

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)


def metrics(log: str) -> Dict[str, float]:
    """A kvpoold's /metrics (started with --metrics=127.0.0.1:0): series ->
    value, the port read from its log file."""
    deadline = time.monotonic() + 5
    port = None
    while port is None:
        m = re.search(r"metrics: serving http://127\.0\.0\.1:(\d+)/metrics",
                      open(log).read())
        if m:
            port = int(m.group(1))
        elif time.monotonic() > deadline:
            raise AssertionError(f"no 'metrics: serving' line in {log}: "
                                 + open(log).read()[-1500:])
        else:
            time.sleep(0.05)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def drain(log: str, timeout: float = 10) -> Dict[str, float]:
    """Wait until the write-behind queue of the kvpoold logging to log is
    empty (its pages written, or failed); returns its metrics then."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(log)
        if m.get("kvpool_remote_queued_bytes", 1) == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"the remote queue of the kvpoold logging to {log} did not drain in "
                                 f"{timeout:.0f} s: {m.get('kvpool_remote_queued_bytes')} "
                                 "bytes still queued")
        time.sleep(0.05)
