"""tx's side of the engine contract: the `EngineManager` façade (`facade.py`) and its parts.

Imports `launch` (the `Launcher` seam), `protocol` and `weight_sync`; never an engine's own code. Each part
opens with what it owns; `facade.py` lists them.
"""

from tx.inference.manager.facade import EngineManager
from tx.inference.manager.groups import EngineSettings

__all__ = ["EngineManager", "EngineSettings"]
