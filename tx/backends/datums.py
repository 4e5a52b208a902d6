"""The rules a forward_backward's datums must follow, from the model's config alone: one home for the checks
at submission and at execution.

A served model's facts (its vocabulary, its context, this server's cap on one sequence, whether it takes
images) need no weights, so `check_batch` runs when a request arrives, in the request's thread: a batch that
can never run is refused with a 400 naming the datum before it has a future or waits in the queue. The
trainer runs the same rules again at execution (`check_datum`, called by the torch and JAX backends'
`prepare_data`/`validate`) on each datum as the model sees it, images expanded.

Image chunks: how many tokens an image becomes is known only once the model's image processor has seen it,
which happens at execution. At submission an image counts the `expected_tokens` it declares and its bytes
are checked against the cap. A datum with an image that declares no count is checked with the tokens known so
far (a lower bound against the caps); its loss inputs, whose shapes follow the exact count, wait for
execution. So do the checks that need the decoded image (pixels, aspect ratio, a declared count that the
processor does not make) and the placeholder token in text beside image chunks (`VisionProcessor.expand`; text
alone may hold it).

Everything is numpy on whole arrays, no Python loop per token: 128 datums of 2,048 tokens are checked in
~10-20 ms on a busy 2-core CPU, less than decoding their protobuf takes (`scripts/bench/check_batch.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np

from tx.backends.losses import TARGET_KEY, LossFn, batch_loss
from tx.multimodal.audio import AudioLimits, AudioSpec, audio_spec, check_audio_caps
from tx.multimodal.images import ImageLimits, check_image_size
from tx.multimodal.prompt import images_refused, vision_processor
from tx.types import (
    AudioChunk,
    BaseModelInfo,
    Chunk,
    CustomLoss,
    Datum,
    ForwardBackwardInput,
    ImageChunk,
    ModelInput,
    TextChunk,
    UserError,
)


@dataclass(frozen=True)
class DatumRules:
    """What a served model accepts in one datum."""

    info: BaseModelInfo
    max_tokens: int | None = None
    """This server's cap on one sequence below the context (`--train-max-sequence-tokens`); None: the context."""
    takes_images: bool = False
    """A vision-language model: image chunks become its placeholder tokens. Otherwise they are refused."""
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    audio: AudioSpec | None = None
    """What audio the model takes (`tx.multimodal.audio`); None: dmel chunks are refused."""
    audio_limits: AudioLimits = field(default_factory=AudioLimits)
    images_refused: str | None = None
    """Why a vision-language model takes no images on this server (`tx.multimodal.images_refused`)."""

    @classmethod
    def of_model_dir(
        cls, info: BaseModelInfo, model_dir: Path, max_tokens: int | None, image_limits: ImageLimits,
        audio_limits: AudioLimits | None = None,
    ) -> DatumRules:
        """The rules of the HF model in `model_dir`: it takes images if it has an image processor, audio if its
        config and class say so (`AudioSpec.load`)."""
        return cls(info, max_tokens, vision_processor(model_dir) is not None, image_limits,
                   audio_spec(model_dir), audio_limits or AudioLimits(), images_refused(model_dir))


def check_batch(batch: ForwardBackwardInput, rules: DatumRules) -> None:
    """Refuse a batch that can never run: its loss, its loss config and every datum that is checkable before
    images are decoded (see the module's docstring); UserError names the datum."""
    loss, _ = batch_loss(batch)
    check_not_empty(batch.data)
    check_clip_caps(batch.data, rules.audio_limits)
    for index, datum in enumerate(batch.data):
        text, image_tokens, exact = _declared(datum.model_input, rules, index)
        if exact:
            check_datum(datum, text, text.size + image_tokens, loss, rules, index)
        else:  # an image of unknown size: the known tokens are a lower bound, the loss inputs wait
            check_length(text.size + image_tokens, rules, index)
            check_vocab(text, rules.info, index)
    if batch.custom_loss is not None:
        check_custom_inputs(batch.custom_loss, batch.data)


def check_not_empty(data: list[Datum]) -> None:
    if not data:
        raise UserError("forward_backward needs at least one datum")


def check_datum(
    datum: Datum, tokens: np.ndarray, num_tokens: int, loss: LossFn, rules: DatumRules, index: int
) -> dict[str, np.ndarray]:
    """Datum `index`'s length and token ids, then its loss inputs as `loss.validate_datum` returns them.

    `num_tokens` is the datum's length as the model sees it; `tokens` the ids to check against the vocabulary
    (at submission, the text tokens of a datum with declared images; at execution, all of them)."""
    check_length(num_tokens, rules, index)
    check_vocab(tokens, rules.info, index)
    arrays = loss.validate_datum(datum.loss_fn_inputs, num_tokens, index, datum.loss_fn_input_spans)
    check_targets(arrays[TARGET_KEY], rules.info, index)
    return arrays


def check_custom_inputs(loss: CustomLoss, data: list[Datum]) -> None:
    """The inputs a custom loss declares (logprobs first, then the loss_fn_inputs keys it reads, each with its
    rank) against every datum: logprobs take target_tokens' rank, and every key is there with its rank."""
    (_, logprobs_rank), *named = loss.inputs
    for index, datum in enumerate(data):
        inputs = datum.loss_fn_inputs
        if TARGET_KEY in inputs and np.ndim(inputs[TARGET_KEY]) != logprobs_rank:
            raise UserError(f"datum {index}: loss {loss.name!r} takes logprobs of rank {logprobs_rank}, "
                            f"but target_tokens has rank {np.ndim(inputs[TARGET_KEY])}")
        for name, rank in named:
            if name not in inputs:
                raise UserError(f"datum {index}: loss_fn_inputs lacks {name!r}, which loss {loss.name!r} takes")
            if np.ndim(inputs[name]) != rank:
                raise UserError(f"datum {index}: loss_fn_inputs[{name!r}] has rank {np.ndim(inputs[name])}, "
                                f"but loss {loss.name!r} declared it with rank {rank}")


def check_length(num_tokens: int, rules: DatumRules, index: int) -> None:
    """UserError unless the datum holds tokens and fits the model's context and this server's cap."""
    info = rules.info
    if num_tokens == 0:
        raise UserError(f"datum {index}: model_input is empty")
    if num_tokens > info.max_context_length:
        raise UserError(
            f"datum {index}: {num_tokens} tokens exceed the maximum context length "
            f"{info.max_context_length} of {info.name}"
        )
    if rules.max_tokens is not None and num_tokens > rules.max_tokens:
        raise UserError(
            f"datum {index}: {num_tokens} tokens exceed this server's limit of {rules.max_tokens} tokens per "
            "sequence (--train-max-sequence-tokens)"
        )


def check_vocab(tokens: np.ndarray, info: BaseModelInfo, index: int) -> None:
    bad = _outside(tokens, info.vocab_size)
    if bad is not None:
        raise UserError(
            f"datum {index}: token id {bad} is outside the vocabulary [0, {info.vocab_size}) of {info.name}"
        )


def check_targets(targets: np.ndarray, info: BaseModelInfo, index: int) -> None:
    bad = _outside(targets, info.vocab_size)
    if bad is not None:
        raise UserError(
            f"datum {index}: {TARGET_KEY!r} holds token id {bad}, outside the vocabulary [0, {info.vocab_size})"
        )


def text_tokens(model_input: ModelInput, index: int) -> np.ndarray:
    """A text-only input's token ids (int64); UserError naming the datum if it holds images or audio."""
    try:
        model_input.text_tokens()
    except UserError as exc:
        raise UserError(f"datum {index}: {exc}") from None
    return _text_ids(model_input)


def _declared(model_input: ModelInput, rules: DatumRules, index: int) -> tuple[np.ndarray, int, bool]:
    """The datum's text token ids, the image and audio tokens its chunks declare, and whether every image
    declares (a clip always does: its frames)."""
    if not rules.takes_images and rules.audio is None and rules.images_refused is None:
        return text_tokens(model_input, index), 0, True
    for number, chunk in enumerate(model_input.chunks):
        if isinstance(chunk, ImageChunk):
            _check_image_bytes(chunk, rules.image_limits, index, number)
        _check_takes(chunk, rules, index, number)
    _check_audio(model_input, rules, index)
    others = [chunk for chunk in model_input.chunks if not isinstance(chunk, TextChunk)]
    declared = sum(chunk.expected_tokens or 0 for chunk in others)
    exact = all(chunk.expected_tokens is not None for chunk in others)
    return _text_ids(model_input), declared, exact


def _check_takes(chunk: Chunk, rules: DatumRules, index: int, number: int) -> None:
    """A UserError naming datum and chunk when the model does not take the chunk's kind, or its clip."""
    try:
        if isinstance(chunk, AudioChunk):
            if rules.audio is None:
                raise UserError(f"{rules.info.name} takes no audio: the input holds a dmel chunk")
            rules.audio.check(chunk)
        elif not isinstance(chunk, TextChunk) and rules.images_refused:
            raise UserError(f"{rules.info.name} takes no images on this server: {rules.images_refused}")
        elif not isinstance(chunk, TextChunk) and not rules.takes_images:
            raise UserError(f"{rules.info.name} takes no images: the input holds an image chunk")
    except UserError as exc:
        raise UserError(f"datum {index}: chunk {number}: {exc}") from None


def check_clip_caps(data: list[Datum], limits: AudioLimits) -> None:
    """The audio caps on each datum's clips, for every datum before any clip's values are read (a datum's level
    check would read its clips): off their headers and byte lengths (`check_audio_caps`)."""
    for index, datum in enumerate(data):
        clips = [chunk for chunk in datum.model_input.chunks if isinstance(chunk, AudioChunk)]
        try:
            check_audio_caps(clips, limits)
        except UserError as exc:
            raise UserError(f"datum {index}: {exc}") from None


def _check_audio(model_input: ModelInput, rules: DatumRules, index: int) -> None:
    """No audio placeholder in the datum's text (its clips' caps were checked first: `check_clip_caps`)."""
    if rules.audio is None:
        return
    try:
        rules.audio.check_text(_text_ids(model_input))
    except UserError as exc:
        raise UserError(f"datum {index}: {exc}") from None


def _check_image_bytes(chunk: ImageChunk, limits: ImageLimits, index: int, number: int) -> None:
    try:
        check_image_size(chunk.data, limits)
    except UserError as exc:
        raise UserError(f"datum {index}: chunk {number}: {exc}") from None


def _text_ids(model_input: ModelInput) -> np.ndarray:
    texts = [chunk.tokens for chunk in model_input.chunks if isinstance(chunk, TextChunk)]
    return np.fromiter(chain.from_iterable(texts), dtype=np.int64, count=sum(len(t) for t in texts))


def _outside(ids: np.ndarray, vocab_size: int) -> int | None:
    """The smallest id below 0, else the largest at or above `vocab_size`, else None."""
    if ids.size == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        return low
    return high if high >= vocab_size else None
