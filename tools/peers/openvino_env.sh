#!/bin/sh
# The Python environment of the OpenVINO adapter (adapters/python/openvino_paged.py):
# openvino 2026.4.1 from PyPI (the cp311 manylinux wheel, about 59 MB; no torch), numpy and
# safetensors (what the helper library attn_diff_adapter needs).
#
#   sh tools/peers/openvino_env.sh                  # openvino 2026.4.1 in ~/.cache/attn-diff/venv-openvino
#   sh tools/peers/openvino_env.sh DIR VERSION      # another venv, another openvino release
set -eu
version=${2:-2026.4.1}
venv=${1:-$HOME/.cache/attn-diff/venv-openvino}
python3 -m venv "$venv"
"$venv/bin/pip" install -q "openvino==$version" numpy safetensors pytest
"$venv/bin/python" - <<'PY'
import openvino as ov
from openvino import op
assert hasattr(op, "_PagedAttentionExtension"), "this openvino has no _PagedAttentionExtension"
core = ov.Core()
print("openvino", ov.get_version(), "importable; CPU:", core.get_property("CPU", "FULL_DEVICE_NAME"))
# What decides the paged-attention executor's precision on this CPU (docs/findings-openvino.md, finding 2).
print("OPTIMIZATION_CAPABILITIES:", core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"),
      "default INFERENCE_PRECISION_HINT:", core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
PY
