"""The engine recorder's pieces: idle without ATTN_DIFF_RECORD, vLLM's window and cache
conventions read right, files written whole, and (where torch is installed) one call turned
into the case attn-diff reads, from metadata shaped as vLLM's CPU engine passes it."""

import json
import os
import types

import pytest

from attn_diff_adapter import recorder


class Shaped:
    def __init__(self, *shape):
        self.shape = shape


def test_idle_without_the_variable(monkeypatch):
    monkeypatch.delenv(recorder.ENV_DIR, raising=False)
    monkeypatch.setattr(recorder, "_installed", False)
    recorder.register()
    assert recorder._installed is False


def test_windows_as_vllm_keeps_them():
    assert recorder._window(None) is None
    assert recorder._window(-1) is None  # CPU_ATTN: -1 for none
    assert recorder._window(48) == 48
    assert recorder._window((47, 0)) == 48  # FlashAttention: (w - 1, 0)
    assert recorder._window((-1, -1)) is None
    with pytest.raises(recorder._LeftOut):
        recorder._window((4, 4))


def test_block_size_from_the_known_cache_layouts():
    assert recorder._block_size(Shaped(100, 2, 32, 64), kv_heads=2, d=32) == 32  # CPU_ATTN
    assert recorder._block_size(Shaped(2, 100, 16, 2, 32), kv_heads=2, d=32) == 16  # flash
    with pytest.raises(recorder._LeftOut, match="shape"):
        recorder._block_size(Shaped(100, 64, 2, 32), kv_heads=2, d=32)


def test_files_are_written_whole(tmp_path):
    path = tmp_path / "x.json"
    recorder._write_atomic(str(path), '{"a": 1}')
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_a_call_becomes_a_case():
    torch = pytest.importorskip("torch")
    bs, kv, heads, d = 4, 1, 2, 2
    impl = types.SimpleNamespace(
        attn_type="decoder", kv_cache_dtype="auto", num_heads=heads, num_kv_heads=kv,
        head_size=d, scale=0.5, sliding_window=-1, logits_soft_cap=0, alibi_slopes=None,
        sinks=None,
    )
    mirror = recorder._Mirror()
    # Sequence 0: 5 tokens of context in engine blocks 7 and 3; sequence 1: none.
    ctx = torch.arange(5 * kv * d, dtype=torch.float32).reshape(5, kv, d)
    mirror.write(ctx, -ctx, torch.tensor([28, 29, 30, 31, 12]))
    # One new token for sequence 0 (position 5, block 3 slot 13), two for sequence 1 (block 9).
    query = torch.ones(4, heads, d, dtype=torch.bfloat16)  # the last row: padding
    key = torch.full((4, kv, d), 2.0, dtype=torch.bfloat16)
    md = types.SimpleNamespace(
        query_start_loc=torch.tensor([0, 1, 3]), seq_lens=torch.tensor([6, 2]),
        block_table=torch.tensor([[7, 3], [9, 0]]), slot_mapping=torch.tensor([13, 36, 37, -1]),
        num_actual_tokens=3, causal=True, dynamic_causal=None,
    )
    case = recorder._case_of(impl, query, key, -key, Shaped(10, kv, bs, 2 * d), md, mirror, 64)
    assert case["config"]["dtype"] == "bf16" and case["config"]["block_size"] == bs
    assert case["config"]["sliding_window"] is None and case["config"]["logits_soft_cap"] is None
    assert case["batch"] == {"seq_lens": [6, 2], "query_lens": [1, 2], "num_padding_tokens": 1}
    # Blocks renumbered in order of first use: 7 -> 1, 3 -> 2, 9 -> 3.
    assert case["layout"]["block_table"] == [[1, 2], [3, 0]]
    assert case["layout"]["slot_mapping"] == [2 * bs + 1, 3 * bs, 3 * bs + 1, -1]
    assert case["layout"]["num_blocks"] == 4
    assert case["tensors"]["context_key"][0] == ctx.reshape(-1).tolist()
    assert case["tensors"]["context_value"][0] == (-ctx).reshape(-1).tolist()
    assert case["tensors"]["context_key"][1] == []
    assert len(case["tensors"]["query"]) == 4 * heads * d
    # A slot mapping off its block table is left out, not recorded wrong.
    md.slot_mapping = torch.tensor([14, 36, 37, -1])
    with pytest.raises(recorder._LeftOut, match="slot mapping"):
        recorder._case_of(impl, query, key, -key, Shaped(10, kv, bs, 2 * d), md, mirror, 64)


def test_a_windowed_layers_stale_blocks_get_blocks_of_their_own():
    torch = pytest.importorskip("torch")
    bs, kv, heads, d = 2, 1, 1, 2
    impl = types.SimpleNamespace(
        attn_type="decoder", kv_cache_dtype="auto", num_heads=heads, num_kv_heads=kv,
        head_size=d, scale=0.5, sliding_window=2, logits_soft_cap=0, alibi_slopes=None,
        sinks=None,
    )
    mirror = recorder._Mirror()
    # Context of 6 tokens in blocks 5, 6, 7; with a window of 2 the query at position 6
    # sees keys 5 and 6 alone, so vLLM freed block 5 and reused it for position 6.
    mirror.write(torch.ones(6, kv, d), torch.ones(6, kv, d), torch.tensor([10, 11, 12, 13, 14, 15]))
    query = torch.ones(1, heads, d)
    key = torch.full((1, kv, d), 3.0)
    mirror.write(key, key, torch.tensor([10]))
    md = types.SimpleNamespace(
        query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([7]),
        block_table=torch.tensor([[5, 6, 7, 5]]), slot_mapping=torch.tensor([10]),
        num_actual_tokens=1, causal=True, dynamic_causal=None,
    )
    case = recorder._case_of(impl, query, key, key, Shaped(10, kv, bs, 2 * d), md, mirror, 64)
    # Blocks 5 and 6 at indices 0 and 1 are below the window: the null block, never read
    # (block 5 is the one written now).
    assert case["layout"]["block_table"] == [[0, 0, 1, 2]]
    assert case["layout"]["slot_mapping"] == [2 * bs]
    assert case["config"]["sliding_window"] == 2
