"""The base models this server serves, as the use cases ask about them (the backend knows them)."""

from __future__ import annotations

from tx.backends.base import TrainingBackend
from tx.types import BaseModelInfo, NotFoundError, UserError


class BaseModels:
    def __init__(self, backend: TrainingBackend) -> None:
        self._backend = backend

    def served(self) -> list[BaseModelInfo]:
        return self._backend.served_models()

    def info(self, base_model: str) -> BaseModelInfo:
        """The served base model's facts; a UserError naming the served ones if it is not served."""
        try:
            return self._backend.base_model_info(base_model)
        except NotFoundError:
            served = ", ".join(m.name for m in self._backend.served_models())
            raise UserError(f"base model {base_model!r} is not served here; served: {served}") from None

    def runs_custom_losses(self) -> bool:
        """Whether uploaded custom losses run here (client/config's custom_loss_server_side)."""
        return self._backend.runs_custom_losses()
