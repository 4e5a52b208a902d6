"""Every family: an adapter tx exported (sampler weights, as a user downloads them) imports back
(`tx checkpoints import`, tx/backends/adapter_import.py) into a training state whose forward gives the logprobs
of the run it came from (1e-5, float32); an adapter plain PEFT made on the Hugging Face base imports and computes
what PEFT computes; an adapter of another rank, targets or base is refused with a UserError (a 400) naming what
differs, before anything is written.

Unit-level: the trainer is the torch backend in-process, one per module (the families' models built once);
tests/integration/test_import_adapter.py takes an export through the SDK's download, the CLI and the server.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import peft
import pytest
import torch
from backend_helpers import ce, datum, randomize
from families import FAMILIES

from tx.backends import adapter_import
from tx.backends.torch import checkpoint
from tx.models.auto import load_pretrained
from tx.types import LoraConfig, UserError

TOKENS = np.random.default_rng(0).integers(0, 2048, size=24)


@pytest.fixture(scope="module")
def backend(family_model_dirs):
    from tx.backends.torch.backend import TorchBackend

    return TorchBackend(family_model_dirs, device="cpu")


@pytest.fixture(scope="module")
def exports(backend, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[np.ndarray, Path]]:
    """Per family, trained once: (the trainer's logprobs of TOKENS, the run's exported sampler weights)."""
    root = tmp_path_factory.mktemp("exports")
    return {preset: _exported(backend, preset, root / preset) for preset in FAMILIES}


def _forward(backend, model_id: str) -> np.ndarray:
    batch = ce([datum(TOKENS[:-1], target_tokens=TOKENS[1:])], forward_only=True)
    return np.asarray(backend.forward_backward(model_id, batch).loss_fn_outputs[0]["logprobs"])


def _exported(backend, preset: str, directory: Path) -> tuple[np.ndarray, Path]:
    backend.create_model(preset, preset, LoraConfig(rank=4, seed=0))
    try:
        randomize(backend, preset, seed=3)
        expected = _forward(backend, preset)
        backend.save_sampler_weights(preset, directory)
    finally:
        backend.delete_model(preset)
    return expected, directory


def _imported(backend, adapter_dir: Path, preset: str, tmp_path: Path) -> np.ndarray:
    """The adapter in `adapter_dir` uploaded and imported as `tx checkpoints import` does; its state loaded into
    a fresh run of the config it records, that run's logprobs of TOKENS."""
    upload = tmp_path / "upload.safetensors"
    upload.write_bytes(adapter_import.upload_of(adapter_dir))
    out = tmp_path / "state"
    lora = backend.import_adapter(upload, preset, out)
    base_model, recorded = checkpoint.read_state_config(out)
    assert (base_model, recorded) == (preset, lora)
    backend.create_model("imported", preset, lora)
    try:
        backend.load_state("imported", out, with_optimizer=False)
        return _forward(backend, "imported")
    finally:
        backend.delete_model("imported")


@pytest.mark.parametrize("preset", FAMILIES)
def test_an_export_imports_back_as_the_run_it_came_from(backend, exports, preset: str, tmp_path: Path) -> None:
    expected, sampler = exports[preset]
    np.testing.assert_allclose(_imported(backend, sampler, preset, tmp_path), expected, atol=1e-5)


def _peft_logprobs(model) -> np.ndarray:
    ids = torch.tensor([TOKENS[:-1].tolist()])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(TOKENS) - 1), torch.tensor(TOKENS[1:])].numpy()


def _plain_peft_adapter(base_dir: Path, targets: list[str], into: Path):
    """A rank-8 LoRA (alpha 16, B far from zero) plain PEFT makes on the Hugging Face base, on `targets` of the
    language model (a VLM's vision tower has projections of the same names, where tx places no LoRA)."""
    base = load_pretrained(base_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False,
                             exclude_modules=VISION)
    model = peft.get_peft_model(base, config).eval()
    model.save_pretrained(str(into))
    return model


@pytest.mark.parametrize("preset", FAMILIES)
def test_an_adapter_plain_peft_made_imports_as_it_computes(
    backend, exports, family_model_dirs, preset: str, tmp_path: Path
) -> None:
    """On the attention projections tx's own export names (every family has them; PEFT makes it on each)."""
    _, sampler = exports[preset]
    targets = json.loads((sampler / "adapter_config.json").read_text())["target_modules"]
    attention = sorted(t for t in targets if t.rsplit(".", 1)[-1] in ATTENTION)
    assert attention, "every family's export targets some attention projection"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _plain_peft_adapter(family_model_dirs[preset], attention, tmp_path / "theirs")
        expected = _peft_logprobs(model)
    np.testing.assert_allclose(_imported(backend, tmp_path / "theirs", preset, tmp_path), expected, atol=1e-5)


VISION = r".*(vision_tower|visual|vision_model).*"
ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
             "kv_proj", "o_b_proj", "r_proj"}
"""The attention projections' names across the families (tx's exports name them; see docs/model-families.md)."""


def _edited(sampler: Path, into: Path, config: dict | None = None, tensors=None) -> Path:
    """A copy of the adapter in `sampler` with its config updated by `config` and its tensors mapped."""
    from safetensors.torch import load_file, save_file

    into.mkdir()
    written = json.loads((sampler / "adapter_config.json").read_text())
    (into / "adapter_config.json").write_text(json.dumps({**written, **(config or {})}))
    weights = load_file(str(sampler / checkpoint.WEIGHTS_FILE))
    save_file(tensors(weights) if tensors else weights, str(into / checkpoint.WEIGHTS_FILE))
    return into


def _refusal(backend, adapter: Path, preset: str, tmp_path: Path) -> str:
    upload = tmp_path / "upload.safetensors"
    upload.write_bytes(adapter_import.upload_of(adapter))
    with pytest.raises(UserError) as refused:
        backend.import_adapter(upload, preset, tmp_path / "state")
    assert not (tmp_path / "state").exists()
    return str(refused.value)


MISMATCHED = ("tiny", "deepseek_v3", "nemotron_h")
"""Dense attention, MLA with fused experts, and a Mamba hybrid: the mismatches below on each."""


@pytest.mark.parametrize("preset", MISMATCHED)
def test_an_adapter_of_another_rank_is_refused_naming_both_ranks(backend, exports, preset: str, tmp_path: Path
                                                                 ) -> None:
    _, sampler = exports[preset]
    said = _refusal(backend, _edited(sampler, tmp_path / "r8", {"r": 8}), preset, tmp_path)
    assert "rank 8" in said and "rank 4" in said, said


@pytest.mark.parametrize("preset", MISMATCHED)
def test_an_adapter_on_modules_tx_does_not_place_is_refused_naming_them(backend, exports, preset: str,
                                                                        tmp_path: Path) -> None:
    _, sampler = exports[preset]

    def renamed(weights: dict) -> dict:
        return {name.replace(".layers.0.", ".layers.0.nowhere.", 1): value for name, value in weights.items()}

    said = _refusal(backend, _edited(sampler, tmp_path / "elsewhere", tensors=renamed), preset, tmp_path)
    assert "where tx places no LoRA" in said and ".layers.0.nowhere." in said, said


@pytest.mark.parametrize(("made_for", "imported_on"), [("tiny", "llama"), ("llama", "gemma3"), ("qwen3_moe", "tiny")])
def test_an_adapter_of_another_base_is_refused_naming_the_base(backend, exports, made_for: str, imported_on: str,
                                                               tmp_path: Path) -> None:
    _, sampler = exports[made_for]
    said = _refusal(backend, sampler, imported_on, tmp_path)
    assert f"made for {made_for!r}" in said and imported_on in said, said
