"""scripts/gpu/prepare.sh, the wheelhouse a GPU machine without network runs tx from
(docs/operations.md#gpu-checks): built here for this Python, it must make tx work over a stand-in for the GPU
image.

The stand-in is a fresh venv holding what the image provides: the CPU torch (for the image's CUDA one) and the
packages the script left to the image (its `image.txt`). The script's install line (`install.sh`, with the
wheelhouse and its --site in temporary folders) then puts the wheels on PYTHONPATH with the checkout itself,
as on the GPU machine; `pip check` must find nothing broken, and tx must import (the API, the torch backend,
the tinker SDK) from there and write a tiny model. Needs PyPI: skipped when pip cannot reach it.

The whole (~2-3 min on a 2-core box: resolving, downloading ~35 MiB, torch into the venv) starts niced as soon
as this test is collected (tests/background.py) and the test waits for its result.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import background
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
VERSION = "%d.%d" % sys.version_info[:2]
# What pip prints when it cannot reach an index (name resolution, refused or broken connections, proxies).
OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                     r"resolution|Network is unreachable|Name or service not known|ProxyError|ConnectTimeout")

CHECK = """
import json, sys
import tx, tx.cli, tx.api.app, tx.backends.torch.backend, tinker, torch, transformers, peft
print("IMPORTS " + json.dumps({m.__name__: [getattr(m, "__version__", ""), m.__file__]
                               for m in (tx, tinker, torch, transformers, peft)}))
"""

JOB = r"""
set -euo pipefail
d=$1 py=$2 version=$3
t=$SECONDS
bash scripts/gpu/prepare.sh --python "$version" --dest "$d/whl" --site "$d/site"
echo "TIMING prepare $((SECONDS - t))"
t=$SECONDS
"$py" -m venv "$d/venv"
"$d/venv/bin/python" -m pip install -q --no-compile torch==2.13.0 -r "$d/whl/image.txt"
echo "TIMING image $((SECONDS - t))"
t=$SECONDS
unset PYTHONPATH VIRTUAL_ENV
export PATH="$d/venv/bin:$PATH" HF_HOME="$d/hf"
source "$d/whl/install.sh"
python3 -m pip check  # the carried wheels' needs met by what was left to the image, and theirs by the wheels
echo "TIMING install $((SECONDS - t))"
t=$SECONDS
python3 -c "$4"
python3 -m tx.cli models make-tiny Qwen/Qwen3-0.6B --out "$d/tiny"
echo "TIMING checks $((SECONDS - t))"
"""


def prepare_and_install(directory: Path) -> background.Job:
    return background.Job(["bash", "-c", JOB, "job", str(directory), sys.executable, VERSION, CHECK],
                          cwd=ROOT, timeout_s=900)


BACKGROUND_JOBS = {"gpu_prepare": prepare_and_install}


@pytest.mark.slow
def test_wheelhouse_makes_tx_work_over_a_stand_in_for_the_gpu_image() -> None:
    run = background.result("gpu_prepare")
    output = run.stdout + run.stderr
    offline = OFFLINE.search(output)
    if run.returncode != 0 and offline:
        pytest.skip(f"pip cannot reach its index ({offline.group(0)})")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-4000:]
    d = run.directory
    timings = dict(re.findall(r"^TIMING (\w+) (\d+)$", run.stdout, re.M))
    print("gpu_prepare stages, s:", timings)

    size = re.search(r"^prepare\.sh: (\d+) wheels, ([\d.]+) MiB", run.stdout, re.M)
    assert size, run.stdout[-4000:]
    assert float(size.group(2)) <= 48
    wheels = {w.name.split("-")[0].lower() for w in (d / "whl").glob("*.whl")}
    assert {"transformers", "peft", "fastapi", "pydantic", "sqlalchemy", "tinker", "pyrage"} <= wheels
    assert not {w for w in wheels if re.match(r"torch|triton|nvidia|cuda", w)}, wheels
    line = (d / "whl" / "install.sh").read_text().splitlines()[-1]
    assert line.startswith("python3 -m pip install -q --no-index --no-deps ") and f"--target {d}/site" in line

    found = re.search(r"^IMPORTS (.*)$", run.stdout, re.M)
    assert found, run.stdout[-4000:]
    imports = json.loads(found.group(1))
    assert imports["tx"][1] == str(ROOT / "tx" / "__init__.py")  # the checkout, as on the GPU machine
    pins = {(req := Requirement(dep)).name: req.specifier
            for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    for name in ("transformers", "peft"):  # tx's versions (the image has others), carried
        assert pins[name].contains(imports[name][0]), (name, imports[name], pins[name])
        assert imports[name][1].startswith(f"{d}/site/"), imports[name]
    assert imports["tinker"][1].startswith(f"{d}/site/")
    assert imports["torch"][1].startswith(f"{d}/venv/")  # the image's own, never carried
    assert (d / "tiny" / "model.safetensors").is_file() and (d / "tiny" / "tokenizer.json").is_file()
