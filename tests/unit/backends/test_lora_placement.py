"""docs/model-families.md's LoRA table holds: for each family, the LoRA parameters a run gets, read back from
the model, are exactly the table's, group by group; nothing lands outside the decoder layers and the head (a
vision tower stays frozen); a structure tx cannot read is a clear error at create_model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from families import LINEUP

from tx.backends.torch.backend import TorchBackend
from tx.backends.torch.lora import peft_config_for
from tx.models.lora_targets import read_structure, structure_of
from tx.types import LoraConfig, UserError

DOC = Path(__file__).resolve().parents[3] / "docs" / "model-families.md"
GROUPS = {"attn": 2, "mlp": 3, "experts": 4, "unembed": 5}  # table column of each group


def table() -> dict[str, list[str]]:
    """{preset: cells} of the LoRA table."""
    text = DOC.read_text()
    rows = {}
    for line in text[text.index("<!-- lora-table"):].splitlines()[3:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def names(cell: str) -> set[str]:
    return {name.strip() for name in cell.split(",") if name.strip()}


def placed(backend: TorchBackend, model_id: str) -> tuple[set[str], set[str]]:
    """(module names relative to a decoder layer, or the head's; expert tensors) holding the run's LoRA."""
    run = backend._runs[model_id]  # its own PEFT config says which expert tensor each wrapper holds
    config = backend._hosts[run.base_model].peft_config(run.adapter)
    modules, wrappers = set(), set()
    for key, _ in backend.iter_trainable_weights(model_id):
        path = key.removeprefix("base_model.model.").split(".lora_")[0]
        match = re.fullmatch(r"(?:model\.|model\.language_model\.)layers\.\d+\.(.+)", path)
        if match is None:
            assert path == "lm_head", f"LoRA outside the decoder layers and the head: {key}"
            modules.add(path)
        elif re.fullmatch(r".*experts(\.base_layer)*", match.group(1)):
            wrappers.add(match.group(1))  # PEFT nests one wrapper per expert tensor
        else:
            modules.add(match.group(1))
    experts = set(config.target_parameters or ())
    assert len(wrappers) == len(experts), f"{sorted(wrappers)} hold LoRA for expert tensors {sorted(experts)}"
    return modules, experts


@pytest.fixture(scope="module")
def backend(family_model_dirs, tmp_path_factory) -> TorchBackend:
    from tx.models import write_tiny_model

    vlm = write_tiny_model(tmp_path_factory.mktemp("vlm"), preset="vlm")
    return TorchBackend({**family_model_dirs, "vlm": vlm}, device="cpu")


def test_the_table_covers_every_family(family_model_dirs) -> None:
    assert set(family_model_dirs) <= set(table())


@pytest.mark.parametrize("preset", list(table()))
def test_lora_lands_where_the_table_says(backend, preset: str) -> None:
    cells = table()[preset]
    every = {"attn": True, "mlp": True, "unembed": True}
    cases = [every, {"attn": True, "mlp": False, "unembed": False}, {"attn": False, "mlp": True, "unembed": False},
             {"attn": False, "mlp": False, "unembed": True}]
    for i, groups in enumerate(cases):
        model_id = f"{preset}-{i}"
        lora = LoraConfig(rank=2, seed=0, train_attn=groups["attn"], train_mlp=groups["mlp"],
                          train_unembed=groups["unembed"])
        backend.create_model(model_id, preset, lora)
        try:
            modules, experts = placed(backend, model_id)
        finally:
            backend.delete_model(model_id)
        want_modules = (names(cells[GROUPS["attn"]]) if groups["attn"] else set()) | (
            names(cells[GROUPS["mlp"]]) if groups["mlp"] else set()) | (
            names(cells[GROUPS["unembed"]]) if groups["unembed"] else set())
        want_experts = names(cells[GROUPS["experts"]]) if groups["mlp"] else set()
        assert (modules, experts) == (want_modules, want_experts), (preset, groups)


@pytest.mark.parametrize("preset", LINEUP)
def test_a_config_written_from_the_model_files_is_the_trainers(backend, preset: str) -> None:
    """Trainer workers and `tx checkpoints export` write an adapter's config from the model's files
    (`structure_of`, which does not run the model, so no probe): it names what the trainer's adapter holds."""
    backend.create_model("files", preset, LoraConfig(rank=2, seed=0))
    try:
        run = backend._runs["files"]
        want = backend._hosts[preset].peft_config(run.adapter)
        held = [key for key, _ in backend.iter_trainable_weights("files")]
        written = peft_config_for(run.lora, structure_of(backend._paths[preset]), held=held)
    finally:
        backend.delete_model("files")
    for field in ("target_modules", "target_parameters", "exclude_modules"):
        assert set(getattr(written, field) or ()) == set(getattr(want, field) or ()), field


def test_the_vision_tower_stays_frozen(backend) -> None:
    backend.create_model("vl", "qwen3_5_vl", LoraConfig(rank=2, seed=0))
    try:
        keys = [key for key, _ in backend.iter_trainable_weights("vl")]
    finally:
        backend.delete_model("vl")
    assert keys and not [key for key in keys if "visual" in key]


def test_an_unreadable_structure_is_a_user_error_at_create_model() -> None:
    class Mixer(torch.nn.Module):  # a layer part named like neither attention nor an MLP, holding weights
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=4))
    model.model.layers[0].add_module("token_shift", Mixer())
    with pytest.raises(UserError, match=r"model\.layers\.0\.token_shift .*docs/model-families\.md"):
        read_structure(model)


def test_a_part_holding_routed_experts_is_an_mlp_whatever_its_name() -> None:
    """Nemotron-3 calls every layer's body `mixer`: its MoE mixer (fused experts, a router) is an MLP, its Mamba
    mixer attention-kind (was: a 400 at create_model, the MoE mixer read as attention)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(vocab_size=16, hidden_size=8, layers_block_type=["linear_attention", "moe"],
                             mamba_num_heads=2, mamba_head_dim=4, ssm_state_size=4, n_groups=1,
                             n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=4,
                             moe_shared_expert_intermediate_size=4)
    with torch.device("meta"):
        model = NemotronHForCausalLM(config)
    mamba, moe = read_structure(model).layers
    assert (mamba.attention, mamba.mlp, mamba.experts) == (("mixer.in_proj", "mixer.out_proj"), (), ())
    assert moe.attention == ()
    assert moe.mlp == ("mixer.shared_experts.up_proj", "mixer.shared_experts.down_proj")
    assert moe.experts == ("mixer.experts.up_proj", "mixer.experts.down_proj")
