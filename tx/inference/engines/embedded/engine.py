"""The embedded engine: weights + scheduler + weight receiver behind the contract's operations.

Design / who owns what:
- `EmbeddedEngine` validates requests against the loaded model (vocabulary, adapters, lengths) and turns the
  contract's operations into calls on its three parts: it is the `EngineBackend` behind `engines/app.py`,
  which maps routes to these methods and runs the blocking ones (every one but `generate`) in its threads.
- Sleep first pauses the scheduler (reason "sleep", with the requested mode), then frees the weights; the
  reason stays until every tag is awake again, so requests that arrive meanwhile wait instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from concurrent.futures import Future

import torch

from tx.inference.engines.embedded.batch import Listener
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.embedded.scheduler import Scheduler
from tx.inference.engines.embedded.transfer import WeightReceiver
from tx.inference.engines.embedded.vision import prepare_vision
from tx.inference.engines.embedded.weights import Weights
from tx.inference.engines.scores import check_prompt_scores
from tx.inference.engines.streaming import TokenStream
from tx.inference.protocol import (
    GenerateRequest,
    GenerateResponse,
    HealthResponse,
    IpcWeightsUpdateRequest,
    PauseMode,
    StateResponse,
    TokenizeRequest,
    TokenizeResponse,
    WakeTag,
    WeightsFinishRequest,
    WeightsUpdateRequest,
    WeightsUpdateResponse,
)
from tx.inference.protocol.stream import GenerateEvent
from tx.inference.weight_sync import TransferInit, Transport, cuda_device_uuid
from tx.models.fingerprint import model_fingerprint
from tx.multimodal import ImageLimits, audio_spec, vision_processor
from tx.types import NotFoundError, UserError

logger = logging.getLogger(__name__)


class EmbeddedEngine:
    """One transformers model serving the engine contract."""

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.weights = Weights(config.model_dir, config.max_adapters, config.stash_dir, config.device,
                               config.dtype, config.attn_implementation)
        self.scheduler = Scheduler(self.weights, config.max_batch_size, config.batch_wait_s,
                                   static=config.batching == "static")
        self.receiver = WeightReceiver(self.weights)
        self.vision = vision_processor(config.model_dir)  # None for a text-only model
        self.audio = audio_spec(config.model_dir)  # None for a model without audio
        self.image_limits = ImageLimits()  # the server checked its own caps; these only bound the work here
        self.placement = _placement(self.weights.device)  # what /health says about where this engine runs
        self.fingerprint = model_fingerprint(config.model_dir)  # what /health says about which model it serves

    def start(self) -> None:
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.close()
        self.receiver.close()
        self.weights.close()

    # ---- sampling

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        """Queue `request` and wait for its result without blocking the event loop."""
        if request.images:  # decoding and processing images is CPU work: keep it off the event loop
            future = await asyncio.to_thread(self.submit, request)
        else:
            future = self.submit(request)
        return await asyncio.wrap_future(future)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        """Queue `request` (validated now: a bad one raises before anything streams); its tokens as they are
        sampled, then its answer."""
        stream = TokenStream()
        if request.images:
            future = await asyncio.to_thread(self.submit, request, stream.listener)
        else:
            future = self.submit(request, stream.listener)
        stream.finish_with(future)
        return stream.events()

    def submit(self, request: GenerateRequest, listener: Listener | None = None) -> Future:
        """Validate `request` (decoding its images, if any: call from a worker thread then) and queue it;
        `listener` hears its tokens as they are sampled."""
        self._validate(request)
        vision = prepare_vision(request, self.vision, self.image_limits, self.audio)
        return self.scheduler.submit(request, vision, listener)

    def _validate(self, request: GenerateRequest) -> None:
        weights = self.weights
        if weights.serving.refused:
            raise UserError(f"this engine cannot serve {self.config.model_dir.name} exactly: "
                            f"{weights.serving.refused}; see docs/engines.md#the-engines-self-check")
        ids = request.prompt_token_ids + request.stop_token_ids
        bad = [t for t in ids if not 0 <= t < weights.vocab_size]
        if bad:
            raise UserError(f"token ids outside the vocabulary [0, {weights.vocab_size}): {bad[:5]}")
        if request.adapter is not None and not weights.has_adapter(request.adapter):
            raise NotFoundError(f"adapter {request.adapter!r} is not loaded")
        total = len(request.prompt_token_ids) + request.max_tokens
        if total > weights.max_positions:
            raise UserError(f"prompt + max_tokens = {total} exceeds the model's {weights.max_positions}")
        if request.stop_strings and weights.tokenizer is None:
            raise UserError("stop strings need a tokenizer, and this model directory has none")
        if max(request.topk_prompt_logprobs, request.topk_sample_logprobs) > weights.vocab_size:
            raise UserError(f"topk_prompt_logprobs and topk_sample_logprobs must be <= vocab size {weights.vocab_size}")
        check_prompt_scores(request, weights.vocab_size)

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        if self.weights.tokenizer is None:
            raise UserError("this model directory has no tokenizer")
        ids = self.weights.tokenizer.encode(request.text, add_special_tokens=request.add_special_tokens)
        return TokenizeResponse(token_ids=list(ids))

    # ---- lifecycle

    def pause(self, mode: PauseMode) -> StateResponse:
        self.scheduler.pause(mode)
        return self.state()

    def resume(self) -> StateResponse:
        self.scheduler.resume()
        return self.state()

    def sleep(self, level: int, mode: PauseMode) -> StateResponse:
        self.scheduler.pause(mode, reason="sleep")
        self.weights.sleep(level)
        return self.state()

    def wake_up(self, tags: list[WakeTag] | None) -> StateResponse:
        self.weights.wake(tags)
        if not self.weights.asleep:
            self.scheduler.resume(reason="sleep")
        return self.state()

    # ---- weights

    def init_transfer(self, init: TransferInit) -> HealthResponse:
        self.receiver.init(init)
        return self.health()

    def update_weights(self, request: WeightsUpdateRequest) -> WeightsUpdateResponse:
        return self.receiver.update(request)

    def update_weights_ipc(self, request: IpcWeightsUpdateRequest) -> WeightsUpdateResponse:
        return self.receiver.update_ipc(request)

    def finish_weights(self, request: WeightsFinishRequest) -> HealthResponse:
        self.weights.set_version(request.version, request.adapter)
        for name in request.remove_adapters:
            if self.weights.has_adapter(name):
                self.weights.delete_adapter(name)
        return self.health()

    def delete_adapter(self, name: str) -> HealthResponse:
        self.weights.delete_adapter(name)
        return self.health()

    # ---- state

    def state(self) -> StateResponse:
        return StateResponse(paused=self.scheduler.paused, sleeping_level=self.weights.sleep_level)

    def health(self) -> HealthResponse:
        running, waiting = self.scheduler.counts()
        weights = self.weights
        return HealthResponse(
            paused=self.scheduler.paused,
            sleeping_level=weights.sleep_level,
            model=str(self.config.model_dir),
            model_fingerprint=self.fingerprint,
            max_adapters=self.config.max_adapters,
            base_version=weights.base_version,
            adapters=dict(weights.adapters),
            asleep_tags=sorted(weights.asleep),
            weight_transfer=self.receiver.state,
            num_running=running,
            num_waiting=waiting,
            stats=self.scheduler.stats.model_copy(),
            **self.placement,
        )


def _placement(device: torch.device) -> dict:
    """Device, GPU UUID, host and the weight transports this engine takes (NCCL and CUDA IPC on a GPU)."""
    transports: list[Transport] = ["gloo"]
    gpu_uuid = None
    if device.type == "cuda":
        transports.extend(("nccl", "ipc"))
        gpu_uuid = cuda_device_uuid(device.index)
    return {"device": str(device), "gpu_uuid": gpu_uuid, "hostname": socket.gethostname(),
            "weight_transports": transports}
