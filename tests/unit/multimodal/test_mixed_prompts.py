"""A prompt mixing text, an image and an audio clip, through the trainer's micro-batch and the embedded engine's
prefill inputs. No model served here takes both images and audio (docs/model-families.md#audio-in), so this is
checked where the two meet: the tiny Qwen3-VL's own image processor beside an audio spec whose placeholder id is
one of its free ids; each kind's placeholders and inputs must come out where and as they would alone."""

from __future__ import annotations

import base64

import numpy as np
import torch
from dmel_bytes import tensor_container
from image_helpers import encode

from tx.backends.losses import LOSSES, TARGET_KEY
from tx.backends.torch.batch import build_micro_batch, prepare_data
from tx.inference.engines.embedded.vision import batch_vision, prepare_vision
from tx.inference.protocol import GenerateRequest, PromptAudio, PromptImage
from tx.multimodal import AudioSpec, ImageLimits, vision_processor
from tx.multimodal.audio import decode_dmel
from tx.types import BaseModelInfo, Datum, ImageChunk, ModelInput, TextChunk

IMAGE_TOKEN, AUDIO_TOKEN = 2005, 2040
SPEC = AudioSpec(token_id=AUDIO_TOKEN, mel_bins=2, levels=4)
CLIP = np.array([[0, 1], [2, 3], [3, 0]])


def mixed_input() -> ModelInput:
    """Text, a 64x48 image (70 tokens), text, a 3-frame clip, text."""
    return ModelInput((TextChunk((1, 2)), ImageChunk(encode((5, 5, 5)), "png", 70), TextChunk((3,)),
                       decode_dmel(tensor_container(CLIP)), TextChunk((4, 5))))


def test_the_trainers_micro_batch_carries_both_kinds_in_place(vlm_dir) -> None:
    vision = vision_processor(vlm_dir)
    info = BaseModelInfo("vlm", "qwen3_vl", "vlm", 2048, 4096)
    text_only = ModelInput.from_tokens([6, AUDIO_TOKEN - 1, 7])
    data = []
    for model_input, length in ((mixed_input(), 2 + 70 + 1 + 3 + 2), (text_only, 3)):
        data.append(Datum(model_input, {TARGET_KEY: np.zeros(length, np.int64)}))
    items = prepare_data(data, LOSSES["cross_entropy"], info, vision, ImageLimits(), None, SPEC)
    micro = build_micro_batch(items, torch.device("cpu"), vision, packed=False)
    row = micro.input_ids[0].tolist()
    assert row == [1, 2, *[IMAGE_TOKEN] * 70, 3, *[AUDIO_TOKEN] * 3, 4, 5]
    assert micro.input_ids[1].tolist()[:3] == [6, AUDIO_TOKEN - 1, 7]
    alone = vision.pixel_inputs([items[0].expanded.images[0].image], [70])
    torch.testing.assert_close(micro.vision["pixel_values"], alone["pixel_values"])
    assert micro.vision["image_grid_thw"].tolist() == alone["image_grid_thw"].tolist()
    np.testing.assert_array_equal(micro.vision["audio_input_ids"][:, 0].numpy(), CLIP)


def test_the_engines_prefill_carries_both_kinds_in_place(vlm_dir) -> None:
    vision = vision_processor(vlm_dir)
    ids = [1, 2, *[IMAGE_TOKEN] * 70, 3, *[AUDIO_TOKEN] * 3, 4, 5]
    image = PromptImage(data=base64.b64encode(encode((5, 5, 5))).decode(), format="png", offset=2, num_tokens=70)
    request = GenerateRequest(prompt_token_ids=ids, images=[image], audio=[PromptAudio.of(CLIP, 73)])
    prepared = prepare_vision(request, vision, ImageLimits(), SPEC)
    assert prepared is not None and prepared.spans == [(2, 70)]
    inputs = batch_vision([None, prepared], [len(ids), 2], len(ids) + 2)  # a text row, then ours padded by 2
    types = inputs["mm_token_type_ids"][1].tolist()
    assert types == [0, 0, 0, 0, *[1] * 70, *[0] * 6]  # the image's span, shifted by the pad; not the clip's
    np.testing.assert_array_equal(inputs["audio_input_ids"][:, 0].numpy(), CLIP)
    assert inputs["image_grid_thw"].tolist() == prepared.image_grid_thw.tolist() == [[1, 14, 20]]  # height 224 / 16, width 320 / 16
