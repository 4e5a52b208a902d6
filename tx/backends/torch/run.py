"""A training run: one LoRA adapter on a shared base model, with its own optimizer (AdamW or Dimuon)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tx.types import LoraConfig


@dataclass
class Run:
    model_id: str
    base_model: str
    lora: LoraConfig
    adapter: str  # the PEFT adapter name inside the shared base model
    params: dict[str, torch.nn.Parameter]  # PEFT adapter-file name -> parameter
    optimizer: torch.optim.Optimizer

    def zero_grad(self) -> None:
        for param in self.params.values():
            param.grad = None
