#!/usr/bin/env bash
# The GPU checks in one go, for a machine with one or more CUDA GPUs and tx's dependencies importable
# (docs/operations.md#gpu-checks): the GPU tests (tests/gpu, marker `gpu`), then several runs in one training
# pass against turns (scripts/bench/shared_pass.py) and the step through the SDK against plain torch
# (scripts/bench/train_step.py), both at Qwen3-0.6B's shapes. Logs go to $OUT (default /tmp/tx-gpu-checks).
# TESTS_S and BENCH_S bound each part in seconds.
# For a GPU machine without network (the H200 this project is lent: its python3 has torch but not all of tx's
# dependencies), run `scripts/gpu/prepare.sh` first, here, on a machine with network: it writes the wheelhouse
# .whl/ (git-ignored) and .whl/install.sh, which this script sources when present (from the repo root). The
# run there is `bash scripts/gpu_checks.sh`, carrying .whl.
set -uo pipefail
if [[ -f .whl/install.sh ]]; then
    source .whl/install.sh || { echo "gpu_checks.sh: installing the wheels of .whl failed" >&2; exit 1; }
fi
out=${OUT:-/tmp/tx-gpu-checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TINKER_TELEMETRY=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__)" | tee -a "$out/gpu.txt"
python3 -m pip check 2>&1 | tee -a "$out/gpu.txt"  # conflicts of the carried wheels with the image, if any
timeout "${TESTS_S:-330}" python3 -m pytest -p no:cacheprovider -m gpu -s -ra --timeout 200 \
  tests/gpu/test_families_gpu.py tests/gpu/test_trainer_gpu.py tests/gpu/test_weight_sync_gpu.py \
  tests/gpu/test_transport_gpu.py tests/gpu/test_engines_gpu.py tests/gpu/test_trainer_workers_gpu.py \
  tests/gpu/test_vllm_images_gpu.py 2>&1 | tee "$out/tests.log"
tests_rc=$?
model=$(mktemp -d)/qwen3-0.6b
python3 -c "import sys; sys.path.insert(0, 'tests/gpu'); from test_trainer_gpu import _qwen3_0_6b; _qwen3_0_6b('$model')
from pathlib import Path; import shutil; from tx.models import write_tiny_text_model
tiny = write_tiny_text_model(Path('$model').parent / 'tokenizer', preset='vocab-h64')  # Qwen3's vocabulary
for name in ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja'): shutil.copy(tiny / name, '$model')"
timeout "${BENCH_S:-90}" python3 scripts/bench/shared_pass.py --model "$model" --device cuda --runs 1 4 16 \
  --rounds 2 2>&1 | tee "$out/shared_pass.log"
timeout "${BENCH_S:-90}" python3 scripts/bench/train_step.py --model "$model" --device cuda --steps 10 --warmup 3 \
  2>&1 | tee "$out/train_step.log"
exit "$tests_rc"
