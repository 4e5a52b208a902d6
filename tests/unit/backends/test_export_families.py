"""Every family: the adapter a user downloads (sampler weights) loads in plain PEFT on the Hugging Face base, and
`tx checkpoints export --merge` loads in plain transformers, each giving the trainer's logprobs (1e-4, float32).

The adapter is trained here in-process (the torch backend, random LoRA weights so every tensor counts);
tests/integration/test_export_download.py takes the same files through the server and the SDK's download for
Qwen3. Families whose adapter plain PEFT cannot load as written (docs/model-families.md#exports) must fail
loudly there and load with tx's `exact_targets`, and their export says so in its README.md.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import numpy as np
import peft
import pytest
import torch
from backend_helpers import ce, datum, randomize
from families import FAMILIES

from tx.backends.torch.export import merge_into_base
from tx.backends.torch.merge import Plan, plan_merge
from tx.models.auto import load_pretrained
from tx.models.lora_targets import exact_targets
from tx.types import LoraConfig

TOKENS = np.random.default_rng(0).integers(0, 2048, size=24)


def table() -> dict[str, tuple[str, str]]:
    """docs/model-families.md's export table: preset -> (plain PEFT loads it, the merge)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "model-families.md").read_text()
    section = text.split("<!-- export-table", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ")]
    return {preset.strip(): (plain, merge) for presets, plain, merge, *_ in rows[1:] for preset in presets.split(",")}


@pytest.fixture(scope="module")
def backend(family_model_dirs):
    from tx.backends.torch.backend import TorchBackend

    return TorchBackend(family_model_dirs, device="cpu")


def _logprobs(model) -> np.ndarray:
    ids = torch.tensor([TOKENS[:-1].tolist()])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(TOKENS) - 1), torch.tensor(TOKENS[1:])].numpy()


def _trained(backend, preset: str, tmp_path: Path) -> tuple[np.ndarray, Path, Path]:
    """(the trainer's logprobs of TOKENS, the run's sampler weights, its training state)."""
    backend.create_model(preset, preset, LoraConfig(rank=4, seed=0))
    try:
        randomize(backend, preset, seed=3)
        batch = ce([datum(TOKENS[:-1], target_tokens=TOKENS[1:])], forward_only=True)
        expected = backend.forward_backward(preset, batch).loss_fn_outputs[0]["logprobs"]
        backend.save_sampler_weights(preset, tmp_path / "sampler")
        backend.save_state(preset, tmp_path / "state")
    finally:
        backend.delete_model(preset)
    return expected, tmp_path / "sampler", tmp_path / "state"


def test_the_table_covers_every_family() -> None:
    assert set(FAMILIES) <= set(table())


@pytest.mark.parametrize("preset", FAMILIES)
def test_the_downloaded_adapter_loads_in_plain_peft(backend, family_model_dirs, preset: str, tmp_path: Path) -> None:
    expected, sampler, _ = _trained(backend, preset, tmp_path)
    base = load_pretrained(family_model_dirs[preset], dtype=torch.float32).eval()
    assert np.abs(_logprobs(base) - expected).max() > 1e-2  # the adapter really changes the model
    plain, _ = table()[preset]
    readme = sampler / "README.md"
    if plain == "yes":
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # PEFT's "missing adapter keys" is a failure here
            model = peft.PeftModel.from_pretrained(base, str(sampler)).eval()
        np.testing.assert_allclose(_logprobs(model), expected, atol=1e-4)
        assert not readme.exists() or "does NOT load this adapter as written" not in readme.read_text()
        return
    assert "exact_targets" in readme.read_text() and "--merge" in readme.read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # plain PEFT refuses it, warns of keys it dropped, or loads other logprobs: never silently right
            wrong = np.abs(_logprobs(peft.PeftModel.from_pretrained(base, str(sampler)).eval()) - expected).max()
        except (ValueError, RuntimeError):
            wrong = np.inf
    assert wrong > 1e-3
    base = load_pretrained(family_model_dirs[preset], dtype=torch.float32).eval()
    with exact_targets():
        model = peft.PeftModel.from_pretrained(base, str(sampler)).eval()
    np.testing.assert_allclose(_logprobs(model), expected, atol=1e-4)


@pytest.mark.parametrize("preset", FAMILIES)
def test_the_merged_export_gives_the_trainers_logprobs(
    backend, family_model_dirs, preset: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In blocks of 1 KiB (a few rows of a linear, an untouched tensor in pieces), as a large model's are."""
    from tx.backends.torch import merge

    monkeypatch.setattr(merge, "BLOCK_BYTES", 1024)
    expected, sampler, state = _trained(backend, preset, tmp_path)
    base_dir = family_model_dirs[preset]
    _, merge = table()[preset]
    assert isinstance(plan_merge(sampler, base_dir), Plan) == (merge == "shard by shard")
    with caplog.at_level(logging.INFO, logger="tx.backends.torch.export"):
        for source in (sampler, state):
            out = merge_into_base(source, base_dir, tmp_path / f"merged-{source.name}")
            merged = load_pretrained(out, dtype=torch.float32).eval()
            assert not any("lora" in name for name in merged.state_dict())
            np.testing.assert_allclose(_logprobs(merged), expected, atol=1e-4)
    assert ("shard by shard" in caplog.text) == (merge == "shard by shard")
    if merge == "shard by shard":  # the base's own files, names and dtypes
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in base_dir.iterdir())
        assert json.loads((out / "config.json").read_text()) == json.loads((base_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def tied_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Gemma 3 with its head tied to its embeddings (as google/gemma-3-1b-it), the head not on disk."""
    from safetensors.torch import load_file, save_file

    from tx.models import write_tiny_model

    directory = write_tiny_model(tmp_path_factory.mktemp("tied") / "gemma3", preset="gemma3", seed=0)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = load_file(directory / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("streamed", [True, False])
def test_a_trained_head_tied_to_the_embeddings_merges_untied(
    tied_gemma3: Path, tmp_path: Path, streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Merged into the shared weight, the head's LoRA moved the embeddings too (2.2 nats off the trainer's)."""
    from tx.backends.torch import export
    from tx.backends.torch.backend import TorchBackend

    expected, sampler, _ = _trained(TorchBackend({"gemma3": tied_gemma3}, device="cpu"), "gemma3", tmp_path)
    if not streamed:
        monkeypatch.setattr(export, "plan_merge", lambda *_: "in memory, as for a base it cannot stream")
    out = merge_into_base(sampler, tied_gemma3, tmp_path / "merged")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    np.testing.assert_allclose(_logprobs(load_pretrained(out, dtype=torch.float32).eval()), expected, atol=1e-4)


@pytest.mark.parametrize(("preset", "head", "refused"), [
    ("gemma3", True, True), ("olmo3", True, True), ("gemma3", False, False), ("tiny", True, False),
])
def test_an_export_vllm_refuses_says_so_in_its_readme(
    family_model_dirs, preset: str, head: bool, refused: bool, tmp_path: Path
) -> None:
    """vLLM 0.32 takes no LoRA on Gemma 3's and Olmo 3's lm_head (tests/vllm_engine/test_vllm_exports.py runs it);
    their exports with a trained head say so, and that plain PEFT loads them."""
    from tx.backends.torch.backend import TorchBackend

    backend = TorchBackend({preset: family_model_dirs[preset]}, device="cpu")
    backend.create_model(preset, preset, LoraConfig(rank=4, seed=0, train_unembed=head))
    backend.save_sampler_weights(preset, tmp_path)
    readme = tmp_path / "README.md"
    assert readme.exists() == refused
    if refused:
        text = readme.read_text()
        assert "vLLM does NOT load this adapter" in text and "lm_head" in text and "train_unembed=False" in text
        assert "Plain PEFT (`PeftModel.from_pretrained`) loads this adapter exactly" in text
