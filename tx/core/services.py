"""The training side's use cases, wired together over one store, backend, futures and scheduler (the API's
lifespan and the in-process tests build them the same way; `tx/api/app.py` adds sampling and engines)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tx.backends.base import TrainingBackend
from tx.core.audit import AuditTrail
from tx.core.base_models import BaseModels
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.checkpoints.copies import WeightCopies
from tx.core.checkpoints.downloads import DownloadSigner
from tx.core.checkpoints.files import CheckpointFiles
from tx.core.checkpoints.imports import AdapterImports
from tx.core.checkpoints.writer import CheckpointWriter, SamplerEngines
from tx.core.custom_losses import CustomLosses
from tx.core.futures import FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.run_metrics import MetricsRecorder
from tx.core.runs import RunService
from tx.core.sampling.records import StabilityRecords
from tx.core.sampling.samplers import Samplers
from tx.core.scheduler import Scheduler
from tx.core.sequencing import Lease, Sequencer
from tx.core.sessions import SessionService
from tx.core.training import TrainingCalls
from tx.models.fingerprint import ModelProvenance
from tx.store.store import Store


@dataclass
class Services:
    sessions: SessionService
    runs: RunService
    training: TrainingCalls
    sequencer: Sequencer
    checkpoints: CheckpointWriter
    catalog: CheckpointCatalog
    copies: WeightCopies
    imports: AdapterImports
    samplers: Samplers
    base_models: BaseModels
    custom_losses: CustomLosses
    recorder: MetricsRecorder
    records: StabilityRecords
    audit: AuditTrail


def build_services(store: Store, backend: TrainingBackend, futures: FutureRegistry, scheduler: Scheduler,
                   files: CheckpointFiles, signer: DownloadSigner, *, engines: SamplerEngines | None = None,
                   training_lease: Lease | None = None, versions_kept: int = 8,
                   limits: QuotaLimits | None = None, audit: AuditTrail | None = None,
                   trainer_threads: Callable[[], int] | None = None,
                   provenance: Mapping[str, ModelProvenance] | None = None) -> Services:
    """`engines`: where sampler saves go (the engine manager; None: nowhere). `training_lease`: held around
    each training pass (the manager's, which puts colocated engines to sleep). `limits`: every key's quotas.
    `trainer_threads`: the trainer's CPU threads now (`tx/cpu.py`; None: the backend keeps its own).
    `provenance`: each served base model's revision and fingerprint, recorded with every run and checked when a
    checkpoint is loaded (None: unknown, neither recorded nor checked)."""
    limits = limits or QuotaLimits()
    base_models = BaseModels(backend, provenance)
    catalog = CheckpointCatalog(store, files, signer, engines, audit or AuditTrail(store))
    custom_losses = CustomLosses(store, futures, backend, limits)
    runs = RunService(store, backend, futures, scheduler, catalog, base_models, limits)
    sequencer = Sequencer(store, futures, scheduler, limits)
    recorder = MetricsRecorder(store.metrics)
    records = StabilityRecords(store)
    return Services(
        sessions=SessionService(store, futures, signer, on_finish=[custom_losses, runs, records], limits=limits),
        runs=runs,
        training=TrainingCalls(sequencer, backend, custom_losses, catalog, records, training_lease, recorder,
                               trainer_threads, base_models),
        sequencer=sequencer,
        checkpoints=CheckpointWriter(sequencer, backend, files, engines, versions_kept, catalog.audit),
        catalog=catalog,
        copies=WeightCopies(store, catalog, limits),
        imports=AdapterImports(store, backend, futures, scheduler, files, base_models, limits, catalog.audit),
        samplers=Samplers(store, catalog, base_models, engines),
        base_models=base_models,
        custom_losses=custom_losses,
        recorder=recorder,
        records=records,
        audit=catalog.audit,
    )
