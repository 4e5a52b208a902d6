"""On-disk formats: a run's training state, and the PEFT adapter directory a sampler loads.

A state directory (`save_state`) holds
- `adapter_model.safetensors`: the LoRA tensors, named as in a PEFT adapter file;
- `tx_state.json`: the format tag, the base model's name, the run's LoRA config and its optimizer
  (`{"type": "adamw"|"dimuon", "version": 1}`; absent in older checkpoints: adamw);
- `optimizer.pt`: the optimizer's state dict (AdamW's moments, or Dimuon's momentum), written with `torch.save` and read back with
  `torch.load(weights_only=True)`, so loading unpickles nothing but tensors and plain containers.

A sampler directory (`save_sampler_weights`) is a standard PEFT adapter: `adapter_config.json`
(with `base_model_name_or_path` = the served base model's name) + `adapter_model.safetensors`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import peft
import torch
from safetensors.torch import load_file, save_file

from tx.optimizers import ADAMW, OptimizerConfig
from tx.types import LoraConfig, UserError

WEIGHTS_FILE = "adapter_model.safetensors"
STATE_FILE = "tx_state.json"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FORMAT = "tx.torch.lora_state/1"


def write_state(
    directory: Path,
    base_model: str,
    lora: LoraConfig,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    optimizer: OptimizerConfig = ADAMW,
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _write_weights(directory / WEIGHTS_FILE, weights)
    meta = {"format": STATE_FORMAT, "base_model": base_model, "lora": asdict(lora),
            "optimizer": {"type": optimizer.kind, "version": optimizer.version}}
    (directory / STATE_FILE).write_text(json.dumps(meta, indent=2))
    torch.save(optimizer_state, directory / OPTIMIZER_FILE)


def read_state_config(directory: Path) -> tuple[str, LoraConfig]:
    """(base model, LoRA config) of a state directory; UserError if it is not one."""
    meta = _meta(directory)
    known = {f.name for f in fields(LoraConfig)}
    lora = LoraConfig(**{k: v for k, v in meta["lora"].items() if k in known})
    return str(meta["base_model"]), lora


def read_state_optimizer(directory: Path) -> OptimizerConfig:
    """The optimizer whose state the directory holds (adamw for checkpoints written before Dimuon)."""
    recorded = _meta(directory).get("optimizer") or {}
    try:
        optimizer = OptimizerConfig(recorded.get("type", "adamw"), int(recorded.get("version", 1)))
    except (AttributeError, TypeError, ValueError) as exc:
        raise UserError(f"{directory / STATE_FILE} names no readable optimizer: {recorded!r}") from exc
    optimizer.check()
    return optimizer


def _meta(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{directory} is not a readable training-state checkpoint ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
        raise UserError(f"{path} is not a {STATE_FORMAT} checkpoint")
    return meta


def read_weights(directory: Path, device: torch.device) -> dict[str, torch.Tensor]:
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise UserError(f"checkpoint {directory} has no {WEIGHTS_FILE}")
    return load_file(path, device=str(device))


def read_optimizer_state(directory: Path, device: torch.device) -> dict[str, Any]:
    path = directory / OPTIMIZER_FILE
    if not path.is_file():
        raise UserError(f"checkpoint {directory} has no optimizer state ({OPTIMIZER_FILE})")
    return torch.load(path, map_location=device, weights_only=True)


def write_sampler_weights(
    directory: Path, base_model: str, config: peft.LoraConfig, weights: dict[str, torch.Tensor]
) -> None:
    """A PEFT adapter directory that `PeftModel.from_pretrained(base, directory)` and vLLM load."""
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    config.base_model_name_or_path = base_model
    config.inference_mode = True
    config.save_pretrained(str(directory))
    _write_weights(directory / WEIGHTS_FILE, weights)


def _write_weights(path: Path, weights: dict[str, torch.Tensor]) -> None:
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in weights.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
