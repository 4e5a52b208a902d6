"""Schemathesis fuzzes a live tx server from its own OpenAPI spec: no 5xx, no hang, every status documented.

The fuzzer is a tenant of its own (FUZZ_KEY), given a session, a run and checkpoints to find: schemathesis
reuses the ids it reads in responses (GET /sessions lists the key's sessions) as path parameters, so with the
key the other tests use it finished their live sessions (POST /sessions/{id}/finish) and unloaded their runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tinker import types

from txserver import TxServer

MIN_CASES = 500
FUZZ_KEY = "tml-fuzzer"


@pytest.mark.slow
def test_fuzzing_the_spec_finds_no_server_error(server: TxServer, tmp_path: Path) -> None:
    with server.client() as bystander, server.client(FUZZ_KEY) as own:
        others = bystander.create_lora_training_client("tiny-qwen3", rank=4).result()  # another tenant's run
        mine = own.create_lora_training_client("tiny-qwen3", rank=4).result()  # ids for the fuzzer to find
        mine.save_state("fuzz-state").result()
        mine.save_weights_for_sampler("fuzz-sampler").result()
        run, summary = fuzz(server, FUZZ_KEY, tmp_path)
        # the other tenant's session is still live and its run still loaded
        others.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert summary["failures"] == [] and summary["errors"] == [], run.stdout[-6000:]
    assert summary["test_cases"]["generated"] >= MIN_CASES
    assert summary["operations"]["tested"] == summary["operations"]["total"]
    assert run.returncode == 0, run.stdout[-6000:]


def fuzz(server: TxServer, api_key: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """One schemathesis run against `server` with `api_key`: the process and its JSON report."""
    report = tmp_path / "schemathesis.json"
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json",
        "--header", f"X-API-Key: {api_key}",
        "--checks", "not_a_server_error,status_code_conformance",
        "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "1", "--no-shrink",
        "--request-timeout", "20",  # a hang is a failed case, not a stuck test
        # path ids with a pattern make Hypothesis filter many candidates; that is a generator limit, not an API fault
        "--suppress-health-check", "filter_too_much",
        "--report", "json", "--report-json-path", str(report),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_hooks",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)  # its cache too
    return run, json.loads(report.read_text())
