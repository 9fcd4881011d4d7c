"""vllm_compat against fakes shaped like each vLLM release's interface, 0.27 to 0.34.

No vLLM and no torch: each fake holds only what differs between releases, copied from that
release's `vllm/v1/attention/backend.py` (the kernel block-size declaration, the
`CommonAttentionMetadata` fields, `validate_configuration`'s arguments), and plugin classes
written the way plugins pinned to each release write them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, List, NamedTuple, Optional

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plugin_kv_cache  # noqa: E402
import vllm_compat  # noqa: E402
from vllm_compat import MissingInterface  # noqa: E402


class MultipleOf:
    def __init__(self, base: int) -> None:
        self.base = base


# ---- each release's AttentionBackend base: what differs ---------------------------------


class Base027:
    """0.27: no argument; a `get_kv_cache_shape` on every backend."""

    forward_includes_kv_cache_update = True

    @staticmethod
    def get_supported_kernel_block_sizes() -> List[Any]:
        return [MultipleOf(1)]


class Base032:
    """0.32 to 0.34: the KV-cache spec, optional."""

    forward_includes_kv_cache_update = True

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> List[Any]:
        return [MultipleOf(1)]


BASES = {"0.27": Base027, "0.32": Base032, "0.33": Base032, "0.34": Base032}


def common_metadata(release: str) -> type:
    """`CommonAttentionMetadata` as each release declares it (fields after the first nine)."""
    first = [
        ("query_start_loc", Any),
        ("query_start_loc_cpu", Any),
        ("seq_lens", Any),
        ("num_reqs", int),
        ("num_actual_tokens", int),
        ("max_query_len", int),
        ("max_seq_len", int),
        ("block_table_tensor", Any),
        ("slot_mapping", Any),
    ]
    optional = {
        "0.27": ["causal", "encoder_seq_lens", "encoder_seq_lens_cpu", "dcp_local_seq_lens",
                 "dcp_local_seq_lens_cpu", "positions", "is_prefilling", "seq_lens_cpu_upper_bound",
                 "rswa_prefix_lens", "replayssm_decode_base_cpu", "_seq_lens_cpu",
                 "_num_computed_tokens_cpu"],
        "0.32": ["causal", "max_logits_per_req", "encoder_seq_lens", "encoder_seq_lens_cpu",
                 "dcp_local_seq_lens", "dcp_local_seq_lens_cpu_upper_bound", "positions",
                 "is_prefilling", "seq_lens_cpu_upper_bound", "req_idx", "rswa_prefix_lens",
                 "replayssm_decode_base_cpu"],
        "0.34": ["causal", "max_logits_per_req", "encoder_seq_lens", "encoder_seq_lens_cpu",
                 "dcp_local_seq_lens", "dcp_local_seq_lens_cpu_upper_bound", "positions",
                 "is_prefilling", "seq_lens_cpu_upper_bound", "req_idx", "rswa_prefix_lens"],
    }
    names = optional[{"0.33": "0.32"}.get(release, release)]
    fields = first + [(n, Any, dataclasses.field(default=None)) for n in names]
    return dataclasses.make_dataclass(f"CommonAttentionMetadata{release}", fields)


def validate_configuration(release: str):
    """`validate_configuration`'s signature per release (reasons: the keywords it got)."""
    if release == "0.27":
        def validate(head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse,
                     use_mm_prefix, use_per_head_quant_scales, device_capability, attn_type,
                     has_sliding_window=False, use_non_causal=False):
            return sorted(locals())
    else:
        def validate(head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse,
                     use_mm_prefix, use_per_head_quant_scales, device_capability, attn_type,
                     has_sliding_window=False, use_non_causal=False, use_batch_invariant=False,
                     use_kv_connector=False, use_pcp=False, use_adaptive_verification=False,
                     use_dcp=False, use_rswa=False):
            return sorted(locals())
    return validate


#: What the adapter asks (vllm_backend.VllmBackend.check).
WANTED_SELECTION = dict(
    head_size=64, dtype="f16", kv_cache_dtype="auto", block_size=64, use_mla=False,
    has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
    device_capability=None, attn_type="decoder", has_sliding_window=True,
)

#: What the adapter fills (vllm_backend.VllmBackend.metadata).
WANTED_METADATA = dict(
    query_start_loc=[0, 1], query_start_loc_cpu=[0, 1], seq_lens=[1], num_reqs=1,
    num_actual_tokens=1, max_query_len=1, max_seq_len=1, block_table_tensor=[[0]],
    slot_mapping=[0], causal=True, positions=[0], seq_lens_cpu_upper_bound=[1],
)


# ---- plugins as they are written for each release ------------------------------------------


class PluginFor027:
    """spyre-inference's declaration (pinned to 0.27.1)."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> List[Any]:
        return [MultipleOf(64)]


class PluginFor032:
    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> List[Any]:
        return [16, 32] if kv_cache_spec == "sliding" else [16]


RELEASES = ["0.27", "0.32", "0.33", "0.34"]


@pytest.mark.parametrize("release", RELEASES)
def test_kernel_block_sizes_are_read_with_or_without_the_spec(release):
    assert [s.base for s in vllm_compat.kernel_block_sizes(PluginFor027)] == [64]
    assert vllm_compat.kernel_block_sizes(PluginFor032, "sliding") == [16, 32]
    assert vllm_compat.kernel_block_sizes(PluginFor032) == [16]


@pytest.mark.parametrize("release", RELEASES)
def test_an_older_plugin_is_bridged_to_a_release_that_passes_the_spec(release):
    base = BASES[release]
    bridged, note = vllm_compat.bridge_kernel_block_sizes(PluginFor027, base)
    if release == "0.27":
        assert bridged is PluginFor027 and note is None
        return
    assert issubclass(bridged, PluginFor027) and bridged.__name__ == "PluginFor027"
    # vLLM's own layer (0.32's _largest_kernel_block_within) calls it with the spec.
    assert [s.base for s in bridged.get_supported_kernel_block_sizes(object())] == [64]
    assert "takes no KV-cache spec" in note and "\n" not in note
    # A plugin written for the newer interface is left alone.
    assert vllm_compat.bridge_kernel_block_sizes(PluginFor032, base) == (PluginFor032, None)


@pytest.mark.parametrize("release", RELEASES)
def test_metadata_gets_only_the_fields_the_release_has(release):
    cls = common_metadata(release)
    kwargs = vllm_compat.dataclass_kwargs(cls, WANTED_METADATA)
    made = cls(**kwargs)
    assert made.num_actual_tokens == 1 and made.seq_lens_cpu_upper_bound == [1]
    extra = dict(WANTED_METADATA, req_idx=[0])
    kwargs = vllm_compat.dataclass_kwargs(cls, extra)
    assert ("req_idx" in kwargs) == (release != "0.27")


def test_a_required_field_nobody_fills_is_one_line():
    cls = dataclasses.make_dataclass("CommonAttentionMetadataNext", [("query_start_loc", Any), ("new_required", Any)])
    with pytest.raises(MissingInterface) as missing:
        vllm_compat.dataclass_kwargs(cls, {"query_start_loc": 0})
    assert "new_required" in str(missing.value) and "\n" not in str(missing.value)


@pytest.mark.parametrize("release", RELEASES)
def test_selection_passes_only_the_arguments_the_release_takes(release):
    got = vllm_compat.call_with_known(validate_configuration(release), **WANTED_SELECTION, use_rswa=False)
    assert ("use_rswa" in got) == (release != "0.27")
    assert "has_sliding_window" in got


def test_a_missing_method_is_one_line():
    with pytest.raises(MissingInterface) as missing:
        vllm_compat.kernel_block_sizes(type("Bare", (), {}))
    assert str(missing.value) == "Bare has no get_supported_kernel_block_sizes"


# ---- the impl's own write, and a plugin-owned cache ------------------------------------


class Pages(NamedTuple):
    k_pages: Any
    v_pages: Any


class PairImpl:
    """spyre-inference's shape: forward writes, a private scatter, a NamedTuple cache."""

    def forward(self, layer, query, key, value, kv_cache: Pages, attn_metadata, output=None):
        return output

    def _reshape_and_cache(self, key, value, k_pages, v_pages, slot_mapping):
        for i, s in enumerate(slot_mapping):
            k_pages[s] = key[i]
            v_pages[s] = value[i]


class UpdateImpl:
    """vLLM 0.30 on: a separate update."""

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        kv_cache.append(("update", layer, list(slot_mapping)))


class OlderImpl:
    """vllm-spyre's PyTorch-native backends: `_write_to_kv_cache`."""

    def _write_to_kv_cache(self, key, value, kv_cache, slot_mapping, block_size):
        kv_cache.append(("write", block_size, list(slot_mapping)))


class AmbiguousImpl:
    def scatter_a(self, key, value, kv_cache, slot_mapping):
        pass

    def scatter_b(self, key, value, kv_cache, slots):
        pass


class ForwardOnlyImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        return output


def test_the_write_path_is_found_by_its_parameters():
    path = vllm_compat.find_write_path(PairImpl)
    assert path is not None and path.name == "_reshape_and_cache"
    k, v = [None] * 4, [None] * 4
    path.call(PairImpl(), "layer", ["k0", "k1"], ["v0", "v1"], Pages(k, v), [3, 1], 2)
    assert k == [None, "k1", None, "k0"] and v == [None, "v1", None, "v0"]

    cache: List[Any] = []
    vllm_compat.find_write_path(UpdateImpl).call(UpdateImpl(), "L", [], [], cache, [5], 16)
    vllm_compat.find_write_path(OlderImpl).call(OlderImpl(), "L", [], [], cache, [7], 16)
    assert cache == [("update", "L", [5]), ("write", 16, [7])]


def test_no_or_several_candidate_writes_find_none_and_say_so():
    assert vllm_compat.find_write_path(AmbiguousImpl) is None
    assert vllm_compat.named_write_path(AmbiguousImpl, "scatter_b").name == "scatter_b"
    assert vllm_compat.find_write_path(ForwardOnlyImpl) is None
    writer = plugin_kv_cache.KvWriter("auto", ForwardOnlyImpl)
    assert not writer.available
    with pytest.raises(MissingInterface) as missing:
        writer.write(ForwardOnlyImpl(), None, [], [], None, [], 16)
    assert "--kv-write" in str(missing.value) and "\n" not in str(missing.value)
    with pytest.raises(MissingInterface):
        vllm_compat.named_write_path(ForwardOnlyImpl, "forward")


class FakeBackend:
    @staticmethod
    def get_impl_cls():
        return PairImpl

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, block_size, num_kv_heads, head_size)


class VllmShapedBackend(FakeBackend):
    @staticmethod
    def get_impl_cls():
        return ForwardOnlyImpl

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)


def test_the_cache_follows_what_forward_declares():
    annotation = vllm_compat.kv_cache_annotation(PairImpl)
    assert vllm_compat.tuple_fields(annotation) == ("k_pages", "v_pages")
    factory, text = plugin_kv_cache.cache_factory("auto", PairImpl)
    assert factory is plugin_kv_cache.pair_cache and "Pages(k_pages, v_pages)" in text
    assert plugin_kv_cache.cache_factory("auto", ForwardOnlyImpl)[0] is None


@pytest.mark.parametrize("num_blocks", [1, 2, 3])
def test_a_pair_half_drops_only_a_real_kv_axis(num_blocks):
    # With 2 blocks a leading 2 is the blocks, not K and V.
    def request(backend):
        return plugin_kv_cache.CacheRequest(num_blocks, 64, 2, 64, None, None, backend, None)

    assert plugin_kv_cache.pair_shape(request(FakeBackend)) == (num_blocks, 64, 2, 64)
    assert plugin_kv_cache.pair_shape(request(VllmShapedBackend)) == (num_blocks, 64, 2, 64)


def test_forward_writes_unless_the_class_says_otherwise():
    assert vllm_compat.forward_includes_kv_cache_update(type("Plugin", (), {}))
    assert not vllm_compat.forward_includes_kv_cache_update(
        type("Split", (), {"forward_includes_kv_cache_update": False})
    )


# ---- FP8 scale granularities: what a class declares -----------------------------------------


class Fp8Backend:
    """vLLM 0.32's declarations: `supported_kv_cache_dtypes`, and
    `AttentionBackend.supports_kv_cache_dtype`'s rule (an empty list accepts any)."""

    supported_kv_cache_dtypes = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype):
        return (not cls.supported_kv_cache_dtypes) or kv_cache_dtype in cls.supported_kv_cache_dtypes

    @classmethod
    def supports_per_head_quant_scales(cls):
        return False


class PerHeadBackend(Fp8Backend):
    """FlashAttention 3's: per-head descale."""

    @classmethod
    def supports_per_head_quant_scales(cls):
        return True


class PerTokenBackend(Fp8Backend):
    """TRITON_ATTN's: the per-token-and-head caches besides per-tensor FP8."""

    supported_kv_cache_dtypes = Fp8Backend.supported_kv_cache_dtypes + [
        "int8_per_token_head", "fp8_per_token_head"]


class OlderBackend:
    """An older release's: no `supports_per_head_quant_scales`; a dtype check that raises on
    names it does not know."""

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype):
        if kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
            raise ValueError(kv_cache_dtype)
        return True


FP8 = ["auto", "fp8_e4m3", "fp8_e5m2"]


def test_scale_granularities_are_read_from_the_class():
    assert vllm_compat.kv_scale_features(Fp8Backend, FP8) == []
    assert vllm_compat.kv_scale_features(PerHeadBackend, FP8) == ["kv_head_scales"]
    assert vllm_compat.kv_scale_features(PerTokenBackend, FP8) == ["kv_token_scales"]
    both = type("Both", (PerTokenBackend, PerHeadBackend), {})
    assert vllm_compat.kv_scale_features(both, FP8) == ["kv_head_scales", "kv_token_scales"]
    # An older vLLM's class: neither method answers, nothing is declared.
    assert vllm_compat.kv_scale_features(OlderBackend, FP8) == []


def test_scale_granularities_need_the_fp8_cache_they_refine():
    # Per-head scales with no FP8 cache at all; per-token scales only on E4M3.
    assert vllm_compat.kv_scale_features(PerHeadBackend, ["auto"]) == []
    assert vllm_compat.kv_scale_features(PerHeadBackend, ["auto", "fp8_e5m2"]) == ["kv_head_scales"]
    assert vllm_compat.kv_scale_features(PerTokenBackend, ["auto", "fp8_e5m2"]) == []
    # A declaration that raises declares nothing.
    class Raising(PerHeadBackend):
        @classmethod
        def supports_per_head_quant_scales(cls):
            raise RuntimeError("no flash-attn version on this machine")

    assert vllm_compat.kv_scale_features(Raising, FP8) == []
