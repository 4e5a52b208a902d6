#!/usr/bin/env bash
# The GPU checks in one go, for a machine with one or more CUDA GPUs and tx's dependencies importable
# (docs/operations.md#gpu-checks), within TOTAL_S seconds (default 540: one call of a lent machine's 600 s).
# PARTS (default "train sdk engine tests") chooses, run in this order:
#   train   the trainer's tokens/s, MFU and peak memory against plain PEFT (scripts/bench/train_throughput.py)
#           at Qwen3-8B's shape (8 x 4,096 tokens) and Qwen3-0.6B's (128 x 2,048), LoRA rank 32, with the
#           PyTorch profiler's table of the 8B step;
#   sdk     the step through the SDK against plain torch at 8 x 128 on Qwen3-0.6B (scripts/bench/train_step.py),
#           and the same step in-process (train_throughput.py, with the profiler's table);
#   engine  the colocated embedded engine at Qwen3-8B's shape: a rank-32 LoRA pushed over CUDA IPC (GB/s against
#           a device copy), 64 rows x 256 tokens sampled with it against HF `generate` through PEFT
#           (scripts/bench/engine_generate.py), sleep and wake at levels 1 and 2 (engine_sleep.py); and
#           Qwen3-0.6B's full weights pushed over CUDA IPC;
#   shared  several runs in one training pass against turns (scripts/bench/shared_pass.py);
#   tests   the GPU tests (tests/gpu, marker `gpu`), last, in the time left (at most TESTS_S, default 330).
# The models are Qwen3's real configs with random weights (scripts/bench/real_shapes.py), written once.
# Every bench's JSON goes to $OUT/<name>.json (logs beside it), and all of them into $OUT/figures.json, printed
# at the end. OUT defaults to /tmp/tx-gpu-checks. Each bench has its own bound, cut to the time left; a bench
# with under 20 s left is skipped, and says so.
# For a GPU machine without network (the H200 this project is lent: its python3 has torch but not all of tx's
# dependencies), run `scripts/gpu/prepare.sh` first, here, on a machine with network: it writes the wheelhouse
# .whl/ (git-ignored) and .whl/install.sh, which this script sources when present (from the repo root). The
# run there is `bash scripts/gpu_checks.sh`, carrying .whl.
set -uo pipefail
if [[ -f .whl/install.sh ]]; then
    source .whl/install.sh || { echo "gpu_checks.sh: installing the wheels of .whl failed" >&2; exit 1; }
fi
out=${OUT:-/tmp/tx-gpu-checks}
parts=" ${PARTS:-train sdk engine tests} "
deadline=$((SECONDS + ${TOTAL_S:-540}))
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TINKER_TELEMETRY=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__)" | tee -a "$out/gpu.txt"
python3 -m pip check 2>&1 | tee -a "$out/gpu.txt"  # conflicts of the carried wheels with the image, if any
rc=0
started=$SECONDS

bench() {  # bench NAME SECONDS SCRIPT ARGS...: one bench, its JSON to $out/NAME.json, stderr to $out/NAME.log
    local name=$1 seconds=$2 script=$3
    shift 3
    ((seconds > deadline - SECONDS)) && seconds=$((deadline - SECONDS))
    if ((seconds < 20)); then
        echo "== $name: skipped, $((deadline - SECONDS)) s left"
        rc=1
        return
    fi
    echo "== $name ($((SECONDS - started)) s in, at most $seconds s)"
    timeout "$seconds" python3 "scripts/bench/$script" "$@" > "$out/$name.json" 2> "$out/$name.log"
    local status=$?
    if ((status != 0)); then
        echo "$name: exit $status (timeout: 124); the log's end:"
        tail -n 15 "$out/$name.log"
        rc=1
    fi
}

models=$(mktemp -d)
small=$models/qwen3-0.6b large=$models/qwen3-8b
if [[ $parts == *" train "* || $parts == *" sdk "* || $parts == *" engine "* || $parts == *" shared "* ]]; then
    timeout 60 python3 scripts/bench/real_shapes.py --shape qwen3-0.6b --out "$small" > /dev/null || rc=1
fi
if [[ $parts == *" train "* || $parts == *" engine "* ]]; then
    echo "== writing Qwen3-8B's shape ($((SECONDS - started)) s in)"
    timeout 150 python3 scripts/bench/real_shapes.py --shape qwen3-8b --out "$large" > /dev/null || rc=1
fi
if [[ $parts == *" train "* ]]; then
    bench train_8b 150 train_throughput.py --model "$large" --batch 8 --seq-len 4096 --steps 3 --warmup 1 \
      --profile "$out/profile"
    bench train_0.6b 120 train_throughput.py --model "$small" --batch 128 --seq-len 2048 --steps 1 --warmup 1 \
      --peft-micro-batch 8
fi
if [[ $parts == *" sdk "* ]]; then
    bench train_step 90 train_step.py --model "$small" --device cuda --steps 10 --warmup 3
    # the same step without the server: is the gap to plain PEFT the trainer's or the SDK path's?
    bench step_in_process 60 train_throughput.py --model "$small" --batch 8 --seq-len 128 --rank 8 --steps 10 \
      --warmup 3 --no-peft-checkpointing --profile "$out/profile_step"
fi
if [[ $parts == *" engine "* ]]; then
    bench engine_8b_lora 180 engine_generate.py --model "$large" --device cuda --lora-rank 32 --pushes 3 \
      --concurrency 64 --max-tokens 256 --prompt-len 32 128 --repeats 2
    bench engine_0.6b_full_weights 90 engine_generate.py --model "$small" --device cuda --push-base --pushes 4 \
      --concurrency 8 --max-tokens 32 --repeats 1
    bench engine_8b_sleep 150 engine_sleep.py --model "$large" --device cuda --cycles 1 --max-tokens 16
fi
if [[ $parts == *" shared "* ]]; then
    bench shared_pass 90 shared_pass.py --model "$small" --device cuda --runs 1 4 16 --rounds 2
fi
rm -rf "$models"
tests_s=$((deadline - SECONDS < ${TESTS_S:-330} ? deadline - SECONDS : ${TESTS_S:-330}))
if [[ $parts == *" tests "* ]] && ((tests_s < 20)); then
    echo "== tests: skipped, $tests_s s left"
    rc=1
elif [[ $parts == *" tests "* ]]; then
    echo "== tests ($((SECONDS - started)) s in, at most $tests_s s)"
    timeout "$tests_s" python3 -m pytest -p no:cacheprovider -m gpu -s -ra --timeout 200 \
      tests/gpu/test_families_gpu.py tests/gpu/test_trainer_gpu.py tests/gpu/test_weight_sync_gpu.py \
      tests/gpu/test_transport_gpu.py tests/gpu/test_engines_gpu.py tests/gpu/test_trainer_workers_gpu.py \
      tests/gpu/test_vllm_images_gpu.py 2>&1 | tee "$out/tests.log"
    ((PIPESTATUS[0] == 0)) || rc=1
fi
python3 - "$out" <<'EOF' | tee "$out/figures.json"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
figures = {}
for path in sorted(out.glob("*.json")):
    if path.name != "figures.json":
        lines = path.read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("{")]
        try:
            figures[path.stem] = json.loads("\n".join(lines[starts[-1]:])) if starts else None
        except json.JSONDecodeError:
            figures[path.stem] = None
print(json.dumps(figures, indent=1))
EOF
echo "gpu_checks.sh: $((SECONDS - started)) s, exit $rc"
exit "$rc"
