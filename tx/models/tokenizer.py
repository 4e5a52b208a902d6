"""A synthetic Qwen-style tokenizer, built locally and deterministically.

There is no model hub on these machines, so the tokenizer that tx and the tinker client share is a byte-level
BPE trained with the `tokenizers` library on `corpus.training_corpus()`. Its pre-tokenizer, normalizer and
decoder follow the Qwen2/Qwen3 tokenizer (digits are split one by one), and its special tokens are Qwen's, so
the cookbook's Qwen renderers work with it (docs/cookbook.md#tokenizers-and-models-offline). Ids: regular tokens first
(0..NUM_REGULAR_TOKENS-1), then SPECIAL_TOKENS, then ADDED_TOKENS, in the order listed.

Building twice gives byte-identical files: the server and the client must agree on every id.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

from tx.models.corpus import training_corpus

logger = logging.getLogger(__name__)

NUM_REGULAR_TOKENS = 2000
"""Size of the trained BPE vocabulary (256 byte tokens plus merges), before special tokens."""

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Special tokens (skipped by `decode(skip_special_tokens=True)`), as in the Qwen family."""

ADDED_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Added, non-special tokens: each encodes to one id but stays in decoded text, as in Qwen3."""

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# The Qwen2/Qwen3 pre-tokenizer pattern: words, single digits, punctuation runs, whitespace.
_QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{{- (call.arguments if call.arguments is string else call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
"""A Qwen3-style ChatML template: system, user, assistant (with tool calls), tool results, enable_thinking."""


def _train_bpe() -> Tokenizer:
    """Train the byte-level BPE on the built-in corpus and append the special and added tokens."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=NUM_REGULAR_TOKENS,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(training_corpus(), trainer=trainer)
    if tokenizer.get_vocab_size() != NUM_REGULAR_TOKENS:
        size = tokenizer.get_vocab_size()
        raise RuntimeError(f"BPE training gave {size} tokens, wanted {NUM_REGULAR_TOKENS}")
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tokenizer


def build_tokenizer(directory: Path) -> None:
    """Write the synthetic Qwen-style tokenizer (tokenizer.json, tokenizer_config.json, ...) into `directory`.

    The files are a `PreTrainedTokenizerFast` with eos `<|im_end|>`, pad `<|endoftext|>`, no bos, and a
    ChatML chat template. Deterministic: two builds give identical files.
    """
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(),
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS),
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(directory))
    logger.info("wrote synthetic tokenizer (%d tokens) to %s", len(fast), directory)
