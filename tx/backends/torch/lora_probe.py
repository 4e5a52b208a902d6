"""Which of a base model's LoRA candidates can train, settled once on the loaded model by one probe pass.

`tx/models/lora_targets.py` names the candidates from the model's parts (docs/model-families.md#where-lora-lands).
A name cannot tell whether LoRA there would be right or would learn anything, so when a base model first takes
an adapter, one forward and backward over a few random tokens checks every candidate linear, and the structure
keeps only what passes:

- a linear whose class has its own forward gets LoRA only where the probe proves that forward a plain matmul
  (its output equals `F.linear(input, weight, bias)`): PEFT adds a plain linear's update to the output, which
  is wrong for, e.g., a grouped projection that applies its weight block by block;
- a linear whose output reaches the loss through no gradient (code under `torch.no_grad`, an output used only
  as indices, a module the forward never calls) gets none: its LoRA would never move;
- a part named like attention that works token by token (changing one position of its inputs changes no other
  position's output) is an MLP.

Each module left out, and each part read as an MLP, is logged with the reason. Routed expert tensors are not
probed. The probe runs before any adapter wraps a module and before any sharding (`AdapterHost.structure`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from tx.backends.torch.model import checkpointing_off
from tx.models.lora_targets import LayerParts, ModelStructure

logger = logging.getLogger(__name__)

PROBE_TOKENS = 256
"""Tokens of the probe's one row: longer than every compression window of the families tx serves (DeepSeek-V4
compresses up to 128 tokens into one entry), so each branch runs."""
PROBE_SEED = 0
PLAIN_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
"""Most two outputs the probe compares may differ and count as one (a linear's and F.linear's; a part's at
the unchanged positions), relative to the largest value (16-bit: 1e-2)."""


@dataclass
class Findings:
    """What the probe saw: modules (full names) left out, with why, and parts that work token by token."""

    frozen: dict[str, str] = field(default_factory=dict)
    token_wise: set[str] = field(default_factory=set)


def probe_structure(model: PreTrainedModel, structure: ModelStructure, name: str) -> ModelStructure:
    """`structure` with what the probe on `model` (unwrapped, frozen) left out frozen and its token-wise
    attention-named parts read as MLPs."""
    findings = probe(model, structure)
    for module, reason in sorted(findings.frozen.items()):
        logger.info("%s: no LoRA on %s (%s)", name, module, reason)
    for part in sorted(findings.token_wise):
        logger.info("%s: %s works token by token: LoRA there is train_mlp's", name, part)
    return settle(structure, findings)


def probe(model: PreTrainedModel, structure: ModelStructure) -> Findings:
    """Run the probe pass on `model` (see the module docstring)."""
    findings = Findings()
    linears = _candidates(model, structure)
    parts = _attention_parts(model, structure)
    zeros: dict[str, torch.Tensor] = {}
    calls: dict[str, tuple[tuple, dict]] = {}
    recompute = checkpointing_off(model) if model.is_gradient_checkpointing else nullcontext()
    with recompute, torch.enable_grad(), _hooked(linears, _linear_hook(zeros, findings)), \
            _hooked(parts, _call_recorder(calls), pre=True):
        logits = model(input_ids=_probe_ids(model), use_cache=False).logits
    weights = torch.randn(logits.shape[-1], generator=_generator()).to(logits.device)
    loss = (logits.float() * weights).sum()
    reached = torch.autograd.grad(loss, list(zeros.values()), allow_unused=True) if zeros else ()
    grads = dict(zip(zeros, reached, strict=True))
    for module_name in linears:
        if module_name not in zeros:
            findings.frozen.setdefault(module_name, "the forward never calls it")
        elif grads[module_name] is None:
            findings.frozen.setdefault(module_name, "its output gets no gradient")
    findings.token_wise = {part for part, (args, kwargs) in calls.items() if _token_wise(parts[part], args, kwargs)}
    return findings


def settle(structure: ModelStructure, findings: Findings) -> ModelStructure:
    """`structure` with `findings` applied, layer by layer."""
    layers = tuple(_settle_layer(structure, i, part, findings) for i, part in enumerate(structure.layers))
    return replace(structure, layers=layers)


def _settle_layer(structure: ModelStructure, index: int, part: LayerParts, findings: Findings) -> LayerParts:
    def full(name: str) -> str:
        return structure.full_name(index, name)

    moved = [name for name in part.attention if full(_part_of(name)) in findings.token_wise]
    attention = [name for name in part.attention if name not in moved]
    mlp = [*part.mlp, *moved]
    frozen = [name for name in attention + mlp if full(name) in findings.frozen]
    return LayerParts(
        attention=tuple(name for name in attention if name not in frozen),
        mlp=tuple(name for name in mlp if name not in frozen),
        experts=part.experts,
        frozen=part.frozen + tuple(frozen),
    )


def _part_of(name: str) -> str:
    """The layer part a module belongs to, both relative to the layer: `mixer.up_proj` -> `mixer`."""
    return name.split(".", 1)[0]


def _candidates(model: PreTrainedModel, structure: ModelStructure) -> dict[str, torch.nn.Module]:
    """The layers' attention and MLP linears, by full name."""
    modules = dict(model.named_modules())
    names = [structure.full_name(i, name) for i, part in enumerate(structure.layers)
             for name in part.attention + part.mlp]
    return {name: modules[name] for name in names}


def _attention_parts(model: PreTrainedModel, structure: ModelStructure) -> dict[str, torch.nn.Module]:
    """The layer parts whose linears are attention-kind, by full name."""
    modules = dict(model.named_modules())
    owners = {structure.full_name(i, _part_of(name)) for i, part in enumerate(structure.layers)
              for name in part.attention}
    return {owner: modules[owner] for owner in sorted(owners)}


@contextmanager
def _hooked(modules: dict[str, torch.nn.Module], make: Callable[[str], Callable], pre: bool = False) -> Iterator[None]:
    """Each module of `modules` hooked (forward, or forward-pre with kwargs) by `make(name)` for the block."""
    handles = [module.register_forward_pre_hook(make(name), with_kwargs=True) if pre
               else module.register_forward_hook(make(name)) for name, module in modules.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _linear_hook(zeros: dict[str, torch.Tensor], findings: Findings) -> Callable[[str], Callable]:
    """Hooks that check a linear's output against F.linear's and add a zero that requires grad to it, so the
    backward says whether the output reaches the loss (no gradient reaches the zero of one that does not)."""
    def make(name: str) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, output: object) -> object:
            if not isinstance(output, torch.Tensor):
                findings.frozen.setdefault(name, f"{type(module).__name__} returns no tensor")
                return output
            if not _plain(module, args, output):
                findings.frozen.setdefault(name, f"{type(module).__name__}: its forward is not a plain matmul")
            zero = zeros.setdefault(name, torch.zeros((), device=output.device, requires_grad=True))
            return output + zero.to(output.dtype)
        return hook
    return make


def _plain(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> bool:
    """Whether `module`'s output is `F.linear` of its input (always, for nn.Linear's own forward)."""
    if not isinstance(module, torch.nn.Linear) or not args or not isinstance(args[0], torch.Tensor):
        return False
    if type(module).forward is torch.nn.Linear.forward:
        return True
    with torch.no_grad():
        try:
            want = F.linear(args[0], module.weight, module.bias)
        except RuntimeError:  # the input is not shaped for a plain linear of this weight
            return False
    return want.shape == output.shape and _close(output.detach(), want)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether `got` is `want` up to rounding: within PLAIN_TOLERANCE of `want`'s largest value."""
    scale = float(want.abs().max()) or 1.0
    return float((got - want).abs().max()) <= PLAIN_TOLERANCE.get(want.dtype, 1e-2) * scale


def _call_recorder(calls: dict[str, tuple[tuple, dict]]) -> Callable[[str], Callable]:
    """Pre-hooks that keep each part's first call (its arguments), to call it again after the pass."""
    def make(name: str) -> Callable:
        def hook(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            calls.setdefault(name, (args, kwargs))
        return hook
    return make


def _token_wise(part: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether `part`, called again with its first position changed in every input that runs along the sequence,
    gives the same output at every other position (no sequence mixing); False when its hidden states cannot be
    found or changed.

    Every input: a part may take its keys and values from inputs of their own (Inkling 2's full attention) or
    from another layer's, handed over in a container (Mistral Large 4's layers that reuse an earlier layer's
    latent KV); changing its hidden states alone would change only its queries, and attention would look token
    by token. So each floating-point tensor in its arguments, containers included, with a dimension as long as
    the sequence (the first such after the batch's) gets its first position changed."""
    hidden = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("hidden_states")
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[1] < 2:
        return False
    generator, length = _generator(), hidden.shape[1]
    with torch.no_grad():
        before = _first_tensor(part(*args, **kwargs))
        changed_args = tuple(_first_position_changed(arg, length, generator) for arg in args)
        changed_kwargs = {key: _first_position_changed(value, length, generator) for key, value in kwargs.items()}
        after = _first_tensor(part(*changed_args, **changed_kwargs))
    return _close(after[:, 1:], before[:, 1:])


def _first_position_changed(value: object, length: int, generator: torch.Generator) -> object:
    """`value` with the first position of each sequence-long floating-point tensor in it (`_token_wise`) random,
    as a copy (tuples, lists and mappings copied too); anything else as it is."""
    if isinstance(value, torch.Tensor):
        axes = [axis for axis in range(1, value.dim()) if value.shape[axis] == length]
        if not value.is_floating_point() or not axes:
            return value
        changed = value.detach().clone()
        first = changed.select(axes[0], 0)
        first.copy_(torch.randn(first.shape, generator=generator, dtype=torch.float32).to(first))
        return changed
    if isinstance(value, tuple | list):
        return type(value)(_first_position_changed(item, length, generator) for item in value)
    if isinstance(value, MutableMapping):
        copied = copy.copy(value)
        for key in list(copied):
            copied[key] = _first_position_changed(copied[key], length, generator)
        return copied
    return value


def _first_tensor(output: object) -> torch.Tensor:
    """A part's output, or the first tensor of the tuple it returns (attention's output and weights)."""
    if isinstance(output, torch.Tensor):
        return output
    assert isinstance(output, tuple | list), f"a layer part returned {type(output).__name__}"
    return next(t for t in output if isinstance(t, torch.Tensor))


def _probe_ids(model: PreTrainedModel) -> torch.Tensor:
    """(1, PROBE_TOKENS) random token ids, none of them one of the config's special ids (an image or audio
    placeholder would ask for inputs the probe does not give)."""
    config = model.config.get_text_config()
    length = min(PROBE_TOKENS, int(getattr(config, "max_position_embeddings", PROBE_TOKENS)))
    vocab, special = int(config.vocab_size), _special_ids(model)
    ids = torch.randint(0, vocab, (1, length), generator=_generator())
    ordinary = next(i for i in range(vocab) if i not in special)
    for token in special:
        ids[ids == token] = ordinary
    return ids.to(model.device)


def _special_ids(model: PreTrainedModel) -> set[int]:
    """Every `*_token_id` / `*_token_index` of the model's configs."""
    configs = [model.config, model.config.get_text_config()]
    return {value for config in configs for key, value in vars(config).items()
            if key.endswith(("_token_id", "_token_index")) and isinstance(value, int)}


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(PROBE_SEED)
