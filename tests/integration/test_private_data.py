"""The data directory is private, and no `tx/` folder in the server's working directory shadows the code
of its engines (docs/security.md#the-data-directory, docs/security.md#engine-code)."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sampling_options import sampled_in_full
from tinker import types
from txserver import TxServer


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """A server started as `tx serve --data-dir ./tx`: its data directory (holding `models/`) is a `tx`
    folder in its working directory, which a Python that puts the working directory first on its path takes
    for tx's own code (`tx.models` there has no `attention`). The empty `__init__.py` makes it shadow a
    non-editable install too. The data directory existed, open to others, before the server started."""
    work = tmp_path_factory.mktemp("tx-private")
    data = work / "tx"
    (data / "models").mkdir(parents=True)
    (data / "__init__.py").write_text("")
    data.chmod(0o755)
    with TxServer(data, cwd=work) as srv:
        yield srv


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_engine_starts_and_samples_beside_a_tx_folder(shadowed: TxServer) -> None:
    with shadowed.client() as service:
        sampler = service.create_sampling_client(base_model="tiny-qwen3")
        prompt = types.ModelInput.from_ints([1, 2, 3])
        out = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
    assert sampled_in_full(out.sequences[0], 2), out.sequences
    assert "No module named" not in shadowed.log()


def test_the_store_and_checkpoints_are_the_owners_alone(shadowed: TxServer) -> None:
    with shadowed.client() as service:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4, seed=0).result()
        state = tc.save_state("private").result().path
    assert mode(shadowed.data_dir) == 0o700
    assert "made 0700" in shadowed.log()
    stores = [p for p in shadowed.data_dir.iterdir() if p.name.startswith("tx.db")]
    assert stores and all(mode(p) == 0o600 for p in stores), {p.name: oct(mode(p)) for p in stores}
    run, _, name = state.removeprefix("tinker://").split("/", 2)
    saved = [p for p in (shadowed.data_dir / "checkpoints" / run).rglob("*") if p.is_file()]
    assert saved, state
    assert all(mode(p) == 0o600 for p in saved), {str(p): oct(mode(p)) for p in saved}
