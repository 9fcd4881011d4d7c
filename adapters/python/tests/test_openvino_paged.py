"""OpenVINO's PagedAttentionExtension (adapters/python/openvino_paged.py): the findings of
docs/findings-openvino.md, the u8 cache against its quantization bound, and a short
`attn-diff check` of the float-cache adapter.

Skipped, saying why, where openvino is not importable (it is not in `.python-env`); run it
with the venv `tools/peers/openvino_env.sh` makes:

    ATTN_DIFF=target/release/attn-diff ~/.cache/attn-diff/venv-openvino/bin/python \\
        -m pytest -q adapters/python/tests/test_openvino_paged.py
"""

import os
import sys

import pytest

ov = pytest.importorskip(
    "openvino",
    reason="openvino is not importable here: `sh tools/peers/openvino_env.sh` makes "
    "~/.cache/attn-diff/venv-openvino; run pytest with its python",
)
np = pytest.importorskip("numpy")

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTERS = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(ADAPTERS))
sys.path.insert(0, ADAPTERS)
sys.path.insert(0, os.path.join(REPO, "docs", "findings"))

import openvino_paged  # noqa: E402

BS = openvino_paged.BLOCK_SIZE


def _feed(req, feed, kc, vc):
    for name, x in feed.items():
        req.set_tensor(name, ov.Tensor(x if x.ndim == 0 else np.ascontiguousarray(x)))
    req.set_tensor("key_cache", ov.Tensor(kc, shared_memory=True))
    req.set_tensor("value_cache", ov.Tensor(vc, shared_memory=True))
    req.infer()
    return req.get_output_tensor(0).data.copy()


def _exact(q, k, v, past, scale):
    """float64 causal attention of q [n, Hq, S] at positions past.. over k/v [L, Hkv, S]."""
    n, hq, _ = q.shape
    g = hq // k.shape[1]
    out = np.zeros(q.shape)
    for i in range(n):
        p = past + i
        for h in range(hq):
            logits = k[: p + 1, h // g] @ q[i, h] * scale
            w = np.exp(logits - logits.max())
            out[i, h] = (w / w.sum()) @ v[: p + 1, h // g]
    return out


def _u8_bound(q, k, v, past, scale, writes_per_block):
    """A sound bound on |out(u8 cache) - out(exact)|.

    Keys: asymmetric u8 per channel over each block (255 steps of the channel's range r_c in
    the block), so one quantization is off by at most r_c / 510; a block the op writes again
    in a later call is re-quantized from its dequantized rows, each pass adding at most that
    (the range only grows), so m writes: m * r_c / 510. Values: u8 per token over the head,
    at most r_t / 510. A logit moves by delta <= scale * sum_c |q_c| e_c; the softmax weights
    then move by at most p_j (e^{2 delta_max} - 1), so the output moves by at most
    (e^{2 delta_max} - 1) max|v| + max e_v."""
    n, hq, _ = q.shape
    g = hq // k.shape[1]
    ek = np.zeros_like(k)
    for b in range((len(k) + BS - 1) // BS):
        blk = k[b * BS : (b + 1) * BS]
        ek[b * BS : (b + 1) * BS] = writes_per_block[b] * (blk.max(axis=0) - blk.min(axis=0)) / 510.0
    ev = (v.max(axis=2) - v.min(axis=2)) / 510.0  # [L, Hkv]
    out = np.zeros(q.shape)
    for i in range(n):
        p = past + i
        for h in range(hq):
            delta = scale * (np.abs(q[i, h])[None] * ek[: p + 1, h // g]).sum(axis=1).max()
            out[i, h] = (np.exp(2 * delta) - 1) * np.abs(v[: p + 1, h // g]).max() + ev[: p + 1, h // g].max()
    return out


def _run_steps(hq, hkv, s, steps, seed, prec):
    """One sequence through the op, call by call (`steps` new tokens each), on a cache of
    precision `prec`; the worst |error| / bound over every call (bound: exact for float)."""
    rng = np.random.default_rng(seed)
    a = openvino_paged.OpenVinoPaged("u8" if prec == "u8" else "float")
    got = a._compile(hq, hkv, s, "f32", prec)
    (_, kshape), (_, vshape) = got["cache"]["key_cache"], got["cache"]["value_cache"]
    total = sum(steps)
    nblk = (total + BS - 1) // BS
    table = rng.permutation(np.arange(1, nblk + 2))[:nblk].astype(np.int32)
    dt = np.uint8 if prec == "u8" else np.float32
    kc = np.zeros([nblk + 2] + kshape, dt)
    vc = np.zeros([nblk + 2] + vshape, dt)
    k = (rng.standard_normal((total, hkv, s)) * rng.uniform(0.5, 3)).astype(np.float32)
    v = rng.standard_normal((total, hkv, s)).astype(np.float32)
    scale = s**-0.5
    past, worst, writes = 0, 0.0, np.zeros(nblk, int)
    for n in steps:
        q = (rng.standard_normal((n, hq, s)) * 2).astype(np.float32)
        end = past + n
        nb = (end + BS - 1) // BS
        writes[past // BS : nb] += 1
        feed = {
            "query": q.reshape(n, -1), "key": k[past:end].reshape(n, -1), "value": v[past:end].reshape(n, -1),
            "past_lens": np.array([past], np.int32), "subsequence_begins": np.array([0, n], np.int32),
            "block_indices": table[:nb], "block_indices_begins": np.array([0, nb], np.int32),
            "scale": np.array(scale, np.float32), "sliding_window": np.array(0, np.int32),
            "alibi_slopes": np.zeros(0, np.float32), "max_context_len": np.array(end, np.int32),
            "score_aggregation_window": np.zeros(1, np.int32), "sinks": np.zeros((0, hq, 1, 1), np.float32),
        }
        out = _feed(got["request"], feed, kc, vc).reshape(n, hq, s)
        q64, k64, v64 = q.astype(np.float64), k[:end].astype(np.float64), v[:end].astype(np.float64)
        want = _exact(q64, k64, v64, past, scale)
        if prec == "u8":
            bound = _u8_bound(q64, k64, v64, past, scale, writes) * 1.01 + 1e-5
        else:
            bound = 1e-5 + 1e-5 * np.abs(want)
        worst = max(worst, float((np.abs(out - want) / bound).max()))
        past = end
    return worst


@pytest.mark.parametrize(
    "hq,hkv,s,steps",
    [
        (4, 2, 64, [70]),  # one prefill over three blocks
        (4, 2, 64, [40, 1, 1, 1, 30, 1]),  # partial blocks re-quantized by later calls
        (8, 1, 128, [5] + [1] * 40),  # decode across a block boundary, group 8
        (2, 2, 16, [33, 1, 1]),
        (4, 4, 80, [100, 1, 1]),
    ],
)
def test_u8_cache_is_within_its_quantization_bound(hq, hkv, s, steps):
    worst = _run_steps(hq, hkv, s, steps, seed=1, prec="u8")
    assert worst <= 1.0, f"u8 cache error {worst:.3f}x its quantization bound"


def test_f32_cache_matches_float64_through_the_ops_own_writes():
    assert _run_steps(4, 2, 64, [40, 1, 1, 30, 1], seed=2, prec="f32") <= 1.0


def test_finding_alibi_is_dropped_when_a_window_is_set():
    """Finding 1 of docs/findings-openvino.md: with a sliding window, the CPU plugin ignores
    the ALiBi slopes, silently (the spec's implementation notes call the two mutually
    exclusive on CPU; nothing refuses the model)."""
    import openvino_alibi_window

    readings, got = openvino_alibi_window.main()
    err = {name: float(np.abs(got - want).max()) for name, want in readings.items()}
    assert err["window only (ALiBi dropped)"] < 1e-5, err
    assert err["window and ALiBi (what the inputs say)"] > 1e-2, err


def test_finding_span_with_alibi_and_sinks_is_wrong():
    """Finding 3: a bidirectional token_type_ids span with ALiBi and sinks together is wrong
    (each alone, and both on a causal sequence, agree with numpy)."""
    import openvino_span_alibi_sinks

    results = openvino_span_alibi_sinks.main()
    err = {name: float(np.abs(got - want).max()) for name, (got, want) in results.items()}
    for name, e in err.items():
        if name.startswith("span") and "alibi=True" in name and "sinks=True" in name:
            assert e > 1e-2, err
        else:
            assert e < 1e-5, (name, err)


def test_span_semantics_are_gemma3s():
    """token_type_ids spans (what the adapter maps non-causal and encoder-only requests onto)
    see their whole span, inside a sequence and across the window, as Gemma 3's OR'ed masks:
    the reason a bidirectional request with a window is declined."""
    import openvino_span_alibi_sinks as m

    req = m.build().create_infer_request()
    rng = np.random.default_rng(3)
    n, window = 10, 3
    types = np.array([0, 0, 0, 1, 1, 1, 1, 1, 0, 0], np.int32)
    q = rng.standard_normal((n, m.HQ, m.S)).astype(np.float32)
    k = rng.standard_normal((n, m.HKV, m.S)).astype(np.float32)
    v = rng.standard_normal((n, m.HKV, m.S)).astype(np.float32)
    kc = np.zeros((2, m.HKV, m.BS, m.S), np.float32)
    vc = np.zeros_like(kc)
    feed = {"query": q.reshape(n, -1), "key": k.reshape(n, -1), "value": v.reshape(n, -1),
            "past_lens": np.array([0], np.int32), "subsequence_begins": np.array([0, n], np.int32),
            "block_indices": np.array([1], np.int32), "block_indices_begins": np.array([0, 1], np.int32),
            "scale": np.array(m.S**-0.5, np.float32), "sliding_window": np.array(window, np.int32),
            "alibi_slopes": np.zeros(0, np.float32), "max_context_len": np.array(n, np.int32),
            "score_aggregation_window": np.zeros(1, np.int32), "sinks": np.zeros((0, m.HQ, 1, 1), np.float32),
            "token_type_ids": types}
    got = _feed(req, feed, kc, vc).reshape(n, m.HQ, m.S)
    want = np.zeros(got.shape)
    for p in range(n):
        seen = np.array([(j <= p and p - j < window) or (types[p] and types[j] and 3 <= j <= 7) for j in range(n)])
        for h in range(m.HQ):
            logits = np.where(seen, (k[:, 0] @ q[p, h]) * m.S**-0.5, -np.inf)
            w = np.exp(logits - logits.max())
            want[p, h] = (w / w.sum()) @ v[:, 0]
    assert np.abs(got - want).max() < 1e-5


def test_finding_no_bf16_cache_without_bf16_hardware():
    """Finding 2, on an AVX2-only x86 CPU (OPTIMIZATION_CAPABILITIES without BF16): the plugin
    refuses KV_CACHE_PRECISION bf16 at compile time (runtime precision f32, 'expect kvcache
    type f32'). On a CPU with bf16 it compiles; test_finding_cache_is_the_executors_precision
    covers those."""
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    a = openvino_paged.OpenVinoPaged("float")
    if "BF16" in caps:
        a._compile(4, 2, 64, "bf16", "bf16")  # compiles where the hardware has bf16
        return
    with pytest.raises(RuntimeError, match="expect kvcache type f32"):
        a._compile(4, 2, 64, "bf16", "bf16")


def _executor(compiled):
    (node,) = [
        op.get_rt_info()
        for op in compiled.get_runtime_model().get_ops()
        if op.get_rt_info()["layerType"].astype(str) == "PagedAttention"
    ]
    return node["runtimePrecision"].astype(str)


@pytest.mark.parametrize("hint", [None, "f32", "bf16", "f16"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_finding_cache_is_the_executors_precision(dtype, hint):
    """Finding 2, on any CPU: the executor's precision is the model's after the hint (bf16 or
    f16 only where the CPU has them: getRuntimePrecision), and a float cache is taken only in
    that precision (f16 also beside an f32 executor); any other float cache fails
    compile_model with 'expect kvcache type <executor>'. The adapter's plan must name a
    cache the plugin takes. Prints what ran, so a log says which CPU path this was."""
    a = openvino_paged.OpenVinoPaged("float")
    executor = _executor(a._compile(1, 1, 16, dtype, None, hint)["model"])
    taken = {}
    for prec in ("f32", "bf16", "f16"):
        try:
            got = a._compile(4, 2, 64, dtype, prec, hint)
            taken[prec] = got["cache"]["key_cache"][0].get_type_name()
        except RuntimeError as e:
            assert f"expect kvcache type {executor}" in str(e), (prec, str(e))
    print(f"dtype {dtype} hint {hint}: executor {executor}, float caches taken (asked -> given) {taken}")
    assert taken.get(executor) == executor, taken
    caps = [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
    if executor == "bf16":
        assert "BF16" in caps
    if executor == "f16":
        assert "FP16" in caps
    plan = a.plan(dtype)
    if hint == a.hint(dtype):
        assert plan["executor"] == executor, plan


def test_adapter_declines_what_this_cpu_cannot_hold(monkeypatch):
    """With the plugin's default hint (GenAI's behaviour), a CPU with bf16 runs every model in
    bf16: the f32 and f16 dtypes are left out with a reason instead of failing in compile."""
    monkeypatch.setattr(openvino_paged, "PRECISION", "default")
    a = openvino_paged.OpenVinoPaged("float")
    for dtype in ("f32", "bf16", "f16"):
        plan = a.plan(dtype)
        print(dtype, plan)
        if plan.get("refused"):
            assert dtype not in a.capabilities["dtypes"]
            assert plan.get("executor") not in openvino_paged.HOLDS[dtype]
        else:
            assert dtype in a.capabilities["dtypes"] and plan["cache"] in openvino_paged.HOLDS[dtype]


def test_float_cache_adapter_passes_a_short_check(attn_diff_binary):
    """A short check of the float-cache adapter: no failure, except on a CPU whose plugin
    runs bf16 in bf16 (AVX512-BF16 or AMX), where bf16 cases with logits of 1e2 and more
    may be off (finding 6): there, every failure must be such a case (a mismatch of a bf16
    case with large logits; no crash, no NaN) and at least 120 cases must reach the op."""
    from attn_diff_adapter.testing import check_adapter

    a = openvino_paged.OpenVinoPaged("float")
    bf16_executor = a.plan("bf16").get("executor") == "bf16"
    print("plans:", {d: a.plan(d) for d in ("f32", "bf16", "f16")})
    result = check_adapter(
        [sys.executable, os.path.join(ADAPTERS, "openvino_paged.py")],
        cases=150,
        traces=10,
        binary=attn_diff_binary,
        env={"ATTN_DIFF_THREADS": "1"},
        min_reached=120,
        args=["--jobs", "1"],
        fail=not bf16_executor,
    )
    assert result.reached >= 120, result.stdout[-3000:]
    if bf16_executor and not result.passed:
        failures = [f for b in (result.summary or {}).get("backends", []) for f in b.get("failures") or []]
        for f in failures:
            print(f["class"]["signature"], "|", f["text"].splitlines()[1])
        assert failures, result.stdout[-3000:] + result.stderr[-3000:]
        for f in failures:
            sig, case = f["class"]["signature"], f["text"].splitlines()[1]
            assert f["kind"] == "mismatch" and ", bf16, " in case, f["text"]
            assert "logits 1e2 to 1e4" in sig or "logits past 1e4" in sig, f["text"]


def test_u8_adapter_declines_by_feature(attn_diff_binary):
    from attn_diff_adapter.testing import check_adapter

    result = check_adapter(
        [sys.executable, os.path.join(ADAPTERS, "openvino_paged.py"), "--kv-cache", "u8"],
        cases=5,
        traces=0,
        binary=attn_diff_binary,
        fail=False,
        args=["--no-upstream", "--jobs", "1"],
    )
    assert result.reached == 0 and result.declined == result.drawn > 0, result.summary


def test_spans_adapter_passes_a_short_check(attn_diff_binary):
    """`--spans`: encoder-only cases and non-causal requests through token_type_ids."""
    from attn_diff_adapter.testing import check_adapter

    result = check_adapter(
        [sys.executable, os.path.join(ADAPTERS, "openvino_paged.py"), "--spans"],
        cases=100,
        traces=0,
        only=["kinds=encoder_only"],
        binary=attn_diff_binary,
        env={"ATTN_DIFF_THREADS": "1"},
        min_reached=60,
        args=["--jobs", "1", "--no-upstream"],
    )
    assert result.reached >= 60


def test_findings_half_executors():
    """Findings 4 and 5, where this CPU runs them natively (else skipped, saying so): the f16
    executor is wrong on every multi-token call; the bf16 executor on multi-token calls at odd
    head sizes; single-token calls agree. Why the adapter runs f16 on the f32 executor and
    pads odd head sizes on the bf16 one."""
    import openvino_half_executors as m

    results = m.main()
    if not results:
        pytest.skip("this CPU runs neither bf16 nor f16 natively (no AVX512-BF16/AMX/AVX512-FP16)")
    for (hint, n), row in results.items():
        for s, err in row.items():
            if n == 1:
                assert err == 0.0, (hint, n, s, err)
            elif hint == "f16" or s % 2:
                assert not err < 0.5, (hint, n, s, err)  # wrong or NaN
            else:
                assert err < 0.05, (hint, n, s, err)
