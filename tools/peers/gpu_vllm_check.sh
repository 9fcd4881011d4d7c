#!/bin/sh
# vLLM 0.33's TRITON_ATTN and FLEX_ATTENTION through adapters/python/vllm_backend.py on a CUDA
# GPU with no network: the suspected upstream bugs D-2, D-3 and D-4 of
# docs/findings-vllm-masks.md, and each backend's default case space.
#
#   bash tools/peers/gpu_vllm_check.sh          # from the repository root; results in $OUT
#   bash .gpu/gpu_vllm_check.sh                 # the same, kept in the carried folder
#
# Needs, in the ignored folder .gpu/ (carried to the GPU machine; see "Preparing .gpu" below):
#   .gpu/bin/attn-diff         attn-diff built without libtorch (--no-default-features), stripped
#   .gpu/vllm-src.tar.xz       vllm/ and vllm.egg-info/ of vLLM 0.33.0's source distribution
#   .gpu/whl/*.whl             vLLM's Python dependencies that the machine lacks (cp312 wheels)
# and on the machine: python3 with torch (CUDA) and triton, nvidia-smi.
# vLLM runs from source with no compiled extension; tools/peers/gpu_vllm_adapter.py says what
# stands in for them and how the adapter is put on the GPU (no attention code is changed);
# it is found beside this script.
#
# Every check is bounded by `timeout` (SIGTERM: attn-diff stops, keeps what it found and
# writes its partial summary), and the script goes on when one fails: about 6.5 minutes in
# all. Written to $OUT (default /tmp/gpu-vllm-out): log (everything, with a one-line summary
# per check), one JSON summary per check (--format json: counts, every failure, shrunk), and
# reports.tgz (replay files of failures, each check's stderr, the probes' output).
#
# Preparing .gpu (on a machine with network, x86-64):
#   cargo build --release --locked -p attn-harness --no-default-features --bin attn-diff
#   objcopy --strip-all target/release/attn-diff .gpu/bin/attn-diff
#   pip download --no-deps --no-binary :all: vllm==0.33.0   # then, in the unpacked sdist:
#   tar -cJf .gpu/vllm-src.tar.xz vllm vllm.egg-info        # (egg-info without SOURCES.txt)
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_{17,24,27,28,31}_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl \
#     annotated-types==0.8.0 apache-tvm-ffi==0.1.11 cachetools==8.0.2 cbor2==6.3.0 \
#     fastapi==0.136.1 httpx2==2.16.2 'llguidance>=1.7,<1.8' msgspec==0.23.0 openai==3.60.0 \
#     oss-harmony==0.0.11 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 \
#     pydantic-core==2.50.5 pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 \
#     typing-inspection==0.4.5 xgrammar==0.2.8
# (the smallest set with which `import vllm` and both backends load next to the machine's
# packages; found by trial on torch 2.11.0 and transformers 5.17.0).

set -u
set -o pipefail 2>/dev/null || true
ROOT=$(pwd)
OUT=${OUT:-/tmp/gpu-vllm-out}
WORK=/tmp/gpu-vllm-work
mkdir -p "$OUT" "$WORK/reports"
LOG=$OUT/log
: >"$LOG"
say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
START=$(date +%s)

say "set-up: wheels into /tmp/site, vLLM source into /tmp/vllm-src"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ROOT"/.gpu/whl/*.whl 2>&1 | grep -v "Running pip as" | tee -a "$LOG"
mkdir -p /tmp/vllm-src && tar -xJf "$ROOT/.gpu/vllm-src.tar.xz" -C /tmp/vllm-src 2>&1 | tee -a "$LOG"
export PYTHONPATH=/tmp/vllm-src:/tmp/site PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache
AD="$ROOT/.gpu/bin/attn-diff"
HERE=$(cd "$(dirname "$0")" && pwd)
ADAPTER=${GPU_VLLM_ADAPTER:-python3 $HERE/gpu_vllm_adapter.py}  # beside this script (a test hook)

say "machine"
{
    nvidia-smi -L
    cat "$ROOT/.gpu/bin/BUILD-INFO" 2>/dev/null
    "$AD" --version
    python3 -c 'import sys, torch, triton, vllm; print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__, "| vllm", vllm.__version__, vllm.__file__); print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
} 2>&1 | tee -a "$LOG"

for cls in TRITON_ATTN FLEX_ATTENTION; do
    say "probe $cls"
    timeout -k 10 60 $ADAPTER --class $cls --probe >"$WORK/reports/probe-$cls.txt" 2>&1
    echo "exit $?" >>"$WORK/reports/probe-$cls.txt"
    grep -v '^{' "$WORK/reports/probe-$cls.txt" | tail -n 25 | tee -a "$LOG"
    grep '^{' "$WORK/reports/probe-$cls.txt" | cut -c1-300 | tee -a "$LOG"
done

# check NAME SECONDS CLASS ARGS...: one attn-diff run, its JSON in $OUT/NAME.json.
check() {
    name=$1 secs=$2 cls=$3
    shift 3
    say "check $name ($cls, at most ${secs}s): $*"
    timeout -k 20 "$secs" "$AD" check -q --backend "external:$cls" \
        --external "$cls=$ADAPTER --class $cls" --external-timeout 150 --jobs 6 --shrink-time 8 \
        --format json --out "$WORK/reports/$name" "$@" \
        >"$OUT/$name.json" 2>"$WORK/reports/$name.stderr"
    rc=$?
    case $rc in
        0) what="every case agreed" ;;
        1) what="divergences" ;;
        2) what="set-up error" ;;
        124 | 130) what="stopped at its time limit: partial summary" ;;
        *) what="killed" ;;
    esac
    say "check $name: exit $rc ($what)"
    tail -n 15 "$WORK/reports/$name.stderr" | cut -c1-400 | tee -a "$LOG"
    python3 - "$OUT/$name.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # noqa: BLE001
    sys.exit(f"   no JSON summary: {e}")
for b in d["backends"]:
    parts = " ".join(f"{k}={b[k]['sent']}/{b[k]['passed']}ok/{b[k]['failed']}fail/{b[k]['declined']}decl" for k in ("property", "upstream", "traces") if k in b)
    print(f"   {b['backend']['name']}: {parts}; worst abs {b.get('worst_abs_err')} rel {b.get('worst_rel_err')}; {b.get('wall_seconds')}s")
    for u in (b.get("unsupported") or [])[:6]:
        print("   declined:", json.dumps(u)[:240])
    seen = set()
    for f in b.get("failures") or []:
        sig = (f.get("class") or {}).get("signature") or f.get("kind")
        if sig in seen:
            continue
        seen.add(sig)
        cls = f.get("class") or {}
        print(f"   FAIL class {len(seen)}: {sig} (cases {cls.get('cases')}, traces {cls.get('traces')})")
        text = f.get("text") or f.get("message") or ""
        lines = text.splitlines()
        keep = lines[:14] + (["   ..."] + lines[-6:] if len(lines) > 20 else lines[14:])
        print("\n".join("     " + l[:300] for l in keep))
        if len(seen) >= 5:
            print(f"   (more classes in the JSON)")
            break
PY
}

T="--trace-head-sizes 32,64,80,128 --trace-block-sizes 16,32"
# (a) TRITON_ATTN, everything it declares.
check a-triton-default 95 TRITON_ATTN --cases 200 --traces 10 $T
# (b) D-3: non-causal requests under a sliding window (query_len > window, BLOCK_Q > 1).
check b-triton-noncausal-window 55 TRITON_ATTN --cases 150 --traces 0 --no-upstream \
    --only kinds=decoder --only features=non_causal,sliding_window --only kv_cache_dtypes=auto
# (c) D-4: PrefixLM ranges past seq_len in chunked prefill (serving traces).
check c-triton-prefixlm-traces 60 TRITON_ATTN --cases 40 --traces 20 --no-upstream $T \
    --only kinds=decoder --only features=prefix_lm --only kv_cache_dtypes=auto
# (d) FLEX_ATTENTION, everything it declares.
check d-flex-default 80 FLEX_ATTENTION --cases 100 --traces 5 $T
# (e) D-2: FlexAttention's direct block mask and PrefixLM ranges.
check e-flex-prefixlm 60 FLEX_ATTENTION --cases 60 --traces 10 --no-upstream $T \
    --only kinds=decoder --only features=prefix_lm

say "done in $(( $(date +%s) - START ))s"
tar -czf "$OUT/reports.tgz" -C "$WORK" reports 2>&1 | tee -a "$LOG"
if [ "$(stat -c %s "$OUT/reports.tgz")" -gt 15000000 ]; then  # files back: 16 MB each
    say "reports.tgz over 15 MB: again without files over 2 MB (large replay files)"
    find "$WORK/reports" -type f -size +2M -print -delete | tee -a "$LOG"
    tar -czf "$OUT/reports.tgz" -C "$WORK" reports 2>&1 | tee -a "$LOG"
fi
ls -la "$OUT" | tee -a "$LOG"
