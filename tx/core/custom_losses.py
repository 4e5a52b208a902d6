"""Custom losses uploaded with create_custom_loss, kept per session, named by forward_backward.

A loss is checked by the backend at upload (its allowlist; a 400 names what is refused), stored
here under `loss_id = {session_id}:loss:{custom_loss_seq_id}`, and looked up when a forward_backward
says `loss_fn="custom", loss_fn_config={"loss_id": ...}`: only clients of the session that
uploaded it may use it. Losses live in memory: after a restart a loss_id is unknown (400) and the
SDK's client must create it again. A key holds at most its `custom_losses` quota of them (`quotas.py`);
they go when their session ends.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from tx.backends.base import TrainingBackend
from tx.core import quotas
from tx.core.futures import Future, FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.results import CustomLossCreated
from tx.core.sessions import live_session
from tx.store.store import Store
from tx.types import CustomLoss, ForwardBackwardInput, UserError


class CustomLosses:
    def __init__(self, store: Store, futures: FutureRegistry, backend: TrainingBackend,
                 limits: QuotaLimits | None = None) -> None:
        self._store = store
        self._futures = futures
        self._backend = backend
        self._limits = limits or QuotaLimits()
        self._losses: dict[str, CustomLoss] = {}
        self._owners: dict[str, str] = {}  # loss_id -> the key that uploaded it
        self._lock = threading.Lock()

    def create(
        self, owner: str, session_id: str, seq_id: int, name: str,
        inputs: list[tuple[str, int]], nodes: list[dict[str, Any]],
    ) -> Future:
        """Check and store a loss; the future resolves at once with its loss_id (a resend gets the same)."""
        live_session(self._store, session_id, owner)
        loss_id = f"{session_id}:loss:{seq_id}"
        loss = CustomLoss(loss_id, session_id, name, tuple(inputs), tuple(nodes))
        self._backend.check_custom_loss(loss)
        with self._lock:
            if loss_id not in self._losses:
                held = sum(holder == owner for holder in self._owners.values())
                quotas.check("custom_losses", held, 1, self._limits.custom_losses)
                self._losses[loss_id] = loss
                self._owners[loss_id] = owner
        future, created = self._futures.create(owner, "CreateCustomLoss", ("custom_loss", loss_id))
        if created:
            self._futures.resolve(future, CustomLossCreated(loss_id))
        return future

    def attach(self, session_id: str, batch: ForwardBackwardInput) -> ForwardBackwardInput:
        """`batch` with its stored loss, if it names one (loss_fn "custom"); a UserError otherwise."""
        if batch.loss_fn != "custom":
            return batch
        loss_id = batch.loss_fn_config.get("loss_id")
        if set(batch.loss_fn_config) != {"loss_id"} or not isinstance(loss_id, str):
            raise UserError('loss_fn "custom" takes loss_fn_config {"loss_id": <the id create_custom_loss gave>}')
        with self._lock:
            loss = self._losses.get(loss_id)
        if loss is None or loss.session_id != session_id:
            raise UserError(f"unknown loss_id {loss_id!r} for this session: create the loss with "
                            "ServiceClient.create_custom_loss in the session that trains with it")
        return replace(batch, custom_loss=loss)

    def usage(self) -> dict[str, int]:
        """{owner: custom losses held}."""
        with self._lock:
            held: dict[str, int] = {}
            for owner in self._owners.values():
                held[owner] = held.get(owner, 0) + 1
            return held

    def forget_session(self, owner: str, session_id: str) -> None:
        with self._lock:
            for loss_id in [k for k, v in self._losses.items() if v.session_id == session_id]:
                del self._losses[loss_id]
                self._owners.pop(loss_id, None)
