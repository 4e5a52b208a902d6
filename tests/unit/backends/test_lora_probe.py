"""The load-time probe of LoRA candidates (`tx/backends/torch/lora_probe.py`), on tiny models with one part
changed: a linear whose forward is not a plain matmul is left out (DeepSeek-V4's grouped output projection:
LoRA there made forward_backward a 500) while one whose own forward is plain keeps LoRA; a linear whose output
gets no gradient is left out (GLM-5's indexer, under torch.no_grad: its LoRA stayed 0); a part named like
attention that works token by token is an MLP (Nemotron-H's dense MLP mixer), while attention taking its keys
from other inputs than its hidden states is attention (Inkling 2, Mistral Large 4); and a config written from
the model's files names exactly the modules the trainer's adapter holds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tx.backends.torch.lora import peft_config_for
from tx.backends.torch.lora_probe import probe_structure
from tx.models.lora_targets import read_structure
from tx.types import LoraConfig


class Grouped(torch.nn.Linear):
    """Applies its weight block by block (2 groups), as DeepSeek-V4's grouped output projection."""

    def __init__(self, features: int) -> None:
        super().__init__(features // 2, features // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.unflatten(-1, (2, -1)), self.weight).flatten(-2)


class Logged(torch.nn.Linear):
    """Has its own forward, which is a plain linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class NoGradMlp(torch.nn.Module):
    """An MLP whose up projection runs under torch.no_grad (as GLM-5's indexer does)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(hidden, 16), torch.nn.Linear(hidden, 16)
        self.down_proj = torch.nn.Linear(16, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scale = self.up_proj(x).sigmoid()
        return self.down_proj(F.silu(self.gate_proj(x)) * scale)


def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=4)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


def probed(model: torch.nn.Module):
    return probe_structure(model, read_structure(model), "test")


def test_a_linear_whose_forward_is_not_a_plain_matmul_gets_no_lora() -> None:
    model = llama()
    attention = model.model.layers[0].self_attn
    attention.o_proj = Grouped(8)
    attention.q_proj = Logged(8, 8, bias=False)
    first, second = probed(model).layers
    assert "self_attn.o_proj" in first.frozen and "self_attn.o_proj" not in first.attention
    assert "self_attn.q_proj" in first.attention and "self_attn.o_proj" in second.attention
    targets = probed(model).targets(attn=True, mlp=False, unembed=False)
    assert "self_attn.o_proj" in targets.target_modules  # layer 1's, a plain one
    assert targets.exclude_modules == ("model.layers.0.self_attn.o_proj",)


def test_a_linear_whose_output_gets_no_gradient_gets_no_lora() -> None:
    model = llama()
    for layer in model.model.layers:
        layer.mlp = NoGradMlp(8)
    for part in probed(model).layers:
        assert part.mlp == ("mlp.gate_proj", "mlp.down_proj") and "mlp.up_proj" in part.frozen


def test_an_attention_named_part_that_works_token_by_token_is_an_mlp() -> None:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(0)
    config = NemotronHConfig(vocab_size=32, hidden_size=8, layers_block_type=["mlp", "full_attention"],
                             num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=16)
    model = NemotronHForCausalLM(config).eval().requires_grad_(False)
    assert read_structure(model).layers[0].attention == ("mixer.up_proj", "mixer.down_proj")  # by its name
    dense, attention = probed(model).layers
    assert (dense.attention, dense.mlp) == ((), ("mixer.up_proj", "mixer.down_proj"))
    assert attention.attention == ("mixer.q_proj", "mixer.k_proj", "mixer.v_proj", "mixer.o_proj")


class KeysApart(torch.nn.Module):
    """Causal attention whose queries come from its hidden states and its keys from another input: a tensor of
    their own (Inkling 2's full attention) or an earlier layer's, in a container (Mistral Large 4's KV sharing)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(hidden, hidden)

    def forward(self, hidden_states: torch.Tensor, key_states=None, shared=None, mask=None) -> torch.Tensor:
        keys = key_states if shared is None else shared["kv"][0][:, 0]
        scores = self.q_proj(hidden_states) @ keys.transpose(1, 2)
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ keys


def test_attention_taking_its_keys_from_other_inputs_mixes_positions() -> None:
    from collections import UserDict

    from tx.backends.torch.lora_probe import _token_wise

    torch.manual_seed(0)
    part, hidden, keys = KeysApart(8), torch.randn(1, 6, 8), torch.randn(1, 6, 8)
    mask = torch.zeros(1, 1, 6, 6)
    assert not _token_wise(part, (hidden,), {"key_states": keys, "mask": mask})
    assert not _token_wise(part, (hidden,), {"shared": UserDict({"kv": (keys[:, None],)}), "mask": mask})
    assert _token_wise(TokenWise(8), (hidden,), {"mask": mask})  # a mask changed in its first row changes nothing


class TokenWise(torch.nn.Module):
    """An MLP that is handed the attention mask too (and ignores it)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up_proj, self.down_proj = torch.nn.Linear(hidden, 16), torch.nn.Linear(16, hidden)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(hidden_states)))


@pytest.mark.parametrize("groups", [{"train_mlp": False}, {"train_attn": False}, {}])
def test_a_config_from_the_files_names_what_the_adapter_holds(groups: dict[str, bool]) -> None:
    """`structure_of` reads the model without running it (no probe): a config it writes for an adapter
    (trainer workers, `tx checkpoints export`) names the modules the adapter's tensors hold."""
    from peft import get_peft_model

    model = llama()
    model.model.layers[0].self_attn.o_proj = Grouped(8)
    lora = LoraConfig(rank=2, seed=0, **groups)
    want = peft_config_for(lora, probed(model))
    trained = get_peft_model(model, want)
    names = [name for name, param in trained.named_parameters() if param.requires_grad]
    unprobed = read_structure(llama())  # the same model as its files say: o_proj plain everywhere
    written = peft_config_for(lora, unprobed, held=[name.replace(".default", "") for name in names])
    assert (written.target_modules, written.exclude_modules) == (want.target_modules, want.exclude_modules)


def test_a_mamba_mixers_out_proj_takes_lora() -> None:
    """PEFT refuses LoRA on a Mamba mixer's `out_proj` by name (for kernels that bypass the module); the probe
    shows tx's forward calls it, so it takes LoRA (was: a ValueError at create_model)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from tx.backends.torch.lora import AdapterHost

    torch.manual_seed(0)
    config = NemotronHConfig(vocab_size=32, hidden_size=8, layers_block_type=["linear_attention"], mamba_num_heads=2,
                             mamba_head_dim=4, ssm_state_size=4, n_groups=1, chunk_size=4)
    host = AdapterHost(NemotronHForCausalLM(config).eval().requires_grad_(False))
    params = host.add("run", LoraConfig(rank=2, seed=0, train_mlp=False, train_unembed=False))
    assert {name.split(".lora_")[0] for name in params} == {
        "base_model.model.model.layers.0.mixer.in_proj", "base_model.model.model.layers.0.mixer.out_proj"}
