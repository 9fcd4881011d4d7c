#!/bin/sh
# One `attn-diff bench` run of every backend docs/performance.md compares, side by side:
# the built-in cpu and Spyre backends, vLLM's CPU_ATTN, vllm-spyre's own SpyreAttentionPaged
# (native and SDPA paths) and the libtorch SDPA floor, interleaved call by call.
#
#   tools/peers/bench_all.sh OUT.json [attn-diff bench options...]
#
# Needs ./target/release/attn-diff (or $ATTN_DIFF), the adapters' venv of docs/external-backends.md
# ($VLLM_PYTHON, default ~/.cache/attn-diff/venv-vllm/bin/python) and upstream's
# spyre_paged_attn.py ($SPYRE_FILE, see docs/findings-vllm-spyre.md).
set -eu
out=$1; shift
py=${VLLM_PYTHON:-$HOME/.cache/attn-diff/venv-vllm/bin/python}
spyre="$py adapters/python/vllm_spyre_paged.py --file ${SPYRE_FILE:?set SPYRE_FILE} --construct keywords --padding none"
"${ATTN_DIFF:-./target/release/attn-diff}" bench -q --format json --threads 2 \
    --backend cpu,spyre-native,spyre-sdpa,external:vllm-cpu,external:vllm-spyre-native,external:vllm-spyre-sdpa,external:sdpa-floor \
    --external vllm-cpu="$py adapters/python/vllm_cpu_attn.py" \
    --external vllm-spyre-native="$spyre --mode native" \
    --external vllm-spyre-sdpa="$spyre --mode sdpa" \
    --external sdpa-floor="$py adapters/python/torch_sdpa_floor.py" \
    --external-timeout 600 \
    "$@" > "$out"
