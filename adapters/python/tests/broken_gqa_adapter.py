"""A deliberately wrong adapter for the pytest helper's own tests: the numpy reference with a
classic grouped-query bug, query head h reading KV head h % num_kv_heads instead of
h // (num_heads / num_kv_heads). Right whenever there is one KV head or one query head per KV
head; wrong otherwise, so attn-diff shrinks it to a small GQA case."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attn_diff_adapter import serve  # noqa: E402
from numpy_reference import NumpyReference  # noqa: E402

import numpy as np  # noqa: E402


class BrokenGqa(NumpyReference):
    name = "broken-gqa"
    description = "numpy reference with query head h reading KV head h % num_kv_heads"
    capabilities = {"dtypes": ["f32"], "kinds": ["decoder"], "kv_cache_dtypes": ["auto"]}

    def expand_kv(self, config, x):
        return np.tile(x, (1, config.group_size, 1))


if __name__ == "__main__":
    serve(BrokenGqa())
