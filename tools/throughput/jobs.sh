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

for round in 1 2; do
    timed "check --jobs 1     (round $round)" "$OUT/check-1-$round.json" \
        "$BIN" check -q --jobs 1 --format json --out "$OUT/f1"
    timed "check --jobs $CORES     (round $round)" "$OUT/check-$CORES-$round.json" \
        "$BIN" check -q --jobs "$CORES" --format json --out "$OUT/fn"
    if [ "$(strip "$OUT/check-1-$round.json")" = "$(strip "$OUT/check-$CORES-$round.json")" ]; then
        echo "  summaries identical"
    else
        echo "  SUMMARIES DIFFER"
    fi
done
for round in 1 2; do
    timed "mutants --jobs 1   (round $round)" "$OUT/mutants-1-$round.json" \
        "$BIN" mutants -q --jobs 1 --format json --out "$OUT/m1"
    timed "mutants --jobs $CORES   (round $round)" "$OUT/mutants-$CORES-$round.json" \
        "$BIN" mutants -q --jobs "$CORES" --format json --out "$OUT/mn"
    if [ "$(strip "$OUT/mutants-1-$round.json")" = "$(strip "$OUT/mutants-$CORES-$round.json")" ]; then
        echo "  tables identical"
    else
        echo "  TABLES DIFFER"
    fi
done
