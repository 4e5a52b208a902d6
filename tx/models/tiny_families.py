"""Tiny random text models of the families people fine-tune, each built with transformers' own config class.

Every family keeps the shape of the Qwen3 "tiny" preset where it has one (hidden 64, 4 query heads over 2
key/value heads of size 32, vocabulary 2048, `initializer_range=0.1`: `docs/tiny-models.md`) and two decoder
layers, and adds what makes the family itself:

- qwen3_5 / qwen3_5_moe: one gated-delta-net (linear attention) layer, then one full-attention layer; the
  MoE variant has 4 routed experts (top 2) and a shared expert.
- qwen3_moe: 4 routed experts (top 2), fused into 3-D parameters.
- Routed experts are 32 wide (half the hidden size), so an expert tensor read the wrong way round shows.
- deepseek_v3: multi-head latent attention (low-rank q and kv projections), a dense first layer, then 4 routed
  experts in 2 groups plus a shared expert.
- gpt_oss: attention sinks, a sliding window of 16 on every other layer, 4 experts with biases.
- gemma3: a sliding window of 16, then a full-attention layer; GELU MLPs and four norms per layer.
- llama: Llama 3 (the same shape as Qwen3 without q/k norms).
- olmo3: OLMo 3 (norms after attention and MLP, q/k norms over all heads), a sliding window of 16 then a
  full-attention layer.
- nemotron_h: Nemotron-3 / Nemotron-H, four layers whose bodies are all called `mixer`: a Mamba2 mixer, an
  MoE (4 routed experts of width 32, top 2, and a shared expert), attention, and a dense MLP (Nemotron-H's).
- deepseek_v4: DeepSeek-V4, three layers of its three attention types (sliding window; compressed sparse
  attention, compressing 4 tokens, its indexer keeping 16 entries; heavily compressed attention, 8 tokens),
  shared-KV attention with sinks, the grouped output projection (2 groups), hyper-connections of 2 streams;
  a hash-routed MoE layer, then two top-k ones (4 experts of width 32, top 2, and a shared expert).
- glm_moe_dsa: GLM-5, multi-head latent attention with the DSA indexer (keeping 64 tokens): a layer running
  its own indexer with a dense MLP, then one reusing its choice (a "shared" indexer layer) with 4 routed
  experts (top 2) and a shared one.
- The sparse-attention indexers keep more than the tests' rows hold (as the real ones, 512 and 2048 entries,
  keep more than most datums): a top-k among near-equal scores flips with rounding, so a datum alone and in a
  batch would differ by far more than 1e-5 where the indexer drops anything.
- inkling: Inkling's multimodal model (its vision and audio towers tiny and frozen): a sliding-window layer
  with a dense MLP, then a full-attention one with 4 routed experts (top 2) and a shared expert; short
  convolutions and a relative position bias in every layer; its final hidden states are divided by 2 before
  the head (muP; the real model's 24 leaves a tiny model's logits no room to learn: docs/tiny-models.md). It
  is written without an image processor config, so tx takes text and audio for it, not images: transformers'
  Inkling image processor is torchvision-only, and torchvision cannot be imported beside CPU torch here
  (docs/model-families.md#where-lora-lands).
- inkling_o200k: the same tiny Inkling at the real model's interface (the tokenizer's 200,058 ids, its special
  ids, 80 mel bins of 256 levels), for clients that render with the real tokenizer (the cookbook's audio recipes).
- inkling2: Inkling 2 (transformers >= 5.23), multimodal, text only (no audio tower; its image processor is
  torchvision-only, as Inkling's): sliding-window, full and sliding-window layers (sinks, gates, a relative
  position bias, short convolutions, dynamic ones on the full layer's keys and values), each with 4 routed experts
  (top 2, sigmoid-scored, softcapped SwiGLU); attention residuals over blocks of 2 layers, so both layer types
  meet a block boundary; its logits softcapped at 30.
- mistral_large4: Mistral Large 4 (transformers >= 5.22), multimodal (a Pixtral tower), text only (written without
  an image processor config): four layers of multi-head latent attention with the DSA indexer: a dense-MLP layer
  running its indexer whose latent KV the last two reuse, a NoPE layer reusing the indexer's choice, a layer with
  its own indexer over the reused KV, and one reusing both; the last three with 4 routed experts (top 2) and a
  shared one. Its logits are softcapped at 30.

Windows of 16 tokens are shorter than the sequences tests send, so the window is exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tx.models.tiny import PRESETS
from tx.models.tiny_files import special_ids

if TYPE_CHECKING:
    from transformers import PretrainedConfig

WINDOW = 16
"""Sliding-window width of the families that have one."""
INDEX_HEADS = 16
"""Heads of a sparse-attention indexer (DeepSeek-V4, GLM-5, Mistral Large 4). Its scores are a weighted sum of
ReLUs over heads: with few heads a random model scores many keys exactly 0, and which of those tied keys its
top-k keeps changes with the shape of the pass (a row alone or in a batch, a prompt or a decode step), so the
model itself would not give a position the same logprob twice. With 16 heads no key ties, and a top-k of 4
drops keys from the check's prompts on: the sparse path is the one under test."""


def _common(ids: dict[str, int]) -> dict[str, Any]:
    """The fields every tiny text family shares (the "tiny" Qwen3 preset's shape)."""
    shape = PRESETS["tiny"]
    return {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "max_position_embeddings": shape.max_position_embeddings,
        "initializer_range": shape.initializer_range,
        "tie_word_embeddings": False,
        "dtype": "float32",
        **special_ids(ids),
    }


def linear_attention_fields() -> dict[str, Any]:
    """Qwen3.5's gated delta net at the tiny shape: 2 key heads, 4 value heads, head size 32, conv of 4."""
    return {
        "head_dim": PRESETS["tiny"].head_dim,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "layer_types": ["linear_attention", "full_attention"],
    }


def qwen3_5_text(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**_common(ids), **linear_attention_fields(), intermediate_size=128,
                             architectures=["Qwen3_5ForCausalLM"])


def moe_fields() -> dict[str, Any]:
    """Qwen3.5-MoE's experts at the tiny shape: 4 routed experts of width 32 (top 2), a shared one of 64."""
    return {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_experts": 4,
            "num_experts_per_tok": 2}


def qwen3_5_moe_text(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(**_common(ids), **linear_attention_fields(), **moe_fields(),
                                architectures=["Qwen3_5MoeForCausalLM"])


def qwen3_moe(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(**_common(ids), intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2, norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"])
    config.head_dim = 32  # not an argument of its config class, but read by the model (hidden 64 / 4 heads is 16)
    return config


def deepseek_v3(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **{**_common(ids), "num_key_value_heads": 4}, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=32,
        v_head_dim=32, architectures=["DeepseekV3ForCausalLM"],
    )


def gpt_oss(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import GptOssConfig

    return GptOssConfig(**_common(ids), head_dim=32, intermediate_size=32, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention"],
                        architectures=["GptOssForCausalLM"])


def gemma3(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**_common(ids), head_dim=32, intermediate_size=128, query_pre_attn_scalar=32,
                            sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                            architectures=["Gemma3ForCausalLM"])


def llama(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(**_common(ids), head_dim=32, intermediate_size=128, architectures=["LlamaForCausalLM"])


def olmo3(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Olmo3Config

    config = Olmo3Config(**_common(ids), intermediate_size=128, sliding_window=WINDOW,
                         layer_types=["sliding_attention", "full_attention"], architectures=["Olmo3ForCausalLM"])
    config.head_dim = 32  # not an argument of its config class, but read by the model (hidden 64 / 4 heads is 16)
    return config


def nemotron_h(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import NemotronHConfig

    fields: dict[str, Any] = {**{k: v for k, v in _common(ids).items() if k != "num_hidden_layers"}, "head_dim": 32}
    return NemotronHConfig(
        **fields, layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
        intermediate_size=128, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=8,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=64,
        architectures=["NemotronHForCausalLM"],
    )


def deepseek_v4(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        **{**_common(ids), "num_hidden_layers": 3, "num_key_value_heads": 1}, head_dim=32, q_lora_rank=32,
        partial_rotary_factor=0.5, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, mlp_layer_types=["hash_moe", "moe", "moe"],
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, hc_mult=2,
        sliding_window=WINDOW, o_groups=2, o_lora_rank=16, index_n_heads=INDEX_HEADS, index_head_dim=32, index_topk=4,
        architectures=["DeepseekV4ForCausalLM"],
    )


def glm_moe_dsa(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import GlmMoeDsaConfig

    return GlmMoeDsaConfig(
        **{**_common(ids), "num_key_value_heads": 4}, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, index_topk=4, index_head_dim=64,
        index_n_heads=INDEX_HEADS, indexer_types=["full", "shared"], architectures=["GlmMoeDsaForCausalLM"],
    )


def inkling(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import InklingConfig

    text = {key: value for key, value in _common(ids).items() if key not in ("dtype", "tie_word_embeddings")}
    text |= {"head_dim": 32, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 32,
             "sliding_window_size": WINDOW, "d_rel": 8, "rel_extent": 32, "intermediate_size": 128,
             "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
             "layer_types": ["hybrid_sliding", "hybrid"], "mlp_layer_types": ["dense", "sparse"],
             "logits_mup_width_multiplier": 2.0}  # the real 24 leaves a tiny model's logits no room to learn
    vision = {"patch_size": 16, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    return InklingConfig(
        text_config=text, vision_config=vision, audio_config={"n_mel_bins": 8, "mel_vocab_size": 16},
        image_token_id=ids["<|image_pad|>"], image_bos_token_id=ids["<|vision_start|>"],
        audio_token_id=text["vocab_size"] - 2, audio_bos_token_id=text["vocab_size"] - 1,  # ids no text makes
        architectures=["InklingForConditionalGeneration"],
    )


O200K_IDS = 200058
"""The ids of Inkling's tokenizer: o200k_base's and the chat specials above 200,000 that the cookbook's renderer
(tml-renderers' TMLv0) sends, the last 200,057. The real config pads its vocabulary to 201,024; a tiny random model
puts the mass a trained one keeps off the 966 padding ids on them too (~0.5% of sampled tokens), and the cookbook
decodes every sampled token (its RL loop prints each group), which fails on a padding id. So the tiny model has the
tokenizer's ids and no padding."""


def inkling_o200k(ids: dict[str, int]) -> PretrainedConfig:
    """The tiny Inkling at the real model's interface: its tokenizer's ids (`O200K_IDS`), its special ids (transformers'
    InklingConfig defaults: audio 200053 after 200020, image 200054 after 200005) and its audio shape (80 mel
    bins, 256 levels), so the cookbook's Inkling renderer can talk to it (docs/cookbook.md#audio-recipes)."""
    config = inkling(ids)
    config.text_config.vocab_size = O200K_IDS
    defaults = type(config)()
    for key in ("image_token_id", "image_bos_token_id", "audio_token_id", "audio_bos_token_id"):
        setattr(config, key, getattr(defaults, key))
    config.audio_config.n_mel_bins = defaults.audio_config.n_mel_bins
    config.audio_config.mel_vocab_size = defaults.audio_config.mel_vocab_size
    return config


NEWER: Mapping[str, tuple[str, str]] = MappingProxyType({
    "inkling2": ("Inkling2Config", "5.23"),
    "mistral_large4": ("MistralLarge4Config", "5.22"),
})
"""Families newer than the oldest transformers tx takes (5.19): preset -> (its config class, the release that
brought it)."""


def installed(preset: str) -> bool:
    """Whether the installed transformers has `preset`'s family (every family but those of `NEWER` is older)."""
    import transformers

    return preset not in NEWER or getattr(transformers, NEWER[preset][0], None) is not None


def newer_config_class(preset: str) -> Any:
    """The config class of a family of `NEWER`, or a ValueError naming the transformers release it needs where
    the installed one lacks it."""
    import transformers

    name, version = NEWER[preset]
    if not installed(preset):
        raise ValueError(f"the {preset} family needs transformers >= {version} ({name}); installed: "
                         f"transformers {transformers.__version__}")
    return getattr(transformers, name)


def inkling2(ids: dict[str, int]) -> PretrainedConfig:
    config_class = newer_config_class("inkling2")
    text = {key: value for key, value in _common(ids).items() if key not in ("dtype", "tie_word_embeddings")}
    text |= {"num_hidden_layers": 3, "unpadded_vocab_size": text["vocab_size"], "head_dim": 32,
             "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 32,
             "sliding_window_size": WINDOW, "d_rel": 8, "rel_extent": 32, "moe_intermediate_size": 32,
             "n_routed_experts": 4, "num_experts_per_tok": 2, "n_layers_per_attn_res_block": 2,
             "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"]}
    hidden = text["hidden_size"]
    vision = {"patch_size": 16, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "posemb_grid_size": 4, "projection_hidden_dim": hidden, "text_hidden_size": hidden}
    return config_class(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        architectures=["Inkling2ForConditionalGeneration"])


def mistral_large4(ids: dict[str, int]) -> PretrainedConfig:
    config_class = newer_config_class("mistral_large4")
    text = {key: value for key, value in _common(ids).items() if key != "dtype"}
    text |= {"num_hidden_layers": 4, "num_key_value_heads": 4, "intermediate_size": 128,
             "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
             "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32,
             "index_topk": 4, "index_head_dim": 64, "index_n_heads": INDEX_HEADS,
             "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
             "indexer_types": ["full", "shared", "full", "shared"],
             "no_rope_layers": [1, 0, 1, 1],  # 0: a NoPE layer
             "kv_source_layers": [0, 1, 0, 0],  # the last two attend to the first's latent KV
             # the real YaRN (a 512-token pretraining window, no magnitude scaling), its factor the tiny context's
             "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 512,
                                 "factor": text["max_position_embeddings"] / 512, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "attention_factor": 1.0}}
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
              "patch_size": 16, "image_size": 64, "hidden_act": "silu"}
    return config_class(text_config=text, vision_config={"model_type": "pixtral", **vision},
                        image_token_index=ids["<|image_pad|>"], architectures=["MistralLarge4ForConditionalGeneration"])


TEXT_FAMILIES: Mapping[str, Callable[[dict[str, int]], PretrainedConfig]] = MappingProxyType({
    "qwen3_5": qwen3_5_text,
    "qwen3_5_moe": qwen3_5_moe_text,
    "qwen3_moe": qwen3_moe,
    "deepseek_v3": deepseek_v3,
    "gpt_oss": gpt_oss,
    "gemma3": gemma3,
    "llama": llama,
    "olmo3": olmo3,
    "nemotron_h": nemotron_h,
    "deepseek_v4": deepseek_v4,
    "glm_moe_dsa": glm_moe_dsa,
    "inkling": inkling,
    "inkling_o200k": inkling_o200k,
    "inkling2": inkling2,
    "mistral_large4": mistral_large4,
})
"""Text family presets: name -> the tiny config, given the tokenizer's special-token ids."""
