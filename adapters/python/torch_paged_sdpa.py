"""Paged attention in plain PyTorch (gather through the block table, then SDPA): a template
for an attn-diff adapter around your own PyTorch backend. Not run in default CI (needs torch).

The cache is `[2, num_blocks, block_size, num_kv_heads, head_size]` in the case dtype;
`write_kv` is reshape-and-cache through `slot_mapping` (skipping -1); `forward` gathers each
sequence's keys and values through its block table row and calls
`torch.nn.functional.scaled_dot_product_attention` with a mask for causality, the sliding
window and ALiBi. SDPA wants the additive mask in the query's dtype, and ALiBi biases
rounded to bf16 move logits by up to 1/128 of their size (attn-diff catches that), so the
template runs SDPA in float32 from the cache's values and rounds the output to the case
dtype. Soft-cap and sinks cannot be expressed through SDPA, so this template
declares them unsupported (attn-diff counts those cases per reason instead of failing them).

Replace `new_cache`, `write_kv` and `forward` with calls into your backend, keep the
capabilities honest, and run:

    attn-diff check --backend external:torch-sdpa          # declared in attn-diff.toml
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, serve  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class TorchPagedSdpa(Adapter):
    name = "torch-paged-sdpa"
    description = "PyTorch gather + scaled_dot_product_attention"
    capabilities = {"features": ["sliding_window", "alibi"]}

    def new_cache(self, config, num_blocks):
        shape = (2, num_blocks, config.block_size, config.num_kv_heads, config.head_size)
        return torch.zeros(shape, dtype=DTYPES[config.dtype])

    def write_kv(self, config, cache, key, value, slot_mapping):
        slots = torch.from_numpy(slot_mapping)
        keep = slots >= 0
        slots = slots[keep]
        blocks, offsets = slots // config.block_size, slots % config.block_size
        cache[0, blocks, offsets] = torch.from_numpy(key)[keep].to(cache.dtype)
        cache[1, blocks, offsets] = torch.from_numpy(value)[keep].to(cache.dtype)

    def mask(self, config, context, num_queries, seq_len):
        """Additive float32 mask [num_heads, num_queries, seq_len]."""
        pos = torch.arange(seq_len)
        rel = pos[None, :] - (context + torch.arange(num_queries))[:, None]
        allowed = torch.ones_like(rel, dtype=torch.bool)
        if config.kind == "decoder":
            allowed &= rel <= 0
        lr = config.window_left_right()
        if lr is not None:
            allowed &= (rel >= -lr[0]) & (rel <= lr[1])
        bias = torch.zeros(config.num_heads, num_queries, seq_len)
        if config.alibi_slopes is not None:
            slopes = torch.tensor(config.alibi_slopes, dtype=torch.float32)
            bias += slopes[:, None, None] * rel[None].float()
        return bias.masked_fill(~allowed[None], float("-inf"))

    def forward(self, config, cache, step):
        dtype = cache.dtype
        bs = config.block_size
        query = torch.from_numpy(step.query).to(dtype)
        out = torch.zeros(step.num_tokens, config.num_heads, config.head_size, dtype=dtype)
        block_table = torch.from_numpy(step.block_table)
        elapsed = 0.0
        for s in range(len(step.seq_lens)):
            q0, q1 = int(step.query_start_loc[s]), int(step.query_start_loc[s + 1])
            seq_len = int(step.seq_lens[s])
            context = seq_len - (q1 - q0)
            t0 = time.perf_counter()
            pos = torch.arange(seq_len)
            blocks = block_table[s][pos // bs]
            k = cache[0, blocks, pos % bs]  # [seq_len, num_kv_heads, head_size]
            v = cache[1, blocks, pos % bs]
            # Keys before the first query's window are never seen and may sit in skipped
            # blocks (the null block: stale memory, NaN say); SDPA's additive mask would let
            # a NaN through, so they are zeroed before it runs.
            lr = config.window_left_right()
            if config.kind == "decoder" and lr is not None:
                first = max(0, context - lr[0])
                k[:first] = 0
                v[:first] = 0
            mask = self.mask(config, context, q1 - q0, seq_len)
            o = F.scaled_dot_product_attention(
                query[q0:q1].float().transpose(0, 1)[None],
                k.float().transpose(0, 1)[None],
                v.float().transpose(0, 1)[None],
                attn_mask=mask[None],
                scale=config.scale,
                enable_gqa=config.num_heads > config.num_kv_heads,
            )
            out[q0:q1] = o[0].transpose(0, 1).to(dtype)
            elapsed += time.perf_counter() - t0
        return out.float().numpy(), elapsed


if __name__ == "__main__":
    serve(TorchPagedSdpa())
