"""Models fetched from the hub on first use (tx/models/download.py), against a STAND-IN hub on 127.0.0.1
(tests/hub_standin.py: the real hub is not reachable from CI) that serves tiny models through the HTTP API
huggingface_hub uses. tx's code and huggingface_hub's run unchanged; only HF_ENDPOINT points at the stand-in."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
from hub_standin import HubStandIn

from tx.models import download
from tx.models.download import ModelUnavailable, fetch_model
from tx.models.resolve import resolve_model_dir
from tx.models.serve import served_name
from tx.models.tiny import write_tiny_text_model
from tx.types import NotFoundError

REPO = "Org/Tiny"
MODEL_FILES = ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny models (seeds 0 and 1): two commits of one repository. Seed 0 also carries what tx never fetches:
    pickled weights, code, a README, Mistral's consolidated copy and a subfolder."""
    root = tmp_path_factory.mktemp("hub-models")
    dirs = {seed: write_tiny_text_model(root / seed, preset="tiny", seed=int(seed)) for seed in ("0", "1")}
    for name in ("pytorch_model.bin", "modeling_tiny.py", "README.md", "consolidated.safetensors"):
        (dirs["0"] / name).write_bytes(b"not for tx")
    return dirs


@pytest.fixture
def hub(model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    with HubStandIn() as standin:
        standin.add(REPO, model_dirs["0"])
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        yield standin


def cache(tmp_path: Path) -> Path:
    return tmp_path / "hf" / "hub"


def test_downloads_only_the_model_files_with_progress_lines(
        hub: HubStandIn, model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(download, "PROGRESS_EVERY_S", 0.1)
    hub.bytes_per_s = 3e6  # ~0.5 s for the 1.4 MB of weights: progress lines while it runs
    with caplog.at_level(logging.INFO, logger="tx.models.download"):
        snapshot = resolve_model_dir(REPO)
    assert sorted(p.name for p in snapshot.iterdir()) == MODEL_FILES
    assert (snapshot / "model.safetensors").read_bytes() == (model_dirs["0"] / "model.safetensors").read_bytes()
    fetched = {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if "/resolve/" in path}
    assert fetched == set(MODEL_FILES)  # never the pickle, the code, the README or the second copy
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"downloading {REPO}: ") and "%), " in line and line.endswith("/s")
               for line in lines), lines
    assert any(line.startswith(f"downloaded {REPO} (1.6 MB)") for line in lines), lines
    hub.requests.clear()
    assert resolve_model_dir(REPO) == snapshot and hub.requests == []  # in the cache: no network


def test_a_transfer_cut_off_resumes_where_it_stopped(hub: HubStandIn, model_dirs: dict[str, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub keeps what it received in chunks of DOWNLOAD_CHUNK_SIZE (10 MB); smaller here, so that the
    # tiny model's 1.4 MB file is cut off after whole chunks, as a large shard is
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.cut_once.add("model.safetensors")
    snapshot = resolve_model_dir(REPO)
    gets = hub.file_gets("model.safetensors")
    assert gets[0] is None and len(gets) == 2 and gets[1] is not None
    assert int(gets[1].removeprefix("bytes=").rstrip("-")) >= 64 * 1024  # resumed, not restarted
    assert (snapshot / "model.safetensors").read_bytes() == (model_dirs["0"] / "model.safetensors").read_bytes()


def test_an_interrupted_download_fetches_only_what_is_missing_next_time(hub: HubStandIn, tmp_path: Path) -> None:
    hub.failing.add("model.safetensors")  # the hub fails mid-download: the start fails, one line
    with pytest.raises(ModelUnavailable, match=r"answered 500 for model 'Org/Tiny'.*try again later"):
        resolve_model_dir(REPO)
    hub.failing.clear()
    hub.requests.clear()
    snapshot = resolve_model_dir(REPO)  # the snapshot is incomplete: it is not taken as cached
    assert sorted(p.name for p in snapshot.iterdir()) == MODEL_FILES
    assert {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path} \
        == {"model.safetensors"}


def test_a_gated_repository_needs_a_token(hub: HubStandIn, model_dirs: dict[str, Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add("Org/Gated", model_dirs["1"], token="hf_standin_token")
    with pytest.raises(ModelUnavailable) as info:
        resolve_model_dir("Org/Gated")
    assert str(info.value) == (f"model 'Org/Gated' is gated on {hub.url}/Org/Gated: accept its terms on its page, "
                               "then set HF_TOKEN to a token of that account (https://huggingface.co/settings/tokens)")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ModelUnavailable, match="the token in HF_TOKEN has no access"):
        resolve_model_dir("Org/Gated")
    monkeypatch.setenv("HF_TOKEN", "hf_standin_token")
    assert (resolve_model_dir("Org/Gated") / "model.safetensors").is_file()


def test_offline_downloads_nothing(hub: HubStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotFoundError, match=r"tx is offline \(--offline or HF_HUB_OFFLINE=1\)"):
        resolve_model_dir(REPO, offline=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NotFoundError, match="tx models make-tiny Org/Tiny$"):
        resolve_model_dir(REPO)
    assert hub.requests == []


def test_a_pinned_revision_is_the_one_served(hub: HubStandIn, model_dirs: dict[str, Path]) -> None:
    old = hub.repos[REPO].branches["main"]
    hub.add(REPO, model_dirs["1"])  # main moves on
    pinned = resolve_model_dir(f"{REPO}@{old}")
    assert pinned.name == old
    assert (pinned / "model.safetensors").read_bytes() == (model_dirs["0"] / "model.safetensors").read_bytes()
    latest = resolve_model_dir(REPO)
    assert (latest / "model.safetensors").read_bytes() == (model_dirs["1"] / "model.safetensors").read_bytes()
    hub.requests.clear()
    assert resolve_model_dir(f"{REPO}@{old}") == pinned and hub.requests == []  # cached by its commit
    assert served_name(f"{REPO}@{old}") == REPO
    with pytest.raises(ModelUnavailable, match=f"model 'Org/Tiny' has no revision 'nope' on {hub.url}"):
        resolve_model_dir(f"{REPO}@nope")


def test_short_disk_is_refused_before_anything_is_written(hub: HubStandIn, tmp_path: Path) -> None:
    def faked_free_space(_directory: Path) -> int:  # a FAKED free-space reading, not the disk's: 1 MB
        return 10**6

    with pytest.raises(ModelUnavailable) as info:
        fetch_model(REPO, None, cache(tmp_path), free_bytes=faked_free_space)
    assert str(info.value) == (
        f"not enough disk to download 'Org/Tiny': it needs 1.6 MB in {cache(tmp_path)} (and 67.1 MB to spare), "
        "which has 1.0 MB free; free some space, or point HF_HUB_CACHE (or HF_HOME) at a larger disk")
    assert not (cache(tmp_path) / "models--Org--Tiny").exists()
    assert fetch_model(REPO, None, cache(tmp_path), free_bytes=lambda _d: 10**9).is_dir()  # faked too: 1 GB


def test_unknown_names_and_an_unreachable_hub_are_one_line_each(hub: HubStandIn, monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable) as info:
        resolve_model_dir("Org/Nothing")
    assert str(info.value) == (f"model 'Org/Nothing' is not on {hub.url} (or is private): check the name, or set "
                               "HF_TOKEN to a token that can read it")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ModelUnavailable) as info:
        resolve_model_dir(REPO)
    message = str(info.value)
    assert message.startswith("cannot reach http://127.0.0.1:9 to download model 'Org/Tiny' (")
    assert message.endswith(f"put the model in the cache at {cache(tmp_path)} first (tx models make-tiny Org/Tiny "
                            "writes a tiny stand-in)") and "\n" not in message


def test_a_repository_without_safetensors_is_refused(hub: HubStandIn, tmp_path: Path) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"pickle")
    hub.add("Org/Pickled", pickled)
    with pytest.raises(ModelUnavailable, match="has no safetensors weights on the hub"):
        resolve_model_dir("Org/Pickled")
    assert not any("/resolve/" in path for _, path, _ in hub.requests)
    shutil.rmtree(pickled)


def _fetch_in_a_process(tmp_path: Path, hub: HubStandIn) -> subprocess.Popen:
    """`resolve_model_dir(REPO)` in a process of its own, as a `tx serve` would run it."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    code = f"from tx.models.resolve import resolve_model_dir; print(resolve_model_dir({REPO!r}))"
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_killed_download_is_finished_by_the_next_start(hub: HubStandIn, model_dirs: dict[str, Path],
                                                         tmp_path: Path) -> None:
    hub.bytes_per_s = 200e3  # the 1.4 MB of weights take ~7 s: the process is killed in the middle
    proc = _fetch_in_a_process(tmp_path, hub)
    snapshot = cache(tmp_path) / "models--Org--Tiny" / "snapshots"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (snapshot.is_dir() and len(list(snapshot.glob("*/*"))) >= 5):
        time.sleep(0.1)  # until the small files are in
    assert len(hub.file_gets("model.safetensors")) == 1 and proc.poll() is None
    proc.kill()
    proc.wait()
    hub.bytes_per_s = None
    hub.requests.clear()
    done = resolve_model_dir(REPO)
    assert (done / "model.safetensors").read_bytes() == (model_dirs["0"] / "model.safetensors").read_bytes()
    assert [path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path] \
        == ["model.safetensors"]  # the finished files were kept


def test_two_processes_sharing_a_cache_both_get_the_whole_model(hub: HubStandIn, model_dirs: dict[str, Path],
                                                                tmp_path: Path) -> None:
    hub.bytes_per_s = 2e6
    procs = [_fetch_in_a_process(tmp_path, hub) for _ in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]
    snapshot = Path(outputs[0][0].strip())
    for name in MODEL_FILES:
        assert (snapshot / name).read_bytes() == (model_dirs["0"] / name).read_bytes(), name
    assert not list((cache(tmp_path) / "models--Org--Tiny" / "blobs").glob("*.incomplete"))
