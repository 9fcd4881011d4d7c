"""adapters/python/vllm_backend.py on a CUDA device, with vLLM from its pure-Python source.

    python3 tools/peers/gpu_vllm_adapter.py --class TRITON_ATTN [--probe]    # vllm_backend.py's arguments

(Kept in tools/peers/ or, to travel without being tracked, in the ignored .gpu/ beside
gpu_vllm_check.sh: it finds the checkout's adapters/python/ from where it is.)

For a GPU machine that has torch but cannot install vLLM's wheel (its compiled `_C` is
built for another torch): vLLM's source tree on PYTHONPATH, with none of its compiled
extensions. Runs `vllm_backend.main()` unchanged, with the following added, each printed on
stderr at start and named in the adapter's notes:

1. **Stubs for compiled modules that are imported unconditionally.** `vllm/platforms/cuda.py`
   does `import vllm._C_stable_libtorch` at import time, only to register custom ops. An
   empty module stands in for it (and only when the real one cannot be imported). Any op
   that would have come from it is still missing: a backend that calls one fails with
   torch's own "no attribute" error, which is a limit of this set-up, not a finding.
2. **`torch.ops._C_cache_ops.reshape_and_cache_flash`** (FLEX_ATTENTION's cache write,
   `flex_attention.py` do_kv_cache_update), registered for CUDA as vLLM's own Triton port
   of that kernel, `vllm.v1.attention.ops.triton_reshape_and_cache_flash.
   triton_reshape_and_cache_flash` (same arguments; TRITON_ATTN calls that function
   itself). Registered only when no such op exists. This is a cache write, not attention
   math; its FP8 path is Triton's conversion rather than the CUDA kernel's.
3. **The device.** vllm_backend.py drives a class on the CPU. Here the layer and its
   parameters (sinks, scales, ALiBi slopes) are built under `torch.device("cuda")` as a
   model is, the KV cache is allocated there, the metadata builder gets device cuda, and
   the device-side fields of `CommonAttentionMetadata` (query_start_loc, seq_lens,
   block_table_tensor, slot_mapping, positions, encoder_seq_lens, a per-request causal
   tensor) are moved there before `build`; the `*_cpu` fields and `rswa_prefix_lens` stay
   on the CPU, as vLLM's GPU runner passes them. The impl's calls (the K/V write,
   forward) get their tensors on cuda and forward's output is copied back into
   vllm_backend.py's buffer. The time a step reports includes these copies.
   `compilation_config.cudagraph_mode` is NONE (eager, as `--enforce-eager`): nothing is
   captured here, and `VllmConfig()` on CUDA would enable graphs without capture sizes.

4. **Only if vLLM's NVML-based detection does not find CUDA** while torch sees a device,
   vLLM's own `NonNvmlCudaPlatform` (the same platform, device queries through torch.cuda)
   is set before anything reads the platform; said on stderr when it happens.

Nothing of the backend's own code is patched.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
import types
from typing import Any

def repo_root() -> str:
    """The checkout this file is in (kept in tools/peers/ or in the ignored .gpu/)."""
    here = os.path.dirname(os.path.abspath(__file__))
    while not os.path.exists(os.path.join(here, "adapters", "python", "vllm_backend.py")):
        parent = os.path.dirname(here)
        if parent == here:
            sys.exit("gpu_vllm_adapter.py: adapters/python/vllm_backend.py not found above this file")
        here = parent
    return here


sys.path.insert(0, os.path.join(repo_root(), "adapters", "python"))

SHIM_NOTES = []
#: Where the layer, cache and step tensors go ("cpu" only to test the wiring without a GPU).
DEVICE = "cuda"


def say(text: str) -> None:
    SHIM_NOTES.append(text)
    print(f"gpu_vllm_adapter.py: {text}", file=sys.stderr, flush=True)


def stub_cuda_extension() -> None:
    """`vllm/platforms/cuda.py` imports `vllm._C_stable_libtorch` at import time."""
    for name in ("vllm._C_stable_libtorch",):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError as missing:
            module = types.ModuleType(name, f"empty stand-in (gpu_vllm_adapter.py): {missing}")
            sys.modules[name] = module
            say(f"{name} is not built here ({missing}): an empty module stands in for it")


def stub_flash_attn() -> None:
    # `vllm.vllm_flash_attn` raises ImportError without its compiled kernels, and
    # `v1/attention/backends/fa_utils.py` imports it at the top on CUDA (reached through
    # `vllm.model_executor.layers.attention`, so by every layer). Its own pure-Python
    # interface stands in for the package: it loads, reports FA2/FA3 unavailable, and its
    # functions fail if called (FLASH_ATTN is not what runs here).
    name = "vllm.vllm_flash_attn"
    try:
        importlib.import_module(name)
    except ImportError as missing:
        for stale in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[stale]
        spec = importlib.util.find_spec("vllm")
        assert spec is not None and spec.submodule_search_locations
        package = types.ModuleType(name, f"stand-in (gpu_vllm_adapter.py): {missing}")
        package.__path__ = [os.path.join(list(spec.submodule_search_locations)[0], "vllm_flash_attn")]
        package.__package__ = name
        sys.modules[name] = package
        interface = importlib.import_module(name + ".flash_attn_interface")
        for attr in (
            "compile_flash_attn_varlen_func_from_specs", "fa_version_unsupported_reason",
            "flash_attn_varlen_func", "get_scheduler_metadata", "is_fa_version_supported",
        ):
            setattr(package, attr, getattr(interface, attr))
        say(
            f"{name} needs compiled kernels not built here ({missing}): its pure-Python "
            "flash_attn_interface stands in (FA2/FA3 reported unavailable)"
        )


def ensure_cuda_platform() -> None:
    """vLLM's platform, resolved before anything of vLLM reads it: CUDA, as vLLM detects it
    (NVML). Only if that detection fails or finds another platform while torch sees a CUDA
    device is vLLM's own NonNvmlCudaPlatform (torch.cuda queries) set, and said so."""
    import vllm.platforms as platforms

    stub_cuda_extension()
    try:
        found = platforms.current_platform
        if found.is_cuda():
            return
        why = f"it detected {type(found).__name__}"
    except Exception as failed:  # noqa: BLE001 - reported, then replaced
        why = f"its detection failed: {type(failed).__name__}: {failed}"
    from vllm.platforms.cuda import NonNvmlCudaPlatform

    platforms._current_platform = platforms.current_platform = NonNvmlCudaPlatform()
    say(f"vLLM did not detect CUDA ({why}): vLLM's NonNvmlCudaPlatform is set")


def register_cache_write() -> None:
    import torch

    try:
        torch.ops._C_cache_ops.reshape_and_cache_flash  # noqa: B018 - the real op, if loaded
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
    lib.define(
        "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, "
        "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
        "Tensor v_scale) -> ()"
    )

    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

        triton_reshape_and_cache_flash(
            key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale
        )

    lib.impl("reshape_and_cache_flash", reshape_and_cache_flash, DEVICE.upper())
    register_cache_write.lib = lib  # kept alive for the process
    say(
        "torch.ops._C_cache_ops.reshape_and_cache_flash (compiled, not built here) is vLLM's "
        f"Triton port triton_reshape_and_cache_flash, registered for {DEVICE.upper()}"
    )


def cuda(x: Any) -> Any:
    import torch

    return x.to(DEVICE) if isinstance(x, torch.Tensor) and x.device.type != DEVICE else x


class CudaImpl:
    """The impl, its calls given cuda tensors (forward's output copied back)."""

    def __init__(self, impl: Any) -> None:
        object.__setattr__(self, "_impl", impl)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._impl, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            import torch

            out = kwargs.get("output")
            if isinstance(out, torch.Tensor) and out.device.type != DEVICE:
                gpu_out = torch.zeros_like(out, device=DEVICE)  # vllm_backend.py zero-fills too
                kwargs["output"] = gpu_out
            else:
                gpu_out = None
            result = attr(*[cuda(a) for a in args], **{k: cuda(v) for k, v in kwargs.items()})
            if gpu_out is not None:
                out.copy_(gpu_out)
                return out
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            return result

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._impl, name, value)


class CudaBuilder:
    """The metadata builder, fed `CommonAttentionMetadata` with its device fields on cuda."""

    DEVICE_FIELDS = (
        "query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping", "positions",
        "encoder_seq_lens", "causal",
    )

    def __init__(self, builder: Any) -> None:
        self._builder = builder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)

    def build(self, *args: Any, **kwargs: Any) -> Any:
        common = kwargs.get("common_attn_metadata")
        if common is not None:
            moved = {
                f: cuda(getattr(common, f)) for f in self.DEVICE_FIELDS if hasattr(common, f)
            }
            kwargs["common_attn_metadata"] = dataclasses.replace(common, **moved)
        return self._builder.build(*args, **kwargs)


class CudaBuilderBackend:
    """The layer's backend as vllm_backend.py's `builder()` asks it for its builder class:
    the real builder, with device cuda instead of cpu."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def get_builder_cls(self) -> Any:
        import torch

        real = self._backend.get_builder_cls()

        def make(spec: Any, layer_names: Any, vllm_config: Any, device: Any) -> Any:
            return CudaBuilder(real(spec, layer_names, vllm_config, torch.device(DEVICE)))

        return make


def cuda_adapter_class(base: type) -> type:
    import torch

    class CudaVllmBackend(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            from vllm.config import CUDAGraphMode

            # No graph is captured or replayed here: eager, as `--enforce-eager` runs vLLM
            # (VllmConfig() on CUDA enables CUDA graphs without capture sizes, and
            # TRITON_ATTN's builder asserts on that).
            self.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
            name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE
            self.description += f", device=cuda ({name}, gpu_vllm_adapter.py)"
            self.notes.extend(SHIM_NOTES)
            self.notes.append("compilation_config.cudagraph_mode = NONE (eager, as --enforce-eager)")
            self.notes.append(
                "device: layer, KV cache, builder and metadata on cuda, step tensors copied "
                f"there and back ({name}); step times include the copies"
            )

        def make_layer(self, config: Any) -> Any:
            with torch.device(DEVICE):
                layer = super().make_layer(config)
            quant = getattr(layer, "query_quant", None)
            if quant is not None:
                layer.query_quant = QueryQuantOnCuda(quant)
            return layer

        def allocate(self, *args: Any, **kwargs: Any) -> Any:
            with torch.device(DEVICE):
                return super().allocate(*args, **kwargs)

        def new_cache(self, config: Any, num_blocks: int) -> Any:
            session = super().new_cache(config, num_blocks)
            session.impl = CudaImpl(session.impl)
            return session

        def builder(self, config: Any, cache: Any, num_seqs: int, num_tokens: int) -> Any:
            real = cache.backend
            cache.backend = CudaBuilderBackend(real)
            try:
                return super().builder(config, cache, num_seqs, num_tokens)
            finally:
                cache.backend = real

    class QueryQuantOnCuda(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, query: Any, scale: Any) -> Any:
            return self.inner(cuda(query), cuda(scale))

    return CudaVllmBackend


def main() -> None:
    if not {"--probe", "--list"} & set(sys.argv[1:]):
        # Before vLLM loads (as vllm_backend.main does, later than the stand-ins below):
        # vLLM logs to stdout, the protocol's stream.
        from attn_diff_adapter import protect_stdout

        protect_stdout()
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_vllm_adapter.py: no CUDA device (torch.cuda.is_available() is False)")
    ensure_cuda_platform()
    stub_flash_attn()
    register_cache_write()
    import vllm_backend

    vllm_backend.VllmBackend = cuda_adapter_class(vllm_backend.VllmBackend)
    vllm_backend.main()


if __name__ == "__main__":
    main()
