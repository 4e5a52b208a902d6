"""Text in, text out: the OpenAI-compatible routes' use case, on the same sampling path as asample.

The model is a served base model or a `tinker://` path to sampler (or training) weights the caller may
read. Prompts are tokenized, and chat messages rendered with the model's own chat template, by the
base model's tokenizer in worker processes (`prompts.py`: neither holds the server's GIL, and a prompt that
cannot fit the model's context is refused before it is tokenized); the sample itself goes through
`SamplingService.generate` (the same engines, router, weight versions and queue limit as asample).
Text comes back cut before the first stop string, with no special tokens, split per token
(`detokenize.IncrementalDetokenizer`: linear in the tokens). Streaming (`prepare_*`, then `run` with a
listener) hears tokens as the engine generates them; `text_stream.py` turns them into text.

Decoding the sampled tokens (bounded by max_tokens) runs in worker threads, never on the event loop, one
call at a time per tokenizer (a fast tokenizer is not safe to share between threads that configure it).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tx.core.sampling.detokenize import decode_pieces
from tx.core.sampling.prompts import PromptWorkers
from tx.core.sampling.samplers import Samplers
from tx.core.sampling.service import SamplingService
from tx.core.sampling.text_stream import TextStream
from tx.types import (
    ModelInput,
    SampledSequence,
    SampleRequest,
    SamplingParams,
    StopReason,
    TokenListener,
    UserError,
)

T = TypeVar("T")


@dataclass(frozen=True)
class TextChoice:
    text: str
    tokens: list[int]  # the sampled token ids
    pieces: list[str]  # `text` split by token (empty strings where a token adds no text), for streaming
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    top: list[list[tuple[str, float]]] = field(default_factory=list)  # per token: k best (text, raw logprob)


@dataclass(frozen=True)
class TextResult:
    prompt_tokens: int
    completion_tokens: int
    choices: list[TextChoice]


@dataclass(frozen=True)
class TextJob:
    """A text request checked and tokenized, ready to sample (`TextSampling.run`)."""

    owner: str
    tokenizer: Any
    base_model: str
    weights_dir: Path | None
    label: str
    tokens: list[int]
    params: SamplingParams
    n: int
    top_logprobs: int = 0  # alternatives per sampled token (the OpenAI routes' logprobs / top_logprobs)


class TextSampling:
    def __init__(self, samplers: Samplers, sampling: SamplingService, model_dirs: dict[str, Path],
                 prompts: PromptWorkers) -> None:
        self._samplers = samplers
        self._prompts = prompts
        self._sampling = sampling
        self._model_dirs = model_dirs
        self._tokenizers: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}

    def base_models(self) -> list[str]:
        return sorted(self._model_dirs)

    def close(self) -> None:
        self._prompts.close()

    async def complete(self, owner: str, model: str, prompt: str | list[int], params: SamplingParams,
                       n: int, top_logprobs: int = 0) -> TextResult:
        return await self.run(await self.prepare_completion(owner, model, prompt, params, n, top_logprobs))

    async def chat(self, owner: str, model: str, messages: list[dict[str, str]], params: SamplingParams,
                   n: int, top_logprobs: int = 0) -> TextResult:
        return await self.run(await self.prepare_chat(owner, model, messages, params, n, top_logprobs))

    async def prepare_completion(self, owner: str, model: str, prompt: str | list[int], params: SamplingParams,
                                 n: int, top_logprobs: int = 0) -> TextJob:
        base_model, weights_dir = await asyncio.to_thread(self._samplers.target, owner, model)
        tokenizer = await self._tokenizer(base_model)
        if isinstance(prompt, list):
            tokens = prompt
        else:
            tokens = await self._prompts.text(base_model, prompt, params.max_tokens)
        if any(not 0 <= token < len(tokenizer) for token in tokens):
            raise UserError(f"prompt token ids must be in [0, {len(tokenizer)}) for {base_model!r}")
        return _job(owner, tokenizer, base_model, weights_dir, model, tokens, params, n, top_logprobs)

    async def prepare_chat(self, owner: str, model: str, messages: list[dict[str, str]], params: SamplingParams,
                           n: int, top_logprobs: int = 0) -> TextJob:
        base_model, weights_dir = await asyncio.to_thread(self._samplers.target, owner, model)
        tokenizer = await self._tokenizer(base_model)
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(f"model {base_model!r} has no chat template; render the prompt and use /completions")
        tokens = await self._prompts.chat(base_model, messages, params.max_tokens)
        return _job(owner, tokenizer, base_model, weights_dir, model, tokens, params, n, top_logprobs)

    async def run(self, job: TextJob, on_tokens: TokenListener | None = None) -> TextResult:
        """Sample `job`; `on_tokens` hears each choice's tokens as they are generated (on the event loop:
        `text_stream.py` makes text of them)."""
        request = SampleRequest(prompt=ModelInput.from_tokens(job.tokens), num_samples=job.n, params=job.params,
                                topk_sample_logprobs=job.top_logprobs)
        result = await self._sampling.generate(job.owner, job.base_model, job.weights_dir, job.label, request,
                                               on_tokens=on_tokens)
        choices = await self._off_loop(job.base_model, lambda: [
            _choice(job.tokenizer, seq, job.params.stop_strings) for seq in result.sequences
        ])
        completion_tokens = sum(len(seq.tokens) for seq in result.sequences)
        return TextResult(prompt_tokens=len(job.tokens), completion_tokens=completion_tokens, choices=choices)

    async def stream_text(self, job: TextJob, stream: TextStream, tokens: list[int]) -> str:
        """The text `tokens` add to one choice's `stream` (tokenizer work, off the event loop)."""
        return await self._off_loop(job.base_model, lambda: stream.push(tokens))

    async def _tokenizer(self, base_model: str) -> Any:
        if base_model not in self._tokenizers:
            from transformers import AutoTokenizer

            directory = str(self._model_dirs[base_model])
            self._tokenizers[base_model] = await asyncio.to_thread(AutoTokenizer.from_pretrained, directory)
            self._locks.setdefault(base_model, threading.Lock())
        return self._tokenizers[base_model]

    async def _off_loop(self, base_model: str, work: Callable[[], T]) -> T:
        """`work` (tokenizer calls) in a worker thread, one at a time per tokenizer."""
        lock = self._locks.setdefault(base_model, threading.Lock())

        def locked() -> T:
            with lock:
                return work()

        return await asyncio.to_thread(locked)


def _job(owner: str, tokenizer: Any, base_model: str, weights_dir: Path | None, label: str, tokens: list[int],
         params: SamplingParams, n: int, top_logprobs: int) -> TextJob:
    if not tokens:
        raise UserError("the prompt is empty")
    return TextJob(owner, tokenizer, base_model, weights_dir, label, list(tokens), params, n, top_logprobs)


def _choice(tokenizer: Any, sequence: SampledSequence, stop_strings: tuple[str, ...]) -> TextChoice:
    tokens = sequence.tokens
    pieces = decode_pieces(tokenizer, tokens)
    full = "".join(pieces)
    cuts = [i for i in (full.find(stop) for stop in stop_strings) if i >= 0]
    text = full[: min(cuts)] if cuts else full
    ends = itertools.accumulate(len(piece) for piece in pieces)  # each piece clipped to the text kept
    pieces = [text[max(0, end - len(piece)):end] for piece, end in zip(pieces, ends)]
    finish = "stop" if sequence.stop_reason == StopReason.STOP else "length"
    top = []
    if sequence.topk is not None:  # the alternatives' own text, each decoded alone
        ids, values = sequence.topk
        top = [[(tokenizer.decode([int(t)]), float(v)) for t, v in zip(row_ids, row_values) if t >= 0]
               for row_ids, row_values in zip(ids, values)]
    return TextChoice(text=text, tokens=list(tokens), pieces=pieces, logprobs=list(sequence.logprobs),
                      finish_reason=finish, top=top)
