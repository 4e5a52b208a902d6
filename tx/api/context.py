"""What the routes reach (`Context`) and what the lifespan starts and closes (`Runtime`), built by
`app.build_context`. Its own module so that routes, dependencies and metrics import it without importing the
app that includes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tx.backends.base import TrainingBackend
from tx.config import Settings
from tx.core.audit import AuditTrail
from tx.core.base_models import BaseModels
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.checkpoints.copies import WeightCopies
from tx.core.checkpoints.imports import AdapterImports
from tx.core.checkpoints.merges import ServerMerges
from tx.core.checkpoints.writer import CheckpointWriter
from tx.core.console import ConsoleViews
from tx.core.custom_losses import CustomLosses
from tx.core.futures import FutureRegistry
from tx.core.run_metrics import MetricsRecorder
from tx.core.runs import RunService
from tx.core.sampling.records import StabilityRecords
from tx.core.sampling.samplers import Samplers
from tx.core.sampling.service import SamplingService
from tx.core.sampling.text import TextSampling
from tx.core.scheduler import Scheduler
from tx.core.sequencing import Sequencer
from tx.core.sessions import SessionService
from tx.core.training import TrainingCalls
from tx.core.views import RunViews
from tx.inference.manager import EngineManager
from tx.store.store import Store


@dataclass
class Context:
    """What the routes reach: the use cases (`tx/core`) and the read views, plus futures, and the engines for
    the operator view. The store, the backend and the scheduler sit behind them, in `Runtime`."""

    settings: Settings
    sessions: SessionService
    runs: RunService
    views: RunViews
    training: TrainingCalls
    sequencer: Sequencer
    checkpoints: CheckpointWriter
    catalog: CheckpointCatalog
    copies: WeightCopies
    imports: AdapterImports
    merges: ServerMerges
    samplers: Samplers
    sampling: SamplingService
    text: TextSampling
    base_models: BaseModels
    custom_losses: CustomLosses
    records: StabilityRecords
    audit: AuditTrail
    futures: FutureRegistry
    manager: EngineManager
    console: ConsoleViews


@dataclass
class Runtime:
    """What the lifespan starts and closes; no route reaches it."""

    store: Store
    backend: TrainingBackend
    scheduler: Scheduler
    recorder: MetricsRecorder
