"""The real `tinker` CLI against tx, in subprocesses with TINKER_BASE_URL and TINKER_API_KEY: models,
runs, checkpoints (list, info, set-ttl, publish, unpublish, download, delete), session export-trace.

Importing the SDK costs seconds on a busy machine, so most commands run in ONE subprocess that
calls the CLI's own click entry point once per command (`tinker_cli_batch`); the headline
download runs through the installed `tinker` executable itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from conftest import Trained
from peft import PeftModel
from transformers import AutoModelForCausalLM

from reference_logprobs import token_logprobs
from txserver import TxServer

TINKER = str(Path(sys.executable).parent / "tinker")
BATCH = r"""
import contextlib, io, json, sys
from tinker.cli.__main__ import main_cli
results = []
for args in json.loads(sys.argv[1]):
    out, err, rc = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main_cli.main(args=["-f", "json", *args], prog_name="tinker", standalone_mode=False)
        except SystemExit as exc:
            rc = exc.code or 0
        except Exception as exc:
            rc, _ = 1, err.write(f"{type(exc).__name__}: {exc}")
    results.append({"args": args, "rc": rc, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(results))
"""


def tinker_cli_batch(server: TxServer, commands: list[list[str]], cwd: Path) -> list[Any]:
    """Each command's JSON output (None where it prints nothing), all run by one subprocess."""
    done = subprocess.run([sys.executable, "-c", BATCH, json.dumps(commands)], env=_env(server), cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for r in results:
        assert r["rc"] == 0, f"tinker {' '.join(r['args'])}: {r['err']}"
    return [json.loads(r["out"]) if r["out"].strip() else None for r in results]


def _env(server: TxServer) -> dict[str, str]:
    return {**os.environ, **server.client_env()}


def assert_adapter_reproduces_the_trainer(server: TxServer, trained: Trained, adapter: Path) -> None:
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    base = AutoModelForCausalLM.from_pretrained(server.data_dir / "models" / "tiny-qwen3", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    tokens = trained.tokens
    np.testing.assert_allclose(token_logprobs(model, tokens[:1], tokens[1:]), trained.trainer_logprobs(), atol=1e-5)


def test_cli_commands(server: TxServer, trained: Trained, tmp_path: Path) -> None:
    run, state = trained.tc.model_id, trained.state_path
    external = trained.tc.save_weights_external("cli").result().path
    doomed = trained.tc.save_state("cli-doomed").result().path
    session = run.split(":")[0]
    out = tinker_cli_batch(server, [
        ["model", "list"], ["run", "list", "--limit", "0"], ["run", "info", run],
        ["checkpoint", "list", "--run-id", run], ["checkpoint", "list"],
        ["checkpoint", "set-ttl", state, "--ttl", "7200"], ["checkpoint", "publish", state],
        ["checkpoint", "info", state],
        ["checkpoint", "unpublish", state], ["checkpoint", "set-ttl", state, "--remove"],
        ["checkpoint", "info", state],
        ["checkpoint", "download", external, "--output", "downloads"],
        ["checkpoint", "delete", doomed, "--yes"],
        ["session", "export-trace", session, "--output", "trace.pftrace"],
    ], cwd=tmp_path)
    models, runs, run_info, run_checkpoints, all_checkpoints = out[:5]
    assert "tiny-qwen3" in json.dumps(models) and run in json.dumps(runs)
    assert run_info["training_run_id"] == run and run_info["base_model"] == "tiny-qwen3"
    # the key's whole list pages newest first: the export just saved is on its first page, whatever other
    # tests of this session saved before (the run's own state may be pages down)
    assert state in json.dumps(run_checkpoints) and external in json.dumps(all_checkpoints)
    published, plain = json.dumps(out[7]), json.dumps(out[10])
    assert '"public": true' in published and '"expires_at": null' not in published
    assert '"public": false' in plain and '"expires_at": null' in plain
    assert_adapter_reproduces_the_trainer(server, trained, tmp_path / out[11]["destination"])
    listed = [c.tinker_path for c in trained.rest.list_checkpoints(run).result().checkpoints]
    assert doomed not in listed and state in listed
    trace = json.loads((tmp_path / "trace.pftrace").read_text())
    assert any(e.get("name") == "ForwardBackward" for e in trace["traceEvents"])


def test_tinker_checkpoint_download_of_training_weights(server: TxServer, trained: Trained, tmp_path: Path) -> None:
    """`tinker checkpoint download tinker://.../weights/...`: the CLI loads the state into a new run,
    exports it (save_weights_external), downloads the signed URLs and deletes the export."""
    done = subprocess.run([TINKER, "-f", "json", "checkpoint", "download", trained.state_path, "-o", str(tmp_path)],
                          env=_env(server), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_adapter_reproduces_the_trainer(server, trained, Path(json.loads(done.stdout)["destination"]))
    assert not any(c.checkpoint_type == "external" and c.checkpoint_id.endswith("/download")
                   for c in trained.rest.list_user_checkpoints(limit=1000).result().checkpoints)
