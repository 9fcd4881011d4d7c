"""A paged-attention backend in numpy, as an attn-diff adapter: the protocol end to end.

The cache really is paged, `[num_blocks, block_size, num_kv_heads, head_size]` for K and for
V; `write_kv` stores rows through `slot_mapping` (skipping -1) and `forward` reads every key
through the block table. Computation is in float64, the output rounded to the case dtype.
Supports every feature: GQA, windows, soft-cap, ALiBi, sinks, encoder-only, local chunks, and
FP8 caches as vLLM keeps them: the cache then holds uint8 codes of fp8(x / scale) (E4M3FN or
E5M2, nearest even, saturating) beside a float32 scale per (slot, kv head), from the per-tensor
`k_scale`/`v_scale`, the per-head `scales` or the per-token scales computed as each row is
written, and `forward` reads code_value * scale; with `q_scale`, an FP8 (E4M3) query.

    attn-diff check --backend external:numpy-ref      # declared in attn-diff.toml
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The helper first: it says in one line how to get numpy when it is missing.
from attn_diff_adapter import Adapter, Unsupported, round_to_dtype, serve  # noqa: E402

import numpy as np  # noqa: E402

#: (mantissa bits, exponent bias) of each FP8 format (vLLM's `kv_cache_dtype` names).
FP8_BITS = {"fp8_e4m3": (3, 7), "fp8_e5m2": (2, 15)}
#: Each format's largest finite value: writes saturate to it.
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
#: The code a NaN is stored as (NaN in both formats).
FP8_NAN_CODE = 0x7F
#: The floor of a per-token scale (a zero row's), vLLM's writer's.
TOKEN_SCALE_FLOOR = np.float32(1e-6)


def fp8_decode_table(fmt):
    """Every code's value by the format's definition, float64 [256]: NaN for the NaN codes
    (E4M3FN: S.1111.111; E5M2: exponent 31 with a mantissa), +-inf for E5M2's infinities."""
    mbits, bias = FP8_BITS[fmt]
    out = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp = (code & 0x7F) >> mbits
        mant = code & ((1 << mbits) - 1)
        max_exp = (1 << (7 - mbits)) - 1
        if fmt == "fp8_e4m3" and exp == max_exp and mant == (1 << mbits) - 1:
            out[code] = np.nan
        elif fmt == "fp8_e5m2" and exp == max_exp:
            out[code] = np.nan if mant else sign * np.inf
        elif exp == 0:
            out[code] = sign * mant / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            out[code] = sign * (1.0 + mant / (1 << mbits)) * 2.0 ** (exp - bias)
    return out


FP8_VALUES = {fmt: fp8_decode_table(fmt) for fmt in FP8_BITS}


def fp8_encode(x, fmt):
    """uint8 codes of `x` (any float array, exact in float64): the nearest finite code, ties
    to the even code, saturating to the largest finite value beyond it (+-inf included); NaN
    gives 0x7f; the sign of zero is kept. attn-diff's `Fp8Format::encode`, vectorised.

    Inside a binade of exponent e (or among the subnormals, e = 1 - bias) the codes step by
    one quantum 2^(e - mbits), and the code after a binade's last is the next binade's first,
    so the code is the binade's first code plus a / quantum rounded half to even (exact: the
    division is by a power of two)."""
    mbits, bias = FP8_BITS[fmt]
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    sign = np.where(np.signbit(x), 0x80, 0)
    a = np.minimum(np.abs(np.where(nan, 0.0, x)), FP8_MAX[fmt])
    min_exp = 1 - bias
    _, e2 = np.frexp(a)  # a = m * 2^e2 with m in [0.5, 1): the binade's exponent is e2 - 1
    e = np.maximum(np.where(a == 0.0, min_exp, e2 - 1), min_exp)
    steps = np.rint(np.ldexp(a, mbits - e)).astype(np.int64)  # rint: half to even
    base = np.where((e == min_exp) & (steps < (1 << mbits)), 0, ((e + bias) << mbits) - (1 << mbits))
    code = (base + steps) | sign
    return np.where(nan, FP8_NAN_CODE, code).astype(np.uint8)


def fp8_quantize(x, scale, fmt, reciprocal=False):
    """Codes of fp8(x / scale), the division in float32 as kernels do it (`scale`
    broadcasts against `x`); with `reciprocal`, fp8(x * (1 / scale)) as vLLM's per-token-head
    writer does it (the two differ by one code in about one row in fifty)."""
    x, scale = np.asarray(x, dtype=np.float32), np.asarray(scale, dtype=np.float32)
    q = x * (np.float32(1) / scale) if reciprocal else x / scale
    return fp8_encode(q, fmt)


def fp8_dequantize(code, scale, fmt):
    """What a kernel reads for `code`: code_value * scale, exactly (float64)."""
    return FP8_VALUES[fmt][code] * np.asarray(scale, dtype=np.float32).astype(np.float64)


def fp8_round_trip(x, scale, fmt):
    """`x` as it comes back out of an FP8 cache with `scale`."""
    return fp8_dequantize(fp8_quantize(x, scale, fmt), scale, fmt)


def token_scales(rows, fmt="fp8_e4m3"):
    """The per-token scale of each row (last axis) as vLLM's per-token-head writer computes
    it, in float32: max(absmax / 448, 1e-6) (NaN elements ignored, as attn-diff's fold)."""
    a = np.abs(np.asarray(rows, dtype=np.float32))
    absmax = np.where(np.isnan(a), np.float32(0), a).max(axis=-1, initial=np.float32(0))
    return np.maximum(absmax / np.float32(FP8_MAX[fmt]), TOKEN_SCALE_FLOOR).astype(np.float32)


def write_scales(config, which, rows):
    """The float32 scale of each written row [n, num_kv_heads, D] of K or V ("k" or "v"):
    [n, num_kv_heads], by the cache's granularity."""
    n, hkv = rows.shape[0], config.num_kv_heads
    granularity = config.kv_scales
    if granularity == "token":
        return token_scales(rows, config.kv_cache_dtype)
    if granularity == "head":
        per_head = np.asarray(config.kv_cache["scales"][which], dtype=np.float32)
        # Fitted to the head count as attn-diff fits a case's list (its first ones, repeated).
        per_head = per_head[np.arange(hkv) % len(per_head)]
        return np.broadcast_to(per_head, (n, hkv)).astype(np.float32)
    return np.full((n, hkv), np.float32(config.kv_cache[f"{which}_scale"]), dtype=np.float32)


class NumpyReference(Adapter):
    name = "numpy-reference"
    description = "paged attention in numpy (float64), every feature"
    # Every established feature, padded requests, local chunks and FP8 caches with every
    # scale granularity and an FP8 query (no cross-attention). A subclass with its own forward
    # should declare its own capabilities: it otherwise receives every feature this class
    # learns (the handshake says so).
    capabilities = {
        "kv_cache_dtypes": ["auto", "fp8_e4m3", "fp8_e5m2"],
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
            "fp8_kv_cache",
            "fp8_query",
            "kv_head_scales",
            "kv_token_scales",
        ],
    }

    def check(self, config):
        if config.kv_scales == "token" and config.kv_cache_dtype != "fp8_e4m3":
            raise Unsupported(f"per-token scales with a {config.kv_cache_dtype} cache (E4M3 only)")

    def new_cache(self, config, num_blocks):
        shape = (num_blocks, config.block_size, config.num_kv_heads, config.head_size)
        if config.kv_cache is None:
            return {"k": np.zeros(shape), "v": np.zeros(shape)}
        # An FP8 cache: codes, and the scale each (slot, kv head) row was written with.
        return {
            "k_codes": np.zeros(shape, np.uint8),
            "v_codes": np.zeros(shape, np.uint8),
            "k_scales": np.zeros(shape[:3], np.float32),
            "v_scales": np.zeros(shape[:3], np.float32),
        }

    def write_kv(self, config, cache, key, value, slot_mapping):
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        blocks, offsets = slots // config.block_size, slots % config.block_size
        if config.kv_cache is None:
            cache["k"][blocks, offsets] = key[keep]
            cache["v"][blocks, offsets] = value[keep]
            return
        fmt = config.kv_cache_dtype
        for which, rows in (("k", key[keep]), ("v", value[keep])):
            scales = write_scales(config, which, rows)
            per_token = config.kv_scales == "token"
            codes = fp8_quantize(rows, scales[..., None], fmt, reciprocal=per_token)
            cache[f"{which}_codes"][blocks, offsets] = codes
            cache[f"{which}_scales"][blocks, offsets] = scales

    def read_kv(self, config, cache, blocks, offsets):
        """K and V rows [L, num_kv_heads, D] (float64) at (blocks, offsets), as the kernel
        reads them: dequantized from an FP8 cache."""
        if config.kv_cache is None:
            return cache["k"][blocks, offsets], cache["v"][blocks, offsets]
        fmt = config.kv_cache_dtype
        return tuple(
            fp8_dequantize(
                cache[f"{w}_codes"][blocks, offsets], cache[f"{w}_scales"][blocks, offsets][..., None], fmt
            )
            for w in ("k", "v")
        )

    def read_query(self, config, query):
        """The query [n, num_heads, D] as the kernel reads it (float64): with an FP8 query,
        quantized to E4M3 with `q_scale` and read back, whatever the cache's format."""
        q_scale = (config.kv_cache or {}).get("q_scale")
        if q_scale is None:
            return query.astype(np.float64)
        return fp8_round_trip(query, np.float32(q_scale), "fp8_e4m3")

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
            k_rows, v_rows = self.read_kv(config, cache, blocks, pos % bs)
            k = self.expand_kv(config, k_rows)  # [L, Hq, D]
            v = self.expand_kv(config, v_rows)
            q = self.read_query(config, step.query[q0:q1])  # [n, Hq, D], float64
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
