#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two builds of kvpool side by side in one run, alternating so that drift
# in the machine hits both alike: scripts/scaling.sh (the in-process
# engine, throughput over clients x workers, the shm replay) and kvbench
# disk, REPS times each. Issue 30 asks a restructure to leave both no
# worse; this is how that is measured. It builds nothing: build kvpoold and
# kvbench in both trees first (Release).
#
#   scripts/ab_builds.sh BEFORE_BUILD AFTER_BUILD OUT_DIR
#
# REPS (2), AB_SCALING_SECONDS (1), AB_CLIENTS ("1 2 4"), AB_WORKERS
# ("1 2"), AB_PIPELINES ("4"), AB_DISK_SIZE (256M), AB_DISK_DIR (/var/tmp).
# Writes OUT_DIR/{before,after}-rN-scaling-*.json, OUT_DIR/{before,after}-rN-disk.json
# and OUT_DIR/summary.txt (the figures side by side, from the JSON alone).
set -euo pipefail
[ $# -eq 3 ] || { sed -n '3,15p' "$0"; exit 2; }
before=$1 after=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for b in "$before" "$after"; do
	[ -x "$b/kvbench" ] && [ -x "$b/kvpoold" ] || { echo "ab_builds.sh: no kvbench/kvpoold in $b" >&2; exit 1; }
done
for r in $(seq "${REPS:-2}"); do
	for side in before after; do
		b=$before
		[ $side = before ] || b=$after
		echo "ab_builds.sh: round $r, $side ($b)" >&2
		SCALING_SECONDS=${AB_SCALING_SECONDS:-1} SCALING_CLIENTS=${AB_CLIENTS:-"1 2 4"} \
			SCALING_WORKERS=${AB_WORKERS:-"1 2"} SCALING_PIPELINES=${AB_PIPELINES:-4} \
			"$here/scaling.sh" "$b" "$out" "$side-r$r" > "$out/$side-r$r-scaling.log" 2>&1
		"$b/kvbench" disk --dir "${AB_DISK_DIR:-/var/tmp}" --size "${AB_DISK_SIZE:-256M}" --rounds 3 \
			--json > "$out/$side-r$r-disk.json" 2> "$out/$side-r$r-disk.err"
	done
done
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, sys
out = sys.argv[1]

def figures(kind, d):
    """The figures that say faster or slower, by name."""
    if kind == "disk":
        return {k: v for k, v in d.items() if k.endswith("_gbps") or k.endswith("_ratio")}
    f = {"engine_ops_per_s": d.get("engine_ops_per_s")}
    for r in d.get("rows", []):
        f[f"throughput c{r['clients']} w{r['workers']} ops/s"] = r["ops_per_s"]
    for r in d.get("replay", []):
        p = r["pipelines"]
        for k in ("requests_per_s", "prepare_p50_ns", "prepare_p99_ns", "hit_rate"):
            f[f"replay p{p} {k}"] = r.get(k)
    return f

rows = {}
for side in ("before", "after"):
    for f in sorted(glob.glob(os.path.join(out, f"scaling-*-{side}-r*.json"))) + \
            sorted(glob.glob(os.path.join(out, f"{side}-r*-disk.json"))):
        try:
            d = json.load(open(f))
        except (OSError, ValueError):
            continue
        kind = "disk" if f.endswith("-disk.json") else "scaling"
        for k, v in figures(kind, d).items():
            if isinstance(v, (int, float)):
                rows.setdefault(f"{kind}: {k}", {}).setdefault(side, []).append(v)
print(f"{'figure (every round)':50s} {'before':>28s} {'after':>28s}")
for k in sorted(rows):
    b, a = rows[k].get("before", []), rows[k].get("after", [])
    fmt = lambda xs: ",".join(f"{x:.4g}" for x in xs)
    print(f"{k[:50]:50s} {fmt(b):>28s} {fmt(a):>28s}")
EOF
