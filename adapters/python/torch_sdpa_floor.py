"""The libtorch SDPA floor as an attn-diff adapter: for `attn-diff bench` beside the
backends made of libtorch ops.

It reads the step's keys and values out of the paged cache into one contiguous padded batch
*before* the clock starts, then times only libtorch's `scaled_dot_product_attention` on it:
no gather, no conversion, no paging, only the attention itself, which a backend made of
libtorch tensor ops cannot beat. Shapes are the best `spyre-sdpa` can do: `[B, Hkv, L_max,
D]` keys and values, the query heads of a kv head folded into query rows `[B, Hkv, G *
q_max, D]` (libtorch's CPU `enable_gqa` path is slower), a boolean visibility mask only when
the batch needs one (several query tokens per sequence, or unequal lengths). Its output is
real attention, so `bench` still checks it against the oracle.

Decoder cases without optional features only (it is a timing floor, not a backend).
"""

import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Unsupported, serve  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class SdpaFloor(Adapter):
    name = "libtorch-sdpa-floor"
    description = f"libtorch SDPA on contiguous K/V, timed alone (torch {torch.__version__})"
    capabilities = {"kinds": ["decoder"], "features": []}

    def check(self, config):
        if config.num_heads % config.num_kv_heads:
            raise Unsupported("num_heads not a multiple of num_kv_heads")

    def new_cache(self, config, num_blocks):
        shape = (num_blocks * config.block_size, config.num_kv_heads, config.head_size)
        return [torch.zeros(shape, dtype=DTYPES[config.dtype]) for _ in range(2)]

    def write_kv(self, config, cache, key, value, slot_mapping):
        real = slot_mapping >= 0
        slots = torch.from_numpy(slot_mapping[real])
        cache[0][slots] = torch.from_numpy(key[real]).to(cache[0].dtype)
        cache[1][slots] = torch.from_numpy(value[real]).to(cache[1].dtype)

    def forward(self, config, cache, step):
        dtype = cache[0].dtype
        hkv, d, g = config.num_kv_heads, config.head_size, config.group_size
        seq_lens, query_lens = step.seq_lens, step.query_lens
        b, lmax, qmax = len(seq_lens), int(seq_lens.max()), int(query_lens.max())
        k = torch.zeros(b, hkv, lmax, d, dtype=dtype)
        v = torch.zeros(b, hkv, lmax, d, dtype=dtype)
        q = torch.zeros(b, hkv, g, qmax, d, dtype=dtype)
        visible = torch.zeros(b, qmax, lmax, dtype=torch.bool)
        query = torch.from_numpy(step.query).to(dtype)
        keys = torch.arange(lmax)
        for s in range(b):
            n, ql, start = int(seq_lens[s]), int(query_lens[s]), int(step.query_start_loc[s])
            pos = torch.arange(n)
            slots = torch.from_numpy(step.block_table[s])[pos // config.block_size]
            slots = slots * config.block_size + pos % config.block_size
            k[s, :, :n] = cache[0][slots].transpose(0, 1)
            v[s, :, :n] = cache[1][slots].transpose(0, 1)
            # [ql, H, D] -> [Hkv, G, ql, D]
            q[s, :, :, :ql] = query[start : start + ql].reshape(ql, hkv, g, d).permute(1, 2, 0, 3)
            qpos = torch.arange(qmax).clamp(max=ql - 1) + (n - ql)
            visible[s] = keys[None, :] <= qpos[:, None]
        q = q.reshape(b, hkv, g * qmax, d)
        mask = None
        if qmax > 1 or len(set(seq_lens.tolist())) > 1:
            mask = visible[:, None, None].expand(b, 1, g, qmax, lmax).reshape(b, 1, g * qmax, lmax)
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=config.scale)
        elapsed = time.perf_counter() - t0
        out = out.reshape(b, hkv, g, qmax, d)
        result = np.zeros((step.num_tokens, config.num_heads, d), dtype=np.float32)
        for s in range(b):
            ql, start = int(query_lens[s]), int(step.query_start_loc[s])
            rows = out[s, :, :, :ql].permute(2, 0, 1, 3).reshape(ql, config.num_heads, d)
            result[start : start + ql] = rows.float().numpy()
        return result, elapsed


if __name__ == "__main__":
    if os.environ.get("ATTN_DIFF_THREADS"):  # `attn-diff bench --threads N`
        torch.set_num_threads(int(os.environ["ATTN_DIFF_THREADS"]))
    serve(SdpaFloor())
