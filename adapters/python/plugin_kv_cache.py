"""KV caches and K/V writes that a plugin's model runner owns, not vLLM's.

vLLM's runner gives every layer one tensor (a view of a raw buffer, or a tensor of the
backend's `get_kv_cache_shape`). A platform plugin's runner may allocate something else:
spyre-inference's `TorchSpyreModelRunner.initialize_kv_cache_tensors` gives each layer a
`SpyrePagedKVCache(k_pages, v_pages)`, two dense `[num_blocks, block_size, num_kv_heads,
head_size]` float16 tensors, which its impl unpacks in `forward`. `--kv-cache` chooses:

- `auto`: what the impl's `forward` declares its `kv_cache` to be: a NamedTuple of two fields
  (a K and a V tensor) gets `pair`; anything else gets vLLM's single tensor;
- `vllm`: vLLM's single tensor, as its runner lays it out;
- `pair`: a (K, V) pair, each of `get_kv_cache_shape` without a leading K/V axis of 2, in the
  layer's cache dtype, built as the forward's NamedTuple when it declares one;
- `spyre-inference`: what spyre-inference's runner allocates (above);
- `module:function` or `file.py:function`: `function(request)` returns the cache, where the
  `CacheRequest` carries the block count, the KV-cache spec, the backend class and the layer.
  The object returned is given to `forward` unchanged.

Earlier steps' K/V (the context, stale data) must be written before the step, through the
impl's own code. `--kv-write` chooses how:

- `auto`: the impl's `do_kv_cache_update` (vLLM 0.30 on) or `_write_to_kv_cache`, else the
  one other method whose parameters bind as a write (`vllm_compat.bind_write`: key, value, a
  slot mapping and the cache or its K and V parts; spyre-inference's `_reshape_and_cache`);
- a method name of the impl;
- `module:function` or `file.py:function`: `function(impl, layer, key, value, kv_cache,
  slot_mapping, block_size)`.

Earlier writes carry real slots only; the step's own write, inside `forward`, carries the
runner's padded slot mapping (-1 for padding tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Tuple

import plugin_loader
import vllm_compat
from vllm_compat import MissingInterface

KV_CACHES = ("auto", "vllm", "pair", "spyre-inference")


@dataclasses.dataclass
class CacheRequest:
    """What a cache factory is given: the runner's view of one layer."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any  # torch.dtype of the cache
    spec: Any  # vLLM's KV-cache spec of the layer
    backend: type
    layer: Any
    impl_cls: Optional[type] = None  # the impl's class (the backend's, unless wrapped)


CacheFactory = Callable[[CacheRequest], Any]


def pair_shape(request: CacheRequest) -> Tuple[int, ...]:
    """One half's shape: the backend's `get_kv_cache_shape` without its leading K/V axis of 2,
    when it has one (told from the element count: with 2 blocks a leading 2 is the blocks)."""
    get_shape = getattr(request.backend, "get_kv_cache_shape", None)
    if get_shape is None:
        return (request.num_blocks, request.block_size, request.num_kv_heads, request.head_size)
    shape = tuple(
        get_shape(request.num_blocks, request.block_size, request.num_kv_heads, request.head_size)
    )
    half = request.num_blocks * request.block_size * request.num_kv_heads * request.head_size
    whole = 1
    for n in shape:
        whole *= n
    # A shape holding both K and V (a leading K/V axis) is twice one half.
    return shape[1:] if shape and shape[0] == 2 and whole == 2 * half else shape


def wrap_pair(request: CacheRequest, k: Any, v: Any) -> Any:
    annotation = vllm_compat.kv_cache_annotation(request.impl_cls or request.backend.get_impl_cls())
    fields = vllm_compat.tuple_fields(annotation)
    if fields is not None and len(fields) == 2:
        return annotation(k, v)
    return (k, v)


def pair_cache(request: CacheRequest) -> Any:
    import torch

    shape = pair_shape(request)
    return wrap_pair(request, torch.zeros(shape, dtype=request.dtype), torch.zeros(shape, dtype=request.dtype))


def spyre_inference_cache(request: CacheRequest) -> Any:
    """`TorchSpyreModelRunner.initialize_kv_cache_tensors`, on the CPU (the device layout it
    passes to `.to(spyre)` has no meaning here)."""
    import torch

    shape = (request.num_blocks, request.block_size, request.num_kv_heads, request.head_size)
    return wrap_pair(request, torch.zeros(shape, dtype=torch.float16), torch.zeros(shape, dtype=torch.float16))


def cache_factory(choice: str, impl_cls: type) -> Tuple[Optional[CacheFactory], str]:
    """(the factory, what it is); a None factory is vLLM's own single tensor."""
    if choice == "auto":
        annotation = vllm_compat.kv_cache_annotation(impl_cls)
        fields = vllm_compat.tuple_fields(annotation)
        if fields is not None and len(fields) == 2:
            return pair_cache, f"a pair {annotation.__name__}({', '.join(fields)}), as forward declares"
        return None, "vLLM's single tensor"
    if choice == "vllm":
        return None, "vLLM's single tensor"
    if choice == "pair":
        return pair_cache, "a (K, V) pair"
    if choice == "spyre-inference":
        return spyre_inference_cache, "spyre-inference's SpyrePagedKVCache(k_pages, v_pages), float16"
    return plugin_loader.load_hook(choice), f"{choice}(request)"


def cache_bytes(cache: Any) -> int:
    """The bytes a cache's tensors take (a tensor, or a tuple of them)."""
    if isinstance(cache, tuple):
        return sum(cache_bytes(part) for part in cache)
    return int(cache.numel() * cache.element_size()) if hasattr(cache, "numel") else 0


class KvWriter:
    """How earlier steps' K/V reach the cache: the impl's own write, or a hook."""

    def __init__(self, choice: str, impl_cls: type) -> None:
        self.hook: Optional[Callable[..., Any]] = None
        self.path: Optional[vllm_compat.WritePath] = None
        if choice == "auto":
            self.path = vllm_compat.find_write_path(impl_cls)
        elif ":" in choice:
            self.hook = plugin_loader.load_hook(choice)
        else:
            self.path = vllm_compat.named_write_path(impl_cls, choice)
        if self.hook is not None:
            self.description = f"{choice}(impl, layer, key, value, kv_cache, slot_mapping, block_size)"
        elif self.path is not None:
            self.description = self.path.describe(impl_cls)
        else:
            self.description = "none (forward writes the step's own K/V only)"
        self.impl_name = impl_cls.__name__

    @property
    def available(self) -> bool:
        return self.hook is not None or self.path is not None

    def write(self, impl: Any, layer: Any, key: Any, value: Any, kv_cache: Any, slots: Any, block_size: int) -> None:
        if self.hook is not None:
            self.hook(impl, layer, key, value, kv_cache, slots, block_size)
        elif self.path is not None:
            self.path.call(impl, layer, key, value, kv_cache, slots, block_size)
        else:
            raise MissingInterface(
                f"{self.impl_name} writes K/V only inside forward and has no write method that "
                "binds (do_kv_cache_update, _write_to_kv_cache, or one taking key, value, slot "
                "mapping and the cache): earlier steps' K/V cannot be written; name one with "
                "--kv-write METHOD or module:function"
            )
