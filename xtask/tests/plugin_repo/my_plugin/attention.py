"""The plugin's attention backend: paged attention in numpy (attn-diff's shipped reference
kernel), with an optional planted bug for the test that proves the CI step catches one."""

import os

import numpy as np
from numpy_reference import NumpyReference


class MyPluginAttentionBackend(NumpyReference):
    """The backend class the plugin registers; attn-diff reaches it through attn_adapter.py."""

    name = "my-plugin"
    description = "my-plugin's numpy paged attention"
    capabilities = {"dtypes": ["f32"], "kinds": ["decoder"], "kv_cache_dtypes": ["auto"]}

    def expand_kv(self, config, x):
        if os.environ.get("MY_PLUGIN_PLANTED_BUG") == "1":
            # The planted bug: query head h reads KV head h % num_kv_heads, not h // group.
            return np.tile(x, (1, config.group_size, 1))
        return super().expand_kv(config, x)
