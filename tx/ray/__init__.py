"""The cluster layer, behind the `[ray]` extra: the one place the trainer workers and the engine launcher
reach Ray through.

- `import_ray()`: the `ray` module, or an ImportError naming the extra to install; `connect()`: join a
  cluster or start a local one. Ray itself is imported only when one of them is called.
- `placement.py`: pure placement logic (bundles, per-actor GPU fractions); no Ray import.

Who uses it: `tx/inference/launch/ray_launcher.py` (engines as Ray actors) and
`tx/backends/torch/workers/ray_workers.py` (trainer workers). It imports only the ground floor.
"""

from tx.ray.placement import ActorPlacement, PlacementSpec

MISSING_RAY = "Ray is not installed; install it with: pip install 'tx[ray]'"


def import_ray():
    """The `ray` module, or an ImportError that names the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(MISSING_RAY) from exc
    if not hasattr(ray, "init"):  # a directory named `ray` on sys.path, not the package
        raise ImportError(MISSING_RAY)
    return ray


def connect(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
            object_store_memory: int | None = None, namespace: str = "tx") -> None:
    """Join the Ray cluster at `address` ("auto", "ray://...", "host:port"), or start a local one.

    A local Ray takes `num_cpus`, `num_gpus` (logical: a machine without GPUs may declare some, which
    is how the placement logic is tested on CPU) and `object_store_memory` (bytes; Ray's default is
    30% of RAM). No-op if this process is already connected.
    """
    ray = import_ray()
    if ray.is_initialized():
        return
    if address is not None:
        local = {"num_cpus": num_cpus, "num_gpus": num_gpus, "object_store_memory": object_store_memory}
        if any(v is not None for v in local.values()):
            raise ValueError("num_cpus, num_gpus and object_store_memory are for a local Ray, not an address")
        ray.init(address=address, namespace=namespace, log_to_driver=False)
        return
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus, object_store_memory=object_store_memory,
             namespace=namespace, include_dashboard=False, log_to_driver=False)


__all__ = ["ActorPlacement", "PlacementSpec", "connect", "import_ray"]
