"""Where a run's LoRA goes, read from the model's own structure (no list of module names per family).

The decoder (`model.get_decoder()`: a vision-language model's language model) holds a list of layers; each
layer's children are read by kind, from what they hold first and then from the attribute names transformers'
decoders use:

- MLP: a child holding routed experts (3-D parameters: experts fused into one tensor per projection) or a
  router (a child module named `gate` or `router`), whatever its own name (Nemotron-3 calls every layer's body
  `mixer`), or a child named like an MLP (`mlp`, `feed_forward`, `ffn`, `moe`, `experts`): every `nn.Linear`
  in it (a dense MLP, a shared expert) except routers (`gate`, `router`, `*_gate`: they choose experts, LoRA
  there would move the routing), plus the 3-D parameters, which PEFT adapts through `target_parameters`.
  `train_mlp` adapts them.
- attention (any other child named like `self_attn`, `linear_attn`, `attention`, `mixer`): every
  `nn.Linear` in it: softmax attention's q/k/v/o, multi-head latent attention's low-rank projections, a gated
  delta net's or a Mamba mixer's input and output projections (they mix the sequence). `train_attn` adapts
  them.
- anything else holding weights (norms and convolutions aside) makes the structure unreadable: a
  UserError at `create_model`, never LoRA placed on a guess.

The placement is exactly the modules chosen: a suffix that would also match a module left out (a vision
tower's, one frozen in some layer) excludes that module by its full name.

`train_unembed` adapts the output embeddings (`lm_head`). Nothing outside the decoder layers and the head
gets LoRA: a vision tower stays frozen (`exclude_modules` names any of its modules the suffixes would
match). The result, family by family, is the table in docs/model-families.md (checked by a test).

PEFT on transformers 5 rewrites targets named like transformers 4's MoE experts (`gate_proj`, `up_proj`,
`down_proj`) into fused-expert parameters for some model types (Qwen3-MoE, DeepSeek-V3), which would drop
the dense MLP's and the shared experts' LoRA; `exact_targets` turns that rewrite off while tx builds or
loads an adapter, so the targets stay the ones listed here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tx.types import UserError

if TYPE_CHECKING:
    import peft

ATTENTION_NAMES = re.compile(r"(self_|linear_|cross_)?(attn|attention)|mixer|token_mixer")
MLP_NAMES = re.compile(r"mlp|feed_forward|ffn|moe|experts?|block_sparse_moe")
ROUTER_NAMES = re.compile(r"(gate|router)|.*_gate")
ROUTER_MODULES = re.compile(r"gate|router")
"""A part's child module by these names routes tokens to experts: the part is an MLP."""
FROZEN_KINDS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
"""Modules whose weights are never expert tensors, whatever their shape."""


@dataclass(frozen=True)
class LoraTargets:
    """A run's LoRA placement, as PEFT takes it."""

    target_modules: tuple[str, ...]
    """Module-name suffixes from the decoder layer down (`self_attn.q_proj`, `mlp.shared_expert.up_proj`), and
    the head's name (`lm_head`)."""
    target_parameters: tuple[str, ...] = ()
    """Fused expert tensors (`mlp.experts.gate_up_proj`), adapted through PEFT's `target_parameters`."""
    exclude_modules: tuple[str, ...] = ()
    """Full names of modules outside the decoder that a suffix would also match (a vision tower's)."""


@dataclass(frozen=True)
class LayerParts:
    """One decoder layer's adaptable parts by kind, as names relative to the layer."""

    attention: tuple[str, ...]
    mlp: tuple[str, ...]
    experts: tuple[str, ...]
    frozen: tuple[str, ...] = ()
    """Linear modules that never get LoRA: routers, and what the load-time probe left out."""

    def names(self) -> tuple[str, ...]:
        return self.attention + self.mlp + self.frozen


@dataclass(frozen=True)
class ModelStructure:
    """What of a model LoRA can go on, read once (before any adapter wraps its modules)."""

    model_name: str
    layers_path: str
    """The decoder's layer list (`model.layers`, `model.language_model.layers`)."""
    layers: tuple[LayerParts, ...]
    head: str | None
    """The output embeddings' module name; None when they are not a linear layer."""
    outside: tuple[str, ...]
    """Linear modules outside the decoder layers and the head (a vision tower's, a projector's)."""

    def targets(self, *, attn: bool, mlp: bool, unembed: bool) -> LoraTargets:
        """The LoRA targets of a run training the chosen groups."""
        chosen = {self.full_name(i, name) for i, part in enumerate(self.layers)
                  for name in (part.attention if attn else ()) + (part.mlp if mlp else ())}
        parameters = sorted({name for part in self.layers for name in part.experts}) if mlp else []
        if unembed:
            if self.head is None:
                raise UserError(f"{self.model_name}: its output embeddings are not a linear layer; "
                                "train_unembed cannot put LoRA there")
            chosen.add(self.head)
        if not chosen and not parameters:
            raise UserError(f"{self.model_name}: no module of the chosen groups to put LoRA on")
        return self.targets_of(chosen, parameters)

    def targets_of(self, modules: Collection[str], parameters: Collection[str] = ()) -> LoraTargets:
        """The targets putting LoRA on exactly `modules` (full names) and the expert tensors `parameters`:
        suffixes from the decoder layer down (the head by its own name), with every other module a suffix
        would also match excluded by its full name (a vision tower's, or one the probe left out of a layer)."""
        chosen = set(modules)
        suffixes = sorted({self.relative_name(name) for name in chosen})
        exclude = sorted(name for name in self.modules()
                         if name not in chosen and any(name == s or name.endswith(f".{s}") for s in suffixes))
        return LoraTargets(tuple(suffixes), tuple(sorted(parameters)), tuple(exclude))

    def targets_holding(self, tensor_names: Collection[str], *, mlp: bool) -> LoraTargets:
        """The targets of an adapter whose tensors (PEFT file names) are `tensor_names`: exactly the modules
        they hold, and the expert tensors when it trains the MLP. What a config written from a structure read
        without the model (`structure_of`) must say, where the trainer's probe left modules out."""
        known = set(self.modules())
        held = {name for name in map(module_of, tensor_names) if name in known}
        parameters = sorted({name for part in self.layers for name in part.experts}) if mlp else []
        return self.targets_of(held, parameters)

    def modules(self) -> list[str]:
        """Full names of every linear module read: the layers' (of every kind, frozen ones too), the head,
        and those outside."""
        head = [self.head] if self.head is not None else []
        layers = [self.full_name(i, name) for i, part in enumerate(self.layers) for name in part.names()]
        return layers + head + list(self.outside)

    def full_name(self, layer: int, name: str) -> str:
        return f"{self.layers_path}.{layer}.{name}"

    def relative_name(self, full_name: str) -> str:
        """`full_name` from its decoder layer down (`self_attn.q_proj`); the head's and others' unchanged."""
        match = re.fullmatch(rf"{re.escape(self.layers_path)}\.\d+\.(.+)", full_name)
        return match.group(1) if match else full_name


def read_structure(model: torch.nn.Module) -> ModelStructure:
    """The structure of `model` (not yet wrapped by PEFT); UserError for one this cannot read."""
    layers_path, layers = _decoder_layers(model)
    parts = tuple(read_layer(f"{layers_path}.{i}", layer) for i, layer in enumerate(layers))
    get_head = getattr(model, "get_output_embeddings", None)
    head_module = get_head() if callable(get_head) else None
    head, outside = None, []
    for name, module in model.named_modules():
        if module is head_module and isinstance(module, torch.nn.Linear):
            head = name
        elif isinstance(module, torch.nn.Linear) and not name.startswith(f"{layers_path}."):
            outside.append(name)
    return ModelStructure(type(model).__name__, layers_path, parts, head, tuple(outside))


@functools.lru_cache(maxsize=16)
def structure_of(model_dir: Path) -> ModelStructure:
    """The structure of the model in `model_dir`, built on the meta device from its config (no weights)."""
    from transformers import AutoConfig

    from tx.models.auto import model_class

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = model_class(model_dir)._from_config(config)
    return read_structure(model)


def read_layer(path: str, layer: torch.nn.Module) -> LayerParts:
    """The attention and MLP parts of the decoder layer at `path`; UserError naming what it cannot place."""
    attention, mlp, experts, frozen = [], [], [], []
    for child_name, child in layer.named_children():
        linears = [f"{child_name}.{n}" if n else child_name for n, m in child.named_modules()
                   if isinstance(m, torch.nn.Linear)]
        fused = _fused_experts(child_name, child)
        if not linears and not fused:
            continue  # norms, rotary embeddings, convolution-only parts: frozen
        if fused or _holds_router(child) or MLP_NAMES.fullmatch(child_name):
            routers = [name for name in linears if ROUTER_NAMES.fullmatch(name.rsplit(".", 1)[-1])]
            mlp += [name for name in linears if name not in routers]
            frozen += routers
            experts += fused
        elif ATTENTION_NAMES.fullmatch(child_name):
            attention += linears
        else:
            raise UserError(
                f"cannot tell where LoRA goes in {path}.{child_name} ({type(child).__name__}): tx reads decoder "
                "layers whose parts are named like attention (self_attn, linear_attn, ...) or MLPs (mlp, ...); "
                "see docs/model-families.md"
            )
    return LayerParts(tuple(attention), tuple(mlp), tuple(experts), tuple(frozen))


def _holds_router(part: torch.nn.Module) -> bool:
    """Whether `part` has a router among its children (it sends tokens to experts: an MLP)."""
    return any(ROUTER_MODULES.fullmatch(name) for name, _ in part.named_children())


def _fused_experts(prefix: str, module: torch.nn.Module) -> list[str]:
    """3-D parameters (experts stacked in one tensor) under `module`, convolution kernels aside."""
    return [
        ".".join(filter(None, (prefix, owner, name)))
        for owner, child in module.named_modules() if not isinstance(child, FROZEN_KINDS)
        for name, param in child.named_parameters(recurse=False) if param.ndim == 3
    ]


def _decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The full name and the modules of the decoder's layer list."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(decoder, torch.nn.Module) or not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise UserError(f"{type(model).__name__}: no decoder with a list of layers (get_decoder().layers) "
                        "to put LoRA on; see docs/model-families.md")
    path = next(name for name, module in model.named_modules() if module is layers)
    return path, layers


def module_of(tensor_name: str) -> str:
    """The module a PEFT adapter tensor belongs to (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`
    -> `model.layers.0.self_attn.q_proj`)."""
    return tensor_name.removeprefix("base_model.model.").split(".lora_", 1)[0]


def peft_config(targets: LoraTargets, rank: int, alpha: float) -> peft.LoraConfig:
    """The PEFT LoRA config of `targets`: no dropout, no bias."""
    import peft

    return peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,  # pyright: ignore[reportArgumentType]  (PEFT annotates int; it only scales by alpha / r)
        lora_dropout=0.0,
        bias="none",
        target_modules=list(targets.target_modules),
        target_parameters=list(targets.target_parameters) or None,
        exclude_modules=list(targets.exclude_modules) or None,
        task_type="CAUSAL_LM",
    )


@contextmanager
def exact_targets() -> Iterator[None]:
    """Build or load adapters with PEFT taking their targets as given (see the module docstring): its
    transformers-4-to-5 rewrite of MoE targets is off inside the block, and so is its refusal of a Mamba
    mixer's `out_proj` by name (model types it lists, Nemotron-H's among them): that refusal is for fused
    kernels that read the weight without calling the module, and tx's load-time probe leaves out every module
    the forward does not call (`tx/backends/torch/lora_probe.py`)."""
    from peft.tuners import tuners_utils
    from peft.utils import transformers_weight_conversion as conversion

    config, state, mamba = (conversion.convert_peft_config_for_transformers,
                            conversion.convert_peft_adapter_state_dict_for_transformers,
                            tuners_utils._check_lora_target_modules_mamba)
    conversion.convert_peft_config_for_transformers = _keep_config
    conversion.convert_peft_adapter_state_dict_for_transformers = _keep_state
    tuners_utils._check_lora_target_modules_mamba = _keep_config
    try:
        yield
    finally:
        conversion.convert_peft_config_for_transformers = config
        conversion.convert_peft_adapter_state_dict_for_transformers = state
        tuners_utils._check_lora_target_modules_mamba = mamba


def _keep_config(*_: object, **__: object) -> None:
    """PEFT's config conversion, as a no-op."""


def _keep_state(*_: object, adapter_state_dict: dict[str, torch.Tensor], **__: object) -> dict[str, torch.Tensor]:
    """PEFT's adapter state-dict conversion, as the identity."""
    return adapter_state_dict
