#!/usr/bin/env python3
"""Markdown tables from side_by_side.sh output: `all` (every backend, CPU_ATTN and the floor)
or `cpu` (spec x dtype x block x time x CPU_ATTN time x ratio x GB/s)."""
import json,sys,os,statistics
mode=sys.argv[1]; d=sys.argv[2]; specs=sys.argv[3].split(","); label=sys.argv[4] if len(sys.argv)>4 else ""
def load(p):
    try:
        return json.load(open(p)) if os.path.getsize(p)>0 else None
    except Exception: return None
def med(xs): xs=[x for x in xs if x is not None]; return sum(xs)/len(xs) if xs else float('nan')
bws=[]
if mode=="cpu":
    dt,bs=label.split("-")
    print("| spec | dtype | block | cpu ms (run 1 / 2) | CPU_ATTN ms (run 1 / 2) | ratio (mean of runs) | cpu KV GB/s |")
    print("|---|---|---|---|---|---|---|")
else:
    print("| spec | CPU_ATTN ms (run 1 / 2) | libtorch SDPA floor ms (floor / CPU_ATTN) | backend | ms (run 1 / 2) | vs CPU_ATTN | vs cpu | peak extra MiB | status |")
    print("|---|---|---|---|---|---|---|---|---|")
for s in specs:
    v=[x["median_s"]*1e3 for x in (load(f"{d}/vllm-{s}-{r}.json") for r in (1,2)) if x]
    fl=[x["median_s"]*1e3 for x in (load(f"{d}/floor-{s}-{r}.json") for r in (1,2)) if x]
    ours=[load(f"{d}/ours-{s}-{r}.json") for r in (1,2)]
    ours=[o for o in ours if o]
    bws += [o["read_bandwidth_gb_per_s"] for o in ours]
    backends=[r["backend"] for r in ours[0]["rows"]]
    vm=med(v)
    cpu_ms=None
    for b in backends:
        rr=[[x for x in o["rows"] if x["backend"]==b][0] for o in ours]
        ms=[x["median_ms"] for x in rr]
        m=med(ms)
        if b=="cpu": cpu_ms=m
        vs=" / ".join(f"{x:.3f}" for x in v)
        if mode=="cpu":
            gbs=med([x["kv_gb_per_s"] for x in rr])
            print(f"| {s} | {dt} | {bs} | {' / '.join(f'{x:.3f}' for x in ms)} | {vs} | {m/vm:.2f}x | {gbs:.1f} |")
        else:
            first=b==backends[0]
            fcol=f"{' / '.join(f'{x:.3f}' for x in fl)} ({med(fl)/vm:.1f}x)" if fl and first else ""
            pk=max(x["peak_extra_mib"] or 0 for x in rr)
            vc=f"{m/cpu_ms:.2f}x" if cpu_ms else "-"
            print(f"| {s if first else ''} | {vs if first else ''} | {fcol} | {b} | {' / '.join(f'{x:.3f}' for x in ms)} | {m/vm:.2f}x | {vc} | {pk:.1f} | {rr[0]['status']} |")
print()
print(f"measured read bandwidth (2 threads, best of 3 per invocation): median {statistics.median(bws):.1f} GB/s, range {min(bws):.1f}-{max(bws):.1f}")
