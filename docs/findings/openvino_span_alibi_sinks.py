"""OpenVINO PagedAttentionExtension (CPU plugin): a bidirectional span (token_type_ids) with
ALiBi slopes and attention sinks together.

Needs only openvino and numpy (no attn-diff): one sequence of 6 new tokens, all of one
token_type_ids span (each sees the whole span, as Gemma 3's image tokens), one op call per
combination of ALiBi and sinks, against numpy. Each feature alone agrees, and the causal
sequence agrees with both; the span with both is off in every token that has keys after it
(the last token, which has none, is right).

    ~/.cache/attn-diff/venv-openvino/bin/python docs/findings/openvino_span_alibi_sinks.py
"""

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino import op as ov_op

HQ, HKV, S, BS = 2, 1, 16, 32


def build():
    params = []

    def par(t, shape, name):
        p = ops.parameter(ov.PartialShape(shape), t, name=name)
        params.append(p)
        return p.output(0)

    def const(v, dt):
        return ops.constant(np.array(v, dtype=dt)).output(0)

    f32, i32 = ov.Type.f32, ov.Type.i32
    ins = [par(f32, [-1, HQ * S], "query"), par(f32, [-1, HKV * S], "key"), par(f32, [-1, HKV * S], "value"),
           par(ov.Type.dynamic, [-1, HKV, -1, S], "key_cache"), par(ov.Type.dynamic, [-1, HKV, -1, S], "value_cache"),
           par(i32, [-1], "past_lens"), par(i32, [-1], "subsequence_begins"), par(i32, [-1], "block_indices"),
           par(i32, [-1], "block_indices_begins"), par(f32, [], "scale"), par(i32, [], "sliding_window"),
           par(f32, [-1], "alibi_slopes"), par(i32, [], "max_context_len"), par(i32, [-1], "score_aggregation_window"),
           const(np.zeros(0), np.int32), const(np.zeros((0, 1)), np.int32), const(np.zeros((0, S)), np.float32),
           const(np.zeros(0), np.float32), const(0, np.int32), const(0, np.int32),
           par(f32, [-1, HQ, 1, 1], "sinks"), const(0, np.int32), const(np.zeros(0), np.int32),
           const(np.zeros(0), np.int32), const(np.zeros(0), np.int32), par(i32, [-1], "token_type_ids"),
           ops.constant(np.zeros(0, np.uint8)).output(0), const(np.zeros(0), np.int32)]
    node = ov_op._PagedAttentionExtension(ins)
    for k, v in {"k_head_size": S, "num_k_heads": HKV, "v_head_size": S, "num_v_heads": HKV}.items():
        node.get_rt_info()[k] = v
    model = ov.Model([ops.result(node.output(0))], params, "pa")
    return ov.Core().compile_model(model, "CPU", {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"})


def numpy_attention(q, k, v, bidirectional, slopes, sinks):
    n = len(q)
    out = np.zeros((n, HQ, S))
    for p in range(n):
        for h in range(HQ):
            logits = (k[:, 0] @ q[p, h]) * S**-0.5
            if slopes is not None:
                logits = logits + slopes[h] * (np.arange(n) - p)
            if not bidirectional:
                logits[p + 1 :] = -np.inf
            peak = logits.max() if sinks is None else max(logits.max(), sinks[h])
            w = np.exp(logits - peak)
            denom = w.sum() + (0.0 if sinks is None else np.exp(sinks[h] - peak))
            out[p, h] = (w / denom) @ v[:, 0]
    return out


def main():
    rng = np.random.default_rng(0)
    n = 6
    q = rng.standard_normal((n, HQ, S)).astype(np.float32)
    k = rng.standard_normal((n, HKV, S)).astype(np.float32)
    v = rng.standard_normal((n, HKV, S)).astype(np.float32)
    req = build().create_infer_request()
    slopes = np.array([0.5, 0.25], np.float32)
    sinks = np.array([-1.1, 0.7], np.float32)
    results = {}
    for bidirectional in (True, False):
        for sl, sk in ((slopes, None), (None, sinks), (slopes, sinks)):
            kc = np.zeros((2, HKV, BS, S), np.float32)
            vc = np.zeros_like(kc)
            feed = {"query": q.reshape(n, -1), "key": k.reshape(n, -1), "value": v.reshape(n, -1),
                    "past_lens": np.array([0], np.int32), "subsequence_begins": np.array([0, n], np.int32),
                    "block_indices": np.array([1], np.int32), "block_indices_begins": np.array([0, 1], np.int32),
                    "scale": np.array(S**-0.5, np.float32), "sliding_window": np.array(0, np.int32),
                    "alibi_slopes": np.zeros(0, np.float32) if sl is None else sl,
                    "max_context_len": np.array(n, np.int32), "score_aggregation_window": np.zeros(1, np.int32),
                    "sinks": np.zeros((0, HQ, 1, 1), np.float32) if sk is None else sk.reshape(1, HQ, 1, 1),
                    "token_type_ids": np.ones(n, np.int32) if bidirectional else np.zeros(0, np.int32)}
            for name, x in feed.items():
                req.set_tensor(name, ov.Tensor(x))
            req.set_tensor("key_cache", ov.Tensor(kc, shared_memory=True))
            req.set_tensor("value_cache", ov.Tensor(vc, shared_memory=True))
            req.infer()
            got = req.get_output_tensor(0).data.reshape(n, HQ, S).copy()
            want = numpy_attention(q, k, v, bidirectional, sl, sk)
            name = f"{'span  ' if bidirectional else 'causal'} alibi={sl is not None!s:5} sinks={sk is not None!s:5}"
            results[name] = (got, want)
            print(f"{name}  max |openvino - numpy| = {np.abs(got - want).max():.3e}")
    got, want = results["span   alibi=True  sinks=True "]
    print("span with both, max |openvino - numpy| per token:", np.round(np.abs(got - want).max(axis=(1, 2)), 4))
    return results


if __name__ == "__main__":
    main()
