"""The numpy reference's FP8 cache: its encoder against attn-diff's code tables
(`reference/src/fp8.rs`), and per-tensor, per-head and per-token scales as the case format
defines them."""

import json

import numpy as np
import pytest

import numpy_reference as nr
from attn_diff_adapter import Config, Step, decline_reason, validate_capabilities

E4M3, E5M2 = "fp8_e4m3", "fp8_e5m2"


def encode(x, fmt):
    return int(nr.fp8_encode(np.float64(x), fmt))


def test_known_codes_decode_as_the_formats_define_them():
    v4, v5 = nr.FP8_VALUES[E4M3], nr.FP8_VALUES[E5M2]
    assert v4[0x38] == 1.0 and v4[0x7E] == 448.0 and v4[0xFE] == -448.0
    assert v4[0x01] == 2.0**-9 and v4[0x08] == 2.0**-6 and v4[0x78] == 256.0
    assert np.isnan(v4[0x7F]) and np.isnan(v4[0xFF])
    assert v5[0x3C] == 1.0 and v5[0x7B] == 57344.0 and v5[0x01] == 2.0**-16
    assert v5[0x7C] == np.inf and v5[0xFC] == -np.inf
    assert np.isnan(v5[0x7D]) and np.isnan(v5[0x7F])
    # Every E5M2 code is the top byte of the float16 with the same value.
    halves = (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float64)
    assert np.array_equal(v5, halves, equal_nan=True)


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_every_finite_code_encodes_to_itself(fmt):
    values = nr.FP8_VALUES[fmt]
    finite = np.isfinite(values)
    assert np.array_equal(nr.fp8_encode(values[finite], fmt), np.arange(256)[finite])


def test_encoding_rounds_to_nearest_even_and_saturates():
    # fp8.rs's own cases.
    assert encode(1.0, E4M3) == 0x38 and encode(-2.0, E4M3) == 0xC0
    assert encode(1.0625, E4M3) == 0x38, "a tie between 1 and 1.125 goes to 1 (even)"
    assert encode(1.1875, E4M3) == 0x3A, "a tie between 1.125 and 1.25 goes to 1.25"
    assert encode(1.07, E4M3) == 0x39
    # Subnormals: 2^-10 is a tie between 0 and 2^-9 (to 0), 3 * 2^-10 one between 2^-9 and
    # 2^-8 (to 2^-8); the largest subnormal rounds up into the first normal binade.
    assert encode(2.0**-10, E4M3) == 0x00
    assert encode(3 * 2.0**-10, E4M3) == 0x02
    assert encode(7.5 * 2.0**-9, E4M3) == 0x08
    assert encode(2.0**-17, E5M2) == 0x00 and encode(3 * 2.0**-17, E5M2) == 0x02
    assert encode(-1e-30, E4M3) == 0x80 and encode(-0.0, E4M3) == 0x80, "the sign of zero is kept"
    # Saturation, not NaN: 464 is halfway to the (nonexistent) 480.
    assert encode(448.0, E4M3) == 0x7E and encode(464.0, E4M3) == 0x7E
    assert encode(1e6, E4M3) == 0x7E and encode(-np.inf, E4M3) == 0xFE
    assert encode(np.nan, E4M3) == 0x7F and np.isnan(nr.FP8_VALUES[E5M2][encode(np.nan, E5M2)])
    assert encode(57344.0, E5M2) == 0x7B and encode(61440.0, E5M2) == 0x7B
    assert encode(np.inf, E5M2) == 0x7B
    assert encode(1.125, E5M2) == 0x3C, "tie between 1 and 1.25 goes to 1"
    assert encode(1.375, E5M2) == 0x3E, "tie between 1.25 and 1.5 goes to 1.5"


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_encoding_agrees_with_a_search_over_the_codes(fmt):
    values = nr.FP8_VALUES[fmt]
    finite = [(c, values[c]) for c in range(0x80) if np.isfinite(values[c])]
    magnitudes = np.array([v for _, v in finite])

    def by_search(x):
        if np.isnan(x):
            return 0x7F
        a = min(abs(x), nr.FP8_MAX[fmt])
        i = int(np.searchsorted(magnitudes, a, side="right")) - 1
        code = finite[i][0]
        if i + 1 < len(finite):
            up, down = finite[i + 1][1] - a, a - finite[i][1]
            if up < down or (up == down and code & 1):
                code = finite[i + 1][0]
        return (0x80 if np.signbit(x) else 0) | code

    xs = list(values)
    for c in range(0x7E):
        mid = (values[c] + values[c + 1]) / 2
        xs += [mid, mid * (1 + 1e-12), mid * (1 - 1e-12), -mid]
    rng = np.random.default_rng(7)
    xs += list(rng.normal(size=20000) * 10.0 ** (np.arange(20000) % 12 - 6))
    xs += [0.0, -0.0, 1e-300, 1e300, np.inf, -np.inf]
    xs = np.array(xs)
    assert nr.fp8_encode(xs, fmt).tolist() == [by_search(x) for x in xs]


def test_scales_divide_in_float32_on_write_and_multiply_on_read():
    # fp8.rs: 3 / 0.5 = 6, exact; 1000 / 0.5 saturates to 448, read as 224; 250 rounds to 256.
    assert nr.fp8_round_trip(3.0, 0.5, E4M3) == 3.0
    assert nr.fp8_round_trip(1000.0, 0.5, E4M3) == 224.0
    assert nr.fp8_round_trip(1000.0, 4.0, E4M3) == 1024.0
    # The quotient is rounded to float32 before it is encoded: x / s just above a tie in
    # float64 can be the tie itself in float32.
    x, s = np.float32(1.0625 + 2.0**-30), np.float32(1.0)
    assert float(x) == 1.0625 and nr.fp8_round_trip(x, s, E4M3) == 1.0
    x, s = np.float32(1.0), np.float32(3.0)
    q = np.float32(x / s)
    assert nr.fp8_quantize(x, s, E4M3) == nr.fp8_encode(np.float64(q), E4M3)
    # Read back exactly: code value * scale in float64.
    s = np.float32(0.1)
    assert nr.fp8_dequantize(np.uint8(0x39), s, E4M3) == 1.125 * float(s)


def config(**changes):
    base = dict(num_heads=4, num_kv_heads=2, head_size=8, block_size=4, dtype="f32")
    base.update(changes)
    return Config.from_json(json.dumps(base))


def run(ref, cfg, key, value, query, num_blocks=4):
    """One decoder sequence: `key`/`value` [L, Hkv, D] written to slots 0..L, `query` the
    last len(query) positions."""
    seq_len, n = key.shape[0], query.shape[0]
    cache = ref.new_cache(cfg, num_blocks)
    ref.write_kv(cfg, cache, key, value, np.arange(seq_len))
    step = Step(
        query=query, query_start_loc=np.array([0, n]), query_lens=np.array([n]),
        seq_lens=np.array([seq_len]), block_table=np.arange(num_blocks)[None],
        slot_mapping=np.arange(seq_len - n, seq_len), num_tokens=n,
    )
    return cache, ref.forward(cfg, cache, step), step


def inputs(seed=0, seq_len=11, n=3, hkv=2, hq=4, d=8, spread=3.0):
    rng = np.random.default_rng(seed)
    k = (rng.normal(size=(seq_len, hkv, d)) * spread).astype(np.float32)
    v = (rng.normal(size=(seq_len, hkv, d)) * spread).astype(np.float32)
    q = rng.normal(size=(n, hq, d)).astype(np.float32)
    return k, v, q


def test_numpy_reference_declares_every_fp8_feature():
    caps = validate_capabilities(nr.NumpyReference.capabilities)
    assert caps["kv_cache_dtypes"] == ["auto", "fp8_e4m3", "fp8_e5m2"]
    for f in ("fp8_kv_cache", "fp8_query", "kv_head_scales", "kv_token_scales"):
        assert f in caps["features"]
    token = config(kv_cache={"dtype": E4M3, "k_scale": 1.0, "v_scale": 1.0, "scales": {"granularity": "token"}})
    assert decline_reason(caps, token) is None


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_equal_per_head_scales_are_the_per_tensor_cache(fmt):
    ref = nr.NumpyReference()
    k, v, q = inputs(spread=40.0)  # some elements saturate at k_scale 0.05
    tensor = config(kv_cache={"dtype": fmt, "k_scale": 0.05, "v_scale": 0.375})
    head = config(kv_cache={"dtype": fmt, "k_scale": 1.0, "v_scale": 1.0,
                            "scales": {"granularity": "head", "k": [0.05, 0.05], "v": [0.375, 0.375]}})
    c1, out1, _ = run(ref, tensor, k, v, q)
    c2, out2, _ = run(ref, head, k, v, q)
    assert np.array_equal(out1, out2)
    assert np.array_equal(c1["k_codes"], c2["k_codes"]) and np.array_equal(c1["v_codes"], c2["v_codes"])
    if fmt == E4M3:  # saturated codes, not NaN: 40 sigma passes 448 * 0.05 = 22.4
        assert ((c1["k_codes"] & 0x7F) == 0x7E).any()


def test_per_head_scales_apply_to_their_head():
    ref = nr.NumpyReference()
    k, v, q = inputs()
    ks, vs = [0.5, 0.0078125], [2.0, 0.1]
    cfg = config(kv_cache={"dtype": E4M3, "k_scale": 1.0, "v_scale": 1.0,
                           "scales": {"granularity": "head", "k": ks, "v": vs}})
    cache, out, step = run(ref, cfg, k, v, q)
    for h in range(2):
        want_k = nr.fp8_round_trip(k[:, h], np.float32(ks[h]), E4M3)
        want_v = nr.fp8_round_trip(v[:, h], np.float32(vs[h]), E4M3)
        got_k, got_v = ref.read_kv(cfg, cache, np.arange(11) // 4, np.arange(11) % 4)
        assert np.array_equal(got_k[:, h], want_k) and np.array_equal(got_v[:, h], want_v)
    # The same attention as a plain cache holding the read-back values.
    plain = config()
    pcache = ref.new_cache(plain, 4)
    pos = np.arange(11)
    pcache["k"][pos // 4, pos % 4], pcache["v"][pos // 4, pos % 4] = got_k, got_v
    assert np.array_equal(out, ref.forward(plain, pcache, step))


def test_per_token_scales_are_each_rows_absmax_over_448():
    ref = nr.NumpyReference()
    k, v, q = inputs(seq_len=9, spread=5.0)
    k[2, 1] = 0.0  # a zero row: the floor 1e-6
    k[3, 0, 0] = 3000.0  # one large element: the row's scale, the rest near zero codes
    v[4, 1] = 1e-9  # below the floor: every element 1e-9 / 1e-6 = 1e-3 in codes
    cfg = config(kv_cache={"dtype": E4M3, "k_scale": 1.0, "v_scale": 1.0, "scales": {"granularity": "token"}})
    cache, out, step = run(ref, cfg, k, v, q, num_blocks=3)
    pos = np.arange(9)
    blocks, offsets = pos // 4, pos % 4
    for which, rows in (("k", k), ("v", v)):
        # SPEC: s = max(absmax(x) / 448, 1e-6), float32 arithmetic.
        absmax = np.abs(rows).max(axis=-1)
        s = np.maximum(absmax / np.float32(448.0), np.float32(1e-6))
        assert s.dtype == np.float32
        assert np.array_equal(cache[f"{which}_scales"][blocks, offsets], s)
        codes = nr.fp8_encode((rows / s[..., None]).astype(np.float32), E4M3)
        assert np.array_equal(cache[f"{which}_codes"][blocks, offsets], codes)
    assert cache["k_scales"][0, 2, 1] == np.float32(1e-6) and (cache["k_codes"][0, 2, 1] == 0).all()
    assert cache["k_codes"][0, 3, 0, 0] == 0x7E, "the largest element is stored as 448"
    assert cache["v_scales"][1, 0, 1] == np.float32(1e-6)
    # Every row's largest element lands on (or, by the float32 division, at) 448.
    got_k, got_v = ref.read_kv(cfg, cache, blocks, offsets)
    assert np.allclose(np.abs(got_k).max(axis=-1)[absmax > 0], np.abs(k).max(axis=-1)[absmax > 0], rtol=2**-4)
    plain = config()
    pcache = ref.new_cache(plain, 3)
    pcache["k"][blocks, offsets], pcache["v"][blocks, offsets] = got_k, got_v
    assert np.array_equal(out, ref.forward(plain, pcache, step))


def test_per_token_scales_follow_the_row_as_it_is_rewritten():
    ref = nr.NumpyReference()
    cfg = config(kv_cache={"dtype": E4M3, "k_scale": 1.0, "v_scale": 1.0, "scales": {"granularity": "token"}})
    cache = ref.new_cache(cfg, 2)
    small = np.full((1, 2, 8), 0.5, np.float32)
    ref.write_kv(cfg, cache, small, small, np.array([5]))
    assert cache["k_scales"][1, 1].tolist() == [np.float32(0.5) / np.float32(448)] * 2
    ref.write_kv(cfg, cache, small * 100, small, np.array([5]))
    assert cache["k_scales"][1, 1].tolist() == [np.float32(50.0) / np.float32(448)] * 2
    k, _ = ref.read_kv(cfg, cache, np.array([1]), np.array([1]))
    assert np.allclose(k, 50.0, rtol=2**-4)
    with pytest.raises(nr.Unsupported, match="E4M3 only"):
        ref.check(config(kv_cache={"dtype": E5M2, "k_scale": 1.0, "v_scale": 1.0, "scales": {"granularity": "token"}}))


def test_an_fp8_query_is_read_back_as_e4m3_whatever_the_cache():
    ref = nr.NumpyReference()
    k, v, q = inputs()
    q[0, 0, 0] = 1e4  # saturates at 448 * q_scale
    for fmt in (E4M3, E5M2):
        cfg = config(kv_cache={"dtype": fmt, "k_scale": 0.5, "v_scale": 0.5, "q_scale": 0.25})
        read = ref.read_query(cfg, q)
        assert np.array_equal(read, nr.fp8_round_trip(q, np.float32(0.25), E4M3))
        assert read[0, 0, 0] == 448 * 0.25
    assert np.array_equal(ref.read_query(config(), q), q.astype(np.float64))
