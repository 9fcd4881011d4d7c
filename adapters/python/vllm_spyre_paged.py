"""vllm-spyre's own PyTorch-native attention backends as an attn-diff adapter.

Runs the upstream implementation itself, never a copy, and detects which backend the module
holds (the one subclass of vLLM's `AttentionBackend` defined in it):

- `spyre_attn.py`: `SpyreAttentionBackend` / `SpyreAttentionImpl`, branch
  `pytorch_native_attention` of vllm-project/vllm-spyre (head c6fd7f97 of 2026-04-02; a copy
  of that file, unchanged, is `fixtures/upstream/vllm-spyre/spyre_attn.py`);
- `spyre_paged_attn.py`: `SpyreAttentionPagedBackend` / `SpyreAttentionPagedImpl`, pull
  request #798.

Either is loaded from a file given with `--file`, or imported from an installed
`vllm_spyre_next` (the first of the two modules that imports). It is driven the way vLLM
drives an attention backend, translating attn-diff's inputs and changing nothing of upstream:

- **No Spyre device: a CPU stand-in.** `spyre_attn.py` computes its attention kernel on an
  IBM Spyre card through torch-spyre: it compiles the kernel with `torch.compile(...,
  dynamic=False)` and moves tensors with `convert(t, torch.device("spyre"), torch.float16)`
  from `vllm_spyre_next.custom_ops.utils`. This adapter has no Spyre card and no torch-spyre,
  so at load time, without editing upstream's file, it
  (1) registers the device name `spyre` with PyTorch (`torch.utils.rename_privateuse1_backend`)
  so that `torch.device("spyre")` can be built, with no device behind it: a tensor actually
  moved there fails loudly;
  (2) replaces the module's `convert` by a **dtype cast on the CPU** (`t.to(dtype)`; a move to
  a `spyre` device is dropped, any other device is honoured), and provides that function as
  `vllm_spyre_next.custom_ops.utils` when the package is not installed;
  (3) gives the module a `torch` whose `compile` returns the function unchanged, so the
  kernel **runs eagerly** on the CPU (`torch.compile(..., backend="eager")` is no option:
  TorchDynamo looks for a `torch.spyre` module behind the registered device name).
  What is tested is therefore upstream's Python and its PyTorch ops in float16 on CPU
  kernels: masks, gathers, padding, chunking, the transposed matmul formulation and float16
  rounding of every intermediate that upstream keeps in float16. What the Spyre compiler and
  card do with those ops (their own accumulation widths, fused softmax, stickified layouts)
  is not.
- **Capabilities** come from upstream's own class attributes and methods, read at start
  and mapped to attn-diff's keys (`docs/external-backends.md`), so cases are drawn inside
  what upstream supports rather than declined: `dtypes` from `supported_dtypes`; head sizes
  from `supports_head_size` over 1..1024 (`head_size_multiple_of` when the accepted sizes are
  exactly the multiples of one number, else `head_sizes`); block sizes from
  `get_supported_kernel_block_sizes` (`MultipleOf(m)`: `block_size_multiple_of`); `kinds`
  and `features` from one minimal case per kind and feature put through upstream's
  `validate_configuration` and its constructor (by keyword); `max_seqs` from one
  two-sequence step through `forward` (`spyre_attn.py` asserts one sequence per step: the
  probe's AssertionError makes it `max_seqs: 1`, so the assert is never reached by a case).
  KV caches are upstream's `auto` (FP8 caches are not declared: this adapter does not
  quantize). Whatever the keys cannot express is declined per case with upstream's reason.
  `ATTN_DIFF_SPYRE_DTYPES=bf16` (say) declares fewer dtypes, to look past a known
  divergence.
- **Selection.** vLLM refuses a backend whose `validate_configuration` names a reason (head
  size, dtype, block size, sinks, attention type, ...); those cases are `unsupported` with
  upstream's reasons.
- **Construction.** `--construct layer` (the default) passes the arguments as vLLM's
  `Attention` layer does: positionally, `(num_heads, head_size, scale, num_kv_heads,
  alibi_slopes, sliding_window, kv_cache_dtype, logits_soft_cap, attn_type,
  kv_sharing_target_layer_name, **extra_impl_args)`. `--construct keywords` passes them by
  name as upstream's own tests do, plus `use_sdpa` from `--mode`: the only way to reach the
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

    python vllm_spyre_paged.py --mode native|sdpa [--file spyre_attn.py|spyre_paged_attn.py]
        [--construct layer|keywords] [--padding runner|none] [--reference] [--probe]

`--probe` loads upstream, prints the description and the declared capabilities, and exits.
"""

import argparse
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
import time
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Config, Step, Unsupported, serve  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# Upstream allocates the whole cache as one tensor; attn-diff's huge-cache cases (140,000
# blocks) would take gigabytes per case.
MAX_CACHE_BYTES = int(float(os.environ.get("ATTN_DIFF_MAX_CACHE_GIB", "2")) * 2**30)
# The installed modules tried without --file, newest first.
UPSTREAM_MODULES = (
    "vllm_spyre_next.v1.attention.backends.spyre_attn",
    "vllm_spyre_next.v1.attention.backends.spyre_paged_attn",
)
SPYRE_UTILS = "vllm_spyre_next.custom_ops.utils"
# Head sizes asked of `supports_head_size` (attn-diff draws 1 to 576).
HEAD_SIZE_PROBE = range(1, 1025)


# -- the CPU stand-in for the Spyre device ---------------------------------------------------


def cpu_convert(tensor, device=None, dtype=None):
    """Upstream's `convert` (custom_ops/utils.py) with no Spyre device: the dtype cast only.

    A move to a `spyre` device is dropped, so the tensor stays on the CPU in `dtype`; a move
    to any other device is done as upstream does it.
    """
    if tensor is None:
        return None
    if dtype is not None:
        tensor = tensor.to(dtype=dtype)
    if device is not None and torch.device(device).type != "spyre":
        tensor = tensor.to(device=device)
    return tensor


class UpstreamTorch(types.ModuleType):
    """`torch` as upstream's module sees it: torch itself, except `compile`."""

    def __init__(self, compile_fn):
        super().__init__("torch")
        self.compile = compile_fn

    def __getattr__(self, name):
        return getattr(torch, name)


def register_spyre_device_name():
    """Let `torch.device("spyre")` be built (no device behind it). True if it was needed."""
    try:
        torch.device("spyre")
        return False
    except RuntimeError:
        torch.utils.rename_privateuse1_backend("spyre")
        return True


def provide_spyre_utils():
    """`vllm_spyre_next.custom_ops.utils` for upstream's import when the package is absent."""
    try:
        importlib.import_module(SPYRE_UTILS)
        return False
    except ImportError:
        pass
    parts = SPYRE_UTILS.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []  # a package, for the next import level
            sys.modules[name] = module
    sys.modules[SPYRE_UTILS].convert = cpu_convert
    return True


def upstream_spec(path):
    """The import spec of upstream's module: `path`, or the first installed module."""
    if path is not None:
        stem = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(f"{stem}_upstream", path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load {path}")
        return spec
    errors = []
    for name in UPSTREAM_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
            continue
        if spec is not None:
            return spec
        errors.append(f"{name}: not found")
    raise RuntimeError("no installed upstream module: " + "; ".join(errors))


def load_upstream(path):
    """Upstream's module, from `path` or the installed vllm-spyre-next, with the CPU
    stand-in for the Spyre device installed where its source uses one; returns (module,
    what was stood in)."""
    spec = upstream_spec(path)
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    stand_ins = []
    if '"spyre"' in source and register_spyre_device_name():
        stand_ins.append("device name 'spyre' registered with no device behind it")
    if SPYRE_UTILS in source and provide_spyre_utils():
        stand_ins.append(f"{SPYRE_UTILS} provided by this adapter")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    if SPYRE_UTILS in source and "convert" in vars(module):
        module.convert = cpu_convert
        stand_ins.append("convert(t, spyre, dtype) -> t.to(dtype) on the CPU")
    if "torch.compile" in source:
        module.torch = UpstreamTorch(lambda fn=None, **kwargs: fn)
        stand_ins.append("torch.compile -> the function itself (eager)")
    return module, stand_ins


def find_backend(module):
    """The one subclass of vLLM's AttentionBackend that `module` defines."""
    from vllm.v1.attention.backend import AttentionBackend

    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, AttentionBackend)
        and v is not AttentionBackend
        and v.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise RuntimeError(
            f"{module.__file__} defines {len(found)} attention backends "
            f"({', '.join(c.__name__ for c in found) or 'none'}); expected one"
        )
    return found[0]


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
    environment = ("ATTN_DIFF_SPYRE_DTYPES", "ATTN_DIFF_MAX_CACHE_GIB", "VLLM_*")

    def __init__(self, module, stand_ins, mode, construct, padding, reference):
        from vllm.v1.attention.backend import AttentionType
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        self.upstream = module
        self.backend = find_backend(module)
        self.stand_ins = stand_ins
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
        impl_params = list(inspect.signature(self.backend.get_impl_cls().__init__).parameters)
        # vLLM's Attention layer passes ten arguments after `self`; `use_sdpa` among them
        # receives one of the layer's (pull request #798), after them keeps its default.
        self.use_sdpa_position = (
            impl_params.index("use_sdpa") if "use_sdpa" in impl_params else None
        )
        self.capabilities = {}
        self.capability_notes = []
        self.capabilities = self.upstream_capabilities()
        kind = "paged" if self.backend.__name__ == "SpyreAttentionPagedBackend" else "attn"
        self.name = f"vllm-spyre-{kind}-{mode}" + ("-reference" if reference else "")
        import vllm

        self.description = (
            f"vllm-spyre {self.backend.__name__} ({mode}, construct={construct}"
            + (", float64 math" if reference else "")
            + f", padding={padding}"
            + f", {os.path.basename(module.__file__)} sha256 {source_digest(module)}"
            + f", vllm {vllm.__version__}, torch {torch.__version__}"
            + (", CPU stand-in for Spyre: " + "; ".join(stand_ins) if stand_ins else "")
            + ")"
        )

    # -- capabilities, from upstream's own class ---------------------------------------

    def upstream_capabilities(self):
        backend = self.backend
        caps = {}
        notes = self.capability_notes
        # dtypes: `supported_dtypes`, or fewer by request.
        dtypes = [DTYPE_NAMES[d] for d in backend.supported_dtypes if d in DTYPE_NAMES]
        wanted = os.environ.get("ATTN_DIFF_SPYRE_DTYPES")
        if wanted:
            dtypes = [d for d in dtypes if d in wanted.split(",")]
        caps["dtypes"] = dtypes
        notes.append(f"dtypes {dtypes} (supported_dtypes)")
        # head sizes: `supports_head_size`.
        heads = [h for h in HEAD_SIZE_PROBE if backend.supports_head_size(h)]
        if not heads:
            raise RuntimeError("upstream's supports_head_size accepts no head size in 1..1024")
        step = math.gcd(*heads)
        if heads == list(range(step, HEAD_SIZE_PROBE[-1] + 1, step)):
            if step > 1:
                caps["head_size_multiple_of"] = step
                notes.append(f"head_size_multiple_of {step} (supports_head_size)")
        else:
            caps["head_sizes"] = heads
            notes.append(f"head_sizes {len(heads)} sizes (supports_head_size)")
        # block sizes: `get_supported_kernel_block_sizes`.
        sizes = backend.get_supported_kernel_block_sizes()
        ints = [s for s in sizes if isinstance(s, int)]
        multiples = [s for s in sizes if not isinstance(s, int)]
        if multiples and not ints:
            m = math.gcd(*[int(s.base) for s in multiples])
            if m > 1:
                caps["block_size_multiple_of"] = m
                notes.append(f"block_size_multiple_of {m} (get_supported_kernel_block_sizes)")
        elif ints and not multiples:
            caps["block_sizes"] = sorted(ints)
            notes.append(f"block_sizes {sorted(ints)} (get_supported_kernel_block_sizes)")
        # Everything else from minimal cases put through upstream's selection and
        # constructor, by keyword (what the class implements; --construct layer still
        # applies to every case).
        base = dict(
            num_heads=2,
            num_kv_heads=1,
            head_size=heads[0],
            block_size=caps.get("block_size_multiple_of", caps.get("block_sizes", [1])[0]),
            dtype=dtypes[0] if dtypes else "f16",
            scale=heads[0] ** -0.5,
            kind="decoder",
            sliding_window=None,
            logits_soft_cap=None,
            alibi_slopes=None,
            sinks=None,
        )
        self.probe_config = Config(**base)

        def accepted(**changes):
            config = Config(**{**base, **changes})
            try:
                self.check(config)
                self.make_impl(config, construct="keywords")
                return True, None
            except Unsupported as refused:
                return False, str(refused)

        ok, why = accepted()
        if not ok:
            raise RuntimeError(f"upstream refuses the plainest case: {why}")
        kinds = ["decoder"]
        ok, why = accepted(kind="encoder_only")
        if ok:
            kinds.append("encoder_only")
        else:
            notes.append(f"no encoder_only: {why}")
        caps["kinds"] = kinds  # cross-attention: this adapter does not drive it
        features = []
        for feature, change in [
            ("sliding_window", dict(sliding_window=4)),
            ("logits_soft_cap", dict(logits_soft_cap=30.0)),
            ("alibi", dict(alibi_slopes=[0.5, 0.25])),
            ("sinks", dict(sinks=[0.5, -0.5])),
        ]:
            ok, why = accepted(**change)
            if ok:
                features.append(feature)
            else:
                notes.append(f"no {feature}: {why}")
        caps["features"] = features  # fp8_kv_cache: this adapter does not quantize
        # One sequence per step? One two-sequence step through forward says.
        limit = self.probe_max_seqs()
        if limit is not None:
            caps["max_seqs"] = 1
            notes.append(f"max_seqs 1: a two-sequence step raises {limit}")
        return caps

    def probe_max_seqs(self):
        """None if upstream's forward runs a two-sequence step, else what it raised."""
        config = self.probe_config
        bs, h, d = config.block_size, config.num_heads, config.head_size
        rng = np.random.default_rng(0)
        rows = lambda n, heads: rng.integers(-2, 3, (n, heads, d)).astype(np.float32)  # noqa: E731
        slots = np.array([1 * bs, 2 * bs], dtype=np.int64)
        step = Step(
            query=rows(2, h),
            query_start_loc=np.array([0, 1, 2]),
            query_lens=np.array([1, 1]),
            seq_lens=np.array([1, 1]),
            block_table=np.array([[1], [2]]),
            slot_mapping=slots,
            num_tokens=2,
        )
        cache = self.new_cache(config, 3, construct="keywords")
        self.write_kv(config, cache, rows(2, 1), rows(2, 1), slots)
        try:
            self.forward(config, cache, step)
        except AssertionError as e:
            return f"AssertionError: {e}"
        return None

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

    def make_impl(self, config, construct=None):
        construct = construct or self.construct
        impl_cls = self.backend.get_impl_cls()
        extra = {} if config.sinks is None else {"sinks": torch.tensor(config.sinks)}
        alibi = config.alibi_slopes
        try:
            if construct == "layer":
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
        if construct == "layer" and bool(impl.use_sdpa) != (self.mode == "sdpa"):
            if self.use_sdpa_position is not None and self.use_sdpa_position <= 10:
                how = f"use_sdpa receives alibi_slopes={alibi!r}"
            else:
                how = f"use_sdpa is not among its arguments and keeps {impl.use_sdpa!r}"
            raise Unsupported(f"vLLM's Attention layer cannot select the {self.mode} path ({how})")
        if self.reference:
            impl._compute_attention = types.MethodType(
                lambda s, q, k, v, m, *rest: reference_attention(s, q, k, v, m), impl
            )
        return impl

    # -- the adapter protocol ------------------------------------------------------------

    def new_cache(self, config, num_blocks, construct=None):
        impl = self.make_impl(config, construct)
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
    parser.add_argument(
        "--file", help="upstream spyre_attn.py or spyre_paged_attn.py (default: installed)"
    )
    parser.add_argument("--construct", choices=["layer", "keywords"], default="layer")
    parser.add_argument("--padding", choices=["runner", "none"], default="runner")
    parser.add_argument("--reference", action="store_true", help="float64 attention math")
    parser.add_argument("--probe", action="store_true", help="load upstream and exit")
    args = parser.parse_args()
    threads = os.environ.get("ATTN_DIFF_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    module, stand_ins = load_upstream(args.file)
    adapter = SpyrePaged(
        module, stand_ins, args.mode, args.construct, args.padding, args.reference
    )
    if args.probe:
        print(adapter.description)
        print("capabilities:", adapter.capabilities)
        for note in adapter.capability_notes:
            print("  " + note)
        return
    serve(adapter)


if __name__ == "__main__":
    main()
