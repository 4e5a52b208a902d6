"""Ray behind the `[ray]` extra: engines (and trainer workers) as actors in placement groups.

- `placement.py`: pure placement logic (bundles, per-actor GPU fractions); no Ray import.
- `launcher.py`: `RayLauncher` (the `Launcher` seam) and `connect()`; imports Ray on import, through
  `import_ray`, which names the extra to install when Ray is missing.
- `actor.py`: `EngineActor`, which owns one engine process (of any kind, `engines/kinds.py`) on its node.
"""

from tx.inference.ray.placement import ActorPlacement, PlacementSpec

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


__all__ = ["ActorPlacement", "PlacementSpec", "import_ray"]
