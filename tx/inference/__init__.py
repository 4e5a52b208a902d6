"""Inference: the engines that serve `sample`, grouped by side of the engine contract.

- `protocol/`: the contract every engine serves (HTTP, pydantic; `stream.py`: the stream route's lines); both
  sides import it.
- `engines/`: the engines themselves (embedded, vLLM), the app that serves the contract, `tx engine serve`.
  Engines import `protocol`, `weight_sync` and the ground floor, never `launch` or `manager`.
- `launch/`: where engines run (local processes, Ray actors); imports `engines` (their kinds and configs).
- `manager/`: tx's side: the `EngineManager` façade the services call, and its parts (lifecycle, versions,
  publisher, supervisor, routing, the HTTP client, external engines); imports `launch`, `protocol`,
  `weight_sync`, never an engine's code.
- `weight_sync/`: weight transfer between the trainer (sender) and the engines (receivers); imports only the
  ground floor.

The floors are written down in docs/architecture.md; tests/test_imports.py holds the code to them.
"""
