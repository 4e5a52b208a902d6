"""The embedded engine: a transformers causal LM in its own process, serving `tx.inference.protocol`.

Start it with `python -m tx.inference.engines.embedded` and an `EmbeddedEngineConfig` in the environment
(`config.to_env()`); it writes its URL to `config.ready_file` once it serves. `engines/kinds.py` says what
this kind is; `tx/inference/launch/process.py` starts one (`spawn(EMBEDDED, config)`, `wait_ready`, `stop`).
"""

from tx.inference.engines.embedded.config import EmbeddedEngineConfig, read_ready_file

__all__ = ["EmbeddedEngineConfig", "read_ready_file"]
