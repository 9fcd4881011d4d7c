#!/usr/bin/env bash
# What the release would publish, checked before anything is uploaded:
#
#   tools/release/verify.sh DIST [TAG] [--mode OUTPUT]
#
# DIST must hold exactly one attn-diff wheel tagged py3-none-manylinux_2_17_x86_64 and one sdist,
# both of the workspace's version (Cargo.toml, [workspace.package]: the one place it is
# written); TAG, when given (a release's tag, e.g. v0.1.0), must be that version with a `v`.
# Prints the files and the index the release would upload them to. The release workflow runs
# it in its publish job, in a dry run (the default) and before a real upload alike.
#
# With --mode OUTPUT it also decides the publish job's mode and appends `publish=true` or
# `publish=false` to OUTPUT ($GITHUB_OUTPUT): true only for a tag, and only when
# tools/release/publish-mode says `publish` (it says `dry-run` until a reviewed commit changes
# it, after PyPI's trusted publisher is configured: docs/release.md).
set -euo pipefail

dist="${1:?usage: verify.sh DIST [TAG] [--mode OUTPUT]}"
tag="${2:-}"
mode_output=""
if [ "${3:-}" = "--mode" ]; then mode_output="${4:?--mode needs a file}"; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cargo_toml="$here/../../Cargo.toml"
version="$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$cargo_toml")"
[ -n "$version" ] || { echo "verify.sh: no [workspace.package] version in $cargo_toml" >&2; exit 1; }

if [ -n "$tag" ] && [ "$tag" != "v$version" ]; then
    echo "verify.sh: the tag $tag is not v$version, the workspace's version (Cargo.toml)" >&2
    exit 1
fi
expected=("attn_diff-$version-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl" "attn_diff-$version.tar.gz")
found=()
for f in "$dist"/*; do found+=("$(basename "$f")"); done
if [ "$(printf '%s\n' "${found[@]}" | sort)" != "$(printf '%s\n' "${expected[@]}" | sort)" ]; then
    echo "verify.sh: $dist holds [${found[*]}], not [${expected[*]}]" >&2
    exit 1
fi
for f in "${expected[@]}"; do
    echo "attn-diff $version: $f ($(stat -c %s "$dist/$f") bytes, sha256 $(sha256sum "$dist/$f" | cut -d' ' -f1))"
done
echo "verify.sh: ready to publish attn-diff $version to https://pypi.org/project/attn-diff/"
if [ -n "$mode_output" ]; then
    mode="$(tr -d '[:space:]' < "$here/publish-mode")"
    case "$mode" in
        publish | dry-run) ;;
        *) echo "verify.sh: tools/release/publish-mode says '$mode', not publish or dry-run" >&2; exit 1 ;;
    esac
    if [ -n "$tag" ] && [ "$mode" = "publish" ]; then
        echo "publish=true" >> "$mode_output"
        echo "verify.sh: publishing (tools/release/publish-mode says publish, tag $tag)"
    else
        echo "publish=false" >> "$mode_output"
        if [ -n "$tag" ]; then why="tools/release/publish-mode says $mode"; else why="not a tag's run"; fi
        echo "verify.sh: dry run, nothing is uploaded ($why)"
    fi
fi
