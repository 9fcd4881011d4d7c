"""OpenVINO PagedAttentionExtension (CPU plugin): ALiBi slopes with a sliding window.

Needs only openvino and numpy (no attn-diff): one sequence, one op call, compared with numpy
under each reading of the inputs. Prints which reading the plugin's output matches.

    ~/.cache/attn-diff/venv-openvino/bin/python docs/findings/openvino_alibi_window.py
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
           const(np.zeros((0, HQ, 1, 1)), np.float32), const(0, np.int32), const(np.zeros(0), np.int32),
           const(np.zeros(0), np.int32), const(np.zeros(0), np.int32), const(np.zeros(0), np.int32),
           ops.constant(np.zeros(0, np.uint8)).output(0), const(np.zeros(0), np.int32)]
    node = ov_op._PagedAttentionExtension(ins)
    for k, v in {"k_head_size": S, "num_k_heads": HKV, "v_head_size": S, "num_v_heads": HKV}.items():
        node.get_rt_info()[k] = v
    model = ov.Model([ops.result(node.output(0))], params, "pa")
    return ov.Core().compile_model(model, "CPU", {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"})


def numpy_attention(q, k, v, window, slopes):
    """q [n, HQ, S] for the last n positions of k/v [L, HKV, S]; window 0 = none."""
    n, L = len(q), len(k)
    out = np.zeros((n, HQ, S))
    for i in range(n):
        p = L - n + i
        lo = 0 if window == 0 else max(0, p - window + 1)
        for h in range(HQ):
            logits = (k[lo : p + 1, 0] @ q[i, h]) * S**-0.5
            if slopes is not None:
                logits = logits + slopes[h] * (np.arange(lo, p + 1) - p)
            w = np.exp(logits - logits.max())
            out[i, h] = (w / w.sum()) @ v[lo : p + 1, 0]
    return out


def main():
    rng = np.random.default_rng(0)
    L, n, window = 24, 4, 8
    slopes = np.array([0.5, 0.25], np.float32)
    k = rng.standard_normal((L, HKV, S)).astype(np.float32)
    v = rng.standard_normal((L, HKV, S)).astype(np.float32)
    q = rng.standard_normal((n, HQ, S)).astype(np.float32)
    kc = np.zeros((2, HKV, BS, S), np.float32)
    vc = np.zeros_like(kc)
    kc[1, :, : L - n] = k[: L - n].transpose(1, 0, 2)  # the context, block 1
    vc[1, :, : L - n] = v[: L - n].transpose(1, 0, 2)
    req = build().create_infer_request()
    feed = {"query": q.reshape(n, -1), "key": k[L - n :].reshape(n, -1), "value": v[L - n :].reshape(n, -1),
            "past_lens": np.array([L - n], np.int32), "subsequence_begins": np.array([0, n], np.int32),
            "block_indices": np.array([1], np.int32), "block_indices_begins": np.array([0, 1], np.int32),
            "scale": np.array(S**-0.5, np.float32), "sliding_window": np.array(window, np.int32),
            "alibi_slopes": slopes, "max_context_len": np.array(L, np.int32),
            "score_aggregation_window": np.zeros(1, np.int32)}
    for name, x in feed.items():
        req.set_tensor(name, ov.Tensor(x))
    req.set_tensor("key_cache", ov.Tensor(kc, shared_memory=True))
    req.set_tensor("value_cache", ov.Tensor(vc, shared_memory=True))
    req.infer()
    got = req.get_output_tensor(0).data.reshape(n, HQ, S).copy()
    readings = {
        "window and ALiBi (what the inputs say)": numpy_attention(q, k, v, window, slopes),
        "window only (ALiBi dropped)": numpy_attention(q, k, v, window, None),
        "ALiBi only (window dropped)": numpy_attention(q, k, v, 0, slopes),
        "neither": numpy_attention(q, k, v, 0, None),
    }
    for name, want in readings.items():
        print(f"{name:42s} max |openvino - numpy| = {np.abs(got - want).max():.3e}")
    return readings, got


if __name__ == "__main__":
    main()
