"""Receiving weights over a collective group (gloo; NCCL when the engine is on a GPU) or as CUDA IPC handles
(the trainer's own GPU), and applying them to the engine's `Weights`.

Design / who owns what:
- `init` builds a `BroadcastReceiver` (this engine is a single worker: rank `rank_offset`; tensors land on the
  model's device) and joins the group in a background thread, so `POST /weights/init` returns at once while
  the trainer joins from its side.
- `update` waits for that join, then consumes the whole broadcast (the sender waits for every bucket, so the
  iterator is always drained, even after a bad tensor) and applies it: base tensors are copied in place one by
  one under the weights lock; LoRA tensors are gathered and loaded as one adapter.
- `update_ipc` maps the trainer's shared buffers and applies them the same way (every tensor is copied into
  the model before the answer, after which the trainer releases its buffers); no group is needed.
- One update at a time (`_busy`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch

from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import (
    IpcWeightsUpdateRequest, TransferState, WeightsUpdateRequest, WeightsUpdateResponse,
)
from tx.inference.weight_sync import BroadcastReceiver, IpcReceiver, TransferInit
from tx.types import ConflictError, UserError

logger = logging.getLogger(__name__)


class WeightReceiver:
    """The engine side of weight transfers."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.state: TransferState = "none"
        self._receiver: BroadcastReceiver | None = None
        self._thread: threading.Thread | None = None
        self._init: TransferInit | None = None
        self._error: BaseException | None = None
        self._busy = threading.Lock()

    def init(self, init: TransferInit) -> None:
        """Start joining the group described by `init`; returns at once."""
        with self._busy:
            self.close()
            self._init, self._error, self.state = init, None, "connecting"
            self._receiver = BroadcastReceiver(init, rank=init.rank_offset, device=self.weights.device)
            self._thread = threading.Thread(target=self._connect, args=(self._receiver,),
                                            name="tx-engine-weights-init", daemon=True)
            self._thread.start()

    def _connect(self, receiver: BroadcastReceiver) -> None:
        try:
            receiver.connect()
            self.state = "ready"
        except BaseException as exc:  # reported on the next update and in /health
            logger.exception("joining the weight transfer group failed")
            self._error, self.state = exc, "failed"

    def update(self, request: WeightsUpdateRequest) -> WeightsUpdateResponse:
        """Receive and apply one push; returns when every tensor was applied."""
        with self._busy:
            receiver = self._wait_connected()
            start = time.perf_counter()
            num_bytes = self._receive_and_apply(receiver, request)
            return WeightsUpdateResponse(
                num_tensors=len(request.transfer.tensors),
                num_bytes=num_bytes,
                seconds=time.perf_counter() - start,
            )

    def update_ipc(self, request: IpcWeightsUpdateRequest) -> WeightsUpdateResponse:
        """Apply one push of CUDA IPC handles; returns when every tensor was copied into the model."""
        if self.weights.device.type != "cuda":
            raise ConflictError(f"this engine runs on {self.weights.device}: CUDA IPC needs it on a GPU")
        with self._busy:
            start = time.perf_counter()
            received = IpcReceiver(self.weights.device).receive(request.ipc)
            num_bytes = self._apply(request, received)
            return WeightsUpdateResponse(
                num_tensors=sum(len(bucket.tensors) for bucket in request.ipc.buckets),
                num_bytes=num_bytes,
                seconds=time.perf_counter() - start,
            )

    def _receive_and_apply(self, receiver: BroadcastReceiver, request: WeightsUpdateRequest) -> int:
        """Adapters arrive in buffers; base tensors land straight in the parameters (under the weights lock:
        no forward meanwhile). On a failure the rest is drained: the sender waits for every bucket."""
        base = request.adapter is None
        with self.weights.lock if base else contextlib.nullcontext():
            targets = self._base_targets() if base else None
            received = receiver.receive(request.transfer, reuse_buffers=base, targets=targets)
            try:
                if base:
                    return self._apply_base(received, targets or self.weights.base_parameters())
                return self._apply(request, received)
            except Exception:
                for _ in received:
                    pass
                raise

    def _base_targets(self) -> dict[str, torch.nn.Parameter]:
        """The parameters base tensors may land in; none while the weights sleep (the apply then fails)."""
        try:
            return self.weights.base_parameters()
        except ConflictError:
            return {}

    def _apply(self, request: WeightsUpdateRequest | IpcWeightsUpdateRequest, received) -> int:
        if request.adapter is None or request.lora is None:  # both or neither (validated)
            return self._apply_base(received, self.weights.base_parameters())
        tensors = dict(received)
        self.weights.load_adapter(request.adapter, request.lora, tensors)
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _wait_connected(self) -> BroadcastReceiver:
        if self._thread is None or self._init is None or self._receiver is None:
            raise ConflictError("no weight transfer group: POST /weights/init first")
        self._thread.join(timeout=self._init.timeout_s)
        if self.state != "ready":
            raise ConflictError(f"the weight transfer group is {self.state}: {self._error!r}")
        return self._receiver

    def _apply_base(self, received, params: dict[str, torch.nn.Parameter]) -> int:
        """Copy each received base tensor into its parameter (one that landed there already is done)."""
        problems, num_bytes = [], 0
        for name, tensor in received:  # drain fully whatever happens
            param = params.get(name)
            if param is None or tuple(param.shape) != tuple(tensor.shape):
                problems.append(name)
                continue
            if tensor is not param:
                self.weights.copy_base(param, tensor)
            num_bytes += tensor.numel() * tensor.element_size()
        if problems:
            raise UserError(f"{len(problems)} base tensors unknown or misshaped, e.g. {problems[:5]}")
        return num_bytes

    def close(self) -> None:
        if self._receiver is not None:
            try:
                self._receiver.close()
            except Exception:
                logger.exception("closing the weight transfer group failed")
        self._receiver, self._thread, self.state = None, None, "none"
