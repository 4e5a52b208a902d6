"""A PEFT adapter merged into its base model's safetensors shard by shard (`tx checkpoints export --merge`).

Only one shard of the base is in memory at a time, so a model larger than RAM merges on a machine that could
serve it. Where each LoRA lands comes from PEFT itself, run on the base model's skeleton on the meta device (no
weights): a LoRA linear adds `B @ A * scale` to its weight, a fused expert tensor (`target_parameters`) PEFT's
`ParamWrapper` delta (one `B_e @ A_e` per expert, in the tensor's own layout). The files keep the base's names
(transformers 5 may store a tensor under another name than its module's: `backbone.` for `model.`); a tensor the
adapter touches must be found under a plain renaming of transformers' checkpoint conversion. Where it is not (per-
expert tensors on disk that the model fuses), `plan_merge` says why, and the caller merges in memory. A trained head
tied to the embeddings is written as a head of its own, and the config unties them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import peft
import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraLayer, ParamWrapper
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tx.backends.torch.peft_compat import skeleton as meta_skeleton
from tx.models.lora_targets import exact_targets

PEFT_PREFIX = "base_model.model."
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Delta:
    """One base tensor's LoRA: its update is `einsum(formula, B, A) * scale`."""

    a: str
    b: str
    scale: float
    experts: int
    """0 for a linear's 2-D weight; the number of experts of a fused 3-D tensor."""
    swapped: bool
    """For a fused tensor: stored (experts, out, in) rather than (experts, in, out)."""

    def update(self, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        a, b = weights[self.a].float(), weights[self.b].float()
        if not self.experts:
            return (b @ a) * self.scale
        a3 = a.reshape(self.experts, -1, a.shape[-1])  # experts x rank x in
        b3 = b.reshape(b.shape[0], -1, self.experts)  # out x rank x experts
        formula = "o r e, e r i -> e o i" if self.swapped else "o r e, e r i -> e i o"
        return torch.einsum(formula, b3, a3) * self.scale


@dataclass(frozen=True)
class Plan:
    """What the merge writes: each touched base tensor (its name in the base's files) and its delta."""

    deltas: dict[str, Delta]
    """By the tensor's name in the base's files: added to it in place."""
    untied: dict[str, tuple[str, Delta]]
    """A tied tensor's LoRA (a trained head whose weight is the embeddings'): the model's name of it -> (the
    shared tensor's name in the files, its delta). It is written as a tensor of its own beside the shared one,
    and the config unties them: the shared tensor stays as it was for the others (the embeddings)."""
    shards: tuple[str, ...]


def plan_merge(adapter_dir: Path, base_dir: Path) -> Plan | str:
    """The streaming merge of `adapter_dir` into `base_dir`, or why it cannot stream (a sentence)."""
    config = peft.PeftConfig.from_pretrained(str(adapter_dir))
    if not isinstance(config, peft.LoraConfig) or config.use_dora:
        return "the adapter is not a plain LoRA"
    skeleton = meta_skeleton(base_dir)  # a fresh one: PEFT wraps it
    on_disk, tied = _disk_names(base_dir, skeleton)
    with exact_targets():
        wrapped = peft.inject_adapter_in_model(config, skeleton, low_cpu_mem_usage=True)
    deltas: dict[str, Delta] = {}
    untied: dict[str, tuple[str, Delta]] = {}
    for name, module in wrapped.named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        target, delta = _delta_of(name, module)
        if target not in on_disk:
            return f"{target} is stored under no plain renaming of its name in {base_dir}"
        if target in tied:
            untied[target] = (on_disk[target], delta)
        else:
            deltas[on_disk[target]] = delta
    return Plan(deltas, untied, _shards(base_dir))


def write_merged(plan: Plan, adapter_dir: Path, base_dir: Path, out: Path) -> None:
    """Each shard of `base_dir` with its deltas added (in float32, then the shard's dtype) into `out`, and every
    other file of the base (index, config, tokenizer) copied; an untied tensor goes in its shared one's shard."""
    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    out.mkdir(parents=True)
    placed: dict[str, str] = {}
    for shard in plan.shards:
        tensors = load_file(str(base_dir / shard))
        for name in tensors.keys() & plan.deltas.keys():
            tensors[name] = _plus(tensors[name], plan.deltas[name], adapter)
        for own, (shared, delta) in plan.untied.items():
            if shared in tensors:
                tensors[own] = _plus(tensors[shared], delta, adapter)
                placed[own] = shard
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
        del tensors
    for path in base_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)
    if placed:
        _untie(out, placed)


def _plus(tensor: torch.Tensor, delta: Delta, adapter: dict[str, torch.Tensor]) -> torch.Tensor:
    return (tensor.float() + delta.update(adapter).reshape(tensor.shape)).to(tensor.dtype)


def _untie(out: Path, placed: dict[str, str]) -> None:
    """The merged model's config with its embeddings untied, and its index naming the untied tensors' shards."""
    config = json.loads((out / "config.json").read_text())
    for section in (config, config.get("text_config")):
        if isinstance(section, dict) and section.get("tie_word_embeddings", True):
            section["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    index = out / INDEX
    if index.is_file():
        mapping = json.loads(index.read_text())
        mapping["weight_map"].update(placed)
        index.write_text(json.dumps(mapping, indent=2) + "\n")


def _delta_of(name: str, module: LoraLayer) -> tuple[str, Delta]:
    """(the model's tensor this LoRA layer updates, its delta), from PEFT's wrapped module `name`."""
    key = f"{PEFT_PREFIX}{name}"
    a, b, scale = f"{key}.lora_A.weight", f"{key}.lora_B.weight", float(module.scaling["default"])
    if isinstance(module, ParamWrapper):
        owner = name
        while owner.endswith(".base_layer"):
            owner = owner.removesuffix(".base_layer")
        return f"{owner}.{module.parameter_name}", Delta(a, b, scale, int(module.num_experts),
                                                          bool(module._did_swap_in_out_features))
    if not isinstance(module, LoraLinear) or module.fan_in_fan_out:
        raise ValueError(f"{name}: a {type(module).__name__} LoRA layer; tx merges linears and expert tensors")
    return f"{name}.weight", Delta(a, b, scale, 0, False)


def _disk_names(base_dir: Path, skeleton: torch.nn.Module) -> tuple[dict[str, str], set[str]]:
    """(the model's tensor names -> their names in the base's files, where a plain renaming of transformers'
    checkpoint conversion gives them (a tensor a converter fuses or reshapes is left out); the model's names of
    tied tensors)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [r for r in get_model_conversion_mapping(skeleton) if isinstance(r, WeightRenaming)]
    model_names = dict(skeleton.state_dict(keep_vars=True))
    found: dict[str, str] = {}
    for shard in _shards(base_dir):
        with safe_open(str(base_dir / shard), "pt") as handle:
            for disk in handle.keys():
                renamed, _ = rename_source_key(disk, renamings, [], skeleton.base_model_prefix, model_names)
                if renamed in model_names:
                    found[renamed] = disk
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model_names.items():
        by_tensor.setdefault(id(tensor), []).append(name)
    tied = {name for names in by_tensor.values() if len(names) > 1 for name in names}
    for names in by_tensor.values():  # a tied tensor is on disk once, under one of its names
        stored = next((found[name] for name in names if name in found), None)
        found.update({name: stored for name in names if stored is not None and name not in found})
    return found, tied


def _shards(base_dir: Path) -> tuple[str, ...]:
    index = base_dir / INDEX
    if index.is_file():
        return tuple(sorted(set(json.loads(index.read_text())["weight_map"].values())))
    return tuple(sorted(p.name for p in base_dir.glob("*.safetensors")))
