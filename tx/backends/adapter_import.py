"""A PEFT LoRA adapter trained elsewhere, turned into a training state of this trainer (`tx checkpoints import`).

The adapter must fit the base model as tx places LoRA (`tx/models/lora_targets.py`): tx learns where that is
from the trainer itself, by making short-lived runs of the adapter's rank with one group each (attention, MLP,
the head) and reading the tensors they hold. The adapter's tensors must name modules of those groups, with
their shapes; the groups they touch become the state's `train_attn` / `train_mlp` / `train_unembed`. A module
of a chosen group that the adapter leaves out starts as a fresh LoRA does (its B is zero), so the imported
state computes exactly what the adapter computes. tx scales every LoRA by 32 / rank; the adapter's own scale
(`lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA) is folded into its B tensors.

The state is written by the trainer's own `save_state` from a run loaded with those tensors, so it is in every
trainer's format; its optimizer state is fresh. Refused (a UserError that says why, before anything is kept):
anything but a plain LoRA (DoRA, biases, `modules_to_save`, per-module ranks or alphas), a rank over the key's
quota, a tensor tx does not place or whose shape does not fit (a rank other than the config's is named), an
adapter whose config names another base model (`base_model_name_or_path`, compared by name), a pickled `.bin`
adapter.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from tx.backends.torch import checkpoint
from tx.backends.torch.lora import LORA_ALPHA
from tx.types import LoraConfig, UserError

logger = logging.getLogger(__name__)
CONFIG_METADATA = "adapter_config"
"""The safetensors metadata key that carries `adapter_config.json` in an upload (one file holds both)."""
GROUPS = ("attn", "mlp", "unembed")


class Trainer(Protocol):
    """What an import asks of the trainer (every `TrainingBackend` has it), on its training thread."""

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig) -> None: ...

    def delete_model(self, model_id: str) -> None: ...

    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]: ...

    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None: ...

    def save_state(self, model_id: str, directory: Path) -> None: ...


@dataclass(frozen=True)
class PeftAdapter:
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def rank(self) -> int:
        return int(self.config["r"])

    @property
    def scale(self) -> float:
        alpha = float(self.config.get("lora_alpha", self.rank))
        return alpha / (math.sqrt(self.rank) if self.config.get("use_rslora") else self.rank)


def read_config(upload: Path) -> dict[str, Any]:
    """The checked adapter config an upload carries in its safetensors metadata (no tensor is read)."""
    try:
        with safe_open(str(upload), framework="pt") as handle:
            config = _config_from_metadata(handle.metadata() or {})
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise UserError(f"the upload is not a readable safetensors file ({exc})") from exc
    check_config(config)
    return config


def read_adapter(upload: Path) -> PeftAdapter:
    """The adapter of an upload: a safetensors file of its tensors, its config in the metadata."""
    config = read_config(upload)
    try:
        with safe_open(str(upload), framework="pt") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise UserError(f"the upload's tensors are not readable ({exc})") from exc
    if not tensors:
        raise UserError("the adapter holds no tensors")
    return PeftAdapter(config, tensors)


def upload_of(directory: Path) -> bytes:
    """A PEFT adapter directory as one upload: its safetensors with `adapter_config.json` in the metadata (what
    `tx checkpoints import` sends). A pickled `adapter_model.bin` is refused: nothing is unpickled."""
    from safetensors.torch import load_file, save

    config_file, weights_file = directory / "adapter_config.json", directory / checkpoint.WEIGHTS_FILE
    if not weights_file.is_file():
        pickled = " (adapter_model.bin is a pickle, which tx never loads: save it with safetensors)" \
            if (directory / "adapter_model.bin").exists() else ""
        raise UserError(f"{directory} has no {checkpoint.WEIGHTS_FILE}{pickled}")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{config_file} is not a readable adapter config ({exc})") from exc
    check_config(config)
    return save(load_file(str(weights_file)), metadata={CONFIG_METADATA: json.dumps(config)})


def _config_from_metadata(metadata: dict[str, str]) -> dict[str, Any]:
    if CONFIG_METADATA not in metadata:
        raise UserError(f"the upload carries no adapter config (safetensors metadata {CONFIG_METADATA!r})")
    try:
        config = json.loads(metadata[CONFIG_METADATA])
    except ValueError as exc:
        raise UserError(f"the adapter config is not JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise UserError("the adapter config is not a JSON object")
    return config


def check_config(config: dict[str, Any]) -> None:
    """UserError for an adapter that is not a plain LoRA tx can train on."""
    if config.get("peft_type", "LORA") != "LORA":
        raise UserError(f"only LoRA adapters can be imported, not {config.get('peft_type')!r}")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 1024:
        raise UserError(f"the adapter's rank r must be an integer in [1, 1024], got {rank!r}")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1e6:
        raise UserError(f"the adapter's lora_alpha must be a positive number, got {alpha!r}")
    refused = {
        "use_dora": "DoRA adapters", "modules_to_save": "modules_to_save (fully trained modules)",
        "rank_pattern": "per-module ranks (rank_pattern)", "alpha_pattern": "per-module alphas (alpha_pattern)",
    }
    for key, what in refused.items():
        if config.get(key):
            raise UserError(f"{what} cannot be imported: tx trains plain LoRA of one rank")
    if config.get("bias", "none") != "none":
        raise UserError(f"adapters with trained biases (bias={config['bias']!r}) cannot be imported")


def import_adapter(backend: Trainer, adapter: PeftAdapter, base_model: str, out: Path) -> LoraConfig:
    """Write `adapter` as a training state of `base_model` into `out` (an empty directory); its LoRA config."""
    check_base(adapter.config, base_model)
    placed = {group: _placed(backend, base_model, adapter.rank, (group,)) for group in GROUPS}
    chosen = _groups_of(adapter, placed)
    lora = LoraConfig(rank=adapter.rank, seed=0, **{f"train_{group}": group in chosen for group in GROUPS})
    with _run(backend, base_model, lora) as model_id:
        fresh = {name: _as_torch(value) for name, value in backend.iter_trainable_weights(model_id)}
        weights = {**fresh, **_fitted(adapter, fresh)}
        with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
            checkpoint.write_state(Path(scratch), base_model, lora, weights, {})
            backend.load_state(model_id, Path(scratch), with_optimizer=False)
        backend.save_state(model_id, out)
    logger.info("imported a rank-%d LoRA on %s (%s; %d of %d tensors from the adapter, the rest fresh); "
                "its optimizer state starts fresh", lora.rank, base_model, ", ".join(sorted(chosen)),
                len(adapter.tensors), len(weights))
    return lora


def check_base(config: dict[str, Any], base_model: str) -> None:
    """UserError if the adapter names another base model than `base_model` (its `base_model_name_or_path`, when
    set, is the same name or a path ending in the same name: `Qwen/Qwen3-8B`, `/models/Qwen3-8B`). Two bases of
    one shape would take each other's adapters silently (the tiny Llama's import onto the tiny Gemma 3 did)."""
    named = config.get("base_model_name_or_path")
    if not named or not isinstance(named, str):
        return
    if named == base_model or Path(named).name.lower() == Path(base_model).name.lower():
        return
    raise UserError(f"the adapter was made for {named!r} (its adapter_config.json's base_model_name_or_path), not "
                    f"{base_model!r}; if it is the same model under another name, set base_model_name_or_path to "
                    f"{base_model!r} (or remove it) and import again")


def _placed(backend: Trainer, base_model: str, rank: int, groups: tuple[str, ...]
            ) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of a run of `groups` at `rank` ({} where the model has nothing of them)."""
    lora = LoraConfig(rank=rank, seed=0, **{f"train_{group}": group in groups for group in GROUPS})
    try:
        with _run(backend, base_model, lora) as model_id:
            return {name: tuple(np.shape(value)) for name, value in backend.iter_trainable_weights(model_id)}
    except UserError:
        return {}


def _groups_of(adapter: PeftAdapter, placed: dict[str, dict[str, tuple[int, ...]]]) -> set[str]:
    chosen = {group for group, tensors in placed.items() if set(tensors) & set(adapter.tensors)}
    known = {name: shape for tensors in placed.values() for name, shape in tensors.items()}
    unknown = sorted(set(adapter.tensors) - set(known))
    if unknown:
        raise UserError(f"the adapter holds {len(unknown)} tensors where tx places no LoRA on this base model, "
                        f"e.g. {unknown[:3]} (docs/model-families.md says where LoRA goes)")
    for name, tensor in adapter.tensors.items():
        if tuple(tensor.shape) != known[name]:
            raise UserError(f"the adapter's {name} has shape {tuple(tensor.shape)}; this base model at rank "
                            f"{adapter.rank} needs {known[name]}{_rank_note(adapter.rank, tensor.shape, known[name])}")
    return chosen


def _rank_note(rank: int, shape: tuple[int, ...], needed: tuple[int, ...]) -> str:
    """Where a tensor differs from what is needed only in its rank dimension: that its rank is not the config's."""
    differs = [i for i, (have, need) in enumerate(zip(shape, needed, strict=False)) if have != need]
    if len(shape) != len(needed) or len(differs) != 1 or needed[differs[0]] % rank:
        return ""
    tensor_rank = shape[differs[0]] * rank // needed[differs[0]]
    return f" (its tensors are of rank {tensor_rank}; the adapter_config.json says r={rank})"


def _fitted(adapter: PeftAdapter, fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors in the trainer's dtype, its scale folded into each B (tx scales by 32 / rank)."""
    factor = adapter.scale / (LORA_ALPHA / adapter.rank)
    fitted = {}
    for name, tensor in adapter.tensors.items():
        value = tensor.to(torch.float32)
        if ".lora_B." in name:
            value = value * factor
        fitted[name] = value.to(fresh[name].dtype)
    return fitted


@contextmanager
def _run(backend: Trainer, base_model: str, lora: LoraConfig) -> Iterator[str]:
    model_id = f"import-{uuid.uuid4().hex}"
    backend.create_model(model_id, base_model, lora)
    try:
        yield model_id
    finally:
        backend.delete_model(model_id)


def _as_torch(value: Any) -> torch.Tensor:
    return value.detach().to("cpu") if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))

