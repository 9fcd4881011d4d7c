#!/usr/bin/env bash
# Time vLLM's CPU_ATTN, (optionally) libtorch's contiguous-SDPA floor and `attn-diff bench`
# on the same specs, one spec at a time, the whole sequence twice (run 1 / run 2).
#
# usage (from the repo root, after `cargo build --release -p attn-harness`):
#   tools/peers/side_by_side.sh DTYPE BLOCK BACKENDS OUTDIR FLOOR(0|1) SPEC...
#   tools/peers/side_by_side_table.py all|cpu OUTDIR SPEC,SPEC,... [DTYPE-BLOCK]
# PEER_PYTHON: the python with torch 2.13 and vLLM's kernel (default ~/.cache/vllm-peer/bin/python);
# PEER_SCRIPT: vLLM's kernel-timing script (default ../shared/peers/vllm_cpu_attn_bench.py).
# REPS: timed calls per side per spec and run (default 20; small specs settle with a few hundred).
set -u
dtype=$1; block=$2; backends=$3; out=$4; floor=$5; shift 5
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PEER_PYTHON:-$HOME/.cache/vllm-peer/bin/python}
peer=${PEER_SCRIPT:-$root/../shared/peers/vllm_cpu_attn_bench.py}
bin=$root/target/release/attn-diff
reps=${REPS:-20}
mkdir -p "$out"
case $dtype in bf16) vd=bfloat16;; f16) vd=float16;; f32) vd=float32;; *) echo "dtype: bf16, f16 or f32" >&2; exit 2;; esac
for run in 1 2; do
  for spec in "$@"; do
    (cd /tmp && "$py" "$peer" --spec "$spec" --dtype $vd --block "$block" --threads 2 --reps "$reps") > "$out/vllm-$spec-$run.json" 2>/dev/null
    if [ "$floor" = 1 ]; then
      (cd /tmp && "$py" "$root/tools/peers/libtorch_sdpa_floor.py" --spec "$spec" --dtype $vd --threads 2 --reps "$reps") > "$out/floor-$spec-$run.json" 2>/dev/null
    fi
    "$bin" bench --spec "$spec" --backend "$backends" --dtype "$dtype" --block-size "$block" --threads 2 --reps "$reps" --format json > "$out/ours-$spec-$run.json" 2>/dev/null
  done
done
