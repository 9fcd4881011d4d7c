#!/usr/bin/env python3
"""Markdown table of docs/performance.md from two runs of tools/peers/bench_all.sh.

    tools/peers/bench_table.py RUN1.json RUN2.json

Per spec and backend: the median time of each run, then ratios of the mean of the two runs'
medians: to the upstream implementation of the same path (spyre-native to vllm-spyre-native,
spyre-sdpa to vllm-spyre-sdpa), to the libtorch SDPA floor, to vLLM's CPU_ATTN; peak extra
memory (built-in backends only) and the oracle check of the warm-up call.
"""
import json
import sys

UPSTREAM = {
    "spyre-native": "external:vllm-spyre-native",
    "spyre-sdpa": "external:vllm-spyre-sdpa",
}
FLOOR = "external:sdpa-floor"
CPU_ATTN = "external:vllm-cpu"


def mean_ms(runs, spec, backend):
    times = [r[(spec, backend)]["median_ms"] for r in runs if (spec, backend) in r]
    times = [t for t in times if t is not None]
    return sum(times) / len(times) if times else None


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else ""


def label(row):
    """The row's backend as the table names it: its name, and an FP8 variant's KV cache."""
    b = row["backend"]
    kv = b.get("kv_cache_dtype")
    return f"{b['name']} [{kv}]" if kv else b["name"]


def main():
    docs = [json.load(open(path)) for path in sys.argv[1:]]
    runs = [{(row["spec"], label(row)): row for row in d["rows"]} for d in docs]
    specs = list(dict.fromkeys(row["spec"] for row in docs[0]["rows"]))
    backends = list(dict.fromkeys(label(row) for row in docs[0]["rows"]))
    external = {label(row) for row in docs[0]["rows"] if row["backend"]["role"] == "external"}
    print("| spec | backend | ms (run 1 / 2) | vs upstream | vs floor | vs CPU_ATTN | peak extra MiB | status |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in specs:
        for i, backend in enumerate(backends):
            rows = [r[(spec, backend)] for r in runs if (spec, backend) in r]
            ms = " / ".join(
                "-" if row["median_ms"] is None else f"{row['median_ms']:.3f}" for row in rows
            )
            mine = mean_ms(runs, spec, backend)
            upstream = UPSTREAM.get(backend)
            peak = max((row["peak_extra_mib"] or 0) for row in rows)
            peak = f"{peak:.1f}" if backend not in external else "-"
            statuses = sorted({row["status"] for row in rows})
            print(
                f"| {spec if i == 0 else ''} | {backend} | {ms} "
                f"| {ratio(mine, mean_ms(runs, spec, upstream)) if upstream else ''} "
                f"| {ratio(mine, mean_ms(runs, spec, FLOOR)) if backend != FLOOR else ''} "
                f"| {ratio(mine, mean_ms(runs, spec, CPU_ATTN)) if backend != CPU_ATTN else ''} "
                f"| {peak} | {', '.join(statuses)} |"
            )
    bandwidth = [d["read_bandwidth_gb_per_s"] for d in docs]
    print()
    print("read bandwidth (GB/s, per run): " + " / ".join(f"{b:.1f}" for b in bandwidth))


if __name__ == "__main__":
    main()
