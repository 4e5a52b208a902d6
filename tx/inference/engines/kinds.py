"""What an engine kind is: one `EngineKind` record per kind, the only place that lists them.

Every kind serves the same contract (`tx/inference/protocol/`) through the same app (`engines/app.py`,
`engine_app(backend)`), is run the same way (`tx/inference/launch/process.py`: `python -m <module>` with its
config as JSON in the environment, in a session of its own, ready once it wrote its ready file) and is started
by the same launchers (`tx/inference/launch/`: local processes, or Ray actors), with the Python its config
names (`EngineProcessConfig.interpreter`: the vLLM engine's runs in the vLLM environment). What differs is
here:

| kind       | config (`.config`)     | module (`.module`; its `__main__` builds the backend) | backend behind the app |
|------------|------------------------|-------------------------------------------------------|------------------------|
| `embedded` | `EmbeddedEngineConfig` | `tx.inference.engines.embedded`                       | `engine.EmbeddedEngine` |
| `vllm`     | `VllmEngineConfig`     | `tx.inference.engines.vllm`                           | `server.VllmEngine`    |

This module imports only the configs (pydantic) and vLLM's version check (no vLLM import): launchers and
`tx engine serve` read it without the engines' heavy imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from tx.config.names import EngineKindName
from tx.inference.engines.config import EngineProcessConfig
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.vllm import require_vllm
from tx.inference.engines.vllm.config import VllmEngineConfig


@dataclass(frozen=True)
class EngineKind:
    """One kind of engine: what it is called, what runs it, and what a launcher must know about it."""

    name: EngineKindName
    label: str  # how logs and errors name one ("vLLM engine")
    module: str  # `python -m <module>` runs one engine; `<module>.__main__.main(config)`: in the foreground
    config: type[EngineProcessConfig]
    startup_timeout_s: float  # how long a launcher waits for one to serve, unless told otherwise
    stop_timeout_s: float  # how long `stop` waits after SIGTERM before it SIGKILLs the engine's process group
    tensor_parallel: bool  # whether one engine may span several GPUs
    batch_rows: int  # sequences one engine decodes together (a sample's num_samples is bounded by it)
    # raises when this kind cannot run here with these config fields (at launcher start)
    check: Callable[[dict[str, Any]], object] | None = None
    standby: bool = False  # its module can start ahead and wait for its config on stdin (launch/standby.py)
    # the manager checks it against the trainer before sampling (it runs its own model code, which does not
    # check itself: tx/inference/manager/selfcheck.py)
    checked_by_trainer: bool = False

    def require(self, fields: dict[str, Any]) -> None:
        """Fail now, with a message that says what to install, when this kind cannot run on this machine with
        `fields` of its config (a launcher's engine options)."""
        if self.check is not None:
            self.check(fields)


def _vllm_installed(fields: dict[str, Any]) -> str:
    return require_vllm(fields.get("vllm_python"))


EMBEDDED = EngineKind(
    name="embedded", label="embedded engine", module="tx.inference.engines.embedded",
    config=EmbeddedEngineConfig, startup_timeout_s=300.0, stop_timeout_s=2.0, tensor_parallel=False,
    batch_rows=EmbeddedEngineConfig.model_fields["max_batch_size"].default, standby=True,
)
VLLM = EngineKind(
    name="vllm", label="vLLM engine", module="tx.inference.engines.vllm", config=VllmEngineConfig,
    startup_timeout_s=600.0, stop_timeout_s=30.0, tensor_parallel=True, check=_vllm_installed,
    batch_rows=256,  # vLLM's default --max-num-seqs
    checked_by_trainer=True,
)
ENGINE_KINDS: dict[str, EngineKind] = {kind.name: kind for kind in (EMBEDDED, VLLM)}
assert set(ENGINE_KINDS) == set(get_args(EngineKindName))


def engine_kind(name: str) -> EngineKind:
    """The kind called `name`; ValueError naming the kinds there are."""
    try:
        return ENGINE_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown engine kind {name!r}: {' or '.join(ENGINE_KINDS)}") from None


__all__ = ["EMBEDDED", "ENGINE_KINDS", "VLLM", "EngineKind", "engine_kind"]
