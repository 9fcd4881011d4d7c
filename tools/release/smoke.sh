#!/usr/bin/env bash
# Install a built attn-diff wheel into a fresh virtual environment of PYTHON, on a PATH with no
# Rust, and run what a user runs first:
#
#   tools/release/smoke.sh PYTHON DIST
#
# - `attn-diff --version` and `python -m attn_diff --version` print the wheel's version;
# - `attn-diff check --backend cpu` passes (a short run: 40 cases, 4 traces);
# - the pytest plugin's example (xtask/tests/wheel_project): the numpy adapter passes and the
#   same adapter with a planted bug fails with the shrunk report ("1 failed, 1 passed");
# - the composite action's check step, `python -m attn_diff_adapter.ci`, passes that adapter.
#
# The venv gets the wheel and numpy, safetensors and pytest as a user's pip resolves them for
# that Python (binary wheels only). Exits non-zero, saying what failed, on any difference.
set -euo pipefail

python="${1:?usage: smoke.sh PYTHON DIST}"
dist="$(cd "${2:?usage: smoke.sh PYTHON DIST}" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

shopt -s nullglob
wheels=("$dist"/attn_diff-*-py3-none-*.whl)
[ "${#wheels[@]}" -eq 1 ] || { echo "smoke.sh: expected one attn-diff wheel in $dist" >&2; exit 1; }
wheel="${wheels[0]}"
version="$(basename "$wheel" | cut -d- -f2)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
bin="$work/venv/bin"
echo "smoke.sh: $("$bin/python" --version) in a fresh venv, $(basename "$wheel")"
"$bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    "$wheel" numpy safetensors pytest

# A user's shell: the venv and the system's directories, no cargo.
bare() { env -i HOME="$work" LANG=C.UTF-8 PATH="$bin:/usr/local/bin:/usr/bin:/bin" "$@"; }
for dir in "$bin" /usr/local/bin /usr/bin /bin; do
    if [ -e "$dir/cargo" ]; then echo "smoke.sh: $dir/cargo exists: not a machine without Rust" >&2; exit 1; fi
done

got="$(cd "$work" && bare attn-diff --version)"
[ "$got" = "attn-diff $version" ] || { echo "smoke.sh: attn-diff --version says '$got', not 'attn-diff $version'" >&2; exit 1; }
got="$(cd "$work" && bare python -m attn_diff --version)"
[ "$got" = "attn-diff $version" ] || { echo "smoke.sh: python -m attn_diff --version says '$got'" >&2; exit 1; }

(cd "$work" && bare attn-diff check --backend cpu --cases 40 --traces 4 --out "$work/failures")

mkdir "$work/project"
cp "$repo/xtask/tests/wheel_project/numpy_adapter.py" "$repo/xtask/tests/wheel_project/test_numpy_adapter.py" "$work/project/"
code=0
(cd "$work/project" && bare python -m pytest -p no:cacheprovider -rA --basetemp "$work/pytest-tmp" \
    --attn-diff-cases 60 --attn-diff-seed 3) > "$work/pytest.log" 2>&1 || code=$?
if [ "$code" -ne 1 ] || ! grep -q "1 failed, 1 passed" "$work/pytest.log" \
    || ! grep -q "external:planted diverged" "$work/pytest.log"; then
    cat "$work/pytest.log" >&2
    echo "smoke.sh: the plugin's example should pass the adapter and catch the planted bug (exit $code)" >&2
    exit 1
fi
# The composite action's check step (python -m attn_diff_adapter.ci) on the same adapter.
(cd "$work/project" && bare python -m attn_diff_adapter.ci --adapter "python numpy_adapter.py" \
    --cases 20 --traces 2 --out "$work/ci-out" > "$work/ci.log" 2>&1) \
    || { cat "$work/ci.log" >&2; echo "smoke.sh: python -m attn_diff_adapter.ci failed" >&2; exit 1; }
[ -s "$work/ci-out/summary.md" ] && [ -s "$work/ci-out/junit.xml" ] \
    || { echo "smoke.sh: the CI step wrote no summary or JUnit report" >&2; exit 1; }
echo "smoke.sh: passed on $("$bin/python" --version): the binary, python -m attn_diff, check --backend cpu, the pytest plugin, the CI step"
