"""A user's numpy adapter, as a project outside attn-diff writes one: the shipped numpy
reference (installed with attn-diff), and with --planted-bug the classic grouped-query
bug (query head h reading KV head h % num_kv_heads instead of h // group_size)."""

import sys

import numpy as np
from attn_diff_adapter import serve
from numpy_reference import NumpyReference


class MyAdapter(NumpyReference):
    name = "my-numpy"
    description = "a user's numpy paged attention"
    capabilities = {"dtypes": ["f32"], "kinds": ["decoder"], "kv_cache_dtypes": ["auto"]}


class PlantedBug(MyAdapter):
    description = "a user's numpy paged attention, query head h reading KV head h % num_kv_heads"

    def expand_kv(self, config, x):
        return np.tile(x, (1, config.group_size, 1))


if __name__ == "__main__":
    serve(PlantedBug() if "--planted-bug" in sys.argv[1:] else MyAdapter())
