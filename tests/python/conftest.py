# SPDX-License-Identifier: MIT
"""Fixtures of the Python tests: a private kvpoold on the shm backend in a
temp dir (as tests/integration/harness.c starts one for the C tests), and
clients of it. kvpoold is $KVPOOLD (ctest sets it), else build*/kvpoold."""
from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

SRC = Path(os.environ.get("KVPOOL_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SRC / "examples" / "python"))  # tinymodels

# The layout of the tests' daemon: the tiny models' geometry, fp32.
LAYOUT = "layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16"


def _find(name: str) -> str:
    env = os.environ.get(name.upper())
    if env:
        return env
    for p in sorted(glob.glob(str(SRC / "build*" / name))):
        if os.access(p, os.X_OK):
            return p
    pytest.skip(f"no {name}: build it (cmake --build build) or set ${name.upper()}")


def _pdeathsig() -> None:
    # The daemon dies with the test process, even on SIGKILL.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Daemon:
    """A kvpoold of the test's own, on a socket in a temp dir."""

    def __init__(self, extra: Optional[List[str]] = None, layout: str = LAYOUT,
                 device_mem: str = "8M", host_mem: str = "8M") -> None:
        self.dir = tempfile.mkdtemp(prefix="kvpool-py-")
        self.sock = os.path.join(self.dir, "kvpoold.sock")
        self.log = os.path.join(self.dir, "kvpoold.log")
        self.layout = layout
        args = [_find("kvpoold"), f"--socket={self.sock}", "--backend=shm", "--foreground",
                f"--layout={layout}", f"--device_mem={device_mem}", f"--host_mem={host_mem}",
                *(extra or [])]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_pdeathsig)
        import kvpool
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpoold exited {self.proc.returncode}: "
                                   + open(self.log).read()[-2000:])
            if os.path.exists(self.sock):
                try:
                    kvpool.connect(self.sock, "ready").close()
                    break
                except kvpool.KvpoolError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("kvpoold did not serve within 10 s: "
                                   + open(self.log).read()[-2000:])
            time.sleep(0.02)

    def env(self) -> dict:
        e = dict(os.environ)
        e["KVPOOL_SOCKET"] = self.sock
        return e

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    os.environ["KVPOOL_SOCKET"] = d.sock
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon() -> Iterator[Daemon]:
    """A daemon for a test that needs one to itself (pressure, counts)."""
    d = Daemon(device_mem="256K", host_mem="256K")
    yield d
    d.stop()


@pytest.fixture
def client(daemon: Daemon):
    import kvpool
    with kvpool.connect(daemon.sock, "pytest") as c:
        yield c


_user = [1000]


@pytest.fixture
def user() -> int:
    """A user id no other test uses (the session daemon is shared)."""
    _user[0] += 1
    return _user[0]


def run_py(script: str, *args: str, env: Optional[dict] = None,
           timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a Python script with this interpreter and the package's path."""
    e = dict(env or os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""),
                                                   str(SRC / "examples" / "python")] if p)
    r = subprocess.run([sys.executable, script, *args], env=e, capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} exited {r.returncode}\n"
                             f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r
