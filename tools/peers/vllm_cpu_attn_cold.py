"""vLLM's CPU_ATTN timed with the caches evicted before every call.

In a model, the other layers pass through the caches between two attention calls for one
layer, so its K/V is read from memory however small it is. This runs vLLM's kernel-timing
script (PEER_SCRIPT, default ../shared/peers/vllm_cpu_attn_bench.py) with one change: a
256 MB tensor is incremented (by torch, on every thread) before each timed call. Same
arguments and output as that script. `cpu_bench --cold` does the same on our side.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
path = os.environ.get("PEER_SCRIPT", os.path.join(here, "../../../shared/peers/vllm_cpu_attn_bench.py"))
src = open(path).read()
timed = "    for _ in range(a.reps):\n        t0 = time.perf_counter()"
if timed not in src:
    sys.exit(f"{path}: its timing loop changed; cannot insert the eviction")
src = src.replace(timed, "    evict = torch.ones(32 << 20, dtype=torch.int64)\n"
                         "    for _ in range(a.reps):\n        evict.add_(1)\n        t0 = time.perf_counter()")
exec(compile(src, path, "exec"), {"__name__": "__main__"})
