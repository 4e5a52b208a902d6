"""The vLLM engine's operations: tx's contract translated to calls on the vLLM child's private socket.

Design / who owns what:
- `VllmChild` (`child.py`) runs `vllm serve` (a child in this process's group) on a Unix socket inside a 0700
  directory, with dev mode and runtime LoRA updating on, and tx's worker extension injected. Nothing else can
  reach it.
- `VllmEngine` holds what the contract reports (pause, sleep level, adapters and their versions, transfer
  state) and maps each operation: generate -> `/v1/completions` (see `translate.py`); pause/resume -> vLLM's;
  sleep/wake -> vLLM's where sleep mode is on (a GPU), else only tx's bookkeeping (vLLM's CPU build has no
  sleep mode; `/health` says so in `status`); weights -> `/collective_rpc` into `worker.TxWorkerExtension`.
  Requests with images go to vLLM's token-in/token-out `/inference/v1/generate` instead, with the images as
  data URLs (`images.py` says why and how); text requests keep `/v1/completions`.
- New requests wait in this process while the engine is paused or asleep (the contract queues, it never
  rejects; vLLM >= 0.33 would answer 503), so vLLM never samples from weights that are asleep.
- After every base-weight change the prefix cache is reset (running requests included): otherwise a cached
  prefix would mix old and new weights. Level 2 unloads every adapter and wake reloads the base from disk.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from tx.inference import protocol as p
from tx.inference.engines.stops import LazyDecode, cut_at_resumed_stop
from tx.inference.engines.streaming import Listener, TokenStream, whole
from tx.inference.engines.vllm.adapters import LoadedAdapters
from tx.inference.engines.vllm.batch import BatchGate, record_answer
from tx.inference.engines.vllm.child import VllmChild, VllmError, private_dirs, sleep_mode_on
from tx.inference.engines.vllm.config import VllmEngineConfig
from tx.inference.engines.vllm.images import (
    VisionModel,
    check_expansion,
    check_images,
    collapsed_prompt,
    content_parts,
    decode_images,
)
from tx.inference.engines.vllm.placement import placement
from tx.inference.engines.vllm.scores import PromptScores
from tx.inference.engines.vllm.streaming import first_samples, stream_completion, streams
from tx.inference.engines.vllm.translate import (
    completion_bodies,
    generate_response,
    tokens_answer,
    tokens_body,
    wants_prompt_logprobs,
)
from tx.inference.protocol.stream import GenerateEvent
from tx.inference.weight_sync import TransferInit
from tx.models.fingerprint import model_fingerprint
from tx.types import ConflictError, NotFoundError, UserError

BASE_MODEL_NAME = "tx-base"  # vLLM's name for the base model (requests name an adapter or this)
CPU_SLEEP_NOTE = "ok (sleep is bookkeeping only: this vLLM build has no sleep mode)"


class VllmEngine:
    """tx's contract over one vLLM child."""

    def __init__(self, config: VllmEngineConfig, child: VllmChild, lora_dir: Path) -> None:
        self.config = config
        self.child = child
        self.paused = False
        self.sleeping_level = 0
        self.asleep: set[p.WakeTag] = set()
        self.base_version: str | None = None
        self.loaded = LoadedAdapters(child, lora_dir)
        self.transfer: p.TransferState = "none"
        self.num_running = 0
        self.num_waiting = 0
        self.stats = p.EngineStats()
        self._open = asyncio.Event()
        self._open.set()
        self._weights = asyncio.Lock()
        self._batch = BatchGate()
        self.vision = VisionModel.load(config.model_dir)  # None: a text-only model
        self.scores = PromptScores(config.model_dir)  # the prompt's scores (vllm/scores.py)
        self._placement: dict | None = None  # what /health says about where vLLM runs (read on first use)
        self.fingerprint = model_fingerprint(config.model_dir)  # what /health says about which model it serves
        self._decode = LazyDecode(config.model_dir)  # for stop strings across an abort

    @property
    def adapters(self) -> dict[str, str | None]:
        """The adapters the child holds: name -> version (None until its push finishes)."""
        return self.loaded.versions

    # ---- sampling

    async def generate(self, request: p.GenerateRequest) -> p.GenerateResponse:
        await self._check(request)
        return await self._generate(request)

    async def generate_stream(self, request: p.GenerateRequest) -> AsyncIterator[GenerateEvent]:
        """Tokens as vLLM samples them (which requests: `vllm/streaming.py`), then the answer; a bad one raises."""
        await self._check(request)
        if not streams(request, self.vision is not None):
            return whole(await self._generate(request))
        stream = TokenStream()
        stream.finish_with(asyncio.ensure_future(self._generate(request, stream.listener)))
        return stream.events()

    async def _check(self, request: p.GenerateRequest) -> None:
        """The 4xx a request gets before it is queued."""
        if request.audio:  # the pinned vLLM has no Inkling audio (docs/engines.md)
            raise UserError("audio (dmel) prompts are sampled by the embedded engine only; this base model is "
                            "served by vLLM, which takes no audio here")
        if request.images or self.vision is not None:  # see images.py
            check_images(request, self.vision, self.config.max_images_per_prompt)
        if request.images:
            await asyncio.to_thread(decode_images, request)
        if request.adapter is not None and request.adapter not in self.adapters:
            raise NotFoundError(f"adapter {request.adapter!r} is not loaded")
        self.scores.check(request)

    async def _generate(self, request: p.GenerateRequest, listener: Listener | None = None) -> p.GenerateResponse:
        self.num_waiting += 1
        try:
            await self._open.wait()
        finally:
            self.num_waiting -= 1
        if request.adapter is not None and request.adapter not in self.adapters:
            raise NotFoundError(f"adapter {request.adapter!r} was unloaded")
        model = request.adapter or self.child.served_name
        isolate = wants_prompt_logprobs(request) and bool(self.adapters)
        never = self.vision.never_sampled if self.vision is not None else ()  # see images.py
        bodies = completion_bodies(request, model, isolate_prompt_logprobs=isolate, never=never)
        complete = self._complete
        if listener is not None:  # streamed: see streaming.py
            firsts = first_samples(bodies)
            complete = lambda body: stream_completion(self.child, body, firsts[id(body)], listener)  # noqa: E731
        if request.images:
            assert self.vision is not None  # check_images refused images for a text-only model
            prompt, parts = collapsed_prompt(request, self.vision.image_token_id), content_parts(request)
            bodies = [tokens_body(body, prompt, parts) for body in bodies]
            complete = functools.partial(self._generate_tokens, request)
        self.num_running += 1
        try:  # isolated: the first body alone in vLLM's batch, see translate.py (LoRA + prompt logprobs)
            answers = await self._batch.complete(bodies, complete, first_alone=isolate)
            async with self._batch.shared():
                scores = await self.scores.answer(request, model, self._complete)
        except asyncio.CancelledError:  # tx's caller went away: the closed call makes vLLM abort the request
            self.stats.num_cancelled += 1
            raise
        finally:
            self.num_running -= 1
        response = generate_response(request, answers).model_copy(update=scores)
        if request.resumed_tokens and request.stop_strings:  # vLLM matches stop strings on the new text only
            response = cut_at_resumed_stop(request, response, await self._decode.get())
        record_answer(self.stats, request, response)
        return response

    async def _complete(self, body: dict) -> dict:
        return await self.child.call("POST", "/v1/completions", json_body=body)

    async def _generate_tokens(self, request: p.GenerateRequest, body: dict) -> dict:
        """One image-prompt body through `/inference/v1/generate`, checked and shaped like a completion."""
        answer = await self.child.call("POST", "/inference/v1/generate", json_body=body)
        check_expansion(request, answer)
        return tokens_answer(answer)

    async def tokenize(self, request: p.TokenizeRequest) -> p.TokenizeResponse:
        body = {
            "model": self.child.served_name,
            "prompt": request.text,
            "add_special_tokens": request.add_special_tokens,
        }
        answer = await self.child.call("POST", "/tokenize", json_body=body)
        return p.TokenizeResponse(token_ids=answer["tokens"])

    # ---- pause and sleep

    async def pause(self, mode: p.PauseMode) -> p.StateResponse:
        self.paused = True
        self._open.clear()
        await self.child.call("POST", "/pause", params={"mode": mode})
        return self.state()

    async def resume(self) -> p.StateResponse:
        self.paused = False
        await self._reopen()
        return self.state()

    async def sleep(self, level: int, mode: p.PauseMode) -> p.StateResponse:
        async with self._weights:
            self._open.clear()
            await self.child.call("POST", "/pause", params={"mode": mode})
            if level == 2:
                for name in list(self.adapters):
                    await self.loaded.unload(name)
                self.base_version = None
            if self.child.sleep_mode and not self.asleep:
                await self.child.call("POST", "/sleep", params={"level": level, "mode": mode})
            self.sleeping_level = max(self.sleeping_level, level)
            self.asleep = {"weights", "kv_cache"}
        return self.state()

    async def wake_up(self, tags: list[p.WakeTag] | None) -> p.StateResponse:
        wanted: set[p.WakeTag] = set(tags or ("weights", "kv_cache"))
        async with self._weights:
            waking = wanted & self.asleep
            if waking and self.child.sleep_mode:
                await self.child.call("POST", "/wake_up", params=[("tags", t) for t in sorted(waking)])
            if "weights" in waking and self.sleeping_level == 2:
                await self.child.rpc("tx_reload_base", str(self.config.model_dir), timeout=self.config.rpc_timeout_s)
                await self._reset_prefix_cache()
            self.asleep -= wanted
            if not self.asleep:
                self.sleeping_level = 0
        await self._reopen()
        return self.state()

    async def _reopen(self) -> None:
        if self.paused or self.asleep:
            return
        await self.child.call("POST", "/resume")
        self._open.set()

    # ---- weights

    async def init_transfer(self, init: TransferInit) -> p.HealthResponse:
        async with self._weights:
            answer = await self.child.rpc("tx_init_transfer", init.model_dump_json(), timeout=30)
            self.transfer = answer["state"]
        return self.report()

    async def update_weights(self, request: p.WeightsUpdateRequest) -> p.WeightsUpdateResponse:
        transfer = request.transfer.model_dump_json()
        if request.adapter is None or request.lora is None:  # both or neither (validated)
            return await self._update_base("tx_update_base", transfer)
        return await self._update_adapter(request.adapter, request.lora, "tx_update_lora", transfer)

    async def update_weights_ipc(self, request: p.IpcWeightsUpdateRequest) -> p.WeightsUpdateResponse:
        ipc = request.ipc.model_dump_json()
        if request.adapter is None or request.lora is None:  # both or neither (validated)
            return await self._update_base("tx_update_ipc", ipc)
        return await self._update_adapter(request.adapter, request.lora, "tx_update_ipc", ipc)

    async def _update_base(self, method: str, payload: str) -> p.WeightsUpdateResponse:
        async with self._weights:
            self._require_awake()
            answer = await self._rpc_update(method, payload)
            await self._reset_prefix_cache()
            return p.WeightsUpdateResponse(**answer)

    async def _update_adapter(
        self, name: str, lora: p.LoraSpec, method: str, payload: str
    ) -> p.WeightsUpdateResponse:
        if not self.config.enable_lora:
            raise UserError("this vLLM engine runs without LoRA (enable_lora is off): it takes no adapters")
        async with self._weights:
            self._require_awake()
            if name not in self.adapters and len(self.adapters) >= self.config.max_adapters:
                raise ConflictError(
                    f"{len(self.adapters)} adapters loaded, max_adapters is {self.config.max_adapters}"
                )
            if lora.r > self.config.max_lora_rank:
                raise UserError(
                    f"LoRA rank {lora.r} exceeds this engine's max_lora_rank {self.config.max_lora_rank}"
                )
            path = self.loaded.new_path()
            args = (payload, lora.model_dump_json(), str(path), str(self.config.model_dir))
            answer = await self._rpc_update(method, *args)
            await self.loaded.load(name, path)
            return p.WeightsUpdateResponse(**answer)

    async def _rpc_update(self, method: str, *args: str) -> dict:
        try:
            answer = await self.child.rpc(method, *args, timeout=self.config.rpc_timeout_s)
        except VllmError:
            self.transfer = "failed" if self.transfer != "none" else "none"
            raise
        if method != "tx_update_ipc":
            self.transfer = "ready"
        return answer

    async def finish_weights(self, request: p.WeightsFinishRequest) -> p.HealthResponse:
        async with self._weights:
            if request.adapter is None:
                self.base_version = request.version
            elif request.adapter in self.adapters:
                self.adapters[request.adapter] = request.version
            else:
                raise NotFoundError(f"adapter {request.adapter!r} is not loaded")
            for name in request.remove_adapters:
                if name in self.adapters:
                    await self.loaded.unload(name)
        return self.report()

    async def delete_adapter(self, name: str) -> p.HealthResponse:
        async with self._weights:
            if name not in self.adapters:
                raise NotFoundError(f"adapter {name!r} is not loaded")
            await self.loaded.unload(name)
        return self.report()

    async def _reset_prefix_cache(self) -> None:
        await self.child.call("POST", "/reset_prefix_cache", params={"reset_running_requests": "true"})

    def _require_awake(self) -> None:
        if "weights" in self.asleep:
            raise ConflictError("the weights are asleep; wake_up(['weights']) first")

    # ---- state

    def state(self) -> p.StateResponse:
        return p.StateResponse(status=self._status(), paused=self.paused, sleeping_level=self.sleeping_level)

    def _status(self) -> str:
        return "ok" if self.child.sleep_mode else CPU_SLEEP_NOTE

    async def health(self) -> p.HealthResponse:
        """`report`, with the transfer group's state asked of the workers while it is connecting."""
        await self._refresh_transfer_state()
        return self.report()

    def report(self) -> p.HealthResponse:
        """What `/health` says, from what this process last saw."""
        if self._placement is None:
            self._placement = placement(self.config)
        return p.HealthResponse(
            status=self._status(),
            paused=self.paused,
            sleeping_level=self.sleeping_level,
            model=str(self.config.model_dir),
            model_fingerprint=self.fingerprint,
            max_adapters=self.config.max_adapters,
            max_lora_rank=self.config.max_lora_rank if self.config.enable_lora else None,
            base_version=self.base_version,
            adapters=dict(self.adapters),
            asleep_tags=sorted(self.asleep),
            weight_transfer=self.transfer,
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            stats=self.stats.model_copy(),
            **self._placement,
        )

    async def _refresh_transfer_state(self) -> None:
        """Ask the workers whether the group joined (`report` has the last known state otherwise)."""
        if self.transfer in ("connecting",) and not self._weights.locked():
            try:
                self.transfer = (await self.child.rpc("tx_transfer_state", timeout=5))["state"]
            except (VllmError, httpx.HTTPError, KeyError):
                pass


__all__ = ["BASE_MODEL_NAME", "CPU_SLEEP_NOTE", "VllmChild", "VllmEngine", "VllmError", "private_dirs",
           "sleep_mode_on"]
