#!/usr/bin/env python3
"""large_decode and large_prefill (bf16, 32/8 heads, D 128, block 32): the time of gathering
the K/V pages into contiguous memory, against the time of SDPA on contiguous K/V."""
import time, torch, torch.nn.functional as F
torch.set_num_threads(2)
def med(f, n=10):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e3
for name, b, L, q in [("large_decode", 32, 2048, 1), ("large_prefill", 8, 4096, 32)]:
    bs, hkv, g, d = 32, 8, 4, 128
    nb = b * L // bs
    cache = torch.randn(nb + 1, bs, hkv, d).to(torch.bfloat16)
    ids = torch.randperm(nb)[: nb] + 1
    out = torch.empty(nb, bs, hkv, d, dtype=torch.bfloat16)
    gather = lambda: torch.index_select(cache, 0, ids, out=out)
    k = out.view(b, L, hkv, d).transpose(1, 2)
    qq = torch.randn(b, hkv, g * q, d).to(torch.bfloat16)
    mask = None if q == 1 else torch.ones(b, 1, g * q, L, dtype=torch.bool).tril(L - q)
    kc, vc = k.contiguous(), k.contiguous()
    sdpa_strided = lambda: F.scaled_dot_product_attention(qq, k, k, attn_mask=mask)
    sdpa_contig = lambda: F.scaled_dot_product_attention(qq, kc, vc, attn_mask=mask)
    print(f"{name}: gather K or V {med(gather):.1f} ms (x2 for K and V); SDPA on the gathered (strided) view {med(sdpa_strided):.1f} ms; on contiguous [b, Hkv, L, D] {med(sdpa_contig):.1f} ms")
