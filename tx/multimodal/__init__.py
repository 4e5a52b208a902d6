"""Images in model inputs: safe fetching of asset pointers, decoding under caps, and expansion into the
placeholder tokens and pixel inputs of the model's own processor.

- `fetch.py`: `AssetPolicy` and `fetch_asset` (local roots, allowed hosts, public addresses only, caps).
- `images.py`: `ImageLimits` and `decode_image` (PNG/JPEG only, byte and pixel caps, corrupt data refused).
- `inputs.py`: `ImageInputs`, the server's policy applied to sampling prompts before they reach an engine.
- `prompt.py`: `VisionProcessor` and `expand_input`: image chunks -> placeholder tokens + pixel inputs.
- `audio.py`: `decode_dmel`, `AudioSpec` and `AudioLimits`: DMel chunks decoded, checked, placed (one token a frame).

Heavy libraries (PIL, transformers, torch) are imported only inside the functions that use them.
"""

from tx.multimodal.audio import AudioLimits, AudioSpec, audio_inputs, audio_spec, decode_dmel
from tx.multimodal.fetch import AssetPolicy, address_refusal, check_url, fetch_asset
from tx.multimodal.images import ImageLimits, decode_image
from tx.multimodal.inputs import ImageInputs
from tx.multimodal.prompt import (
    ExpandedInput,
    PlacedImage,
    VisionProcessor,
    expand_chunks,
    expand_input,
    images_refused,
    vision_processor,
)

__all__ = [
    "AssetPolicy",
    "AudioLimits",
    "AudioSpec",
    "ExpandedInput",
    "ImageInputs",
    "ImageLimits",
    "PlacedImage",
    "VisionProcessor",
    "address_refusal",
    "audio_inputs",
    "audio_spec",
    "check_url",
    "decode_dmel",
    "decode_image",
    "expand_chunks",
    "expand_input",
    "fetch_asset",
    "images_refused",
    "vision_processor",
]
