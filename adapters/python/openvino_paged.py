"""OpenVINO's PagedAttentionExtension (CPU plugin) as an attn-diff adapter.

Builds a one-operation OpenVINO model around ``openvino.op._PagedAttentionExtension`` (the op
OpenVINO GenAI's continuous-batching pipeline runs, 28 inputs in openvino 2026.4) and
compiles it for ``CPU`` once per configuration (query heads, kv heads, head size, compute
dtype, cache precision), then feeds each step as GenAI's model runner does:

- ``query``/``key``/``value``: the step's real tokens, ``[tokens, heads * head_size]`` in the
  case dtype (padding tokens are not passed; their output rows are zero);
- ``key_cache``/``value_cache``: the session's cache tensors, ``[num_blocks, kv_heads,
  block_size, head_size]`` in the precision the plugin reports for the compiled model's
  inputs, bound with shared memory so the op's in-place writes persist across a trace;
- ``past_lens`` (context length per sequence), ``subsequence_begins`` (``query_start_loc``),
  ``block_indices`` and ``block_indices_begins`` (each sequence's first ``ceil(seq_len /
  block_size)`` blocks of the block table, flattened), ``scale``, ``sliding_window`` (``w``,
  0 for none), ``alibi_slopes`` (``[num_heads]`` or empty), ``max_context_len`` (the longest
  ``seq_len`` of the step), ``sinks`` (``[1, num_heads, 1, 1]`` or empty), ``token_type_ids``
  (empty, or 1 over the new tokens of each bidirectional request: see below); the others
  (score aggregation, RoPE re-rotation, xattention, adaptive RKV, qq bias) empty or zero, as
  GenAI passes them when those features are off.

The op writes the step's K/V itself, at each sequence's ``past_len + i`` through its block
table. So the case's last write (the step's new tokens, whose slot mapping is the step's) is
not applied by the adapter: its rows become the op's ``key``/``value`` inputs, after checking
that every real token's slot is the one the op derives from its position
(``block_indices[pos // block_size] * block_size + pos % block_size``). Every other write
(stale data in unowned slots, each sequence's context, a trace's writes since its last step)
is stored straight into the cache tensors, as an earlier step of the op would have left it.

Precision: what the CPU plugin runs depends on the CPU (docs/findings-openvino.md, finding
2), so the adapter asks it rather than assuming. Per case dtype it sets
``INFERENCE_PRECISION_HINT`` explicitly: the dtype itself where the plugin's
``OPTIMIZATION_CAPABILITIES`` list it (``BF16``: AVX512-BF16 or AMX; ``FP16``: AVX512-FP16),
else f32, and f32 for f32 cases (the plugin's default hint on a bf16-capable CPU is bf16,
which would run an f32 model in bf16). It then compiles the op once with the plugin's own
default cache and reads the op's executor precision from the compiled model's runtime model
(``runtimePrecision`` of its PagedAttention node), and the real model is compiled with
``KV_CACHE_PRECISION`` set to that precision: the cache holds what the executor computes in
(f32, bf16 or f16), and the cache tensors are made in the element type the compiled model
reports for its cache inputs. A cache type that cannot hold the case dtype's values exactly
(an f16 case on a bf16 executor, say) or a compile the plugin refuses is declined per case
with a typed ``Unsupported`` naming the plugin's answer, never raised; dtypes the plugin
cannot run at all on this CPU are left out of the declared space at start-up, with the
reason on stderr. ``ATTN_DIFF_OV_PRECISION=f32`` asks for an f32 executor for every dtype
(what an AVX2-only CPU runs), ``=default`` leaves the plugin's default hint (GenAI's
behaviour); ``--probe`` prints, per dtype, the hint, the executor precision, its kernel
name and the cache.

``--kv-cache u8`` (adapter ``openvino-paged-u8``): the plugin's default cache on x86 (u8,
per-channel key quantization); attn-diff's oracle compares at the compute dtype's tolerance
and the protocol carries no quantization tolerance, so every case is declined by feature with
that reason; ``tests/test_openvino_paged.py`` checks the u8 cache against a bound derived from
its quantization instead (docs/findings-openvino.md).

Declared space (from the op spec and the CPU plugin): dtypes f32, bf16, f16; block size 32
(the x86 CPU plugin fixes the cache's block dimension to 32 whatever the model says); a
causal decoder; GQA; sliding window; ALiBi; sinks; no soft-cap (the op has no such input); no
cross-attention, local chunks, FP8 cache or MLA. ALiBi with a window is declined per case
(the plugin drops the slopes; the spec calls the two mutually exclusive on CPU).

``--spans`` (adapter ``openvino-paged-spans``) adds encoder-only cases and non-causal
requests through the op's ``token_type_ids``: a run of nonzero ids within a sequence sees
itself both ways (Gemma 3's image spans), so such a request is a span of 1s over its new
tokens. Declined per case there: a bidirectional request with a window (a span ignores the
window: Gemma 3's masks are OR'ed, attn-diff's window reaches both ways) and one with ALiBi
and sinks together (the plugin gets it wrong). docs/findings-openvino.md has the findings.

    python openvino_paged.py --probe             # compile and run one small step
    attn-diff check --backend external:openvino-paged
"""

import json
import os
import sys
import time


def _reexec_under_openvino_venv():
    """Run this script under the venv tools/peers/openvino_env.sh makes when this Python has
    no openvino (attn-diff.toml's bare `python3` is the checkout's .python-env)."""
    import importlib.util

    if importlib.util.find_spec("openvino") is not None:
        return
    python = os.environ.get("ATTN_DIFF_OPENVINO_PYTHON") or os.path.expanduser(
        "~/.cache/attn-diff/venv-openvino/bin/python"
    )
    if os.environ.get("_ATTN_DIFF_OPENVINO_REEXEC") == "1" or not os.path.exists(python):
        sys.exit(
            f"openvino_paged.py: openvino is not importable from {sys.executable} and there is no "
            f"{python}: run `sh tools/peers/openvino_env.sh` (or set ATTN_DIFF_OPENVINO_PYTHON)"
        )
    os.environ["_ATTN_DIFF_OPENVINO_REEXEC"] = "1"
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    _reexec_under_openvino_venv()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Adapter, Unsupported, serve  # noqa: E402

import numpy as np  # noqa: E402

BLOCK_SIZE = 32
HEAD_SIZES = [int(x) for x in os.environ.get("ATTN_DIFF_OV_HEAD_SIZES", "").split(",") if x]
MAX_CACHE_GIB = float(os.environ.get("ATTN_DIFF_MAX_CACHE_GIB", "4"))
THREADS = os.environ.get("ATTN_DIFF_THREADS")
# Run ALiBi with a window anyway (the spec calls the pair mutually exclusive on CPU).
ALIBI_WITH_WINDOW = os.environ.get("ATTN_DIFF_OV_ALIBI_WITH_WINDOW") == "1"
# --kv-cache u8 answers FP8-cache cases with its u8 cache (bench's FP8 slot; never `check`).
U8_AS_FP8 = os.environ.get("ATTN_DIFF_OV_U8_AS_FP8") == "1"
# Odd head sizes on a bf16/f16 executor unpadded (finding 5; else one zero column is added).
ODD_HEAD_PREFILL = os.environ.get("ATTN_DIFF_OV_ODD_HEAD_PREFILL") == "1"
# Run bidirectional requests with ALiBi and sinks anyway (finding 3).
SPAN_ALIBI_SINKS = os.environ.get("ATTN_DIFF_OV_SPAN_ALIBI_SINKS") == "1"
NON_CAUSAL_WINDOW = (
    "a bidirectional request with a window: the op's token_type_ids spans see their whole span "
    "whatever the window (Gemma 3's masks OR'ed), not attn-diff's window both ways"
)
# Which executor precision each dtype asks for: "auto" (bf16 where the plugin lists BF16 in
# OPTIMIZATION_CAPABILITIES, f32 for f32 and f16), "native" (also f16 where it lists FP16),
# "f32" (f32 for every dtype), "default" (the plugin's own INFERENCE_PRECISION_HINT, not set).
PRECISION = os.environ.get("ATTN_DIFF_OV_PRECISION", "auto")
# Which cache element types hold every value of a compute dtype exactly.
HOLDS = {"f32": {"f32"}, "bf16": {"bf16", "f32"}, "f16": {"f16", "f32"}}
# One JSON line per step run (shapes, features, wall and process CPU time of infer(), the
# reported kernel time) appended to this file.
LOG = os.environ.get("ATTN_DIFF_OV_LOG")



def _type_name(t):
    """An openvino element type by its short name (f32, bf16, f16, u8, ...), attn-diff's."""
    return t.get_type_name() if hasattr(t, "get_type_name") else str(t)


def _pad(x, d):
    """[..., S] rows with zero columns up to d (S <= d)."""
    x = np.asarray(x)
    if x.shape[-1] == d:
        return x
    return np.concatenate([x, np.zeros(x.shape[:-1] + (d - x.shape[-1],), x.dtype)], axis=-1)


def _last_line(e):
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else type(e).__name__


def _bf16_bits(x):
    """float32 values (already bf16-representable, or to round) as bf16 bit patterns."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


class OpenVinoPaged(Adapter):
    name = "openvino-paged"
    sessions = True
    environment = ("ATTN_DIFF_OV_*", "ATTN_DIFF_THREADS", "ATTN_DIFF_MAX_CACHE_GIB")

    def __init__(self, kv_cache="float", spans=False):
        import openvino as ov
        from openvino import op as ov_op
        import openvino.opset13 as ops

        if not hasattr(ov_op, "_PagedAttentionExtension"):
            raise RuntimeError(f"openvino {ov.get_version()} has no op._PagedAttentionExtension")
        self.ov, self.ops, self.PA = ov, ops, ov_op._PagedAttentionExtension
        self.core = ov.Core()
        self.kv_mode = kv_cache
        self.version = ov.get_version()
        self.compiled = {}
        self.spans = spans
        if PRECISION not in ("auto", "native", "f32", "default"):
            raise RuntimeError(f"ATTN_DIFF_OV_PRECISION={PRECISION!r}: expected auto, native, f32 or default")
        # What the plugin says about this CPU, before anything is compiled.
        self.optimization = [str(c) for c in self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
        self.default_hint = _type_name(self.core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
        self.plans = {}
        self.name = ("openvino-paged" if kv_cache == "float" else "openvino-paged-u8") + ("-spans" if spans else "")
        dtypes = []
        for dtype in ("f32", "bf16", "f16"):
            plan = self.plan(dtype)
            if plan.get("refused"):
                sys.stderr.write(f"openvino-paged: {dtype} left out of the space: {plan['refused']}\n")
            else:
                dtypes.append(dtype)
        if not dtypes:
            raise RuntimeError("the CPU plugin runs none of f32, bf16, f16: see --probe")
        caps = {
            "dtypes": dtypes,
            "block_sizes": [BLOCK_SIZE],
            "kinds": ["decoder", "encoder_only"] if spans else ["decoder"],
            "features": ["sliding_window", "alibi", "sinks"] + (["non_causal"] if spans else []),
            "kv_cache_dtypes": ["auto"],
            "kv_layouts": ["mha"],
        }
        if HEAD_SIZES:
            caps["head_sizes"] = HEAD_SIZES
        if kv_cache == "u8" and U8_AS_FP8:
            # For `attn-diff bench --kv-cache auto,fp8_e4m3` only: the u8 cache timed in the
            # FP8 slot, beside cpu's FP8 cache (its warm-up is checked against the FP8 oracle).
            caps["kv_cache_dtypes"] = ["fp8_e4m3"]
            caps["features"] = caps["features"] + ["fp8_kv_cache"]
        self.capabilities = caps
        paths = "; ".join(
            f"{d}: {self.plans[d]['executor']} executor ({self.plans[d]['kernel']}), "
            f"{self.plans[d]['cache'] if kv_cache == 'float' else 'u8'} cache"
            for d in dtypes
        )
        self.description = (
            f"OpenVINO {self.version} PagedAttentionExtension on CPU "
            f"({', '.join(self.optimization)}; default hint {self.default_hint}), "
            f"{'executor-precision' if kv_cache == 'float' else 'u8'} KV cache, block size {BLOCK_SIZE}; {paths}"
        )

    # ---- the model ------------------------------------------------------------------

    def _et(self, dtype):
        ov = self.ov
        return {"f32": ov.Type.f32, "f16": ov.Type.f16, "bf16": ov.Type.bf16}[dtype]

    def hint(self, dtype):
        """The INFERENCE_PRECISION_HINT a case of `dtype` is compiled with (None: not set)."""
        if PRECISION == "default":
            return None
        if PRECISION == "f32" or dtype == "f32":
            return "f32"
        if dtype == "f16" and PRECISION != "native":
            # The f16 executor (AVX512-FP16 CPUs) gets multi-token prefill wrong: finding 4.
            return "f32"
        native = {"bf16": "BF16", "f16": "FP16"}[dtype]
        return dtype if native in self.optimization else "f32"

    def plan(self, dtype):
        """What the plugin runs a `dtype` model with on this CPU, asked, not assumed: the op
        compiled with the hint and the plugin's own default cache, then the executor's
        precision and kernel read from the compiled model's runtime model; the float cache
        is the executor's precision (the only float cache every executor takes)."""
        got = self.plans.get(dtype)
        if got is not None:
            return got
        hint = self.hint(dtype)
        plan = {"dtype": dtype, "hint": hint or f"{self.default_hint} (plugin default)"}
        try:
            cm = self._compile(1, 1, 16, dtype, None, hint)["model"]
            node = [
                op.get_rt_info()
                for op in cm.get_runtime_model().get_ops()
                if op.get_rt_info()["layerType"].astype(str) == "PagedAttention"
            ]
            if len(node) != 1:
                raise RuntimeError(f"{len(node)} PagedAttention nodes in the compiled model")
            plan["executor"] = node[0]["runtimePrecision"].astype(str)
            plan["kernel"] = node[0]["primitiveType"].astype(str)
        except RuntimeError as e:
            plan["refused"] = f"the plugin compiles no {dtype} model (hint {plan['hint']}): {_last_line(e)}"
            self.plans[dtype] = plan
            return plan
        plan["cache"] = plan["executor"]
        if plan["cache"] not in HOLDS[dtype]:
            plan["refused"] = (
                f"the plugin runs a {dtype} model in {plan['executor']} on this CPU (hint {plan['hint']}), "
                f"and a {plan['executor']} cache does not hold {dtype} values exactly"
            )
        self.plans[dtype] = plan
        return plan

    def op_head_size(self, config):
        """The head size the op is built with: the case's, or one more (a zero column in q, k
        and v, which changes no logit and no kept output) for an odd head size on a bf16 or
        f16 executor, whose multi-token steps get odd head sizes wrong (finding 5)."""
        plan = self.plans.get(config.dtype) or {}
        if config.head_size % 2 and plan.get("executor") in ("bf16", "f16") and not ODD_HEAD_PREFILL:
            return config.head_size + 1
        return config.head_size

    def cache_precision(self, config):
        if self.kv_mode == "u8":
            return "u8"
        plan = self.plan(config.dtype)
        if plan.get("refused"):
            raise Unsupported(plan["refused"])
        return plan["cache"]

    def _compile(self, hq, hkv, s, dtype, prec, hint="auto"):
        """The op compiled for these shapes; `prec` the KV_CACHE_PRECISION (None: the
        plugin's default), `hint` the INFERENCE_PRECISION_HINT ("auto": self.hint(dtype);
        None: not set). Raises the plugin's RuntimeError when it refuses."""
        if hint == "auto":
            hint = self.hint(dtype)
        key = (hq, hkv, s, dtype, prec, hint)
        got = self.compiled.get(key)
        if got is not None:
            return got
        ov, ops = self.ov, self.ops
        f32, i32 = ov.Type.f32, ov.Type.i32
        et = self._et(dtype)
        params = []

        def par(t, shape, name):
            p = ops.parameter(ov.PartialShape(shape), t, name=name)
            params.append(p)
            return p.output(0)

        def const(v, dt):
            return ops.constant(np.array(v, dtype=dt)).output(0)

        inputs = [
            par(et, [-1, hq * s], "query"),
            par(et, [-1, hkv * s], "key"),
            par(et, [-1, hkv * s], "value"),
            par(ov.Type.dynamic, [-1, hkv, -1, s], "key_cache"),
            par(ov.Type.dynamic, [-1, hkv, -1, s], "value_cache"),
            par(i32, [-1], "past_lens"),
            par(i32, [-1], "subsequence_begins"),
            par(i32, [-1], "block_indices"),
            par(i32, [-1], "block_indices_begins"),
            par(f32, [], "scale"),
            par(i32, [], "sliding_window"),
            par(f32, [-1], "alibi_slopes"),
            par(i32, [], "max_context_len"),
            par(i32, [-1], "score_aggregation_window"),  # [B_seq] zeros: off
            const(np.zeros(0), np.int32),  # rotated_block_indices
            const(np.zeros((0, 1)), np.int32),  # rotation_deltas
            const(np.zeros((0, s)), np.float32),  # rotation_trig_lut
            const(np.zeros(0), np.float32),  # xattention_threshold: dense
            const(0, np.int32),  # xattention_block_size
            const(0, np.int32),  # xattention_stride
            par(et, [-1, hq, 1, 1], "sinks"),
            const(0, np.int32),  # adaptive_rkv_start_size
            const(np.zeros(0), np.int32),  # adaptive_rkv_evictable_sizes
            const(np.zeros(0), np.int32),  # adaptive_rkv_diversity_block_set_indices
            const(np.zeros(0), np.int32),  # ..._begins
            par(i32, [-1], "token_type_ids"),  # empty: causal; 1 over a non-causal request's tokens
            ops.constant(np.zeros(0, np.uint8)).output(0),  # qq_bias
            const(np.zeros(0), np.int32),  # qq_bias_begins
        ]
        node = self.PA(inputs)
        # What OpenVINO's SDPAToPagedAttention sets and the CPU plugin requires.
        for k, v in {"k_head_size": s, "num_k_heads": hkv, "v_head_size": s, "num_v_heads": hkv}.items():
            node.get_rt_info()[k] = v
        out = ops.convert(node.output(0), f32)
        model = ov.Model([ops.result(out)], params, "paged_attention")
        cfg = {}
        if prec is not None:
            cfg["KV_CACHE_PRECISION"] = prec
        if hint is not None:
            cfg["INFERENCE_PRECISION_HINT"] = hint
        if THREADS:
            cfg["INFERENCE_NUM_THREADS"] = int(THREADS)
        cm = self.core.compile_model(model, "CPU", cfg)
        shapes = {}
        for i in cm.inputs:
            name = i.get_any_name()
            if name in ("key_cache", "value_cache"):
                ps = i.get_partial_shape()
                shapes[name] = (i.get_element_type(), [d.get_length() for d in list(ps)[1:]])
        got = {"model": cm, "request": cm.create_infer_request(), "cache": shapes}
        self.compiled[key] = got
        return got

    # ---- the adapter ----------------------------------------------------------------

    def check(self, config):
        if self.kv_mode == "u8" and not U8_AS_FP8:
            raise Unsupported(
                "u8 KV cache: attn-diff's oracle compares at the compute dtype's tolerance and the "
                "protocol carries no quantized-cache tolerance (see docs/findings-openvino.md; the u8 "
                "cache is checked against its quantization bound by tests/test_openvino_paged.py)"
            )
        if config.alibi_slopes is not None and config.sliding_window is not None and not ALIBI_WITH_WINDOW:
            raise Unsupported(
                "ALiBi with a sliding window: the op spec calls them mutually exclusive in the CPU plugin"
            )
        if config.kind == "encoder_only" and config.sliding_window is not None:
            raise Unsupported(NON_CAUSAL_WINDOW)
        if config.block_size != BLOCK_SIZE:
            raise Unsupported(f"block size {config.block_size}: the CPU plugin's cache blocks are {BLOCK_SIZE}")

    def new_cache(self, config, num_blocks):
        prec = self.cache_precision(config)
        try:
            got = self._compile(config.num_heads, config.num_kv_heads, self.op_head_size(config), config.dtype, prec)
        except RuntimeError as e:
            raise Unsupported(
                f"the CPU plugin refuses a {config.dtype} model with a {prec} cache "
                f"(hint {self.hint(config.dtype)}): {_last_line(e)}"
            ) from None
        (ket, kshape), (vet, vshape) = got["cache"]["key_cache"], got["cache"]["value_cache"]
        # The cache is made in the type the compiled model reports for its cache inputs,
        # which is what the executor reads (it may differ from KV_CACHE_PRECISION).
        reported = _type_name(ket)
        if reported != _type_name(vet) or (reported != prec and not (prec in HOLDS[config.dtype] and reported in HOLDS[config.dtype])):
            raise Unsupported(
                f"the compiled model's cache inputs are {reported}/{_type_name(vet)}, asked {prec}: "
                f"not a cache that holds {config.dtype} exactly"
            )
        prec = reported
        # u8: the key cache's block carries its per-channel scales and zero points in extra rows.
        if vshape[1] != config.block_size or (prec != "u8" and kshape[1] != config.block_size):
            raise Unsupported(f"block size {config.block_size}: the compiled cache's blocks are {vshape[1]}")
        np_dt = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "u8": np.uint8}[prec]
        nbytes = num_blocks * (int(np.prod(kshape)) + int(np.prod(vshape))) * np.dtype(np_dt).itemsize
        if nbytes > MAX_CACHE_GIB * 2**30:
            raise Unsupported(f"cache of {nbytes / 2**30:.1f} GiB above ATTN_DIFF_MAX_CACHE_GIB={MAX_CACHE_GIB:g}")
        k = np.zeros([num_blocks] + kshape, np_dt)
        v = np.zeros([num_blocks] + vshape, np_dt)
        ov = self.ov
        return {
            "k": k,
            "v": v,
            "prec": prec,
            "kt": ov.Tensor(k, [num_blocks] + kshape, ket) if prec == "bf16" else ov.Tensor(k, shared_memory=True),
            "vt": ov.Tensor(v, [num_blocks] + vshape, vet) if prec == "bf16" else ov.Tensor(v, shared_memory=True),
            "pending": [],
        }

    def write_kv(self, config, cache, key, value, slot_mapping):
        cache["pending"].append((key, value, slot_mapping))

    def _store(self, config, cache, key, value, slots):
        keep = slots >= 0
        if not keep.any():
            return
        s = slots[keep]
        blocks, offsets = s // config.block_size, s % config.block_size
        k, v = _pad(key[keep], self.op_head_size(config)), _pad(value[keep], self.op_head_size(config))  # [n, Hkv, S]
        prec = cache["prec"]
        if prec == "f16":
            k, v = k.astype(np.float16), v.astype(np.float16)
        elif prec == "bf16":
            k, v = _bf16_bits(k), _bf16_bits(v)
        elif prec != "f32":
            raise Unsupported(f"writing rows into a {prec} cache")
        cache["k"][blocks, :, offsets] = k
        cache["v"][blocks, :, offsets] = v

    def _prefill_context_u8(self, config, cache, req, writes, step, past, block_indices, begins):
        if not writes or not (past > 0).any():
            return
        bs, hq, hkv, d = config.block_size, config.num_heads, config.num_kv_heads, self.op_head_size(config)
        rows = {}
        for key, value, slots in writes:
            for i in np.nonzero(slots >= 0)[0]:
                rows[int(slots[i])] = (key[i], value[i])
        seqs = [s for s in range(len(past)) if past[s] > 0]
        ks, vs = [], []
        for s in seqs:
            pos = np.arange(past[s])
            want = step.block_table[s][pos // bs] * bs + pos % bs
            missing = [int(x) for x in want if int(x) not in rows]
            if missing:
                raise Unsupported("u8 cache: a context token's K/V was written in an earlier step (the session's own cache)")
            ks.append(np.stack([rows[int(x)][0] for x in want]))
            vs.append(np.stack([rows[int(x)][1] for x in want]))
        k = _pad(np.concatenate(ks), d)
        v = _pad(np.concatenate(vs), d)
        n = len(k)
        nbs = np.array([(past[s] + bs - 1) // bs for s in seqs])
        bi = np.concatenate([step.block_table[s][: nbs[j]] for j, s in enumerate(seqs)]).astype(np.int32)
        et = config.dtype
        feed = {
            "query": self._tensor(np.zeros((n, hq * d), np.float32), et),
            "key": self._tensor(k.reshape(n, hkv * d), et),
            "value": self._tensor(v.reshape(n, hkv * d), et),
            "past_lens": self.ov.Tensor(np.zeros(len(seqs), np.int32)),
            "subsequence_begins": self.ov.Tensor(np.concatenate([[0], np.cumsum(past[seqs])]).astype(np.int32)),
            "block_indices": self.ov.Tensor(bi),
            "block_indices_begins": self.ov.Tensor(np.concatenate([[0], np.cumsum(nbs)]).astype(np.int32)),
            "scale": self.ov.Tensor(np.array(config.scale, np.float32)),
            # A window of 1: each (discarded) query sees only its own key, so writing a long
            # context costs a pass over it, not a prefill's n^2 attention.
            "sliding_window": self.ov.Tensor(np.array(1, np.int32)),
            "alibi_slopes": self.ov.Tensor(np.zeros(0, np.float32)),
            "max_context_len": self.ov.Tensor(np.array(int(past.max()), np.int32)),
            "score_aggregation_window": self.ov.Tensor(np.zeros(len(seqs), np.int32)),
            "token_type_ids": self.ov.Tensor(np.zeros(0, np.int32)),
            "sinks": self._tensor(np.zeros((0, hq, 1, 1), np.float32), et),
        }
        for name, t in feed.items():
            req.set_tensor(name, t)
        req.set_tensor("key_cache", cache["kt"])
        req.set_tensor("value_cache", cache["vt"])
        req.infer()

    def _tensor(self, x, dtype):
        ov = self.ov
        x = np.ascontiguousarray(x, dtype=np.float32)
        if dtype == "f32":
            return ov.Tensor(x)
        if dtype == "f16":
            return ov.Tensor(x.astype(np.float16))
        return ov.Tensor(_bf16_bits(x), list(x.shape), ov.Type.bf16)

    def forward(self, config, cache, step):
        pending, cache["pending"] = cache["pending"], []
        bs = config.block_size
        qsl = step.query_start_loc
        n_real = int(qsl[-1])
        query_lens = step.query_lens
        seq_lens = step.seq_lens
        past = seq_lens - query_lens
        if (query_lens <= 0).any():
            raise Unsupported("a request with no new tokens (the op has no empty subsequence)")
        # Bidirectional requests (encoder-only, or non-causal decoder requests): the op's
        # token_type_ids, one span of 1s over each such request's new tokens (a span sees
        # itself both ways, as Gemma 3's image tokens; spans do not cross sequences).
        bidirectional = [config.kind == "encoder_only" or not step.is_causal(s) for s in range(len(seq_lens))]
        if any(bidirectional) and config.sliding_window is not None:
            raise Unsupported(NON_CAUSAL_WINDOW)
        if any(bidirectional) and config.alibi_slopes is not None and config.sinks is not None and not SPAN_ALIBI_SINKS:
            raise Unsupported(
                "a bidirectional request with ALiBi and sinks: the CPU plugin gets the rows of its tokens wrong "
                "(docs/findings-openvino.md, finding 3)"
            )
        token_types = np.zeros(0, np.int32)
        if any(bidirectional):
            token_types = np.repeat(np.array(bidirectional, np.int32), query_lens.astype(np.int64))
        # The step's K/V: the last write, whose slots are the step's.
        if not pending and cache.get("last_step") is not None and len(cache["last_step"][2]) == step.num_tokens:
            # The same step again on the same cache with no writes (bench's timed calls): the
            # op writes the same rows into the same slots again.
            pending = [cache["last_step"]]
        if not pending or len(pending[-1][2]) != step.num_tokens:
            raise Unsupported("no write of the step's new tokens (the op takes them as its key/value)")
        step_k, step_v, step_slots = pending[-1]
        cache["last_step"] = pending[-1]
        nb = (seq_lens + bs - 1) // bs
        for s in range(len(seq_lens)):
            pos = past[s] + np.arange(query_lens[s])
            want = step.block_table[s][pos // bs] * bs + pos % bs
            got = step_slots[qsl[s] : qsl[s + 1]]
            if not np.array_equal(want, got):
                raise Unsupported(
                    "a new token's slot is not the block-table slot of its position "
                    "(the op derives where it writes from past_lens and block_indices)"
                )
        prec = cache["prec"]
        d = self.op_head_size(config)
        got = self._compile(config.num_heads, config.num_kv_heads, d, config.dtype, prec)
        req = got["request"]
        hq, hkv = config.num_heads, config.num_kv_heads
        block_indices = np.concatenate([step.block_table[s][: nb[s]] for s in range(len(seq_lens))]).astype(np.int32)
        begins = np.concatenate([[0], np.cumsum(nb)]).astype(np.int32)
        if prec == "u8":
            # The plugin's u8 layout (per-channel key scales in extra rows of each block) is
            # its own: earlier tokens are written by the op itself, one prefill call over
            # each sequence's context, as the engine's earlier steps would have. Stale rows
            # in slots no sequence owns are not written (nothing reads them).
            self._prefill_context_u8(config, cache, req, pending[:-1], step, past, block_indices, begins)
        else:
            for key, value, slots in pending[:-1]:
                self._store(config, cache, key, value, slots)
        et = config.dtype
        feed = {
            "query": self._tensor(_pad(step.query[:n_real], d).reshape(n_real, hq * d), et),
            "key": self._tensor(_pad(step_k[:n_real], d).reshape(n_real, hkv * d), et),
            "value": self._tensor(_pad(step_v[:n_real], d).reshape(n_real, hkv * d), et),
            "past_lens": self.ov.Tensor(past.astype(np.int32)),
            "subsequence_begins": self.ov.Tensor(qsl.astype(np.int32)),
            "block_indices": self.ov.Tensor(block_indices),
            "block_indices_begins": self.ov.Tensor(begins),
            "scale": self.ov.Tensor(np.array(config.scale, np.float32)),
            "sliding_window": self.ov.Tensor(np.array(config.sliding_window or 0, np.int32)),
            "alibi_slopes": self.ov.Tensor(np.asarray(config.alibi_slopes or [], np.float32)),
            "max_context_len": self.ov.Tensor(np.array(int(seq_lens.max()), np.int32)),
            "score_aggregation_window": self.ov.Tensor(np.zeros(len(seq_lens), np.int32)),
            "token_type_ids": self.ov.Tensor(token_types),
            "sinks": self._tensor(
                np.asarray(config.sinks, np.float32).reshape(1, hq, 1, 1)
                if config.sinks is not None
                else np.zeros((0, hq, 1, 1), np.float32),
                et,
            ),
        }
        for name, t in feed.items():
            req.set_tensor(name, t)
        req.set_tensor("key_cache", cache["kt"])
        req.set_tensor("value_cache", cache["vt"])
        # kernel_seconds: the wall time of the infer request, the op's one call (the plugin's
        # profiler, PERF_COUNT, reports per node a figure accumulated over the request's
        # calls, not this call's time, so it is not used).
        t0 = time.perf_counter()
        c0 = time.process_time()
        req.infer()
        elapsed = time.perf_counter() - t0
        wall, cpu = elapsed, time.process_time() - c0
        if LOG:
            with open(LOG, "a") as f:
                f.write(json.dumps({
                    "dtype": config.dtype, "cache": prec, "hint": self.hint(config.dtype),
                    "executor": self.plans[config.dtype].get("executor"), "seqs": len(seq_lens), "tokens": n_real,
                    "max_seq_len": int(seq_lens.max()), "heads": [hq, hkv], "head_size": d,
                    "features": config.features(), "kind": config.kind,
                    "wall_s": wall, "process_cpu_s": cpu, "kernel_s": elapsed,
                }) + "\n")
        res = req.get_output_tensor(0).data
        out = np.zeros((step.num_tokens, hq, config.head_size), np.float32)
        out[:n_real] = res.reshape(n_real, hq, d)[:, :, : config.head_size]
        return out, elapsed


def probe(kv_cache):
    """What the plugin runs on this CPU: its properties, each dtype's plan, and which cache
    precisions it takes for an f32 model under each hint."""
    a = OpenVinoPaged(kv_cache)
    print(a.description)
    print("OPTIMIZATION_CAPABILITIES", a.optimization, "default INFERENCE_PRECISION_HINT", a.default_hint)
    for dtype in ("f32", "bf16", "f16"):
        print("plan", json.dumps(a.plan(dtype)))
    for hint in (None, "f32", "bf16", "f16"):
        for name in ("f32", "f16", "bf16", "u8"):
            try:
                got = a._compile(4, 2, 64, "f32", name, hint)
                print(f"hint {hint} KV_CACHE_PRECISION={name}: compiles, cache inputs",
                      {k: (_type_name(t), dims) for k, (t, dims) in got["cache"].items()})
            except RuntimeError as e:
                print(f"hint {hint} KV_CACHE_PRECISION={name}: refused: {_last_line(e)}")


def main(argv):
    kv, spans, probe_only = "float", False, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--kv-cache" and args:
            kv = args.pop(0)
            if kv not in ("float", "u8"):
                sys.exit(f"openvino_paged.py: --kv-cache {kv!r}: expected float or u8")
        elif arg == "--spans":
            spans = True
        elif arg == "--probe":
            probe_only = True
        else:
            sys.exit(f"openvino_paged.py: unknown argument {arg!r} (known: --kv-cache float|u8, --spans, --probe)")
    if probe_only:
        probe(kv)
        return
    serve(OpenVinoPaged(kv, spans))


if __name__ == "__main__":
    main(sys.argv[1:])
