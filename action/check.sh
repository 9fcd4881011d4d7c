#!/usr/bin/env bash
# The check step of this repository's composite action (action.yml), runnable as it is from any
# shell: the action's inputs arrive as ATTN_DIFF_* environment variables (never pasted into a
# script), and `python -m attn_diff_adapter.ci` reads them (its --help names them all).
# ATTN_DIFF_PYTHON is the interpreter attn-diff was installed into (default: python3).
set -euo pipefail
exec "${ATTN_DIFF_PYTHON:-python3}" -m attn_diff_adapter.ci "$@"
