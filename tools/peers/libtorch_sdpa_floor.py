"""Time libtorch's own scaled_dot_product_attention on contiguous, unpaged K/V of an upstream
batch spec: the floor under any backend written in libtorch tensor ops (it pays no gather,
no conversion and no paging, only the attention itself).

Shapes as attn-diff's spyre-sdpa uses them at best: one padded batch [B, Hkv, L_max, D],
the query heads of a kv head folded into query rows [B, Hkv, G * q_max, D] (libtorch 2.13's
CPU `enable_gqa` path is slower), a boolean visibility mask only when a sequence has more
than one query token (chunked prefill needs the causal offset that `is_causal` lacks).

Run with the same torch as the peer script (~/.cache/vllm-peer):
    python libtorch_sdpa_floor.py --spec large_decode [--dtype bfloat16] [--threads 2]
Prints one JSON line: median seconds of the SDPA call.
"""
import argparse, json, time
import torch

SPECS = {
    "small_decode": ([32, 40], [1, 1]),
    "small_prefill": ([32, 40], [8, 8]),
    "mixed_small": ([32, 40, 48, 56], [1, 1, 5, 5]),
    "medium_decode": ([128, 256, 512, 1024] * 2, [1] * 8),
    "medium_prefill": ([256, 512, 1024, 2048], [16] * 4),
    "mixed_medium": ([512, 1024, 2048] * 2, [1, 1, 1, 7, 7, 7]),
    "large_decode": ([2048] * 32, [1] * 32),
    "large_prefill": ([4096] * 8, [32] * 8),
    "mixed_large": ([1024, 2048, 4096] * 2, [1, 1, 1, 32, 32, 32]),
    "single_decode": ([1024], [1]),
    "single_prefill": ([1024], [64]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="large_decode", choices=sorted(SPECS))
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dt = getattr(torch, a.dtype)
    seq_lens, query_lens = SPECS[a.spec]
    b, g = len(seq_lens), a.hq // a.hkv
    lmax, qmax = max(seq_lens), max(query_lens)
    q = torch.randn(b, a.hkv, g * qmax, a.d).to(dt)
    k = torch.randn(b, a.hkv, lmax, a.d).to(dt)
    v = torch.randn(b, a.hkv, lmax, a.d).to(dt)
    # Key j is visible to query row i of sequence s when j <= position(i) and j < seq_len.
    keys = torch.arange(lmax)
    visible = torch.zeros(b, qmax, lmax, dtype=torch.bool)
    for s, (l, ql) in enumerate(zip(seq_lens, query_lens)):
        pos = torch.arange(qmax).clamp(max=ql - 1) + (l - ql)
        visible[s] = keys[None, :] <= pos[:, None]
    mask = None
    if qmax > 1 or len(set(seq_lens)) > 1:
        mask = visible[:, None, None].expand(b, 1, g, qmax, lmax).reshape(b, 1, g * qmax, lmax)
    scale = a.d ** -0.5
    call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    call()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"backend": "libtorch-sdpa-contiguous", "spec": a.spec, "dtype": a.dtype,
                      "threads": a.threads, "median_s": times[len(times) // 2], "min_s": times[0]}))


if __name__ == "__main__":
    main()
