"""Shared fixtures: the attn-diff binary (argument-free: $ATTN_DIFF, PATH, else this
checkout's own build), or a skip that says how to get one."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTERS = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(ADAPTERS))
sys.path.insert(0, ADAPTERS)

from attn_diff_adapter.testing import BinaryNotFound, find_binary  # noqa: E402


def _checkout_binary():
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, "attn-diff")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="session")
def attn_diff_binary():
    """$ATTN_DIFF or attn-diff on PATH, else this checkout's target/{release,debug} build."""
    try:
        return find_binary()
    except BinaryNotFound as missing:
        local = _checkout_binary()
        if local is None:
            pytest.skip(f"{missing} (nor is there a build in {REPO}/target)")
        return local


@pytest.fixture(scope="session")
def adapters_dir():
    return ADAPTERS
