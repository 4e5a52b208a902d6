"""The LoRA adapters a vLLM child holds: their versions and their files, loaded and unloaded through vLLM's
runtime LoRA routes.

vLLM 0.27-0.32 loads an adapter from files only, so every push writes a new directory under `lora_dir` (the
workers write it, `worker.py`) and loads it under the adapter's name. The same name pushed again is loaded in
place (`load_inplace`): requests generating with it go on, on the new weights. The files an in-place update
replaced stay until the next update (a request that began on them names that path, should vLLM load it
again); older ones go. An adapter vLLM refuses to load (a module it takes no LoRA on) is the user's error
(`support.adapter_refused`), never a 500.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from tx.inference.engines.vllm.child import VllmChild, VllmError
from tx.inference.engines.vllm.support import adapter_refused, refuses_adapter


class LoadedAdapters:
    """What adapters the child holds (name -> version, None until the push finishes) and their files."""

    def __init__(self, child: VllmChild, lora_dir: Path) -> None:
        self.child = child
        self.lora_dir = lora_dir
        self.versions: dict[str, str | None] = {}
        self._paths: dict[str, Path] = {}
        self._retired: dict[str, Path] = {}  # an adapter's files before its last in-place update

    def new_path(self) -> Path:
        """A fresh directory name under `lora_dir` for the next push's files."""
        return self.lora_dir / f"adapter-{uuid.uuid4().hex[:12]}"

    async def load(self, name: str, path: Path) -> None:
        """Load the adapter files at `path` as `name` (in place over the one of that name, if held); its version
        is unset until the push finishes. The files go if vLLM refuses them."""
        inplace = name in self.versions  # requests generating with it go on, on the new weights
        try:
            await self.child.call("POST", "/v1/load_lora_adapter", json_body={
                "lora_name": name, "lora_path": str(path), "load_inplace": inplace})
        except BaseException as exc:
            shutil.rmtree(path, ignore_errors=True)
            if isinstance(exc, VllmError) and refuses_adapter(exc):
                raise adapter_refused(exc) from exc
            raise
        _remove(self._retired.pop(name, None))
        if name in self._paths:
            self._retired[name] = self._paths[name]
        self.versions[name] = None
        self._paths[name] = path

    async def unload(self, name: str) -> None:
        """Unload adapter `name` from the child and remove its files."""
        del self.versions[name]
        _remove(self._retired.pop(name, None))
        path = self._paths.pop(name, None)
        try:
            await self.child.call("POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})
        finally:
            _remove(path)


def _remove(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
