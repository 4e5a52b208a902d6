"""The torch trainer on N worker processes in one torch.distributed group (FSDP2), local or on Ray.

`create_workers_backend` builds the API process's side (`backend.WorkersBackend`); each worker runs
`worker.py` and hosts runs sharded by `sharded.py`; `group.py` starts local worker processes.
"""

from __future__ import annotations

import os
from pathlib import Path

from tx.backends.torch.workers.backend import WorkersBackend
from tx.backends.torch.workers.group import LocalWorkers, start_group
from tx.multimodal import ImageLimits


def create_workers_backend(
    models: dict[str, Path],
    size: int,
    *,
    device: str = "auto",
    image_limits: ImageLimits | None = None,
    threads: int = 0,
) -> WorkersBackend:
    """`size` local worker processes; on CPU each gets an equal share of the cores unless `threads` is set."""
    threads = threads or max(1, (os.cpu_count() or 1) // size)
    return WorkersBackend(
        models,
        lambda: start_group(LocalWorkers(size, models, device, threads), "127.0.0.1"),
        image_limits=image_limits,
    )
