"""Two tests through the attn-diff pytest plugin, run by xtask/tests/wheel.rs in a fresh venv
holding only the wheel (and numpy, safetensors, pytest): the adapter passes; the same adapter
with a planted bug fails with attn-diff's shrunk report."""

import os
import sys

import pytest

ADAPTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numpy_adapter.py")


@pytest.mark.attn_diff(script="numpy_adapter.py", cases=40, traces=2)
def test_the_adapter_agrees_with_the_oracle():
    pass


def test_the_planted_bug_is_caught(attn_diff):
    attn_diff.check_adapter([sys.executable, ADAPTER, "--planted-bug"], name="planted", traces=0)
