#!/usr/bin/env bash
# Build the release artefacts of the attn-diff Python package into DIST (default: dist/):
#
#   tools/release/build.sh [DIST]
#
# - the wheel, `attn_diff-VERSION-py3-none-manylinux_2_17_x86_64.whl` (maturin, the harness
#   built --locked and linked by zig against glibc 2.17's symbols: the floor it is tagged with);
# - the sdist, `attn_diff-VERSION.tar.gz`, whose own build is checked by smoke.sh --sdist;
# - then `auditwheel show` must report exactly that manylinux tag, and objdump no GLIBC_
#   symbol version above 2.17, or the build fails.
#
# The tools come from tools/release/requirements.txt (hash-checked) in a venv of their own under
# ATTN_DIFF_CACHE (default ~/.cache/attn-diff); the system Python is never modified. Needs
# Rust (cargo), python3 with venv, and binutils (objdump). CARGO_TARGET_DIR is honoured
# (default target/wheel), so a rebuild compiles only what changed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dist="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
glibc_floor="2.17"
tag="manylinux_2_17_x86_64"

# The tools, in a venv named after the requirements' hash.
req_hash="$(sha256sum "$here/requirements.txt" | cut -c1-12)"
tools="${ATTN_DIFF_CACHE:-$HOME/.cache/attn-diff}/release-tools-$req_hash"
# Made in place (a venv's scripts name its path), complete once its marker is written.
if [ ! -f "$tools/complete" ] || ! "$tools/bin/maturin" --version >/dev/null 2>&1; then
    rm -rf "$tools"
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
        --require-hashes --no-deps --only-binary=:all: -r "$here/requirements.txt"
    touch "$tools/complete"
fi
# maturin --zig finds zig as `python -m ziglang`: the tools' python first on PATH.
export PATH="$tools/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target/wheel}"

rm -f "$dist"/attn_diff-*
cd "$repo/adapters/python"
maturin build --release --locked --zig --compatibility "$tag" --out "$dist"
maturin sdist --out "$dist"

shopt -s nullglob
wheels=("$dist"/attn_diff-*-py3-none-*.whl)
sdists=("$dist"/attn_diff-*.tar.gz)
if [ "${#wheels[@]}" -ne 1 ] || [ "${#sdists[@]}" -ne 1 ]; then
    echo "build.sh: expected one py3-none wheel and one sdist in $dist" >&2
    ls -l "$dist" >&2
    exit 1
fi
wheel="${wheels[0]}"

# auditwheel's own reading of the binary's symbol versions.
report="$(auditwheel show "$wheel")"
echo "$report"
if ! tr '\n' ' ' <<<"$report" | grep -q "consistent with the following platform tag: \"$tag\""; then
    echo "build.sh: auditwheel does not report $tag for $wheel" >&2
    exit 1
fi
# And objdump's: the highest GLIBC_ version the binary asks for is the floor.
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
python3 -m zipfile -e "$wheel" "$unpacked"
highest="$(objdump -T "$unpacked"/attn_diff-*.data/scripts/attn-diff | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
if [ "$(printf '%s\n%s\n' "$highest" "$glibc_floor" | sort -V | tail -1)" != "$glibc_floor" ]; then
    echo "build.sh: the binary needs GLIBC_$highest, above the floor $glibc_floor" >&2
    exit 1
fi
echo "build.sh: $(basename "$wheel") (glibc floor $glibc_floor, highest symbol version GLIBC_$highest) and $(basename "${sdists[0]}") in $dist"
