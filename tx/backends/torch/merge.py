"""A PEFT adapter merged into its base model's safetensors shard by shard (`tx checkpoints export --merge`).

Each shard is read and written in blocks (a linear's rows, an expert, 64 MiB of an untouched tensor), so a model
larger than RAM merges on a machine that could serve it. Where each LoRA lands comes from PEFT itself, run on the base model's skeleton on the meta device (no
weights): a LoRA linear adds `B @ A * scale` to its weight, a fused expert tensor (`target_parameters`) PEFT's
`ParamWrapper` delta (one `B_e @ A_e` per expert, in the tensor's own layout). The files keep the base's names
(transformers 5 may store a tensor under another name than its module's: `backbone.` for `model.`); a tensor the
adapter touches must be found under a plain renaming of transformers' checkpoint conversion. Where it is not (per-
expert tensors on disk that the model fuses), `plan_merge` says why, and the caller merges in memory. A trained head
tied to the embeddings is written as a head of its own, and the config unties them.
"""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

import peft
import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraLayer, ParamWrapper
from safetensors.torch import load_file
from transformers import PreTrainedModel

from tx.backends.torch.peft_compat import skeleton as meta_skeleton
from tx.models.lora_targets import exact_targets

PEFT_PREFIX = "base_model.model."
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Delta:
    """One base tensor's LoRA: a linear's update is `B @ A * scale`, a fused expert tensor's `B_e @ A_e * scale`
    for each expert e (PEFT's `ParamWrapper`: A is (rank x experts, in), B (out, rank x experts))."""

    a: str
    b: str
    scale: float
    experts: int
    """0 for a linear's 2-D weight; the number of experts of a fused 3-D tensor."""
    swapped: bool
    """For a fused tensor: stored (experts, out, in) rather than (experts, in, out)."""

    def expert_update(self, weights: dict[str, torch.Tensor], expert: int) -> torch.Tensor:
        """Expert `expert`'s slice of a fused tensor's update, in the tensor's layout (no other expert's)."""
        a, b = weights[self.a].float(), weights[self.b].float()
        a_e = a.reshape(self.experts, -1, a.shape[-1])[expert]  # rank x in
        b_e = b.reshape(b.shape[0], -1, self.experts)[:, :, expert]  # out x rank
        update = (b_e @ a_e) * self.scale
        return update if self.swapped else update.T


@dataclass(frozen=True)
class Piece:
    """Where a tensor of the base's files sits in the model's tensor: whole, or (a converter's per-expert files,
    stacked along experts and concatenated along dim 1 when it loads) expert `expert`'s part `part` of `parts`."""

    expert: int | None = None
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class Update:
    delta: Delta
    piece: Piece = Piece()


@dataclass(frozen=True)
class Plan:
    """What the merge writes: each touched base tensor (its name in the base's files) and its delta."""

    deltas: dict[str, Update]
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
    on_disk, tied, pieces = _disk_names(base_dir, skeleton)
    with exact_targets():
        wrapped = peft.inject_adapter_in_model(config, skeleton, low_cpu_mem_usage=True)
    deltas: dict[str, Update] = {}
    untied: dict[str, tuple[str, Delta]] = {}
    for name, module in wrapped.named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        target, delta = _delta_of(name, module)
        if target in pieces and target not in on_disk:
            deltas.update({disk: Update(delta, piece) for disk, piece in pieces[target]})
            continue
        if target not in on_disk:
            return f"{target} is stored under no plain renaming of its name in {base_dir}"
        if target in tied:
            untied[target] = (on_disk[target], delta)
        else:
            deltas[on_disk[target]] = Update(delta)
    return Plan(deltas, untied, _shards(base_dir))


def write_merged(plan: Plan, adapter_dir: Path, base_dir: Path, out: Path) -> None:
    """Each shard of `base_dir` with its deltas added (in float32, then the shard's dtype) into `out`, and every
    other file of the base (index, config, tokenizer) copied; an untied tensor goes in its shared one's shard.
    Shards are read and written in blocks (plain reads, no memory map): memory holds one block of rows, one
    expert, or `BLOCK_BYTES` of an untouched tensor at a time."""
    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    out.mkdir(parents=True)
    placed: dict[str, str] = {}
    for shard in plan.shards:
        with (base_dir / shard).open("rb") as source:
            header, start = _read_header(source)
            metadata = header.pop("__metadata__", None) or {"format": "pt"}
            extra = {own: shared for own, (shared, _) in plan.untied.items() if shared in header}
            placed |= dict.fromkeys(extra, shard)
            entries = {name: header[extra.get(name, name)] for name in [*header, *extra]}
            updates = {name: Update(plan.untied[name][1]) if name in extra else plan.deltas.get(name)
                       for name in entries}
            layout = {name: (entry["dtype"], entry["shape"]) for name, entry in entries.items()}
            blocks = functools.partial(_blocks, source, start, entries, updates, adapter)
            _write_safetensors(out / shard, layout, blocks, metadata)
    for path in base_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)
    if placed:
        _untie(out, placed)


BLOCK_BYTES = 64 * 2**20
"""An untouched tensor is copied this many bytes at a time, and a linear's update made for as many rows as fit
in it in float32 (the head's whole update at Qwen's vocabulary is 2.5 GB)."""
ITEM_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
              "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
FLOATS = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
"""The dtypes a tensor LoRA updates may have."""


def _read_header(source: BufferedReader) -> tuple[dict[str, Any], int]:
    """A safetensors file's header, and where its data starts."""
    (size,) = struct.unpack("<Q", source.read(8))
    return json.loads(source.read(size)), 8 + size


def _blocks(source: BufferedReader, start: int, entries: dict[str, dict[str, Any]], updates: dict[str, Update | None],
            adapter: dict[str, torch.Tensor], name: str) -> Iterator[bytes | memoryview]:
    """Tensor `name`'s bytes with its update added, block by block."""
    entry, update = entries[name], updates[name]
    begin, end = entry["data_offsets"]
    source.seek(start + begin)
    if update is None:
        for offset in range(begin, end, BLOCK_BYTES):
            yield source.read(min(BLOCK_BYTES, end - offset))
        return
    dtype, shape, delta, piece = FLOATS[entry["dtype"]], entry["shape"], update.delta, update.piece
    if delta.experts:  # a fused tensor one expert at a time, or one expert's file
        experts = [piece.expert] if piece.expert is not None else list(range(shape[0]))
        per = (end - begin) // len(experts)
        for expert in experts:
            block = _read(source, per, dtype)
            part = delta.expert_update(adapter, expert).chunk(piece.parts, dim=0)[piece.part]
            yield _as_bytes(block.float().add_(part.reshape(block.shape)), dtype)
        return
    a, b = adapter[delta.a].float(), adapter[delta.b].float()
    row_bytes, step = (end - begin) // b.shape[0], max(1, BLOCK_BYTES // (4 * a.shape[-1]))
    for row in range(0, b.shape[0], step):
        rows = min(step, b.shape[0] - row)
        block = _read(source, rows * row_bytes, dtype).view(rows, a.shape[-1]).float()
        yield _as_bytes(block.addmm_(b[row:row + rows], a, alpha=delta.scale), dtype)


def _read(source: BufferedReader, size: int, dtype: torch.dtype) -> torch.Tensor:
    buffer = bytearray(size)
    if source.readinto(buffer) != size:
        raise ValueError(f"{source.name} ends inside a tensor")
    return torch.frombuffer(buffer, dtype=dtype)


def _as_bytes(tensor: torch.Tensor, dtype: torch.dtype) -> memoryview:
    """The bytes of `tensor` in `dtype`, without a copy of them."""
    return tensor.to(dtype).contiguous().reshape(-1).view(torch.uint8).numpy().data


def _write_safetensors(path: Path, layout: dict[str, tuple[str, list[int]]],
                       blocks: Callable[[str], Iterator[bytes | memoryview]], metadata: dict[str, str]) -> None:
    """A safetensors file of the tensors `layout` names (dtype, shape), each written as `blocks` makes it."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, (dtype, shape) in layout.items():
        size = ITEM_BYTES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for name in layout:
            for block in blocks(name):
                file.write(block)
        if file.tell() != 8 + len(encoded) + offset:
            raise ValueError(f"{path.name}: wrote {file.tell()} bytes, not the header's {8 + len(encoded) + offset}")


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


def _disk_names(base_dir: Path, skeleton: PreTrainedModel
                ) -> tuple[dict[str, str], set[str], dict[str, list[tuple[str, Piece]]]]:
    """(the model's tensor names -> their names in the base's files, where a plain renaming of transformers'
    checkpoint conversion gives them; the model's names of tied tensors; the model's fused expert tensors -> the
    per-expert files a converter stacks (and concatenates) into them, with where each sits). A tensor another
    converter makes (interleaved, split) is in neither: the merge then runs in memory."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    conversions = get_model_conversion_mapping(skeleton)
    renamings = [r for r in conversions if isinstance(r, WeightRenaming)]
    stacked = [_stacking(c) for c in conversions]
    model_names = dict(skeleton.state_dict(keep_vars=True))
    found: dict[str, str] = {}
    pieces: dict[str, list[tuple[str, Piece]]] = {}
    for shard in _shards(base_dir):
        with (base_dir / shard).open("rb") as source:
            stored = [name for name in _read_header(source)[0] if name != "__metadata__"]
            for disk in stored:
                renamed, _ = rename_source_key(disk, renamings, [], skeleton.base_model_prefix, model_names)
                if renamed in model_names:
                    found[renamed] = disk
                    continue
                for fused, piece in (hit for stack in stacked if stack for hit in [_stacked_piece(disk, *stack)] if hit):
                    renamed, _ = rename_source_key(fused, renamings, [], skeleton.base_model_prefix, model_names)
                    if renamed in model_names:
                        pieces.setdefault(renamed, []).append((disk, piece))
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model_names.items():
        by_tensor.setdefault(id(tensor), []).append(name)
    tied = {name for names in by_tensor.values() if len(names) > 1 for name in names}
    for names in by_tensor.values():  # a tied tensor is on disk once, under one of its names
        stored = next((found[name] for name in names if name in found), None)
        found.update({name: stored for name in names if stored is not None and name not in found})
    complete = {name: got for name, got in pieces.items() if _complete(got, model_names[name].shape)}
    return found, tied, complete


def _stacking(conversion: object) -> tuple[list[re.Pattern[str]], str] | None:
    """(a source pattern per part, the target) of a converter that stacks per-expert tensors along dim 0 and
    concatenates the parts along dim 1 (transformers' MoE experts); None for any other conversion."""
    from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

    if not isinstance(conversion, WeightConverter) or len(conversion.target_patterns) != 1:
        return None
    ops = conversion.operations
    if not ops or not isinstance(ops[0], MergeModulelist) or ops[0].dim != 0:
        return None
    if ops[1:] and not (len(ops) == 2 and isinstance(ops[1], Concatenate) and ops[1].dim == 1):
        return None
    if len(conversion.source_patterns) > 1 and len(ops) != 2:
        return None
    sources = [re.compile(p.replace(".*.", r"\.(\d+)\.", 1).replace("*", r"(\d+)", 1))
               for p in conversion.source_patterns]
    return sources, conversion.target_patterns[0].replace("\\", "")


def _stacked_piece(disk: str, sources: list[re.Pattern[str]], target: str) -> tuple[str, Piece] | None:
    """(the fused tensor's name in the files' naming, where `disk` sits in it), if a source pattern matches."""
    for part, source in enumerate(sources):
        match = source.search(disk)
        if match:
            prefix = disk[:match.start()]
            joint = "" if target.startswith(".") or not prefix or prefix.endswith(".") else "."
            return f"{prefix}{joint}{target}", Piece(int(match.group(1)), part, len(sources))
    return None


def _complete(got: list[tuple[str, Piece]], shape: torch.Size) -> bool:
    """Whether the per-expert files cover every expert's every part of a fused tensor of `shape` once."""
    seen = {(piece.expert, piece.part) for _, piece in got}
    parts = {piece.parts for _, piece in got}
    return len(parts) == 1 and len(seen) == len(got) == shape[0] * parts.pop()


def _shards(base_dir: Path) -> tuple[str, ...]:
    index = base_dir / INDEX
    if index.is_file():
        return tuple(sorted(set(json.loads(index.read_text())["weight_map"].values())))
    return tuple(sorted(p.name for p in base_dir.glob("*.safetensors")))
