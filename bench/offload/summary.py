"""Summary of bench/offload/run.sh's replays: one line per run, then the copy profiles."""
import glob, json, os, sys

d = sys.argv[1]
for f in sorted(glob.glob(os.path.join(d, 'replay-*.json'))):
    name = os.path.basename(f)[7:-5]
    try:
        j = json.load(open(f))
    except Exception as e:
        print(name, 'no json', e)
        continue
    k = j['systems']['kvpool']
    g = j.get('gpu') or {}
    c = g.get('ceiling') or {}
    print(f"{name}: p50 {k['prepare_p50_ns']/1e3:.1f}us p99 {k['prepare_p99_ns']/1e3:.1f}us "
          f"wall {k['wall_s']:.2f}s hit {k['hit_rate']:.4f} stalls {k['pool']['reclaim_stalls']} "
          f"offload {g.get('offload_gbps')} GB/s ppd {g.get('pages_per_demotion')} "
          f"ratio {g.get('offload_vs_ceiling')} vs_duplex {g.get('offload_vs_duplex')} | "
          f"ceil pages {c.get('d2h_pages_gbps')} run {c.get('d2h_run_gbps')} bulk "
          f"{c.get('d2h_bulk_gbps')} dup_pages {c.get('d2h_pages_duplex_gbps')} dup_run "
          f"{c.get('d2h_run_duplex_gbps')} k {c.get('pages_per_sync')}")
    p = os.path.join(d, f'prof-{name}.txt')
    if os.path.exists(p):
        for line in open(p):
            w = line.split()
            if w[0] == 'copy':
                fl, runs, by, ns = int(w[3]), int(w[5]), int(w[7]), int(w[9])
                joined = int(w[11]) if w[10] == 'dst_joined' else 0
                print(f"   {line.strip()}  | pages/flush {by/2**20/max(fl,1):.1f} "
                      f"pages/run {by/2**20/max(runs,1):.2f} GB/s {by/max(ns,1):.2f} "
                      f"runs/dst-run {runs/max(runs-joined,1):.2f}")
            else:
                calls, by, wall, gpu, enq = (int(w[i]) for i in (5, 7, 9, 11, 13))
                print(f"   {line.strip()}  | wall GB/s {by/max(wall,1):.2f} gpu GB/s "
                      f"{by/max(gpu,1):.2f} enq/call {enq/max(calls,1)/1e3:.1f}us "
                      f"wall/call {wall/max(calls,1)/1e3:.1f}us")
