"""Samplers (sampling sessions): created on a base model or on saved weights named by a tinker path (the
caller's own, or published), described, and resolved for the OpenAI-compatible routes' `model` field.
A sampler on a saved path is pinned to the newest weight version of that path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tx.core.base_models import BaseModels
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.checkpoints.writer import SamplerEngines
from tx.core.sessions import live_session
from tx.store.store import Store
from tx.store.tables import SamplingSessionRow
from tx.types import NotFoundError, UserError, sampler_id_for


@dataclass(frozen=True)
class SamplerView:
    sampler_id: str
    base_model: str
    model_path: str | None


class Samplers:
    def __init__(self, store: Store, catalog: CheckpointCatalog, base_models: BaseModels,
                 engines: SamplerEngines | None = None) -> None:
        self.store = store
        self.catalog = catalog
        self.base_models = base_models
        self._engines = engines

    def create(self, owner: str, session_id: str, seq: int, base_model: str | None,
               model_path: str | None) -> str:
        """A sampler on a base model, or on sampler (or training) weights named by a tinker path."""
        live_session(self.store, session_id, owner)
        run_id = weights_dir = None
        if model_path is not None:
            path, run = self.catalog.readable(owner, model_path, kinds=("sampler_weights", "weights"),
                                              purpose="sample")
            if base_model is not None and base_model != run.base_model:
                raise UserError(f"{model_path} was trained on {run.base_model!r}, not {base_model!r}")
            base_model, run_id = run.base_model, run.run_id
            weights_dir = str(self.catalog.files.require(path))
        if base_model is None:
            raise UserError("a sampling session needs a base_model or a model_path")
        self.base_models.info(base_model)
        sampler_id = sampler_id_for(session_id, seq)
        if weights_dir is not None and model_path is not None and self._engines is not None:
            self._engines.pin(sampler_id, Path(weights_dir), model_path)  # the newest version of that path
        self.store.create_sampling_session(SamplingSessionRow(
            sampling_session_id=sampler_id, session_id=session_id, owner=owner,
            base_model=base_model, model_path=model_path, run_id=run_id, weights_dir=weights_dir,
        ))
        return sampler_id

    def check_access(self, row: SamplingSessionRow) -> None:
        """A sampler made from a checkpoint samples only while its key may still read it: unpublished by its
        owner, or deleted, it fails (NotFoundError naming why)."""
        if row.model_path is None:
            return
        try:
            self.catalog.readable(row.owner, row.model_path, kinds=("sampler_weights", "weights"))
        except NotFoundError:
            raise NotFoundError(
                f"sampler {row.sampling_session_id!r} was made from {row.model_path}, which its owner unpublished "
                "or deleted (or which expired): it can no longer sample"
            ) from None

    def join(self, owner: str, sampler_id: str) -> int:
        """join_sampling_session: the number of a new client of the caller's sampler (an unpickled SamplingClient
        numbers its sample seq_ids from 1e9 x that number, so that no two clients' seq_ids collide)."""
        return self.store.join_sampling_session(sampler_id, owner)

    def describe(self, owner: str, sampler_id: str) -> SamplerView:
        row = self.store.get_sampling_session(sampler_id, owner)
        return SamplerView(row.sampling_session_id, row.base_model, row.model_path)

    def target(self, owner: str, model: str) -> tuple[str, Path | None]:
        """(base model, weights dir or None) for a model named by a served base model or a tinker path
        the caller may sample (its own, or published)."""
        if model.startswith("tinker://"):
            path, run = self.catalog.readable(owner, model, kinds=("sampler_weights", "weights"))
            return run.base_model, self.catalog.files.require(path)
        self.base_models.info(model)
        return model, None
