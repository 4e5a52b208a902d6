"""Run unchanged tinker-cookbook recipes against a real tx server, offline (docs/cookbook.md).

The pieces, shared by the cookbook tests (chat_sl, math_rl, vlm_classifier):

- `CookbookFixture`: one directory that is both the recipes' working directory and their offline world:
      <root>/hf/        HF_HOME: tiny random models + tokenizers under hub names (`tx models make-tiny`)
      <root>/runs/      TINKER_COOKBOOK_RUNS_DIR and the default home of `log_path`s
      <root>/<org>/<name>/   datasets as local folders: `datasets.load_dataset("<org>/<name>")` takes its
                        local-directory branch when that relative path exists in the cwd
                        (docs/cookbook.md#datasets-offline)
  `add_model(name)` files one more hub name; `dataset_dir(hub_id)` is where a dataset folder goes.
- `start_tx_server(fixture, data_dir)`: `tx serve --base-model <each model>` with the SAME HF_HOME, so the
  server and the cookbook load the same tokenizer by name
  (docs/cookbook.md#tokenizers-and-models-offline).
- `run_recipe(module, overrides, ...)`: `python -m <module> key=value ...` as a subprocess, stdin=/dev/null
  (an interactive prompt fails fast: docs/cookbook.md#pointing-a-recipe-at-tx), cwd = fixture root, a hard
  timeout, output to a log file that is printed (with the server log's tail) when it fails.
- `RecipeRun.metrics()` / `.checkpoints()`: the rows of metrics.jsonl and checkpoints.jsonl
  (docs/cookbook.md#what-a-recipe-writes).

Evaluation is whatever the overrides say: pass e.g. `eval_every=0` to keep a recipe from sampling, or a
positive `eval_every` (and a test split) to turn its evaluators on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txserver import TxServer

DEFAULT_MODEL = "Qwen/Qwen3-8B"
REPO_ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = "run scripts/install_cookbook.sh in the venv"


def recipe_test_marks() -> list:
    """Marks for a cookbook recipe test module: slow, and skipped without tinker_cookbook."""
    import pytest

    return [pytest.mark.slow,
            pytest.mark.skipif(not cookbook_available(), reason=f"tinker_cookbook is not installed ({INSTALL_HINT})")]


def cookbook_available() -> bool:
    """Whether tinker_cookbook can be imported (without importing it)."""
    return importlib.util.find_spec("tinker_cookbook") is not None


def cookbook_example_data(name: str = "conversations.jsonl") -> Path:
    """A file from the example_data folder the cookbook wheel ships (e.g. 128 chat conversations)."""
    spec = importlib.util.find_spec("tinker_cookbook")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"tinker_cookbook is not installed ({INSTALL_HINT})")
    return Path(next(iter(spec.submodule_search_locations))) / "example_data" / name


def offline_env(hf_home: Path) -> dict[str, str]:
    """Environment that keeps both tx and the cookbook off every hub."""
    return {
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TINKER_TELEMETRY": "0",
    }


@dataclass
class CookbookFixture:
    """An offline fixture root: HF cache with tiny models, runs dir, dataset folders (see module doc)."""

    root: Path
    models: list[str] = field(default_factory=list)

    @classmethod
    def create(
        cls, root: Path, models: Iterable[str] = (DEFAULT_MODEL,), preset: str | None = None
    ) -> CookbookFixture:
        fx = cls(Path(root))
        fx.root.mkdir(parents=True, exist_ok=True)
        fx.runs_dir.mkdir(parents=True, exist_ok=True)
        for name in models:
            fx.add_model(name, preset=preset)
        return fx

    @property
    def hf_home(self) -> Path:
        return self.root / "hf"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def add_model(self, name: str, preset: str | None = None, timeout_s: float = 300) -> Path:
        """File a tiny random model + tokenizer under hub name `name` (`tx models make-tiny`): of `preset`, or
        of the family the name says.

        Returns its snapshot directory. Idempotent: a name already in the cache is not rewritten.
        """
        org, repo = name.split("/")
        ref = self.hf_home / "hub" / f"models--{org}--{repo}" / "refs" / "main"
        if ref.exists():
            snapshot = ref.parent.parent / "snapshots" / ref.read_text().strip()
        else:
            cmd = [sys.executable, "-m", "tx.cli", "models", "make-tiny", name,
                   "--hf-home", str(self.hf_home), *(["--preset", preset] if preset else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, env={**os.environ, **offline_env(self.hf_home)})
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
            snapshot = Path(proc.stdout.strip().splitlines()[-1])
        if name not in self.models:
            self.models.append(name)
        return snapshot

    def dataset_dir(self, hub_id: str) -> Path:
        """Where the local stand-in for dataset `org/name` goes (created empty if missing)."""
        path = self.root / hub_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def new_log_path(self, name: str) -> Path:
        """A fresh, not-yet-existing run directory under runs/ (recipes may prompt if it exists)."""
        base = self.runs_dir / name
        path, i = base, 1
        while path.exists():
            path, i = base.with_name(f"{base.name}-{i}"), i + 1
        return path

    def env(self, server: TxServer | None = None) -> dict[str, str]:
        """The env vars a recipe needs: offline HF, runs dir, and (given a server) TINKER_*."""
        env = {**offline_env(self.hf_home), "TINKER_COOKBOOK_RUNS_DIR": str(self.runs_dir)}
        if server is not None:
            env.update(server.client_env())
        return env


def start_tx_server(fixture: CookbookFixture, data_dir: Path, args: Sequence[str] = (),
                    env: Mapping[str, str] | None = None, timeout_s: float = 120) -> TxServer:
    """`tx serve` with every fixture model as a base model, reading the fixture's HF cache offline."""
    model_args = [a for name in fixture.models for a in ("--base-model", name)]
    return TxServer(Path(data_dir), args=[*model_args, *args],
                    env={**offline_env(fixture.hf_home), **(env or {})}).start(timeout_s=timeout_s)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class RecipeRun:
    """A finished recipe process and the files it wrote."""

    module: str
    cmd: list[str]
    returncode: int
    log_path: Path | None  # the recipe's log_path (run directory), when known
    output_path: Path  # captured stdout+stderr of the process
    elapsed_s: float

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else ""

    def _run_dir(self) -> Path:
        if self.log_path is None:
            raise ValueError("this run's log_path is unknown; pass log_path= to run_recipe")
        return self.log_path

    def metrics(self) -> list[dict[str, Any]]:
        """Rows of metrics.jsonl: one per logged step ({"step": n, "train_mean_nll": ..., ...})."""
        return read_jsonl(self._run_dir() / "metrics.jsonl")

    def checkpoints(self) -> list[dict[str, Any]]:
        """Rows of checkpoints.jsonl: name, loop state, and state_path / sampler_path tinker:// URIs."""
        return read_jsonl(self._run_dir() / "checkpoints.jsonl")

    def metric_series(self, key: str) -> list[float]:
        """The values of `key` over the metrics rows that have it, in step order."""
        rows = sorted((r for r in self.metrics() if key in r), key=lambda r: r.get("step", 0))
        return [float(r[key]) for r in rows]


def _tail(text: str, n_chars: int) -> str:
    return text if len(text) <= n_chars else "...\n" + text[-n_chars:]


def format_override(key: str, value: Any) -> str:
    """chz CLI syntax: key=value (bools lower-case, None as the literal None)."""
    if isinstance(value, bool):
        value = str(value)
    return f"{key}={value}"


def run_recipe(
    module: str,
    overrides: Mapping[str, Any] | Sequence[str],
    *,
    fixture: CookbookFixture,
    server: TxServer | None = None,
    log_path: Path | None = None,
    timeout_s: float = 300,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> RecipeRun:
    """Run `python -m <module> key=value ...` offline against `server`; return the finished run.

    `overrides` is a mapping (rendered as key=value) or a ready list of CLI args. `log_path`, when given,
    is added as `log_path=...` unless the overrides set it (recipes whose config names it differently,
    e.g. vlm_classifier's experiment_dir, pass theirs in overrides and the run dir here); so are `base_url`
    (the server's) and `behavior_if_log_dir_exists=delete`, where the recipe has them. The process runs
    with stdin=/dev/null, cwd=fixture.root, in its own session, and is killed after `timeout_s`.
    With check=True a non-zero exit or a timeout raises AssertionError carrying the recipe output and the
    server log tail.
    """
    if isinstance(overrides, Mapping):
        args = [format_override(k, v) for k, v in overrides.items()]
    else:
        args = list(overrides)
    if log_path is not None and not any(a.startswith("log_path=") for a in args):
        args.append(f"log_path={log_path}")
    if server is not None and not any(a.startswith("base_url=") for a in args) and _has_field(module, "base_url"):
        args.append(f"base_url={server.url}")
    if not any(a.startswith("behavior_if_log_dir_exists=") for a in args) and _has_field(
            module, "behavior_if_log_dir_exists"):
        args.append("behavior_if_log_dir_exists=delete")  # never the interactive prompt
    cmd = [sys.executable, "-m", module, *args]

    fixture.runs_dir.mkdir(parents=True, exist_ok=True)
    stem = module.rsplit(".", 2)[-2] if module.count(".") >= 2 else module
    output_path = fixture.new_log_path(f"{stem}-output").with_suffix(".log")
    full_env = {**os.environ, **fixture.env(server), **(env or {})}
    t0 = time.monotonic()
    with open(output_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=fixture.root, env=full_env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode if proc.returncode is not None else -9
    run = RecipeRun(module, cmd, rc, Path(log_path) if log_path else None, output_path, time.monotonic() - t0)
    if check and (timed_out or rc != 0):
        why = f"timed out after {timeout_s:.0f}s" if timed_out else f"exited with {rc}"
        server_log = _tail(server.log(), 8000) if server is not None else "(no server)"
        raise AssertionError(
            f"recipe {module} {why} after {run.elapsed_s:.1f}s\ncmd: {' '.join(cmd)}\n"
            f"--- recipe output ({output_path}) ---\n{_tail(run.output(), 20000)}\n"
            f"--- tx server log (tail) ---\n{server_log}"
        )
    return run


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _has_field(module: str, name: str) -> bool:
    """Whether the recipe's CLI config has a field `name` (cheap textual check of its source)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    src = Path(spec.origin).read_text()
    return f"\n    {name}:" in src


def assert_finite(values: Iterable[float], what: str) -> None:
    vals = list(values)
    bad = [v for v in vals if not math.isfinite(v)]
    assert not bad, f"{what}: non-finite values {bad} in {vals}"


def assert_checkpoints_on_server(server: TxServer, checkpoints: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every state_path / sampler_path in checkpoints.jsonl rows is listed by the server's REST API.

    Returns the checked tinker:// paths.
    """
    import tinker

    paths = [row[k] for row in checkpoints for k in ("state_path", "sampler_path") if row.get(k)]
    assert paths, f"no tinker:// paths in checkpoints.jsonl rows: {checkpoints}"
    rest = tinker.RestClient(base_url=server.url, api_key=server.client_env()["TINKER_API_KEY"])
    listed: dict[str, set[str]] = {}
    for path in paths:
        assert path.startswith("tinker://"), path
        run_id = path.removeprefix("tinker://").split("/", 1)[0]
        if run_id not in listed:
            resp = rest.list_checkpoints(run_id).result(timeout=60)
            listed[run_id] = {c.tinker_path for c in resp.checkpoints}
        assert path in listed[run_id], (
            f"{path} not among the server's checkpoints of {run_id}: {sorted(listed[run_id])}"
        )
    return paths
