"""Any vLLM v1 attention backend class as an attn-diff adapter, driven as vLLM drives it.

    python vllm_backend.py --class vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend
    python vllm_backend.py --class CPU_ATTN                   # a name in vLLM's backend registry
    python vllm_backend.py --file my_plugin/attention.py --class MyBackend
    python vllm_backend.py --class CPU_ATTN --probe           # load it, print what it declares
    python vllm_backend.py --list                             # every registry backend: loads or not
    python vllm_backend.py --file plugin/v1/attention/backends/attn.py --selection platform --probe

The backend class is never copied or patched; per cache (a case, or a serving trace's session
under protocol version 2) this does what vLLM's model runner does with it:

- **Selection.** The capabilities sent in the handshake are what the class declares, mapped to
  attn-diff's keys: ``supported_dtypes`` to ``dtypes``; ``get_supported_head_sizes`` /
  ``supports_head_size`` (probed over every size attn-diff draws) to ``head_sizes`` or
  ``head_size_multiple_of``; ``get_supported_kernel_block_sizes`` to ``block_sizes`` or
  ``block_size_multiple_of`` (sizes the kernel runs unsplit); ``supported_kv_cache_dtypes``
  to ``kv_cache_dtypes``; ``supports_attn_type`` to ``kinds``; ``supports_sliding_window``
  and ``supports_sink`` to ``features`` (soft-cap and ALiBi are not declared by vLLM's
  interface: the impl's constructor refuses them when it cannot run them);
  ``supports_per_head_quant_scales`` (with an FP8 cache) to ``kv_head_scales`` and
  ``supports_kv_cache_dtype("fp8_per_token_head")`` (with an E4M3 cache) to
  ``kv_token_scales``;
  ``supports_batch_invariance``, under ``VLLM_BATCH_INVARIANT=1`` (the mode it promises it
  in), to ``batch_invariant``. Per case,
  ``validate_configuration`` (what vLLM's selector calls) gives the remaining refusals:
  a case it finds reasons against is ``unsupported`` with upstream's reasons.
- **Construction.** vLLM's own ``Attention`` layer is built with the class as its backend
  (``attn_backend=``), under a ``VllmConfig`` whose ``model_config`` is a stand-in (a real one
  needs a Hugging Face model config), with ``CacheConfig(block_size, cache_dtype)``,
  ``per_layer_sliding_window``, the soft-cap, ALiBi slopes and sinks (float32) as a model
  passes them; so the impl gets its arguments positionally as in a model, and whatever the
  layer or the impl raises is ``unsupported`` with upstream's message. Encoder-only and
  cross-attention layers wrap the class as ``EncoderOnlyAttention`` and ``CrossAttention``
  do (``create_encoder_only_attention_backend``, ``create_cross_attention_backend``). FP8
  caches get the case's k/v scales after ``process_weights_after_loading``, as a
  checkpoint's scales arrive: per-head scales as ``[num_kv_heads]`` float32 ``_k_scale`` /
  ``_v_scale`` buffers (compressed-tensors' ``attn_head`` strategy, selected with
  ``use_per_head_quant_scales``); a per-token case is the cache dtype
  ``fp8_per_token_head``, whose scales the backend computes as it writes.
- **The cache** is laid out as the runner lays it out: the layer's KV-cache spec
  (``FullAttentionSpec`` / ``SlidingWindowSpec``, ``EncoderOnlyAttentionSpec``,
  ``CrossAttentionSpec``) at the case's block size, the backend's preferred layout
  (``supported_kv_cache_layouts``), a zeroed int8 buffer viewed per layer by vLLM's
  ``create_kv_cache_views``; a class with the older ``get_kv_cache_shape`` gets a tensor of
  that shape instead.
- **Writes.** Every write goes through the impl's ``do_kv_cache_update`` (vLLM's
  ``unified_kv_cache_update``) when the backend's ``forward`` does not include the update;
  when it does, earlier steps' writes go through ``do_kv_cache_update`` or
  ``_write_to_kv_cache`` if the impl has one, and the step's own K/V through ``forward``.
- **Metadata** comes from the backend's own builder (``get_builder_cls()``), built once per
  cache from the spec, the layer name and the config, fed vLLM's ``CommonAttentionMetadata``
  as the runner fills it (int32 ``query_start_loc``, ``seq_lens``, block table; int64 slot
  mapping; positions; ``seq_lens_cpu_upper_bound``). With ``--padding runner`` (the default)
  ``num_actual_tokens`` is the padded token count and padding tokens carry slot -1, as when
  the runner pads a batch; ``--padding none`` drops them first.
- **The step** is ``impl.forward(layer, query, key, value, kv_cache, metadata,
  output=...)`` (vLLM's ``unified_attention_with_output``), with the layer's query
  quantization applied first when it has one. The output is zero-filled (vLLM uses
  ``torch.empty``) so padding rows stay finite.

**A platform plugin's backend** (spyre-inference's, say) runs through the same steps: `--file`
imports it from its plugin's source tree with a CPU stand-in for its device
(`plugin_loader.py`); `--kv-cache` and `--kv-write` give it the cache its own runner allocates
and its own write path (`plugin_kv_cache.py`); `--selection platform` finds what it runs when
its platform names it without vLLM's validation (`platform_probe.py`); `--construct keywords`
and `--impl-arg` build an impl whose parameters are not in the layer's order. The differences
between vLLM 0.27 and 0.34 are found by detection (`vllm_compat.py`), and what a class lacks
is one line naming the interface. `docs/external-backends.md` has the whole of it.

A class's own code can differ from the class vLLM would pick on a given platform; this runs
the class named, on the CPU. ``ATTN_DIFF_MAX_CACHE_GIB`` (default 8) bounds the cache
allocated per case (attn-diff's huge-cache cases would take gigabytes); ``ATTN_DIFF_THREADS``
sets torch's threads. ``ATTN_DIFF_VLLM_FEATURES=sliding_window,sinks`` (say) declares fewer
features, to look past a known divergence.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import sys
import time
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Capabilities, Config, Step, Unsupported, protect_stdout, serve  # noqa: E402
import plugin_kv_cache  # noqa: E402
import platform_probe  # noqa: E402
import plugin_loader  # noqa: E402
import vllm_compat  # noqa: E402
from vllm_compat import MissingInterface  # noqa: E402

import torch  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
#: vLLM's `kv_cache_dtype` strings for attn-diff's KV-cache dtypes.
VLLM_KV_CACHE_DTYPE = {"auto": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
#: ... and with per-token-and-head scales (`config.kv_scales == "token"`, E4M3 only).
VLLM_PER_TOKEN_KV_CACHE_DTYPE = {"fp8_e4m3": vllm_compat.PER_TOKEN_HEAD_FP8}
#: The sizes attn-diff draws (head sizes up to 576, block sizes up to 256).
DRAWN_HEAD_SIZES = range(1, 577)
DRAWN_BLOCK_SIZES = range(1, 257)
MAX_CACHE_BYTES = int(float(os.environ.get("ATTN_DIFF_MAX_CACHE_GIB", "8")) * 2**30)
LAYER_NAME = "model.layers.0.self_attn.attn"


# ---- loading the class --------------------------------------------------------------------


def load_backend(
    name: Optional[str], file: Optional[str] = None, stand_in: str = "auto", notes: Optional[List[str]] = None
) -> type:
    """The backend class: `name` in the Python file `file` (the one backend it defines when
    `name` is None), imported from its plugin's source tree with the device stand-in
    (`plugin_loader`); else ``module.path:Class`` (or ``module.path.Class``); else a name in
    vLLM's backend registry (``CPU_ATTN``)."""
    if file is not None:
        from vllm.v1.attention.backend import AttentionBackend

        loaded = plugin_loader.load_file(file, stand_in)
        if notes is not None:
            notes.extend(loaded.notes)
        if name is None:
            return plugin_loader.only_backend(loaded.module, AttentionBackend)
        return _attr_path(loaded.module, name)
    if name is None:
        raise ValueError("--class is required without --file")
    if ":" in name:
        module_name, qualname = name.split(":", 1)
        return _attr_path(importlib.import_module(module_name), qualname)
    if "." in name:
        module_name, qualname = name.rsplit(".", 1)
        return _attr_path(importlib.import_module(module_name), qualname)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def _attr_path(obj: Any, qualname: str) -> type:
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{qualname} is not a class")
    return obj


# ---- what the class declares --------------------------------------------------------------


def _sizes(ok: Callable[[int], bool], drawn: Iterable[int]) -> Tuple[Optional[List[int]], Optional[int]]:
    """(list, multiple): None, None when every drawn size is accepted; (None, m) when exactly
    the multiples of m are; else the accepted sizes."""
    drawn = list(drawn)
    accepted = [s for s in drawn if ok(s)]
    if len(accepted) == len(drawn):
        return None, None
    if accepted:
        m = accepted[0]
        if accepted == [s for s in drawn if s % m == 0]:
            return None, m
    return accepted, None


def vllm_kv_cache_dtype(config: Config) -> str:
    """vLLM's `kv_cache_dtype` for the case's cache: "fp8_per_token_head" for per-token
    scales, else the format's name."""
    if config.kv_scales == "token":
        dtype = VLLM_PER_TOKEN_KV_CACHE_DTYPE.get(config.kv_cache_dtype)
        if dtype is None:
            raise Unsupported(f"per-token scales on a {config.kv_cache_dtype} cache: vLLM has none")
        return dtype
    return VLLM_KV_CACHE_DTYPE[config.kv_cache_dtype]


def kernel_block_ok(backend: type, block_size: int, spec: Any = None) -> bool:
    """Whether the backend's kernel runs `block_size` itself (a listed size or a multiple of
    a ``MultipleOf``): vLLM's `supports_block_size` also accepts multiples of a listed size,
    which the runner splits into kernel blocks; that path is not driven here."""
    from vllm.v1.attention.backend import MultipleOf

    sizes = vllm_compat.kernel_block_sizes(backend, spec)
    if not sizes:
        return True
    return any(
        (block_size % s.base == 0) if isinstance(s, MultipleOf) else s == block_size for s in sizes
    )


def capabilities_of(backend: type) -> Capabilities:
    """The class's declarations as attn-diff capabilities."""
    from vllm.v1.attention.backend import AttentionType

    caps: Capabilities = {}
    names = {v: k for k, v in DTYPES.items()}
    caps["dtypes"] = [names[d] for d in backend.supported_dtypes if d in names]
    head_sizes, head_multiple = _sizes(backend.supports_head_size, DRAWN_HEAD_SIZES)
    if head_sizes is not None:
        caps["head_sizes"] = head_sizes
    if head_multiple is not None:
        caps["head_size_multiple_of"] = head_multiple
    block_sizes, block_multiple = _sizes(
        lambda b: backend.supports_block_size(b) and kernel_block_ok(backend, b), DRAWN_BLOCK_SIZES
    )
    if block_sizes is not None:
        caps["block_sizes"] = block_sizes
    if block_multiple is not None:
        caps["block_size_multiple_of"] = block_multiple
    kinds = {
        "decoder": AttentionType.DECODER,
        "encoder_only": AttentionType.ENCODER_ONLY,
        "encoder_decoder": AttentionType.ENCODER_DECODER,
    }
    caps["kinds"] = [k for k, t in kinds.items() if backend.supports_attn_type(t)]
    features = ["logits_soft_cap", "alibi"]
    if backend.supports_sliding_window():
        features.append("sliding_window")
    if backend.supports_sink():
        features.append("sinks")
    # vLLM 0.33: per-request causality in the paged decoder path (older releases have no
    # such method and run every decoder request causally).
    supports_non_causal = getattr(backend, "supports_non_causal", None)
    if callable(supports_non_causal) and supports_non_causal():
        features.append("non_causal")
    # vLLM 0.33: PrefixLM ranges (`mm_req_doc_ranges`) and R-SWA (`rswa_prefix_lens`).
    for method, feature in (("supports_mm_prefix", "prefix_lm"), ("supports_rswa", "rswa")):
        supports = getattr(backend, method, None)
        if callable(supports) and supports():
            features.append(feature)
    kv = [k for k, v in VLLM_KV_CACHE_DTYPE.items() if backend.supports_kv_cache_dtype(v)]
    if "fp8_e4m3" not in kv and backend.supports_kv_cache_dtype("fp8"):
        kv.append("fp8_e4m3")
    caps["kv_cache_dtypes"] = kv
    if any(k != "auto" for k in kv):
        features.append("fp8_kv_cache")
    features.extend(vllm_compat.kv_scale_features(backend, kv))
    only = os.environ.get("ATTN_DIFF_VLLM_FEATURES")
    if only is not None:
        wanted = [f for f in only.split(",") if f]
        features = [f for f in features if f in wanted]
        if "fp8_kv_cache" not in features:
            caps["kv_cache_dtypes"] = [k for k in kv if k == "auto"]
            features = [f for f in features if f not in ("kv_head_scales", "kv_token_scales")]
    caps["features"] = features
    # vLLM declares batch invariance per class (`supports_batch_invariance`, vllm#40193), and
    # promises it only in its batch-invariant mode: the claim is judged when the adapter runs
    # under VLLM_BATCH_INVARIANT=1, and is otherwise measured drift.
    supports_invariance = getattr(backend, "supports_batch_invariance", None)
    if (
        callable(supports_invariance)
        and supports_invariance()
        and os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0")
    ):
        caps["batch_invariant"] = True
    return caps


def causal_of(config: Config, step: Step) -> Any:
    """`CommonAttentionMetadata.causal` as vLLM 0.33's runner sets it: a bool for the whole
    batch (False when every real request is non-causal), else one int32 flag per request."""
    if config.kind != "decoder":
        return False
    if step.causal is None or step.causal.all():
        return True
    real = step.query_lens > 0
    if not step.causal[real].any():
        return False
    # One int32 flag per request, as the kernels read it (vLLM 0.33's per-seq causal).
    return torch.from_numpy(step.causal.astype("int32"))


def request_masks(cache: Session, step: Step) -> Dict[str, Any]:
    """vLLM 0.33's PrefixLM ranges and R-SWA prefixes as `CommonAttentionMetadata` holds
    them (`mm_req_doc_ranges`: request -> [(start, end)], ends inclusive; `rswa_prefix_lens`:
    int32 per request), and Gemma 4's clamp as the layer attribute kernels read."""
    out: Dict[str, Any] = {}
    if step.prefix_lm_ranges is not None and len(step.prefix_lm_ranges):
        out["mm_req_doc_ranges"] = {
            s: step.ranges_of(s) for s in range(len(step.seq_lens)) if step.ranges_of(s)
        }
        setattr(cache.layer, "mm_prefix_clamp_sliding_window", step.prefix_lm_clamp)
    if step.rswa_prefix_lens is not None:
        out["rswa_prefix_lens"] = torch.from_numpy(step.rswa_prefix_lens.astype("int32"))
    return out


def describe(backend: type) -> str:
    import vllm

    return (
        f"{backend.__module__}.{backend.__qualname__} ({backend.get_name()}), "
        f"vllm {vllm.__version__}, torch {torch.__version__}"
    )


# ---- the stand-ins for a model ------------------------------------------------------------


class ModelConfigStandIn:
    """What attention layers, impls and metadata builders read of `model_config`, answered
    from the case; anything else is an AttributeError naming the attribute (a real
    ModelConfig needs a Hugging Face model config)."""

    def __init__(self, config: Config, max_model_len: int) -> None:
        self.dtype = DTYPES[config.dtype]
        self.max_model_len = max_model_len
        self.is_mm_prefix_lm = False
        self.rswa_window = None
        self.use_mla = False
        self.is_encoder_decoder = config.kind == "encoder_decoder"
        self.head_size = config.head_size
        self._heads = (config.num_heads, config.num_kv_heads)

    def get_num_attention_heads(self, parallel_config: Any = None) -> int:
        return self._heads[0]

    def get_num_kv_heads(self, parallel_config: Any = None) -> int:
        return self._heads[1]

    def get_head_size(self) -> int:
        return self.head_size

    def get_sliding_window(self) -> Optional[int]:
        return None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the model-config stand-in has no {name!r} (vllm_backend.py)")


def per_head_scales(config: Config, which: str) -> List[float]:
    """The case's per-head scales of K or V ("k", "v"), one per kv head (a list drawn for
    more heads fitted as attn-diff fits it: its first ones, repeated)."""
    listed = [float(s) for s in config.kv_cache["scales"][which]]
    return [listed[h % len(listed)] for h in range(config.num_kv_heads)]


def set_per_head_scales(layer: Any, config: Config) -> None:
    """Per-head scales as a checkpoint with compressed-tensors' ``attn_head`` strategy leaves
    them after loading (`CompressedTensorsKVCacheMethod.process_weights_after_loading`):
    ``_k_scale`` / ``_v_scale`` float32 buffers of shape [num_kv_heads] (FlashAttention 3
    expands them to its (num_seqs, num_kv_heads) descale), ``_*_scale_float`` and the host
    copies ``_*_scale_cpu`` their largest."""
    for which in ("k", "v"):
        scales = torch.tensor(per_head_scales(config, which), dtype=torch.float32)
        layer.register_buffer(f"_{which}_scale", scales)
        largest = float(scales.max())
        setattr(layer, f"_{which}_scale_float", largest)
        getattr(layer, f"_{which}_scale_cpu").fill_(largest)


class Session:
    """One layer, cache and builder: what a model runner holds for one attention layer."""

    def __init__(self, layer: Any, kv_cache: Any, spec: Any, backend: type) -> None:
        self.layer = layer
        self.impl = layer.impl
        self.kv_cache = kv_cache
        self.spec = spec
        self.backend = backend
        self.builder: Any = None
        self.builder_limits: Tuple[int, int] = (0, 0)
        #: The R-SWA window the builder was made with (builders read it at construction).
        self.builder_rswa: Optional[int] = None
        self.pending: Optional[Tuple[Any, Any, Any]] = None


class VllmBackend(Adapter):
    """attn-diff adapter around a vLLM v1 AttentionBackend class."""
    #: What changes the run: this adapter's settings, and vLLM's own (it reads VLLM_* at
    #: import and at construction).
    environment = ("ATTN_DIFF_VLLM_FEATURES", "ATTN_DIFF_MAX_CACHE_GIB", "VLLM_*")

    def __init__(
        self,
        backend: type,
        padding: str = "runner",
        kv_cache: str = "auto",
        kv_write: str = "auto",
        impl_args: Optional[Dict[str, Any]] = None,
        notes: Sequence[str] = (),
        selection: str = "declared",
        kinds: Optional[List[str]] = None,
        construct: str = "layer",
    ) -> None:
        from vllm.config import VllmConfig
        from vllm.v1.attention.backend import AttentionType
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        if backend.is_mla() or backend.is_sparse():
            raise SystemExit(
                f"{backend.get_name()} is an MLA or sparse backend (latent K/V, "
                "forward_mqa/forward_mha, top-k indices): vllm_backend.py drives standard "
                "attention (AttentionImpl.forward over a K/V cache)"
            )
        from vllm.v1.attention.backend import AttentionBackend

        backend, bridged = vllm_compat.bridge_kernel_block_sizes(backend, AttentionBackend)
        self.impl_cls = backend.get_impl_cls()
        if construct == "keywords":
            backend = vllm_compat.keyword_construction(backend)
        self.backend = backend
        self.padding = padding
        self.name = f"vllm-{backend.get_name().lower()}"
        self.impl_args = dict(impl_args or {})
        self.cache_factory, cache_text = plugin_kv_cache.cache_factory(kv_cache, self.impl_cls)
        self.writer = plugin_kv_cache.KvWriter(kv_write, self.impl_cls)
        self.notes = list(notes) + ([bridged] if bridged else []) + [
            f"kv cache: {cache_text}",
            f"earlier steps' K/V written by: {self.writer.description}",
        ]
        if self.impl_args:
            self.notes.append(f"impl arguments: {self.impl_args}")
        self.description = describe(backend) + f", padding={padding}"
        if construct != "layer":
            self.description += f", construct={construct}"
        if kv_cache != "auto" or kv_write != "auto" or self.impl_args:
            self.description += f", kv-cache={kv_cache}, kv-write={kv_write}"
            if self.impl_args:
                self.description += ", impl-args=" + ",".join(f"{k}={v!r}" for k, v in self.impl_args.items())
        self.selection = selection
        self.platform_kinds = list(kinds or [])
        self.capabilities = capabilities_of(backend)
        if self.platform_kinds:
            if selection != "platform":
                raise ValueError("--kinds names what a platform routes to the class: with --selection platform")
            self.capabilities["kinds"] = self.platform_kinds
            self.description += ", kinds=" + ",".join(self.platform_kinds)
        if selection == "platform":  # probed at the end of __init__
            self.description += ", selection=platform"
            self.notes.append(
                "selection=platform: features as the impl builds and runs them, not "
                "supports_sliding_window/supports_sink (a plugin's platform picks its backend "
                "without vLLM's validation of those)"
            )
        self.attention_type = AttentionType
        self.vllm_config = VllmConfig()
        self.selection_params = set(inspect.signature(backend.validate_configuration).parameters)
        # vLLM's Attention layer looks its backend up by name in the registry; a plugin's
        # class registers itself there (register_backend) before vLLM uses it.
        if backend.get_name() not in AttentionBackendEnum.__members__:
            AttentionBackendEnum.register(
                backend.get_name(), f"{backend.__module__}.{backend.__qualname__}"
            )
        if selection == "platform":  # the probe builds layers: needs everything above
            self.capabilities = platform_probe.probe(self, self.capabilities, self.notes)

    # -- selection -------------------------------------------------------------------------

    def attn_type(self, config: Config) -> Any:
        return {
            "decoder": self.attention_type.DECODER,
            "encoder_only": self.attention_type.ENCODER_ONLY,
            "encoder_decoder": self.attention_type.ENCODER_DECODER,
        }[config.kind]

    def check(self, config: Config) -> None:
        if config.num_heads % config.num_kv_heads:
            raise Unsupported("vLLM's Attention layer needs num_heads % num_kv_heads == 0")
        from vllm.platforms import current_platform

        try:
            capability = current_platform.get_device_capability()
        except Exception:
            capability = None
        wanted = {
            "head_size": config.head_size,
            "dtype": DTYPES[config.dtype],
            "kv_cache_dtype": vllm_kv_cache_dtype(config),
            "block_size": config.block_size,
            "use_mla": False,
            "has_sink": config.sinks is not None,
            "use_sparse": False,
            "use_mm_prefix": False,
            "use_per_head_quant_scales": config.kv_scales == "head",
            "device_capability": capability,
            "attn_type": self.attn_type(config),
            "has_sliding_window": config.sliding_window is not None,
        }
        if self.selection == "platform":
            # The plugin's platform names its backend without vLLM's validation of these
            # features; whether the impl runs them is its constructor's and builder's word.
            wanted["has_sink"] = wanted["has_sliding_window"] = False
        reasons = self.backend.validate_configuration(
            **{k: v for k, v in wanted.items() if k in self.selection_params}
        )
        if config.kind in self.platform_kinds:  # routed here by the platform, not declared
            reasons = [r for r in reasons if r != f"attention type {wanted['attn_type']} not supported"]
        if reasons:
            raise Unsupported("vLLM's validate_configuration: " + "; ".join(reasons))
        if not kernel_block_ok(self.backend, config.block_size):
            raise Unsupported(
                f"block size {config.block_size} is split into kernel blocks by the runner "
                "(not driven by vllm_backend.py)"
            )

    # -- construction ----------------------------------------------------------------------

    def layer_backend(self, config: Config) -> type:
        """The class as the layer of this kind wraps it."""
        if config.kind == "encoder_only":
            from vllm.model_executor.layers.attention.encoder_only_attention import (
                create_encoder_only_attention_backend,
            )

            return create_encoder_only_attention_backend(self.backend)
        if config.kind == "encoder_decoder":
            from vllm.model_executor.layers.attention.cross_attention import (
                create_cross_attention_backend,
            )

            return create_cross_attention_backend(self.backend)
        return self.backend

    def configure(self, config: Config, num_blocks: int) -> Any:
        from vllm.config import CacheConfig

        vc = self.vllm_config
        vc.model_config = ModelConfigStandIn(config, max(num_blocks * config.block_size, 1))
        vc.cache_config = CacheConfig(
            block_size=config.block_size, cache_dtype=vllm_kv_cache_dtype(config)
        )
        # What the engine sets once it has sized the cache.
        vc.cache_config.num_gpu_blocks = num_blocks
        vc.compilation_config.static_forward_context.clear()
        return vc

    def make_layer(self, config: Config) -> Any:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention import Attention

        extra = {} if config.sinks is None else {"sinks": torch.tensor(config.sinks, dtype=torch.float32)}
        default = torch.get_default_dtype()
        torch.set_default_dtype(DTYPES[config.dtype])  # as while a model is built
        try:
            with set_current_vllm_config(self.vllm_config):
                layer = Attention(
                    config.num_heads,
                    config.head_size,
                    config.scale,
                    num_kv_heads=config.num_kv_heads,
                    alibi_slopes=config.alibi_slopes,
                    cache_config=self.vllm_config.cache_config,
                    logits_soft_cap=config.logits_soft_cap,
                    per_layer_sliding_window=config.sliding_window,
                    prefix=LAYER_NAME,
                    attn_type=self.attn_type(config),
                    attn_backend=self.layer_backend(config),
                    **extra,
                    **self.impl_args,
                )
        except (NotImplementedError, ValueError, TypeError, AssertionError) as refused:
            raise Unsupported(f"vLLM refuses the layer: {type(refused).__name__}: {refused}")
        finally:
            torch.set_default_dtype(default)
        layer.process_weights_after_loading(DTYPES[config.dtype])
        if config.kv_cache is not None:  # the checkpoint's scales
            for which in ("k", "v"):
                s = float(config.kv_cache[f"{which}_scale"])
                getattr(layer, f"_{which}_scale").fill_(s)
                getattr(layer, f"_{which}_scale_cpu").fill_(s)
                setattr(layer, f"_{which}_scale_float", s)
            if config.kv_scales == "head":
                set_per_head_scales(layer, config)
        return layer

    def kv_cache_spec(self, config: Config, layer: Any) -> Any:
        from vllm.v1.kv_cache_interface import (
            CrossAttentionSpec,
            EncoderOnlyAttentionSpec,
            get_kv_quant_mode,
        )

        common = dict(
            block_size=config.block_size,
            num_kv_heads=config.num_kv_heads,
            head_size=config.head_size,
            dtype=layer.kv_cache_torch_dtype,
        )
        if config.kind == "encoder_only":  # the runner's, for encoder-only layers
            return EncoderOnlyAttentionSpec(**common)
        if config.kind == "encoder_decoder":  # CrossAttention.get_kv_cache_spec
            return CrossAttentionSpec(**common, kv_quant_mode=get_kv_quant_mode(layer.kv_cache_dtype))
        spec = layer.get_kv_cache_spec(self.vllm_config)
        # A windowed layer may pick its own block size in vLLM; the case fixes it.
        spec = dataclasses.replace(spec, block_size=config.block_size)
        if config.kv_scales == "token":
            # The runner's `customize_attention_spec`: a per-token-head cache packs each
            # (slot, head)'s float32 scale after its K and V rows (TRITON_ATTN's
            # `customize_spec`), which the backend's writes and reads expect.
            customize = getattr(layer.attn_backend, "customize_spec", None)
            if callable(customize):
                spec = customize(spec)
        return spec

    def allocate(self, config: Config, spec: Any, layer: Any, num_blocks: int) -> Any:
        if self.cache_factory is not None:  # the plugin runner's own cache
            request = plugin_kv_cache.CacheRequest(
                num_blocks=num_blocks,
                block_size=config.block_size,
                num_kv_heads=config.num_kv_heads,
                head_size=config.head_size,
                dtype=layer.kv_cache_torch_dtype,
                spec=spec,
                backend=self.backend,
                layer=layer,
                impl_cls=self.impl_cls,
            )
            # What the factory would allocate, checked before it does.
            self.check_size(spec.page_size_bytes * num_blocks)
            return self.cache_factory(request)
        if hasattr(self.backend, "get_kv_cache_shape"):  # the older interface
            shape = self.backend.get_kv_cache_shape(
                num_blocks, config.block_size, config.num_kv_heads, config.head_size,
                layer.kv_cache_dtype,
            )
            size = layer.kv_cache_torch_dtype.itemsize
            for n in shape:
                size *= n
            self.check_size(size)
            return torch.zeros(shape, dtype=layer.kv_cache_torch_dtype)
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
        from vllm.v1.kv_cache_interface import (
            KVCacheTensor,
            compute_layout_strides,
            create_kv_cache_views,
        )

        layout = get_supported_kv_cache_layouts([layer.attn_backend])[0]
        size = spec.page_size_bytes * num_blocks
        self.check_size(size)
        layer_stride, block_stride, _, _, _ = compute_layout_strides(spec, num_blocks, 1, layout)
        raw = torch.zeros(size, dtype=torch.int8)
        tensor = KVCacheTensor(
            size=size, layers=[LAYER_NAME], layer_stride=layer_stride, block_stride=block_stride
        )
        return create_kv_cache_views(raw, spec, num_blocks, layout, tensor)[0]

    def check_size(self, size: int) -> None:
        if size > MAX_CACHE_BYTES:
            raise Unsupported(
                f"a KV cache of {size / 2**30:.1f} GiB is over this machine's limit "
                f"(ATTN_DIFF_MAX_CACHE_GIB={MAX_CACHE_BYTES / 2**30:g})"
            )

    # -- the adapter protocol ----------------------------------------------------------------

    def new_cache(self, config: Config, num_blocks: int) -> Session:
        self.configure(config, num_blocks)
        layer = self.make_layer(config)
        spec = self.kv_cache_spec(config, layer)
        kv_cache = self.allocate(config, spec, layer, num_blocks)
        layer.kv_cache = kv_cache
        session = Session(layer, kv_cache, spec, layer.attn_backend)
        # The runner makes the builders with the KV cache, before any step (CPU_ATTN's
        # sets the layer's ISA, which its cache writes read).
        try:
            self.builder(config, session, 0, 0)
        except NotImplementedError as refused:  # a combination the class cannot declare
            raise Unsupported(f"vLLM's metadata builder refuses: {refused}")
        return session

    def write_kv(self, config: Config, cache: Session, key: Any, value: Any, slot_mapping: Any) -> None:
        # The last write is the step's own K/V (the runner's, with the forward); every earlier
        # one is what earlier steps wrote.
        self.flush(config, cache)
        cache.pending = (key, value, slot_mapping)

    def store(self, config: Config, cache: Session, key: Any, value: Any, slots: Any) -> None:
        """One write as vLLM makes it: the impl's own KV-cache update."""
        dtype = DTYPES[config.dtype]
        k = torch.from_numpy(key).to(dtype)
        v = torch.from_numpy(value).to(dtype)
        s = torch.from_numpy(slots).to(torch.int64)
        writer = self.writer
        if writer.path is None or writer.path.name != "do_kv_cache_update":
            # Only vLLM's own update is made to skip padding slots (-1).
            real = s >= 0
            k, v, s = k[real], v[real], s[real]
        try:
            writer.write(cache.impl, cache.layer, k, v, cache.kv_cache, s, config.block_size)
        except MissingInterface as missing:
            raise Unsupported(str(missing))

    def flush(self, config: Config, cache: Session) -> None:
        if cache.pending is None:
            return
        key, value, slots = cache.pending
        cache.pending = None
        if (slots >= 0).any():
            self.store(config, cache, key, value, slots)

    def builder(self, config: Config, cache: Session, num_seqs: int, num_tokens: int) -> Any:
        """The backend's metadata builder, made as the runner makes it (once per cache; again
        when a step is larger than the scheduler limits it was sized for)."""
        from vllm.config import set_current_vllm_config

        limits = cache.builder_limits
        rswa = self.vllm_config.model_config.rswa_window
        if (
            cache.builder is None
            or num_seqs > limits[0]
            or num_tokens > limits[1]
            or rswa != cache.builder_rswa
        ):
            sc = self.vllm_config.scheduler_config
            seqs = max(num_seqs, limits[0], 256)
            tokens = max(num_tokens, limits[1], 8192)
            sc.max_num_seqs, sc.max_num_batched_tokens = seqs, tokens
            with set_current_vllm_config(self.vllm_config):
                cache.builder = cache.backend.get_builder_cls()(
                    cache.spec, [LAYER_NAME], self.vllm_config, torch.device("cpu")
                )
            cache.builder_limits = (seqs, tokens)
            cache.builder_rswa = rswa
        return cache.builder

    def metadata(self, config: Config, cache: Session, step: Step, n: int, slots: Any) -> Any:
        import numpy as np
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.backend import CommonAttentionMetadata

        def i32(a: Any) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(torch.int32)

        qsl = i32(step.query_start_loc)
        seq_lens = i32(step.seq_lens)
        positions = np.zeros(n, dtype=np.int64)
        for s in range(len(step.seq_lens)):
            q0, q1 = int(step.query_start_loc[s]), int(step.query_start_loc[s + 1])
            positions[q0:q1] = np.arange(int(step.seq_lens[s]) - (q1 - q0), int(step.seq_lens[s]))
        extra: Dict[str, Any] = {}
        if config.kind == "encoder_decoder":
            # A decoder step after the request's first: the encoder's K/V is in the cross
            # cache (the builder's seq_lens become the encoder lengths).
            decoder_lens = i32(step.query_lens + 1)
            extra = dict(
                encoder_seq_lens=seq_lens,
                encoder_seq_lens_cpu=step.seq_lens.astype(np.int32),
                seq_lens_cpu_upper_bound=decoder_lens,
            )
            seq_lens = decoder_lens
        else:
            extra = dict(seq_lens_cpu_upper_bound=seq_lens.clone())
        fields = dict(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl.clone(),
            seq_lens=seq_lens,
            num_reqs=len(step.seq_lens),
            num_actual_tokens=n,
            max_query_len=int(step.query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_table_tensor=i32(step.block_table),
            slot_mapping=torch.from_numpy(np.ascontiguousarray(slots)).to(torch.int64),
            causal=causal_of(config, step),
            positions=torch.from_numpy(positions),
            **extra,
            **request_masks(cache, step),
        )
        if "mm_req_doc_ranges" in fields or "rswa_prefix_lens" in fields:
            # A field this vLLM's metadata lacks would be dropped, and the mask with it.
            masks = {k: v for k, v in fields.items() if k in ("mm_req_doc_ranges", "rswa_prefix_lens")}
            missing = vllm_compat.missing_fields(CommonAttentionMetadata, masks)
            if missing:
                raise Unsupported(f"this vLLM's CommonAttentionMetadata has no {', '.join(missing)}")
        self.vllm_config.model_config.rswa_window = step.rswa_window
        try:
            common = CommonAttentionMetadata(**vllm_compat.dataclass_kwargs(CommonAttentionMetadata, fields))
        except MissingInterface as missing:
            raise Unsupported(str(missing))
        builder = self.builder(config, cache, len(step.seq_lens), n)
        with set_current_vllm_config(self.vllm_config):
            return builder.build(common_prefix_len=0, common_attn_metadata=common)

    def forward(self, config: Config, cache: Session, step: Step) -> Tuple[Any, float]:
        from vllm.config import set_current_vllm_config

        dtype = DTYPES[config.dtype]
        if cache.pending is None:
            raise RuntimeError("a step without its own write")
        key, value, slots = cache.pending
        cache.pending = None
        # Padding tokens come last; without runner padding the call sees real tokens only.
        n = step.num_tokens if self.padding == "runner" else int(step.query_start_loc[-1])
        slots = slots[:n]
        metadata = self.metadata(config, cache, step, n, slots)
        query = torch.from_numpy(step.query[:n]).to(dtype)
        k: Optional[torch.Tensor] = torch.from_numpy(key[:n]).to(dtype)
        v: Optional[torch.Tensor] = torch.from_numpy(value[:n]).to(dtype)
        output = torch.zeros(step.num_tokens, config.num_heads, config.head_size, dtype=dtype)
        layer, impl = cache.layer, cache.impl
        t0 = time.perf_counter()
        with set_current_vllm_config(self.vllm_config):
            if config.kind == "encoder_decoder":
                k = v = None  # the decoder's step writes nothing to the cross cache
            elif not vllm_compat.forward_includes_kv_cache_update(cache.backend):
                impl.do_kv_cache_update(layer, k, v, cache.kv_cache, torch.from_numpy(slots))
            if getattr(layer, "query_quant", None) is not None:
                query, _ = layer.query_quant(query, layer._q_scale)
            impl.forward(layer, query, k, v, cache.kv_cache, metadata, output=output[:n])
        elapsed = time.perf_counter() - t0
        return output.float().numpy(), elapsed


# ---- the command line -----------------------------------------------------------------------


def list_registry() -> int:
    """Every backend in vLLM's registry: whether its class loads, and what it declares."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for member in AttentionBackendEnum:
        if not member.value:
            continue
        try:
            cls = member.get_class()
            if cls.is_mla() or cls.is_sparse():
                print(f"{member.name}: loads; MLA or sparse (not driven by vllm_backend.py)")
                continue
            caps = capabilities_of(cls)
            print(f"{member.name}: loads; {json.dumps(caps)}")
        except Exception as e:  # noqa: BLE001 - reported, not raised
            print(f"{member.name}: does not load: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--class", dest="cls", help="module.path:Class, or a registry name such as CPU_ATTN"
    )
    parser.add_argument(
        "--file",
        help="a Python file defining the backend (imported from its plugin's source tree, unchanged); "
        "--class then names the class, or may be left out when the file defines one",
    )
    parser.add_argument(
        "--stand-in", choices=plugin_loader.STAND_INS, default="auto",
        help="the CPU stand-in for a plugin's device (auto: spyre when the file uses one)",
    )
    parser.add_argument(
        "--kv-cache", default="auto",
        help="auto | vllm | pair | spyre-inference | module:function (see plugin_kv_cache.py)",
    )
    parser.add_argument(
        "--kv-write", default="auto",
        help="how earlier steps' K/V are written: auto | an impl method | module:function",
    )
    parser.add_argument(
        "--impl-arg", action="append", default=[], metavar="NAME=VALUE",
        help="an extra impl constructor argument, as a model passes one (a JSON value)",
    )
    parser.add_argument(
        "--selection", choices=["declared", "platform"], default="declared",
        help="declared: vLLM's selector (validate_configuration) decides; platform: as a plugin "
        "platform that names its backend itself (features by the impl's constructor)",
    )
    parser.add_argument(
        "--construct", choices=["layer", "keywords"], default="layer",
        help="layer: the impl built by vLLM's Attention layer (positional arguments); keywords: "
        "by name, as a plugin's own tests build it",
    )
    parser.add_argument(
        "--kinds", type=lambda v: [k for k in v.split(",") if k], default=None,
        help="with --selection platform: the layer kinds the platform routes to this class "
        "(decoder,encoder_only,encoder_decoder), when its supports_attn_type does not say",
    )
    parser.add_argument("--padding", choices=["runner", "none"], default="runner")
    parser.add_argument("--probe", action="store_true", help="load the class, print what it declares")
    parser.add_argument("--list", action="store_true", help="every backend of vLLM's registry")
    args = parser.parse_args(argv)
    threads = os.environ.get("ATTN_DIFF_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if args.list:
        sys.exit(list_registry())
    if not args.cls and not args.file:
        parser.error("--class (or --file) is required")
    if not args.probe:
        # Before vLLM loads: some releases (0.27) log to stdout, the protocol's stream.
        protect_stdout()
    try:
        impl_args = parse_impl_args(args.impl_arg)
        notes: List[str] = []
        backend = load_backend(args.cls, args.file, args.stand_in, notes)
        adapter = VllmBackend(
            backend, args.padding, args.kv_cache, args.kv_write, impl_args, notes, args.selection,
            args.kinds, args.construct,
        )
    except (MissingInterface, LookupError, ValueError, FileNotFoundError, Unsupported) as failed:
        sys.exit(f"vllm_backend.py: {failed}")
    if args.probe:
        print(adapter.description)
        for note in adapter.notes:
            print(f"note: {note}")
        print(json.dumps(adapter.capabilities))
        return
    serve(adapter)


def parse_impl_args(pairs: Sequence[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--impl-arg {pair!r}: expected NAME=VALUE")
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


if __name__ == "__main__":
    main()
