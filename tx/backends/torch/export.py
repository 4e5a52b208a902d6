"""`tx checkpoints export --merge`: a checkpoint's adapter merged into its base model.

The result is a plain Hugging Face model directory (config, safetensors weights, tokenizer) that
transformers and vLLM load with no adapter support. Either checkpoint kind works: a PEFT adapter
directory (sampler_weights/, or unencrypted external_weights/) or a training state (weights/).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import peft
import torch
from transformers import PretrainedConfig, PreTrainedModel

from tx.backends.torch import checkpoint
from tx.backends.torch.lora import peft_config_for
from tx.backends.torch.merge import Plan, plan_merge, write_merged
from tx.backends.torch.model import load_causal_lm
from tx.models.lora_targets import exact_targets, structure_of
from tx.types import UserError

logger = logging.getLogger(__name__)
ADAPTER_CONFIG = "adapter_config.json"


def checkpoint_base_model(directory: Path) -> str:
    """The name of the base model a checkpoint directory was trained on."""
    if (directory / ADAPTER_CONFIG).is_file():
        return str(json.loads((directory / ADAPTER_CONFIG).read_text())["base_model_name_or_path"])
    if any(directory.glob("*.age")):
        raise UserError(f"{directory} is age-encrypted; decrypt its files (age -d) first")
    return checkpoint.read_state_config(directory)[0]


def merge_into_base(directory: Path, base_dir: Path, out: Path) -> Path:
    """Write base + adapter of `directory`, merged, as an HF model directory `out` (must not exist)."""
    if out.exists():
        raise UserError(f"{out} already exists; choose a new output directory")
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        adapter = _as_peft_adapter(directory, base_dir, Path(scratch))
        plan = plan_merge(adapter, base_dir)
        if isinstance(plan, Plan):
            write_merged(plan, adapter, base_dir, tmp)
            logger.info("merged %s into %s shard by shard (%d shards): %s", directory, base_dir, len(plan.shards), out)
        else:
            logger.info("merging %s into %s in memory (the whole model loaded): %s", directory, base_dir, plan)
            merge_in_memory(adapter, base_dir, tmp)
    tmp.rename(out)
    return out


def merge_in_memory(adapter: Path, base_dir: Path, out: Path) -> None:
    """PEFT's `merge_and_unload` on the whole base model, saved to `out`: for bases `plan_merge` cannot stream."""
    model = load_causal_lm(base_dir, torch.device("cpu"))
    _untie_head(model)
    with exact_targets():
        merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)
    _copy_tokenizer(base_dir, out)


def _untie_head(model: PreTrainedModel) -> None:
    """Give a head tied to the input embeddings a weight of its own (and say so in the config), so that merging
    its LoRA leaves the embeddings as the trainer has them (merged in place, the shared weight moved both)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embeddings is None or head.weight is not embeddings.weight:
        return
    shared = embeddings.weight
    assert isinstance(shared, torch.Tensor), "a tied head shares a tensor"
    head.weight = torch.nn.Parameter(shared.detach().clone(), requires_grad=False)
    config: PretrainedConfig = model.config
    for section in {id(c): c for c in (config, config.get_text_config())}.values():
        section.tie_word_embeddings = False


def _as_peft_adapter(directory: Path, base_dir: Path, scratch: Path) -> Path:
    if (directory / ADAPTER_CONFIG).is_file():
        return directory
    base_model, lora = checkpoint.read_state_config(directory)
    weights = checkpoint.read_weights(directory, torch.device("cpu"))
    config = peft_config_for(lora, structure_of(base_dir), held=weights)
    checkpoint.write_sampler_weights(scratch, base_model, config, weights)
    return scratch


def _copy_tokenizer(base_dir: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(out))
    for extra in ("generation_config.json", "chat_template.jinja", "preprocessor_config.json"):
        if (base_dir / extra).is_file() and not (out / extra).exists():
            shutil.copy2(base_dir / extra, out / extra)
