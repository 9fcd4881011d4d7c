"""OpenVINO PagedAttentionExtension (CPU plugin): its bf16 and f16 executors, on CPUs that
have them (AVX512-BF16 or AMX for bf16, AVX512-FP16 for f16), against numpy.

Needs only openvino and numpy (no attn-diff). One sequence, one op call, past_lens 0, small
integer q, k and v (exact in every dtype); the model's inputs are f32 and
INFERENCE_PRECISION_HINT picks the executor (the script prints which one ran, read from the
compiled model's runtime model, and skips a precision this CPU does not run natively).
Printed: max |openvino - numpy| per head size, for one new token and for six.

- finding 4: the f16 executor is wrong (or NaN) on every call with more than one new token,
  at every head size; one new token agrees;
- finding 5: the bf16 executor is wrong (or NaN) on calls with more than one new token at
  odd head sizes; even head sizes, and one new token at any size, agree (to bf16's rounding).

    ~/.cache/attn-diff/venv-openvino/bin/python docs/findings/openvino_half_executors.py
"""

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino import op as ov_op

HQ, HKV, BS = 2, 1, 32
HEAD_SIZES = [1, 2, 3, 5, 8, 15, 16, 33, 64, 127, 128]


def build(s, hint):
    params = []

    def par(t, shape, name):
        p = ops.parameter(ov.PartialShape(shape), t, name=name)
        params.append(p)
        return p.output(0)

    def const(v, dt):
        return ops.constant(np.array(v, dtype=dt)).output(0)

    f32, i32 = ov.Type.f32, ov.Type.i32
    ins = [par(f32, [-1, HQ * s], "query"), par(f32, [-1, HKV * s], "key"), par(f32, [-1, HKV * s], "value"),
           par(ov.Type.dynamic, [-1, HKV, -1, s], "key_cache"), par(ov.Type.dynamic, [-1, HKV, -1, s], "value_cache"),
           par(i32, [-1], "past_lens"), par(i32, [-1], "subsequence_begins"), par(i32, [-1], "block_indices"),
           par(i32, [-1], "block_indices_begins"), par(f32, [], "scale"), par(i32, [], "sliding_window"),
           par(f32, [-1], "alibi_slopes"), par(i32, [], "max_context_len"), par(i32, [-1], "score_aggregation_window"),
           const(np.zeros(0), np.int32), const(np.zeros((0, 1)), np.int32), const(np.zeros((0, s)), np.float32),
           const(np.zeros(0), np.float32), const(0, np.int32), const(0, np.int32),
           par(f32, [-1, HQ, 1, 1], "sinks"), const(0, np.int32), const(np.zeros(0), np.int32),
           const(np.zeros(0), np.int32), const(np.zeros(0), np.int32), par(i32, [-1], "token_type_ids"),
           ops.constant(np.zeros(0, np.uint8)).output(0), const(np.zeros(0), np.int32)]
    node = ov_op._PagedAttentionExtension(ins)
    for k, v in {"k_head_size": s, "num_k_heads": HKV, "v_head_size": s, "num_v_heads": HKV}.items():
        node.get_rt_info()[k] = v
    model = ov.Model([ops.result(ops.convert(node.output(0), f32))], params, "pa")
    cm = ov.Core().compile_model(model, "CPU", {"KV_CACHE_PRECISION": hint, "INFERENCE_PRECISION_HINT": hint})
    (executor,) = [
        op.get_rt_info()["runtimePrecision"].astype(str)
        for op in cm.get_runtime_model().get_ops()
        if op.get_rt_info()["layerType"].astype(str) == "PagedAttention"
    ]
    return cm, executor


def error(s, n, hint, seed=0):
    rng = np.random.default_rng(seed)
    cm, executor = build(s, hint)
    req = cm.create_infer_request()
    q = rng.integers(-3, 4, (n, HQ, s)).astype(np.float32)
    k = rng.integers(-3, 4, (n, HKV, s)).astype(np.float32)
    v = rng.integers(-3, 4, (n, HKV, s)).astype(np.float32)
    (_, kshape), (vt, vshape) = [
        (i.get_element_type(), [d.get_length() for d in list(i.get_partial_shape())[1:]])
        for i in cm.inputs if i.get_any_name() in ("key_cache", "value_cache")
    ]
    np_dt = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[vt.get_type_name()]
    caches = [np.zeros([2] + kshape, np_dt), np.zeros([2] + vshape, np_dt)]
    feed = {"query": q.reshape(n, -1), "key": k.reshape(n, -1), "value": v.reshape(n, -1),
            "past_lens": np.array([0], np.int32), "subsequence_begins": np.array([0, n], np.int32),
            "block_indices": np.array([1], np.int32), "block_indices_begins": np.array([0, 1], np.int32),
            "scale": np.array(s**-0.5, np.float32), "sliding_window": np.array(0, np.int32),
            "alibi_slopes": np.zeros(0, np.float32), "max_context_len": np.array(n, np.int32),
            "score_aggregation_window": np.zeros(1, np.int32), "sinks": np.zeros((0, HQ, 1, 1), np.float32),
            "token_type_ids": np.zeros(0, np.int32)}
    for name, x in feed.items():
        req.set_tensor(name, ov.Tensor(x if x.ndim == 0 else np.ascontiguousarray(x)))
    for name, c, shape in (("key_cache", caches[0], kshape), ("value_cache", caches[1], vshape)):
        req.set_tensor(name, ov.Tensor(c, [2] + shape, vt))
    req.infer()
    got = req.get_output_tensor(0).data.reshape(n, HQ, s)
    want = np.zeros((n, HQ, s))
    for i in range(n):
        for h in range(HQ):
            logits = k[: i + 1, 0] @ q[i, h] * s**-0.5
            w = np.exp(logits - logits.max())
            want[i, h] = (w / w.sum()) @ v[: i + 1, 0]
    return executor, float(np.abs(got - want).max())


def main():
    results = {}
    for hint in ("bf16", "f16"):
        for n in (1, 6):
            row = {}
            executor = None
            for s in HEAD_SIZES:
                executor, err = error(s, n, hint)
                row[s] = err
            if executor != hint:
                print(f"{hint}: this CPU runs it in {executor} (no native {hint}); skipped")
                break
            results[(hint, n)] = row
            print(f"{hint} executor, {n} new token(s): max |openvino - numpy| by head size:")
            print("   " + "  ".join(f"{s}: {e:.3g}" for s, e in row.items()))
    return results


if __name__ == "__main__":
    print("CPU:", ov.Core().get_property("CPU", "FULL_DEVICE_NAME"),
          ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    main()
