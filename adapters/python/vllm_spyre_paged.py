"""vllm-spyre's own paged attention (`SpyreAttentionPaged`) as an attn-diff adapter.

Runs the upstream implementation itself, never a copy: `spyre_paged_attn.py` of the
vllm-spyre-next package (vllm-project/vllm-spyre, pull request #798), imported from an
installed `vllm_spyre_next` or loaded from a file given with `--file`. It is driven the way
vLLM drives an attention backend, translating attn-diff's inputs and changing nothing of
upstream:

- **Selection.** vLLM refuses a backend whose `validate_configuration` names a reason (head
  size, dtype, block size, sinks, attention type, ...); those cases are `unsupported` with
  upstream's reasons.
- **Construction.** `--construct layer` (the default) passes the arguments as vLLM's
  `Attention` layer does: positionally, `(num_heads, head_size, scale, num_kv_heads,
  alibi_slopes, sliding_window, kv_cache_dtype, logits_soft_cap, attn_type,
  kv_sharing_target_layer_name, **extra_impl_args)`. `--construct keywords` passes them by
  name as upstream's own test does, plus `use_sdpa` from `--mode`: the only way to reach the
  SDPA path. Whatever the constructor raises (NotImplementedError, TypeError) is
  `unsupported` with upstream's message.
- **Metadata** comes from upstream's metadata builder, built from vLLM's own
  `CommonAttentionMetadata` and `FullAttentionSpec` as the model runner fills them: with
  `--padding runner` (the default) `num_actual_tokens` is the padded token count and
  `slot_mapping` covers every token, -1 for padding tokens (vLLM's `_get_slot_mapping`
  when the batch is padded); with `--padding none` the padding tokens are dropped before
  the call, as when the runner does not pad (`num_tokens_padded == num_tokens`). Tensors
  are int32 except the int64 slot mapping.
- **The cache** has upstream's shape (`get_kv_cache_shape`) in the model dtype. Every earlier
  write (stale data, the context) goes through upstream's own write path
  (`_write_to_kv_cache`) with the real slots only, as the earlier steps of a real engine
  would have written them; the step's own K/V are written by upstream's `forward`, with the
  step's padded slot mapping.

`--reference` swaps only the attention math (`_compute_attention`) for plain float64
torch: every divergence left then comes from the glue (this file and upstream's metadata,
cache write, gather and masks), so a clean `--reference` run proves the adapter adds none.

The metadata builder reads `vllm_config.model_config.get_num_attention_heads(parallel_config)`
and `get_num_kv_heads(...)`; a real `VllmConfig` needs a Hugging Face model config, which
needs the network, so the builder gets a stand-in answering those two calls with the case's
head counts (the values a real config would give; nothing else of it is read).

    python vllm_spyre_paged.py --mode native|sdpa [--file spyre_paged_attn.py]
        [--construct layer|keywords] [--padding runner|none] [--reference] [--probe]
"""

import argparse
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Unsupported, serve  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# Upstream allocates the whole cache as one tensor; attn-diff's huge-cache cases (140,000
# blocks) would take gigabytes per case.
MAX_CACHE_BYTES = int(float(os.environ.get("ATTN_DIFF_MAX_CACHE_GIB", "2")) * 2**30)
UPSTREAM_MODULE = "vllm_spyre_next.v1.attention.backends.spyre_paged_attn"


def load_upstream(path):
    """Upstream's module: from `path`, or the installed vllm-spyre-next."""
    if path is None:
        return importlib.import_module(UPSTREAM_MODULE)
    spec = importlib.util.spec_from_file_location("spyre_paged_attn_upstream", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_digest(module) -> str:
    with open(module.__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def reference_attention(impl, query, key, value, mask):
    """Plain float64 attention with upstream's shapes and mask convention (True = masked)."""
    b, q_len, h, d = query.shape
    group = impl.num_queries_per_kv
    q = query.transpose(1, 2).to(torch.float64)  # [B, H, q, D]
    k = key.transpose(1, 2).to(torch.float64).repeat_interleave(group, dim=1)
    v = value.transpose(1, 2).to(torch.float64).repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * impl.scale
    scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)
    return torch.matmul(weights, v).to(query.dtype).transpose(1, 2)


class ModelConfigStandIn:
    """The two calls upstream's metadata builder makes on `vllm_config.model_config`."""

    def __init__(self, num_heads, num_kv_heads):
        self._heads = (num_heads, num_kv_heads)

    def get_num_attention_heads(self, parallel_config):
        return self._heads[0]

    def get_num_kv_heads(self, parallel_config):
        return self._heads[1]


class SpyrePaged(Adapter):
    # Upstream's `supported_dtypes`; ATTN_DIFF_SPYRE_DTYPES=bf16 (say) declares fewer, to
    # look past a known divergence.
    capabilities = {"dtypes": os.environ.get("ATTN_DIFF_SPYRE_DTYPES", "f32,bf16,f16").split(",")}

    def __init__(self, module, mode, construct, padding, reference):
        from vllm.v1.attention.backend import AttentionType
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        self.upstream = module
        self.backend = module.SpyreAttentionPagedBackend
        self.mode = mode
        self.construct = construct
        self.padding = padding
        self.reference = reference
        self.attention_type = AttentionType
        self.full_attention_spec = FullAttentionSpec
        # The selection arguments this vLLM's `validate_configuration` takes (they vary by
        # release), read once rather than per case.
        self.selection_params = set(
            inspect.signature(self.backend.validate_configuration).parameters
        )
        self.name = f"vllm-spyre-paged-{mode}" + ("-reference" if reference else "")
        import vllm

        self.description = (
            f"vllm-spyre SpyreAttentionPaged ({mode}, construct={construct}"
            + (", float64 math" if reference else "")
            + f", padding={padding}"
            + f", {os.path.basename(module.__file__)} sha256 {source_digest(module)}"
            + f", vllm {vllm.__version__}, torch {torch.__version__})"
        )

    # -- selection and construction, as vLLM does them ---------------------------------

    def attn_type(self, config):
        return {
            "decoder": self.attention_type.DECODER,
            "encoder_only": self.attention_type.ENCODER_ONLY,
        }[config.kind]

    def check(self, config):
        if config.num_heads % config.num_kv_heads:
            raise Unsupported("num_heads not a multiple of num_kv_heads")
        wanted = {
            "head_size": config.head_size,
            "dtype": DTYPES[config.dtype],
            "kv_cache_dtype": "auto",
            "block_size": config.block_size,
            "use_mla": False,
            "has_sink": config.sinks is not None,
            "use_sparse": False,
            "use_mm_prefix": False,
            "use_per_head_quant_scales": False,
            "device_capability": None,
            "attn_type": self.attn_type(config),
            "has_sliding_window": config.sliding_window is not None,
            "use_non_causal": config.kind != "decoder",
        }
        reasons = self.backend.validate_configuration(
            **{k: v for k, v in wanted.items() if k in self.selection_params}
        )
        if reasons:
            raise Unsupported("upstream backend refuses: " + "; ".join(reasons))

    def make_impl(self, config):
        impl_cls = self.backend.get_impl_cls()
        extra = {} if config.sinks is None else {"sinks": torch.tensor(config.sinks)}
        alibi = config.alibi_slopes
        try:
            if self.construct == "layer":
                impl = impl_cls(
                    config.num_heads,
                    config.head_size,
                    config.scale,
                    config.num_kv_heads,
                    alibi,
                    config.sliding_window,
                    "auto",
                    config.logits_soft_cap,
                    self.attn_type(config),
                    None,
                    **extra,
                )
            else:
                impl = impl_cls(
                    num_heads=config.num_heads,
                    head_size=config.head_size,
                    scale=config.scale,
                    num_kv_heads=config.num_kv_heads,
                    use_sdpa=self.mode == "sdpa",
                    alibi_slopes=alibi,
                    sliding_window=config.sliding_window,
                    kv_cache_dtype="auto",
                    logits_soft_cap=config.logits_soft_cap,
                    attn_type=self.attn_type(config),
                    kv_sharing_target_layer_name=None,
                    **extra,
                )
        except (NotImplementedError, TypeError, ValueError) as refused:
            raise Unsupported(f"upstream constructor: {type(refused).__name__}: {refused}")
        if self.construct == "layer" and bool(impl.use_sdpa) != (self.mode == "sdpa"):
            raise Unsupported(
                f"vLLM's Attention layer cannot select the {self.mode} path "
                f"(use_sdpa receives alibi_slopes={alibi!r})"
            )
        if self.reference:
            impl._compute_attention = types.MethodType(
                lambda s, q, k, v, m: reference_attention(s, q, k, v, m), impl
            )
        return impl

    # -- the adapter protocol ------------------------------------------------------------

    def new_cache(self, config, num_blocks):
        impl = self.make_impl(config)
        shape = self.backend.get_kv_cache_shape(
            num_blocks, config.block_size, config.num_kv_heads, config.head_size, "auto"
        )
        size = DTYPES[config.dtype].itemsize
        for n in shape:
            size *= n
        if size > MAX_CACHE_BYTES:
            raise Unsupported(
                f"a KV cache of {size / 2**30:.1f} GiB is over this machine's limit "
                f"(ATTN_DIFF_MAX_CACHE_GIB={MAX_CACHE_BYTES / 2**30:g})"
            )
        return {
            "impl": impl,
            "kv": torch.zeros(shape, dtype=DTYPES[config.dtype]),
            "pending": None,
        }

    def write_kv(self, config, cache, key, value, slot_mapping):
        # The last write is the step's own K/V, which upstream's forward writes; every
        # earlier one is what earlier steps wrote, through upstream's write path.
        self.flush(config, cache)
        cache["pending"] = (key, value, slot_mapping)

    def flush(self, config, cache):
        if cache["pending"] is None:
            return
        key, value, slots = cache["pending"]
        cache["pending"] = None
        real = slots >= 0
        if not real.any():
            return
        dtype = cache["kv"].dtype
        cache["impl"]._write_to_kv_cache(
            torch.from_numpy(key[real]).to(dtype),
            torch.from_numpy(value[real]).to(dtype),
            cache["kv"],
            torch.from_numpy(slots[real]),
            config.block_size,
        )

    def metadata(self, config, step, num_tokens):
        from vllm.v1.attention.backend import CommonAttentionMetadata

        i32 = lambda a: torch.from_numpy(a).to(torch.int32)  # noqa: E731
        qsl = i32(step.query_start_loc)
        seq_lens = i32(step.seq_lens)
        common = CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl.clone(),
            seq_lens=seq_lens,
            num_reqs=len(step.seq_lens),
            num_actual_tokens=num_tokens,
            max_query_len=int(step.query_lens.max()),
            max_seq_len=int(step.seq_lens.max()),
            block_table_tensor=i32(step.block_table),
            slot_mapping=torch.from_numpy(step.slot_mapping).to(torch.int64),
            causal=config.kind == "decoder",
        )
        spec = self.full_attention_spec(
            block_size=config.block_size,
            num_kv_heads=config.num_kv_heads,
            head_size=config.head_size,
            dtype=DTYPES[config.dtype],
        )
        vllm_config = types.SimpleNamespace(
            model_config=ModelConfigStandIn(config.num_heads, config.num_kv_heads),
            parallel_config=None,
        )
        builder = self.backend.get_builder_cls()(
            spec, ["layers.0.self_attn"], vllm_config, torch.device("cpu")
        )
        return builder.build(common_prefix_len=0, common_attn_metadata=common)

    def forward(self, config, cache, step):
        dtype = cache["kv"].dtype
        key, value, slots = cache["pending"]
        cache["pending"] = None
        if len(slots) != step.num_tokens:
            raise RuntimeError(f"last write has {len(slots)} rows, the step {step.num_tokens}")
        # Padding tokens come last; without runner padding the call sees real tokens only.
        n = step.num_tokens if self.padding == "runner" else int(step.query_start_loc[-1])
        step.slot_mapping = step.slot_mapping[:n]
        metadata = self.metadata(config, step, n)
        query = torch.from_numpy(step.query[:n]).to(dtype)
        # vLLM allocates the output with torch.empty; zeros keep padding rows finite.
        output = torch.zeros(step.num_tokens, config.num_heads, config.head_size, dtype=dtype)
        t0 = time.perf_counter()
        cache["impl"].forward(
            None,
            query,
            torch.from_numpy(key[:n]).to(dtype),
            torch.from_numpy(value[:n]).to(dtype),
            cache["kv"],
            metadata,
            output=output[:n],
        )
        elapsed = time.perf_counter() - t0
        return output.float().numpy(), elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["native", "sdpa"], default="native")
    parser.add_argument("--file", help="upstream spyre_paged_attn.py (default: installed)")
    parser.add_argument("--construct", choices=["layer", "keywords"], default="layer")
    parser.add_argument("--padding", choices=["runner", "none"], default="runner")
    parser.add_argument("--reference", action="store_true", help="float64 attention math")
    parser.add_argument("--probe", action="store_true", help="load upstream and exit")
    args = parser.parse_args()
    threads = os.environ.get("ATTN_DIFF_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    adapter = SpyrePaged(
        load_upstream(args.file), args.mode, args.construct, args.padding, args.reference
    )
    if args.probe:
        print(adapter.description)
        return
    serve(adapter)


if __name__ == "__main__":
    main()
