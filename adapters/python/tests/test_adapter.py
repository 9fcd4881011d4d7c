"""The protocol helper without attn-diff: capability validation, the safety net that declines
what an adapter did not declare, and one case answered end to end through `answer`."""

import json

import numpy as np
import pytest

import attn_diff_adapter as ada
from attn_diff_adapter import CapabilityError, Config, decline_reason, validate_capabilities


def config(**changes):
    base = dict(num_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype="bf16")
    base.update(changes)
    return Config.from_json(json.dumps(base))


def test_every_key_is_accepted_and_fp8_is_e4m3():
    caps = {
        "dtypes": ["f32", "bf16"],
        "head_sizes": [64, 128],
        "head_size_multiple_of": 32,
        "block_sizes": [16, 32],
        "block_size_multiple_of": 16,
        "kinds": ["decoder", "encoder_only"],
        "features": ["sliding_window", "fp8_kv_cache"],
        "max_seqs": 8,
        "max_query_len": 64,
        "max_seq_len": 1024,
        "max_tokens": 256,
        "max_group": 4,
        "kv_cache_dtypes": ["auto", "fp8", "fp8_e5m2"],
        "max_group_unused": None,
    }
    with pytest.raises(CapabilityError, match="unknown capability key 'max_group_unused'"):
        validate_capabilities(caps)
    del caps["max_group_unused"]
    out = validate_capabilities(caps)
    assert out["kv_cache_dtypes"] == ["auto", "fp8_e4m3", "fp8_e5m2"]
    assert validate_capabilities({"dtypes": None}) == {}
    assert validate_capabilities({"batch_invariant": True}) == {"batch_invariant": True}


@pytest.mark.parametrize(
    "caps, message",
    [
        ({"head_size": [64]}, "unknown capability key 'head_size'"),
        ({"dtypes": ["fp32"]}, "unknown value 'fp32'"),
        ({"dtypes": "bf16"}, "is not a list"),
        ({"max_seqs": 0}, "not a positive integer"),
        ({"max_seqs": True}, "not a positive integer"),
        ({"head_sizes": [64, "128"]}, "'128' is not a positive integer"),
        ({"features": ["softcap"]}, "unknown value 'softcap'"),
        ({"kv_cache_dtypes": ["int8"]}, "unknown value 'int8'"),
        ({"batch_invariant": "yes"}, "'yes' is not true or false"),
        ({"batch_invariant": 1}, "1 is not true or false"),
    ],
)
def test_malformed_capabilities_are_named(caps, message):
    with pytest.raises(CapabilityError, match=message):
        validate_capabilities(caps)


def test_serve_refuses_malformed_capabilities_before_the_handshake(capsys):
    class Bad(ada.Adapter):
        name = "bad"
        capabilities = {"head_size": [64]}

    with pytest.raises(SystemExit) as exited:
        ada.serve(Bad())
    assert exited.value.code == 2
    assert "unknown capability key 'head_size'" in capsys.readouterr().err


def test_the_safety_net_declines_what_is_not_declared():
    c = config()
    assert decline_reason({}, c) is None
    assert "dtype bf16" in decline_reason({"dtypes": ["f32"]}, c)
    assert "not a multiple of 128" in decline_reason({"head_size_multiple_of": 128}, c)
    assert "block size 16" in decline_reason({"block_sizes": [32]}, c)
    assert "group of 2" in decline_reason({"max_group": 1}, c)
    assert "sequences per step 3" in decline_reason({"max_seqs": 2}, c, [1, 2, 3], [1, 1, 1], 3)
    assert "tokens per step 5" in decline_reason({"max_tokens": 4}, c, [2], [2], 5)
    assert "query length 7" in decline_reason({"max_query_len": 4}, c, [9], [7], 7)
    windowed = config(sliding_window=4)
    assert decline_reason({"features": ["alibi"]}, windowed) == "sliding_window not implemented"
    assert decline_reason({"features": ["sliding_window"]}, windowed) is None
    # FP8 caches and cross-attention must be declared, not assumed.
    fp8 = config(kv_cache={"dtype": "fp8_e4m3", "k_scale": 1.0, "v_scale": 1.0})
    assert "FP8" in decline_reason({}, fp8)
    assert decline_reason({"features": ["fp8_kv_cache"]}, fp8) is None
    assert decline_reason({"kv_cache_dtypes": ["auto", "fp8_e4m3"]}, fp8) is None
    assert "FP8" in decline_reason({"kv_cache_dtypes": ["fp8_e5m2"]}, fp8)
    assert "auto" in decline_reason({"kv_cache_dtypes": ["fp8_e4m3"]}, c)
    cross = config(kind="encoder_decoder")
    assert "cross-attention" in decline_reason({}, cross)
    assert decline_reason({"kinds": ["encoder_decoder"]}, cross) is None


class Echo(ada.Adapter):
    """Writes nothing, returns the query: enough to drive one message through `answer`."""

    capabilities = {"dtypes": ["f32"]}

    def new_cache(self, config, num_blocks):
        return {}

    def write_kv(self, config, cache, key, value, slot_mapping):
        cache["writes"] = cache.get("writes", 0) + 1

    def forward(self, config, cache, step):
        return step.query


def case_message(dtype="f32"):
    cfg = json.dumps(dict(num_heads=1, num_kv_heads=1, head_size=2, block_size=1, dtype=dtype))
    meta = dict(message="case", version=1, case_id=7, config=cfg, num_blocks=2, num_tokens=1, num_writes=1)
    tensors = {
        "write.0.key": np.ones((1, 1, 2), np.float32),
        "write.0.value": np.ones((1, 1, 2), np.float32),
        "write.0.slot_mapping": np.array([1], np.int64),
        "query": np.full((1, 1, 2), 3.0, np.float32),
        "query_start_loc": np.array([0, 1], np.int32),
        "query_lens": np.array([1], np.int32),
        "seq_lens": np.array([1], np.int32),
        "block_table": np.array([[1]], np.int32),
    }
    return ada.message(meta, tensors)


def test_a_case_round_trips_and_an_undeclared_one_is_unsupported():
    from safetensors.numpy import load

    reply = ada.answer(Echo(), case_message())
    meta = ada.metadata_of(reply)
    assert meta["message"] == "output" and meta["case_id"] == "7"
    assert load(reply)["output"].tolist() == [[[3.0, 3.0]]]
    reply = ada.answer(Echo(), case_message("bf16"))
    meta = ada.metadata_of(reply)
    assert meta["message"] == "unsupported" and "dtype bf16" in meta["reason"]


def test_the_handshake_sends_validated_capabilities():
    hello = ada.message({"message": "hello", "protocol": ada.PROTOCOL, "version": 1, "versions": "1,2"})

    class Fp8(Echo):
        capabilities = {"kv_cache_dtypes": ["fp8"], "max_seq_len": None}

    meta = ada.metadata_of(ada.answer(Fp8(), hello))
    assert meta["version"] == "2"
    assert json.loads(meta["capabilities"]) == {"kv_cache_dtypes": ["fp8_e4m3"]}


def test_local_chunks_are_declined_unless_listed():
    chunked = config(attention_chunk_size=8)
    assert chunked.attention_chunk_size == 8 and "chunked_local_attention" in chunked.features()
    assert config().attention_chunk_size is None and config().features() == []
    # A feature added after the established ones: an adapter that lists no features at all
    # does not get it either.
    assert "chunked_local_attention" in decline_reason({}, chunked)
    assert decline_reason(validate_capabilities({"features": ["chunked_local_attention"]}), chunked) is None
    back = config(attention_chunk_size=8, chunk_lookback=1)
    assert back.features() == ["chunked_local_attention", "chunk_lookback"]
    listed = validate_capabilities({"features": ["chunked_local_attention"]})
    assert "chunk_lookback" in decline_reason(listed, back)


def test_an_fp8_query_is_declined_unless_listed():
    cache = {"dtype": "fp8_e4m3", "k_scale": 0.5, "v_scale": 0.25}
    quantized = config(kv_cache=dict(cache, q_scale=0.25))
    assert "fp8_query" in quantized.features() and "fp8_kv_cache" in quantized.features()
    assert "fp8_query" not in config(kv_cache=cache).features()
    # An adapter with an FP8 cache but no FP8 query must not be handed one.
    fp8_only = validate_capabilities({"kv_cache_dtypes": ["auto", "fp8_e4m3"]})
    assert "fp8_query" in decline_reason(fp8_only, quantized)
    assert decline_reason(fp8_only, config(kv_cache=cache)) is None
    both = validate_capabilities({"kv_cache_dtypes": ["auto", "fp8_e4m3"], "features": ["fp8_query"]})
    assert decline_reason(both, quantized) is None


def test_mla_is_declined_unless_listed_and_reads_its_latent_width():
    mla = config(num_heads=16, num_kv_heads=1, head_size=576, scale=192**-0.5, mla={"head_size_v": 512})
    assert mla.head_size_v == 512 and mla.kv_layout == "mla" and "mla" in mla.features()
    assert config().head_size_v == 64 and config().kv_layout == "mha"
    # Not listed, even with no feature restriction at all: declined, as an FP8 cache is.
    assert "mla" in decline_reason({}, mla)
    assert "mla" in decline_reason(validate_capabilities({"features": ["sinks"]}), mla)
    declared = validate_capabilities({"features": ["mla"], "kv_layouts": ["mla"]})
    assert decline_reason(declared, mla) is None
    # An MLA-only adapter declines ordinary attention by its layout.
    assert "KV layout mha" in decline_reason(declared, config())
    with pytest.raises(CapabilityError, match="kv_layouts"):
        validate_capabilities({"kv_layouts": ["gqa"]})


def test_the_handshake_sends_the_declared_environment_that_is_set(monkeypatch):
    hello = ada.message({"message": "hello", "protocol": ada.PROTOCOL, "version": 1, "versions": "1,2"})

    class Plugin(Echo):
        environment = ("PLUGIN_FILE", "UNSET_ONE", "VLLM_*")

    monkeypatch.setenv("PLUGIN_FILE", "/src/attn.py")
    monkeypatch.delenv("UNSET_ONE", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    meta = ada.metadata_of(ada.answer(Plugin(), hello))
    env = json.loads(meta["environment"])
    assert env["PLUGIN_FILE"] == "/src/attn.py" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "UNSET_ONE" not in env
    assert "environment" not in ada.metadata_of(ada.answer(Echo(), hello))
    assert ada.environment_of(["A*", "B"], {"A1": "x", "A2": "y", "C": "z"}) == {"A1": "x", "A2": "y"}


def test_a_subclass_that_computes_its_own_way_on_inherited_capabilities_is_named():
    import numpy_reference

    class OwnForward(numpy_reference.NumpyReference):
        def forward(self, config, cache, step):  # pragma: no cover - never run
            raise NotImplementedError

    class Declared(OwnForward):
        capabilities = {"features": ["sliding_window"]}

    class SameMaths(numpy_reference.NumpyReference):
        name = "renamed"

    assert ada.capabilities_inherited_from(OwnForward()) == "numpy_reference.NumpyReference"
    assert ada.capabilities_inherited_from(Declared()) is None
    assert ada.capabilities_inherited_from(SameMaths()) is None
    # Adapter's own default ({}: the established features) is not an inheritance to warn of.
    assert ada.capabilities_inherited_from(Echo()) is None
    instance = OwnForward()
    instance.capabilities = {}
    assert ada.capabilities_inherited_from(instance) is None
    hello = ada.message({"message": "hello", "protocol": ada.PROTOCOL, "version": 1, "versions": "1,2"})
    meta = ada.metadata_of(ada.answer(OwnForward(), hello))
    assert meta["inherited_capabilities"] == "numpy_reference.NumpyReference"


def test_prefix_lm_ranges_and_r_swa_are_declined_unless_listed_and_masked_as_upstream():
    c = config()
    assert "PrefixLM" in decline_reason({}, c, prefix_lm=True)
    assert decline_reason({"features": ["prefix_lm"]}, c, prefix_lm=True) is None
    assert "R-SWA" in decline_reason({"features": ["prefix_lm"]}, c, rswa=True)
    assert decline_reason({"features": ["rswa"]}, c, rswa=True) is None

    import numpy_reference

    ref = numpy_reference.NumpyReference()
    empty = np.zeros(0, np.int64)
    step = ada.Step(
        query=np.zeros((3, 4, 64), np.float32), query_start_loc=np.array([0, 3]),
        query_lens=np.array([3]), seq_lens=np.array([6]), block_table=np.zeros((1, 1), np.int64),
        slot_mapping=empty, num_tokens=3,
        prefix_lm_ranges=np.array([[0, 1, 4], [1, 0, 0]]),
    )
    assert step.ranges_of(0) == [(1, 4)] and step.ranges_of(1) == [(0, 0)]
    pos, qpos = np.arange(6), np.array([3, 4, 5])
    causal = pos[None, :] <= qpos[:, None]
    # Positions 3 and 4 lie in [1, 4] (ends inclusive): 3 also sees key 4; 5 is outside.
    seen = ref.request_masks(c, step, 0, causal, pos, qpos)
    assert seen.tolist() == [
        [True, True, True, True, True, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    # R-SWA, window 2 and prefix 2: keys 0, 1 and the last two.
    step = ada.Step(**{**step.__dict__, "prefix_lm_ranges": None, "rswa_window": 2,
                       "rswa_prefix_lens": np.array([2])})
    seen = ref.request_masks(c, step, 0, causal, pos, qpos)
    assert seen.tolist() == [
        [True, True, True, True, False, False],
        [True, True, False, True, True, False],
        [True, True, False, False, True, True],
    ]


def test_kv_scale_granularities_are_declined_unless_listed():
    cache = {"dtype": "fp8_e4m3", "k_scale": 1.0, "v_scale": 1.0}
    head = config(kv_cache=dict(cache, scales={"granularity": "head", "k": [0.5, 2.0], "v": [1.0, 0.25]}))
    token = config(kv_cache=dict(cache, scales={"granularity": "token"}))
    tensor = config(kv_cache=cache)
    assert (head.kv_scales, token.kv_scales, tensor.kv_scales, config().kv_scales) == ("head", "token", "tensor", None)
    assert head.features() == ["fp8_kv_cache", "kv_head_scales"]
    assert token.features() == ["fp8_kv_cache", "kv_token_scales"]
    assert tensor.features() == ["fp8_kv_cache"]
    # Not established: an adapter with an FP8 cache but neither granularity listed declines
    # both, as one that lists no features at all does.
    fp8_only = validate_capabilities({"kv_cache_dtypes": ["auto", "fp8_e4m3"]})
    assert "kv_head_scales" in decline_reason(fp8_only, head)
    assert "kv_token_scales" in decline_reason(fp8_only, token)
    assert decline_reason(fp8_only, tensor) is None
    assert "FP8" in decline_reason({}, head)
    heads = validate_capabilities({"kv_cache_dtypes": ["auto", "fp8_e4m3"], "features": ["kv_head_scales"]})
    assert decline_reason(heads, head) is None
    assert "kv_token_scales" in decline_reason(heads, token)
    both = validate_capabilities({"features": ["fp8_kv_cache", "kv_head_scales", "kv_token_scales"]})
    assert decline_reason(both, head) is None and decline_reason(both, token) is None
    # The granularity is no FP8 cache by itself: one must be declared as well.
    no_fp8 = validate_capabilities({"kv_cache_dtypes": ["auto"], "features": ["kv_head_scales"]})
    assert "FP8" in decline_reason(no_fp8, head)
    assert {"kv_head_scales", "kv_token_scales"} <= set(ada.FEATURES)
    assert not {"kv_head_scales", "kv_token_scales"} & set(ada.ESTABLISHED_FEATURES)
