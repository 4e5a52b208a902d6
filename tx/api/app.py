"""create_app(settings): the HTTP face of tx. Its lifespan builds and supervises the service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import FastAPI

from tx.api.auth import KeyChecker, OperatorChecker, TokenIssuer, labels_by_owner
from tx.api.console_engines import EngineRates
from tx.api.console_metrics import MetricsCache
from tx.api.context import Context, Runtime
from tx.api.errors import install_error_handlers
from tx.api.hosts import HostCheck, allowed_host_names
from tx.api.limits import BodyLimit
from tx.api.metrics import Metrics, MetricsMiddleware
from tx.api.routes import (
    audit,
    checkpoints,
    client,
    console,
    console_pages,
    copies,
    custom_losses,
    downloads,
    futures,
    identity,
    imports,
    merges,
    oai,
    runs,
    sampling,
    sessions,
    training,
)
from tx.api.routes import metrics as metrics_route
from tx.api.sequencing import reject_seq_of_invalid_body
from tx.backends import create_backend
from tx.backends.torch.export import merge_into_base
from tx.config import Settings, make_private_dir
from tx.config.sections import EngineSection
from tx.core.audit import AuditTrail
from tx.core.checkpoints.downloads import DownloadSigner
from tx.core.checkpoints.files import CheckpointFiles
from tx.core.checkpoints.merges import ServerMerges
from tx.core.console import ConsoleViews
from tx.core.engine_check import TrainerReference
from tx.core.futures import FutureRegistry
from tx.core.sampling.admission import SampleAdmission
from tx.core.sampling.prompts import PromptWorkers
from tx.core.sampling.service import SamplingService
from tx.core.sampling.text import TextSampling
from tx.core.scheduler import Scheduler
from tx.core.services import build_services
from tx.core.views import RunViews
from tx.cpu import ThreadBudget, split_threads
from tx.inference.engines.kinds import engine_kind
from tx.inference.launch import Launcher
from tx.inference.launch.build import build_launcher
from tx.inference.manager import EngineManager, EngineSettings
from tx.inference.manager.external import ExternalEngine, ExternalEngineError, check_at_startup
from tx.models.auto import is_vision_language
from tx.models.fingerprint import model_provenance
from tx.models.serve import resolve_served_models, tokenizer_id_for
from tx.multimodal import ImageInputs
from tx.store.store import Store
from tx.types import MAX_SAMPLES_PER_REQUEST

logger = logging.getLogger(__name__)
TRAINING_STOP_WAIT_S = 2.0  # at shutdown, the training step in flight gets this long to end (the thread is a daemon)


def build_manager(engines: EngineSection, models: dict[str, Path], loop: asyncio.AbstractEventLoop,
                  trainer_device: str, launcher: Launcher, colocate: bool,
                  externals: list[ExternalEngine] | None = None) -> EngineManager:
    """`trainer_device`: where the trainer runs (the backend's `training_device()`); it picks the weight
    transport to each engine (gloo, NCCL, CUDA IPC). `externals`: engines started by someone else, checked."""
    engine_settings = EngineSettings.build(engines, colocate=colocate, trainer_device=trainer_device,
                                           self_check=engine_kind(engines.kind).checked_by_trainer)
    manager = EngineManager(models, engine_settings, launcher, externals or [])
    manager.bind(loop)
    return manager


def trainer_placement(launcher: Launcher, loop: asyncio.AbstractEventLoop) -> Callable[[int], dict] | None:
    """With Ray, where trainer worker `rank` goes (asked of the launcher on the server's loop, from the
    training thread); None for local engines (trainer workers are then local processes)."""
    trainer_options = getattr(launcher, "trainer_options", None)
    if trainer_options is None:
        return None
    return lambda rank: asyncio.run_coroutine_threadsafe(trainer_options(rank), loop).result()


def sample_admission(settings: Settings, models: dict[str, Path]) -> SampleAdmission:
    """Samples' checks and fair-share turns: num_samples within the engines' batch, and twice that per engine in
    flight at a base model's engines (`--sampling-dispatch-rows` overrides it)."""
    engines = settings.engines
    batch_rows = engine_kind(engines.kind).batch_rows
    count = max(1, engines.managed_count(bool(engines.urls)) + len(engines.urls))
    dispatch = settings.sampling_dispatch_rows or 2 * batch_rows * count
    return SampleAdmission(settings.sampling_max_queue, settings.quotas, dispatch_rows=dispatch,
                           max_num_samples=min(batch_rows, MAX_SAMPLES_PER_REQUEST),
                           takes_images=lambda name: is_vision_language(models[name]))


def checkpoint_files(root: Path) -> CheckpointFiles:
    files = CheckpointFiles(root)
    if swept := files.sweep():
        logger.warning("removed %d checkpoint directories left by an interrupted save", swept)
    return files


def thread_budget(settings: Settings, num_engines: int) -> ThreadBudget:
    """The CPU threads of this machine's trainer and engines (`tx/cpu.py`): Ray places engines itself."""
    local_engines = num_engines if settings.engines.ray_address is None else 0
    return split_threads(settings.cpu_threads, local_engines, trainer=settings.trainer.threads,
                         engine=settings.engines.threads)


def shares_passes(settings: Settings, training_device: str) -> bool:
    """Whether runs' ready calls share training passes: the `shared_pass` setting; auto is on with CUDA only
    (on CPU a larger pass costs more per token: docs/operations.md#shared-passes)."""
    choice = settings.trainer.shared_pass
    return choice == "on" or (choice == "auto" and training_device.startswith("cuda"))


def build_context(settings: Settings, loop: asyncio.AbstractEventLoop) -> tuple[Context, Runtime]:
    make_private_dir(settings.data_dir)
    models = resolve_served_models(settings)
    engines = settings.engines
    externals = check_at_startup(engines.urls, engines.secret_value(), models,  # before the slow parts
                                 engines.max_adapters)
    images = ImageInputs.from_section(settings.images, settings.audio)
    colocate = engines.resolved_colocate()
    with_external = {e.base_model for e in externals}
    num_engines = sum(engines.managed_count(name in with_external) for name in models)
    managed = [path for name, path in models.items() if engines.managed_count(name in with_external)]
    budget = thread_budget(settings, num_engines)
    launcher = build_launcher(engines, settings.trainer, work_dir=settings.data_dir / "engines",
                              num_engines=num_engines, colocate=colocate, model_dirs=managed,
                              threads=budget.engine)
    backend = create_backend(models, settings.trainer, image_limits=images.limits, audio_limits=images.audio,
                             ray_options=trainer_placement(launcher, loop), threads=budget.total)
    store = Store.from_url(settings.store_url)
    futures_ = FutureRegistry(loop, settings.future_ttl_s)
    scheduler = Scheduler(futures_, settings.seq_gap_timeout_s, share=shares_passes(settings, backend.training_device()))
    manager = build_manager(engines, models, loop, backend.training_device(), launcher, colocate, externals)
    files = checkpoint_files(settings.checkpoints_dir)
    signer = DownloadSigner.from_data_dir(settings.data_dir, settings.download_link_ttl_s)
    audit = AuditTrail(store, settings.audit_max_entries, settings.audit_retention_days * 86400)
    core = build_services(store, backend, futures_, scheduler, files, signer, engines=manager,
                          training_lease=manager.training_pass, versions_kept=engines.versions_kept,
                          limits=settings.quotas, audit=audit,
                          trainer_threads=lambda: budget.trainer_threads(bool(manager.engine_processes())),
                          provenance={name: model_provenance(path) for name, path in models.items()})
    manager.reference = TrainerReference(backend, futures_, scheduler)
    logger.info("CPU threads: %d; the trainer's %d while a local engine runs; each local engine's %d",
                budget.total, budget.trainer, budget.engine)
    sampling = SamplingService(store, futures_, manager, settings.sampling_max_queue, core.records, images,
                               access=core.samplers.check_access, admission=sample_admission(settings, models))
    views = RunViews(store, core.base_models.info, {n: tokenizer_id_for(n, p) for n, p in models.items()})
    text = TextSampling(core.samplers, sampling, models, PromptWorkers(models, settings.prompt_workers))
    logger.info("serving base models: %s", ", ".join(f"{n} ({p})" for n, p in models.items()))
    logger.info("data directory: %s; store: %s", settings.data_dir, _redact(settings.store_url))
    ctx = Context(
        settings=settings, sessions=core.sessions, runs=core.runs, views=views, training=core.training,
        sequencer=core.sequencer, checkpoints=core.checkpoints, catalog=core.catalog, copies=core.copies,
        imports=core.imports,
        merges=ServerMerges(core.catalog, futures_, models, merge_into_base, settings.quotas),
        samplers=core.samplers,
        sampling=sampling, text=text, base_models=core.base_models,
        custom_losses=core.custom_losses, records=core.records, audit=core.audit, futures=futures_,
        manager=manager,
        console=ConsoleViews(store, scheduler, futures_),
    )
    return ctx, Runtime(store, backend, scheduler, core.recorder)


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            ctx, runtime = build_context(settings, asyncio.get_running_loop())
        except Exception as exc:
            app.state.startup_error = exc  # `tx serve` prints it as one line (tx/cli.py), the traceback with --debug
            if isinstance(exc, ExternalEngineError):
                logger.error("tx cannot start: %s", exc)  # one line per engine, each naming its URL
            raise
        app.state.ctx = ctx
        metrics.watch(ctx, runtime.scheduler)
        runtime.scheduler.start()
        janitor = asyncio.create_task(_janitor(ctx))
        try:
            yield
        finally:
            janitor.cancel()
            try:  # the training thread off the loop (it may be waiting on the loop), the engines meanwhile
                await asyncio.gather(asyncio.to_thread(runtime.scheduler.stop, TRAINING_STOP_WAIT_S),
                                     ctx.manager.close())
                runtime.backend.close()
                ctx.merges.close()
                ctx.text.close()
                logger.info("training and engines stopped")
            finally:
                runtime.recorder.close()  # the last steps' metrics, before the store goes
                runtime.store.close()

    app = FastAPI(title="tx", lifespan=lifespan)
    make_private_dir(settings.data_dir)  # before the token key is written in it
    tokens = TokenIssuer.from_data_dir(settings.data_dir, settings.jwt_ttl_s) if settings.jwt_auth else None
    app.state.key_checker = keys = KeyChecker(settings.api_keys, settings.operator_keys, tokens)
    app.state.operator_checker = OperatorChecker(settings.api_keys, keys)
    app.state.key_labels = labels_by_owner(settings.key_labels)
    app.state.metrics = metrics = Metrics()
    app.state.settings = settings
    app.state.engine_rates = EngineRates()
    app.state.metrics_cache = MetricsCache()
    # checkpoints before runs: its .../{checkpoint_id:path}/publish routes must match first
    for module in (client, identity, audit, sessions, training, custom_losses, futures, checkpoints, copies,
                   imports, merges, runs, sampling, downloads, console):
        app.include_router(module.router, prefix="/api/v1")
    if settings.console:
        app.include_router(console_pages.router)
    app.include_router(oai.router, prefix="/oai/api/v1")
    app.include_router(metrics_route.router)
    install_error_handlers(app, on_invalid=reject_seq_of_invalid_body)
    app.add_middleware(BodyLimit, max_json_bytes=settings.max_json_bytes,
                       max_request_bytes=settings.max_request_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    allowed_hosts = allowed_host_names(settings)
    if allowed_hosts is not None:  # outermost: a rebound page's request is answered before anything reads it
        app.add_middleware(HostCheck, allowed=allowed_hosts)
    return app


async def _janitor(ctx: Context) -> None:
    """Drop old futures, expired checkpoints and stability records, and sessions that stopped heartbeating."""
    while True:
        await asyncio.sleep(ctx.settings.janitor_interval_s)
        try:
            ctx.futures.expire()
            await asyncio.to_thread(ctx.catalog.delete_expired)
            await asyncio.to_thread(ctx.records.delete_expired)
            await asyncio.to_thread(ctx.sessions.reap_stale, ctx.settings.session_timeout_s)
            await asyncio.to_thread(ctx.audit.prune)
        except Exception:  # noqa: BLE001 - the janitor must never die
            logger.exception("janitor pass failed")


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url

