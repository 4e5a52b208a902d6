"""The embedded engine: a transformers causal LM in its own process, serving `tx.inference.protocol`.

Start it with `python -m tx.inference.engines.embedded` and an `EmbeddedEngineConfig` in the environment
(`config.to_env()`); it writes its URL to `config.ready_file` once it serves. See `process.spawn_engine` and
`process.wait_ready`.
"""

from tx.inference.engines.embedded.config import EmbeddedEngineConfig, read_ready_file

__all__ = ["EmbeddedEngineConfig", "read_ready_file"]
