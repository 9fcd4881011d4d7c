"""A paged-attention backend in numpy, as an attn-diff adapter: the protocol end to end.

The cache really is paged, `[num_blocks, block_size, num_kv_heads, head_size]` for K and for
V; `write_kv` stores rows through `slot_mapping` (skipping -1) and `forward` reads every key
through the block table. Computation is in float64, the output rounded to the case dtype.
Supports every feature: GQA, windows, soft-cap, ALiBi, sinks, encoder-only, local chunks.

    attn-diff check --backend external:numpy-ref      # declared in attn-diff.toml
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The helper first: it says in one line how to get numpy when it is missing.
from attn_diff_adapter import Adapter, round_to_dtype, serve  # noqa: E402

import numpy as np  # noqa: E402


class NumpyReference(Adapter):
    name = "numpy-reference"
    description = "paged attention in numpy (float64), every feature"
    # Every established feature, padded requests and local chunks (no FP8 cache, no
    # cross-attention). A subclass with its own forward should declare its own capabilities:
    # it otherwise receives every feature this class learns (the handshake says so).
    capabilities = {
        "features": [
            "sliding_window",
            "logits_soft_cap",
            "alibi",
            "sinks",
            "padded_requests",
            "chunked_local_attention",
            "chunk_lookback",
            "non_causal",
            "prefix_lm",
            "rswa",
        ]
    }

    def new_cache(self, config, num_blocks):
        shape = (num_blocks, config.block_size, config.num_kv_heads, config.head_size)
        return {"k": np.zeros(shape), "v": np.zeros(shape)}

    def write_kv(self, config, cache, key, value, slot_mapping):
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        blocks, offsets = slots // config.block_size, slots % config.block_size
        cache["k"][blocks, offsets] = key[keep]
        cache["v"][blocks, offsets] = value[keep]

    def visible(self, config, rel):
        """Mask of keys a query sees, from rel = key position - query position."""
        mask = np.ones(rel.shape, dtype=bool)
        if config.kind == "decoder":
            mask &= rel <= 0
        lr = config.window_left_right()
        if lr is not None:
            left, right = lr
            mask &= (rel >= -left) & (rel <= right)
        return mask

    def visible_both_ways(self, config, rel):
        """The mask of a non-causal decoder request: its whole sequence, a window of w
        reaching w - 1 keys each way."""
        mask = np.ones(rel.shape, dtype=bool)
        if config.sliding_window is not None:
            w = config.sliding_window - 1
            mask &= (rel >= -w) & (rel <= w)
        return mask

    def in_chunk(self, config, rel, qpos):
        """Mask of keys in each query's local chunk and the `chunk_lookback` chunks before
        it (all keys without chunks), from rel [n, L] and the queries' positions qpos [n]:
        none before (qpos // chunk - lookback) * chunk."""
        chunk = config.attention_chunk_size
        if chunk is None or config.kind != "decoder":
            return np.ones(rel.shape, dtype=bool)
        start = np.maximum(qpos // chunk - (config.chunk_lookback or 0), 0) * chunk
        return rel >= (start - qpos)[:, None]

    def request_masks(self, config, step, s, seen, pos, qpos):
        """vLLM 0.33's per-request masks on top of `seen` [n, L]: R-SWA keeps keys below the
        request's prefix or with p - k < w; a PrefixLM range [a, b] (ends inclusive) adds all
        of itself for its queries, (causal and window) or in-range, within the window when
        clamped (Gemma 4)."""
        rel = qpos[:, None] - pos[None, :]
        if step.rswa_window is not None:
            prefix = int(step.rswa_prefix_lens[s])
            seen = seen & ((pos[None, :] < prefix) | (rel < step.rswa_window))
        for a, b in step.ranges_of(s):
            both = ((qpos >= a) & (qpos <= b))[:, None] & ((pos >= a) & (pos <= b))[None, :]
            if step.prefix_lm_clamp and config.sliding_window is not None:
                both &= rel < config.sliding_window
            seen = seen | both
        return seen

    def expand_kv(self, config, x):
        """K or V rows [L, num_kv_heads, D] per query head: [L, num_heads, D]."""
        return np.repeat(x, config.group_size, axis=1)

    def forward(self, config, cache, step):
        bs = config.block_size
        out = np.zeros((step.num_tokens, config.num_heads, config.head_size), np.float32)
        for s in range(len(step.seq_lens)):
            q0, q1 = int(step.query_start_loc[s]), int(step.query_start_loc[s + 1])
            if q1 == q0:
                continue  # a padded request: no query, no output row
            seq_len = int(step.seq_lens[s])
            context = seq_len - (q1 - q0)
            pos = np.arange(seq_len)
            blocks = step.block_table[s][pos // bs]
            k = self.expand_kv(config, cache["k"][blocks, pos % bs])  # [L, Hq, D]
            v = self.expand_kv(config, cache["v"][blocks, pos % bs])
            q = step.query[q0:q1].astype(np.float64)  # [n, Hq, D]
            logits = np.einsum("nhd,lhd->hnl", q, k) * config.scale
            if config.logits_soft_cap is not None:
                cap = config.logits_soft_cap
                logits = cap * np.tanh(logits / cap)
            qpos = context + np.arange(q1 - q0)
            rel = pos[None, :] - qpos[:, None]  # [n, L]
            if config.alibi_slopes is not None:
                logits += np.asarray(config.alibi_slopes)[:, None, None] * rel[None]
            # Subclasses override visible(config, rel): a non-causal request has its own.
            visible = self.visible(config, rel) if step.is_causal(s) else self.visible_both_ways(config, rel)
            seen = visible & self.in_chunk(config, rel, qpos)
            seen = self.request_masks(config, step, s, seen, pos, qpos)
            logits = np.where(seen[None], logits, -np.inf)
            # A value row no query sees may be stale memory (a skipped block's null block, a
            # partial page's tail): 0 · NaN is NaN, so it must not reach P·V at all.
            v = np.where(seen.any(axis=0)[:, None, None], v, 0.0)
            peak = logits.max(axis=2, keepdims=True)
            if config.sinks is not None:
                sinks = np.asarray(config.sinks, dtype=np.float64)[:, None, None]
                peak = np.maximum(peak, sinks)
            weights = np.exp(logits - peak)
            denom = weights.sum(axis=2, keepdims=True)
            if config.sinks is not None:
                denom += np.exp(sinks - peak)
            o = np.einsum("hnl,lhd->nhd", weights / denom, v)
            out[q0:q1] = round_to_dtype(o, config.dtype)
        return out


if __name__ == "__main__":
    serve(NumpyReference())
