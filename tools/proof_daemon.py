# SPDX-License-Identifier: MIT
"""A kvpoold of a proof's or benchmark's own (tools/hf_proof.py,
chunk_proof.py, fastpath.py, hstu_e2e.py): started on a socket in a temp
dir, killed with its parent (PR_SET_PDEATHSIG), stopped with SIGTERM."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import tempfile
import time
from typing import Sequence


class Daemon:
    """A kvpoold of this run's own, on a socket in a temp dir, serving once
    this returns (ready_s at most: a cuda kvpoold pins its host tier first,
    and tens of GiB take a while). Also tools/chunk_proof.py's, fastpath.py's
    and hstu_e2e.py's."""

    def __init__(self, kvpoold: str, layout: str, device_mem: str, backend: str,
                 host_mem: str = "64M", ready_s: float = 60,
                 extra: Sequence[str] = ()) -> None:
        import kvpool
        self.dir = tempfile.mkdtemp(prefix="kvpool-hf-")
        self.sock = os.path.join(self.dir, "kvpoold.sock")
        self.log = os.path.join(self.dir, "kvpoold.log")
        self.args = [kvpoold, f"--socket={self.sock}", f"--backend={backend}", "--foreground",
                     f"--layout={layout}", f"--device_mem={device_mem}",
                     f"--host_mem={host_mem}", *extra]

        def pdeathsig() -> None:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=pdeathsig)
        deadline = time.monotonic() + ready_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpoold exited {self.proc.returncode}: {self.tail()}")
            if os.path.exists(self.sock):
                try:
                    kvpool.connect(self.sock, "hf_proof-ready").close()
                    return
                except kvpool.KvpoolError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvpoold did not serve within {ready_s:g} s: "
                                   f"{self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        try:
            return open(self.log).read()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
