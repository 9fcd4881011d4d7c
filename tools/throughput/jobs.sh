#!/bin/sh
# `check` and `mutants` at --jobs 1 and at every core, side by side, each pair twice
# (alternating, so drift on a noisy machine hits both), with the summaries compared.
#
#   tools/throughput/jobs.sh [OUT_DIR]
#
# Prints one line per run (wall seconds) and whether each pair's summaries agree (timings
# aside). Needs `cargo build --release -p attn-harness --features mutants` first.
set -eu
BIN=${BIN:-target/release/attn-diff}
OUT=${1:-/tmp/attn-diff-jobs}
CORES=$(nproc)
mkdir -p "$OUT"

strip() {
    # The summary without timings: every key ending in "seconds" dropped, durations in
    # failure texts ("shrunk in 0.3 s") left as they are (a clean run has none).
    python3 -c 'import json,sys
def s(v):
    if isinstance(v, dict): return {k: s(x) for k, x in v.items() if not k.endswith("seconds")}
    if isinstance(v, list): return [s(x) for x in v]
    return v
print(json.dumps(s(json.load(open(sys.argv[1]))), sort_keys=True))' "$1"
}

timed() {
    # $1: label, $2: output file, rest: command. Prints "label wall".
    label=$1; file=$2; shift 2
    start=$(date +%s.%N)
    "$@" > "$file" 2>/dev/null || true
    end=$(date +%s.%N)
    echo "$label $(python3 -c "print(f'{$end - $start:.1f} s')")"
}

# $1: the subcommand; the rest its arguments. Runs it at --jobs 1 and at every core, twice,
# alternating, and says whether each pair's JSON agrees.
side_by_side() {
    cmd=$1; shift
    for round in 1 2; do
        for jobs in 1 "$CORES"; do
            timed "$cmd --jobs $jobs (round $round)" "$OUT/$cmd-$jobs-$round.json" \
                "$BIN" "$cmd" -q --jobs "$jobs" --format json --out "$OUT/$cmd-$jobs" "$@"
        done
        if [ "$(strip "$OUT/$cmd-1-$round.json")" = "$(strip "$OUT/$cmd-$CORES-$round.json")" ]; then
            echo "  identical (timings aside)"
        else
            echo "  DIFFERENT"
        fi
    done
}

side_by_side check
side_by_side mutants
