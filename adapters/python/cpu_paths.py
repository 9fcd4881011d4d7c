"""Run a vendor-kernel adapter on whatever CPU this is, through every CPU-dependent path it
can take here, and say which path ran.

Vendor CPU kernels pick their code by the CPU: OpenVINO's plugin runs its paged attention in
f32, bf16 or f16 by the CPU's bf16/fp16 support and the inference-precision hint; vLLM's
CPU_ATTN loads one of three kernel builds (`_C` with AVX512-BF16 and AMX, `_C_AVX512`,
`_C_AVX2`) and runs the `vec`, `vec16` or `amx` ISA by dtype, block and head size; CPU_MLA
runs one decode kernel from whichever build was loaded. An adapter that crashes, or quietly
runs another path than the one its vendor would, on a CPU it was not written on is the fault
this checks for.

    python cpu_paths.py openvino-paged | vllm-cpu-attn | vllm-cpu-mla

For each dtype the adapter declares, and each shape that selects another path (block sizes
16 and 32, head sizes 64, 80 and 7; a prefill and a decode step), it builds the case through
the adapter's own API (check, new_cache, write_kv, forward), compares the output with float64
attention, and prints one JSON line: adapter, dtype, shape, the path the adapter reports
(`path`), `status` (`ok`, `wrong` with the error, `declined` with the reason, or `error` with
the exception). A crash of the kernel itself (SIGILL, SIGSEGV) ends the process: the caller
(tests/test_cpu_paths.py) sees the signal and the last case printed before it (each case is
printed, flushed, before it runs). Exit status 0 when no case errs or is wrong.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_diff_adapter import Config, Step, Unsupported  # noqa: E402

TOL = {"f32": 1e-4, "bf16": 4e-2, "f16": 4e-3}


def _round(x, dtype):
    x = np.asarray(x, np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32)
    return x


def _reference(q, k, v, past, scale, group):
    """float64 causal attention; q [n, Hq, S] at positions past.., k [L, Hkv, S], v [L, Hkv, V]."""
    n, hq, _ = q.shape
    out = np.zeros((n, hq, v.shape[2]))
    for i in range(n):
        p = past + i
        for h in range(hq):
            logits = k[: p + 1, h // group] @ q[i, h] * scale
            w = np.exp(logits - logits.max())
            out[i, h] = (w / w.sum()) @ v[: p + 1, h // group]
    return out


def run_case(adapter, dtype, head_size, block_size, past, new, hq=4, hkv=2, mla=None, seed=0):
    """One sequence: `past` context tokens written, then one step of `new` tokens."""
    rng = np.random.default_rng(seed)
    total = past + new
    nblocks = (total + block_size - 1) // block_size
    table = (1 + rng.permutation(nblocks)).astype(np.int64)
    config = Config(
        num_heads=hq, num_kv_heads=hkv, head_size=head_size, block_size=block_size, dtype=dtype,
        scale=head_size**-0.5, kind="decoder", sliding_window=None, logits_soft_cap=None,
        alibi_slopes=None, sinks=None, mla=mla,
    )
    vs = config.head_size_v
    k = _round(rng.standard_normal((total, hkv, head_size)), dtype)
    v = k[:, :, :vs] if mla else _round(rng.standard_normal((total, hkv, vs)), dtype)
    q = _round(rng.standard_normal((new, hq, head_size)), dtype)
    pos = np.arange(total)
    slots = table[pos // block_size] * block_size + pos % block_size
    check = getattr(adapter, "check", None)
    if check is not None:
        check(config)
    cache = adapter.new_cache(config, nblocks + 1)
    vwrite = np.zeros((total, hkv, 0), np.float32) if mla else v
    if past:
        adapter.write_kv(config, cache, k[:past], vwrite[:past], slots[:past])
    adapter.write_kv(config, cache, k[past:], vwrite[past:], slots[past:])
    step = Step(
        query=q,
        query_start_loc=np.array([0, new]),
        query_lens=np.array([new]),
        seq_lens=np.array([total]),
        block_table=table[None, :],
        slot_mapping=slots[past:],
        num_tokens=new,
    )
    out, _ = adapter.forward(config, cache, step)
    want = _reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), past, config.scale, hq // hkv)
    err = float(np.nanmax(np.abs(np.asarray(out, np.float64) - want))) if np.isfinite(out).all() else float("nan")
    return config, cache, err


# ---- the adapters and the paths they report -------------------------------------------


def openvino_paged():
    import openvino_paged as m

    a = m.OpenVinoPaged("float")

    def path(config, cache):
        plan = a.plans[config.dtype]
        return (
            f"hint {plan['hint']}, executor {plan['executor']} ({plan['kernel']}), cache {cache['prec']}, "
            f"op head size {a.op_head_size(config)}"
        )

    shapes = [(64, 32), (80, 32), (7, 32)]
    return a, path, shapes, None, a.description


def vllm_cpu_attn():
    import vllm_cpu_attn as m

    lib = m.load_kernel()
    a = m.VllmCpuAttn(lib)

    def path(config, cache):
        return f"{m.PATHS['library']} isa {cache['isa']}"

    shapes = [(64, 32), (64, 16), (80, 32), (128, 64)]
    return a, path, shapes, None, a.description


def vllm_cpu_mla():
    import torch
    import vllm_cpu_attn as attn
    import vllm_cpu_mla as m

    lib = attn.load_kernel()
    if not hasattr(torch.ops._C, "mla_decode_kvcache"):
        raise RuntimeError(f"{lib} has no mla_decode_kvcache")
    a = m.VllmCpuMla(lib)

    def path(config, cache):
        return f"{attn.PATHS['library']} mla_decode_kvcache"

    return a, path, [(m.HEAD_SIZE, m.BLOCK_SIZE)], {"head_size_v": m.HEAD_SIZE_V}, a.description


ADAPTERS = {"openvino-paged": openvino_paged, "vllm-cpu-attn": vllm_cpu_attn, "vllm-cpu-mla": vllm_cpu_mla}


def main(argv):
    if len(argv) != 1 or argv[0] not in ADAPTERS:
        sys.exit(f"usage: cpu_paths.py {{{'|'.join(ADAPTERS)}}}")
    name = argv[0]
    adapter, path, shapes, mla, description = ADAPTERS[name]()
    print(json.dumps({"adapter": name, "description": description}), flush=True)
    bad = 0
    max_query = adapter.capabilities.get("max_query_len")
    steps = [(0, 1), (40, 1)] + ([] if max_query == 1 else [(0, 37), (40, 9)])
    for dtype in adapter.capabilities["dtypes"]:
        for head_size, block_size in shapes:
            for past, new in steps:
                hq, hkv = (16, 1) if mla else (4, 2)
                line = {"adapter": name, "dtype": dtype, "head_size": head_size, "block_size": block_size,
                        "context": past, "new_tokens": new}
                print(json.dumps(dict(line, status="running")), flush=True)
                try:
                    config, cache, err = run_case(adapter, dtype, head_size, block_size, past, new, hq, hkv, mla)
                    line["path"] = path(config, cache)
                    line["max_abs_error"] = err
                    line["status"] = "ok" if err <= TOL[dtype] * 8 else "wrong"
                except Unsupported as e:
                    line.update(status="declined", reason=str(e))
                except Exception as e:  # noqa: BLE001 - reported, and the run fails
                    line.update(status="error", error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
                bad += line["status"] in ("error", "wrong")
                print(json.dumps(line), flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if os.environ.get("ATTN_DIFF_THREADS"):
        os.environ.setdefault("OMP_NUM_THREADS", os.environ["ATTN_DIFF_THREADS"])
    main(sys.argv[1:])
