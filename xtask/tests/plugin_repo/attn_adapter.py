"""The plugin's attn-diff adapter: serves MyPluginAttentionBackend over attn-diff's protocol
(`python attn_adapter.py`, started by attn-diff)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from attn_diff_adapter import serve  # noqa: E402
from my_plugin.attention import MyPluginAttentionBackend  # noqa: E402

if __name__ == "__main__":
    serve(MyPluginAttentionBackend())
