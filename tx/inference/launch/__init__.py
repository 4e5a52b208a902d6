"""Where engines run: the `Launcher` seam (`base.py`), local child processes (`local.py`, the default), Ray
actors (`ray_launcher.py`, `ray_actor.py`, behind the [ray] extra), the one way every launcher runs an
engine process (`process.py`), and the launcher the settings ask for (`build.py`). Imports `engines` (kinds
and configs), `tx.ray` and `tx.config`; never `manager`.
"""

from tx.inference.launch.base import EngineHandle, Launcher
from tx.inference.launch.local import LocalLauncher

__all__ = ["EngineHandle", "Launcher", "LocalLauncher"]
