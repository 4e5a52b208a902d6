"""The base models this server serves, as the use cases ask about them (the backend knows them)."""

from __future__ import annotations

from collections.abc import Mapping

from tx.backends.base import TrainingBackend
from tx.models.fingerprint import ModelProvenance
from tx.store.tables import TrainingRunRow
from tx.types import BaseModelInfo, NotFoundError, UserError


class BaseModels:
    def __init__(self, backend: TrainingBackend, provenance: Mapping[str, ModelProvenance] | None = None) -> None:
        """`provenance`: each served model's revision and fingerprint (None or absent: unknown, nothing checked)."""
        self._backend = backend
        self._provenance = dict(provenance or {})

    def provenance(self, base_model: str) -> ModelProvenance | None:
        return self._provenance.get(base_model)

    def check_same_weights(self, run: TrainingRunRow, what: str) -> None:
        """A UserError when `run` recorded other base weights than those served now under its base model's name
        (its checkpoints were trained on them); a run recorded without a fingerprint (before migration 0009)
        passes."""
        served = self.provenance(run.base_model)
        if run.base_fingerprint is None or served is None or served.fingerprint == run.base_fingerprint:
            return
        raise UserError(
            f"{what} was trained on base model {run.base_model!r} with fingerprint {run.base_fingerprint}"
            f"{_at(run.base_revision)}, but the {run.base_model!r} served here has fingerprint {served.fingerprint}"
            f"{_at(served.revision)}: serve the weights it was trained on (--base-model {run.base_model}@<revision>)")

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


def _at(revision: str | None) -> str:
    return f" (revision {revision})" if revision else ""
