#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/results/multigpu-DATE.json from one scripts/gpu/multigpu.sh run's
files (issue 31's interface): device, gpus, gpu2_tests {passed, failed,
skipped}, tp2_tokens_identical, move_gbps, peer_ceiling_gbps, move_ratio,
group_prepare_p99_ns, command; every figure read from the run's own files,
None where the run did not produce it.

    python3 tools/multigpu_summary.py RUN_DIR bench/results/multigpu-DATE.json
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Optional


def load(p: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def ctest_counts(p: Path) -> Dict[str, int]:
    """passed / failed / skipped from a ctest log's result lines."""
    out = {"passed": 0, "failed": 0, "skipped": 0}
    try:
        text = p.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        m = re.match(r"\s*\d+/\d+ Test\s+#\d+: \S+ \.+\s*(\**)\s*(\w[\w ]*?)\s+[\d.]+ sec", line)
        if not m:
            continue
        word = m.group(2)
        if word == "Passed":
            out["passed"] += 1
        elif word.startswith("Skipped") or word == "Not Run":
            out["skipped"] += 1
        else:
            out["failed"] += 1
    return out


def main() -> None:
    run, dst = Path(sys.argv[1]), Path(sys.argv[2])
    machine = (run / "machine.txt").read_text() if (run / "machine.txt").exists() else ""
    gpus = [l for l in machine.splitlines() if l.startswith("GPU ")]
    tp = load(run / "tp2.json") or {}
    peer = load(run / "peer.json") or {}
    res = {
        "what": "issue 31 on a 2-GPU host: gpu2 tests, TP=2 on one page table, moves",
        "device": ", ".join(g.split(" (UUID")[0] for g in gpus) or None,
        "gpus": len(gpus),
        "gpu2_tests": ctest_counts(run / "ctest-gpu2.txt"),
        "gpu_tests": ctest_counts(run / "ctest-gpu.txt"),
        "tp2_tokens_identical": tp.get("tp2_tokens_identical"),
        "tp2_hf_matches_tp1": tp.get("hf_matches_tp1"),
        "tp2_max_logit_diff": tp.get("max_logit_diff"),
        "tp2_same_page_tables": tp.get("same_page_tables"),
        "move_gbps": peer.get("move_gbps"),
        "peer_ceiling_gbps": peer.get("peer_ceiling_gbps"),
        "move_ratio": peer.get("move_ratio"),
        "peer_access": peer.get("peer_access"),
        "group_prepare_p99_ns": tp.get("group_prepare_p99_ns"),
        "group_latency_ns": tp.get("group_latency_ns"),
        "command": "bash scripts/gpu/multigpu.sh (device kind nvidia-h200-x2, carry .gpu); "
                   "then python3 tools/multigpu_summary.py RUN_DIR THIS_FILE",
        "tp_command": tp.get("command"),
        "date": tp.get("date"),
        "errors": tp.get("errors"),
    }
    dst.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
