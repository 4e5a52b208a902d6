"""The vLLM engine's stream route: each `/v1/completions` body goes to vLLM with `stream: true`; the tokens of
every server-sent chunk go to the listener as they arrive (sample index = the body's first sample + the chunk's
choice index), and the chunks are put back together into the answer vLLM would have given whole, so
`translate.generate_response` reads a streamed answer as any other. Closing the stream (tx's caller went away)
closes the call, and vLLM aborts the request.

Streamed: text prompts without prompt logprobs; the rest (images, prompt scores) is answered whole, as one line.
"""

from __future__ import annotations

import json
from typing import Any

from tx.inference.engines.streaming import Listener
from tx.inference.engines.vllm.child import VllmChild, VllmError
from tx.inference.engines.vllm.translate import wants_prompt_logprobs
from tx.inference.protocol import GenerateRequest


def streams(request: GenerateRequest, vision_model: bool) -> bool:
    """Whether the stream route streams `request` token by token (else it answers it whole, as one line)."""
    return not request.images and not vision_model and not wants_prompt_logprobs(request)


def first_samples(bodies: list[dict[str, Any]]) -> dict[int, int]:
    """Per body (by identity), the sample index of its first choice."""
    offsets, first = {}, 0
    for body in bodies:
        offsets[id(body)] = first
        first += int(body["n"])
    return offsets


async def stream_completion(child: VllmChild, body: dict[str, Any], first: int, listener: Listener) -> dict:
    """`body`'s answer, in `/v1/completions`' shape, its tokens heard by `listener` as vLLM samples them."""
    choices: dict[int, dict[str, Any]] = {}
    async with child.stream("/v1/completions", {**body, "stream": True}) as lines:
        async for line in lines:
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:  # an error once the stream began
                error = chunk["error"]
                raise VllmError(int(error.get("code") or 500), str(error.get("message", error)))
            for part in chunk.get("choices") or []:
                index = int(part["index"])
                choice = choices.setdefault(index, {"index": index, "token_ids": [], "finish_reason": None,
                                                    "logprobs": {"token_logprobs": [], "top_logprobs": []}})
                _merge(choice, part)
                for token, value in zip(part.get("token_ids") or [], _logprobs(part).get("token_logprobs") or []):
                    listener(first + index, int(token), float(value))
    return {"choices": list(choices.values())}


def _merge(choice: dict[str, Any], part: dict[str, Any]) -> None:
    choice["token_ids"] += part.get("token_ids") or []
    logprobs = _logprobs(part)
    choice["logprobs"]["token_logprobs"] += logprobs.get("token_logprobs") or []
    choice["logprobs"]["top_logprobs"] += logprobs.get("top_logprobs") or []
    if part.get("finish_reason"):
        choice["finish_reason"] = part["finish_reason"]


def _logprobs(part: dict[str, Any]) -> dict[str, Any]:
    return part.get("logprobs") or {}
