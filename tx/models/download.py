"""Fetch a model a user names from the Hugging Face hub into the standard cache, on first use.

`tx serve --base-model Qwen/Qwen3-8B` finds the model in the local hub cache when it is there (no network); when
it is not, tx downloads it with huggingface_hub before the server reports ready
(docs/operations.md#models-from-the-hub):

- only the files a model needs, from the repository's top level: `*.safetensors` weights (never `*.bin`, `*.pt`
  or other pickles, and not Mistral's duplicate `consolidated*.safetensors`), the JSON configs (model, generation,
  tokenizer, preprocessor, processor, chat template), tokenizer files and `*.jinja` chat templates; never code;
- `name@revision` pins a branch, tag or commit; `HF_TOKEN` (or a stored `hf auth login`) reads gated repositories;
- the free disk of the cache is checked against what is left to fetch before anything is written;
- huggingface_hub's own locks keep two processes sharing a cache from corrupting it, a file cut off mid-transfer
  is resumed from where it stopped, and files finished before an interruption are not fetched again;
- progress: huggingface_hub's bar on the terminal, and a line in the log every `PROGRESS_EVERY_S`.

`HF_ENDPOINT` (the hub's address) and `HF_TOKEN` are read when a model is fetched, not when huggingface_hub is
first imported. Every failure is a `ModelUnavailable` whose message is one line naming the cause and the fix.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tx.types import NotFoundError

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
ALLOW_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt"]
IGNORE_PATTERNS = ["*/*", "consolidated*"]  # the top level only; Mistral's second copy of the weights
PROGRESS_EVERY_S = 10.0
DISK_MARGIN_BYTES = 64 * 2**20  # left free beyond the model's files (the cache's metadata, the log)


class ModelUnavailable(NotFoundError):
    """A model that can be neither found in the cache nor fetched; the message is one line: cause and fix."""


def split_revision(name: str) -> tuple[str, str | None]:
    """`org/name@revision` -> (`org/name`, `revision`); a name without `@` -> (name, None)."""
    repo_id, at, revision = name.partition("@")
    return (repo_id, revision or None) if at else (name, None)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def free_disk_bytes(directory: Path) -> int:
    """Free bytes on the disk that holds `directory` (or its nearest existing parent)."""
    for path in (directory, *directory.parents):
        if path.exists():
            return shutil.disk_usage(path).free
    return shutil.disk_usage("/").free


def fetch_model(repo_id: str, revision: str | None, cache_dir: Path,
                free_bytes: Callable[[Path], int] = free_disk_bytes) -> Path:
    """Download `repo_id` at `revision` (None: main) into the hub cache `cache_dir`; return its snapshot
    directory. Raises ModelUnavailable (one line) when the hub refuses, cannot be reached, or the disk is short."""
    from huggingface_hub import snapshot_download

    commit, files = _needed_files(repo_id, revision, cache_dir)
    repo_dir = cache_dir / f"models--{repo_id.replace('/', '--')}"
    missing = _bytes_missing(files, repo_dir / "snapshots" / commit)
    _check_disk(repo_id, missing, cache_dir, free_bytes)
    logger.info("downloading %s%s from %s: %d files, %s to fetch, into %s", repo_id,
                f"@{revision}" if revision else "", hub_endpoint(), len(files), _size(missing), cache_dir)
    started = time.monotonic()
    with _hub_errors(repo_id, revision, cache_dir), _progress_lines(repo_id, repo_dir / "blobs", missing):
        snapshot = snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir), endpoint=hub_endpoint(),
                                     allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS)
    logger.info("downloaded %s (%s) in %.0f s: %s", repo_id, _size(missing), time.monotonic() - started, snapshot)
    return Path(snapshot)


def _needed_files(repo_id: str, revision: str | None, cache_dir: Path) -> tuple[str, dict[str, int]]:
    """The revision's commit and {file: size} of the files tx fetches from it; refuses a repository without
    safetensors."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    with _hub_errors(repo_id, revision, cache_dir):
        info = HfApi(endpoint=hub_endpoint()).model_info(repo_id, revision=revision, files_metadata=True)
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
    kept = set(filter_repo_objects(sizes, allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    if not any(name.endswith(".safetensors") for name in kept):
        raise ModelUnavailable(f"model {repo_id!r} has no safetensors weights on the hub (tx loads no pickled "
                               "*.bin weights): convert it to safetensors, or serve a local directory that has them")
    return str(info.sha), {name: sizes[name] for name in sorted(kept)}


def _bytes_missing(files: dict[str, int], snapshot: Path) -> int:
    """What is left to fetch: the files not already in the commit's cached snapshot."""
    have = {p.name for p in snapshot.glob("*") if p.exists()}
    return sum(size for name, size in files.items() if name not in have)


def _check_disk(repo_id: str, needed: int, cache_dir: Path, free_bytes: Callable[[Path], int]) -> None:
    free = free_bytes(cache_dir)
    if free < needed + DISK_MARGIN_BYTES:
        raise ModelUnavailable(
            f"not enough disk to download {repo_id!r}: it needs {_size(needed)} in {cache_dir} (and "
            f"{_size(DISK_MARGIN_BYTES)} to spare), which has {_size(free)} free; free some space, or point "
            "HF_HUB_CACHE (or HF_HOME) at a larger disk")


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, cache_dir: Path) -> Iterator[None]:
    """The hub's refusals and network failures, as one line each naming the fix."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = hub_endpoint()
    try:
        yield
    except GatedRepoError as exc:
        fix = ("the token in HF_TOKEN has no access: accept the model's terms on its page with that account"
               if os.environ.get("HF_TOKEN") else "accept its terms on its page, then set HF_TOKEN to a token of "
               "that account (https://huggingface.co/settings/tokens)")
        raise ModelUnavailable(f"model {repo_id!r} is gated on {endpoint}/{repo_id}: {fix}") from exc
    except RevisionNotFoundError as exc:
        raise ModelUnavailable(f"model {repo_id!r} has no revision {revision!r} on {endpoint}: give a branch, tag "
                               f"or commit of {endpoint}/{repo_id}") from exc
    except RepositoryNotFoundError as exc:
        raise ModelUnavailable(f"model {repo_id!r} is not on {endpoint} (or is private): check the name, or set "
                               "HF_TOKEN to a token that can read it") from exc
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as exc:
        raise ModelUnavailable(_unreachable(repo_id, endpoint, cache_dir, exc)) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "an error"
        raise ModelUnavailable(f"{endpoint} answered {status} for model {repo_id!r}: "
                               f"{str(exc).splitlines()[0]}; try again later") from exc
    except (ModelUnavailable, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise ModelUnavailable(_unreachable(repo_id, endpoint, cache_dir, exc)) from exc


def _unreachable(repo_id: str, endpoint: str, cache_dir: Path, exc: BaseException) -> str:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (f"cannot reach {endpoint} to download model {repo_id!r} ({reason}): connect this machine to it, set "
            f"HF_ENDPOINT to a mirror, or put the model in the cache at {cache_dir} first (tx models make-tiny "
            f"{repo_id} writes a tiny stand-in)")


@contextmanager
def _progress_lines(repo_id: str, blobs: Path, total: int) -> Iterator[None]:
    """A log line every PROGRESS_EVERY_S while the download runs: bytes, share and rate, read off the cache's
    blobs (finished and in flight), so it holds whatever huggingface_hub's own bars show."""
    start_bytes, started, done = _dir_bytes(blobs), time.monotonic(), threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            got = max(_dir_bytes(blobs) - start_bytes, 0)
            share = 100 * got / total if total else 100.0
            rate = got / max(time.monotonic() - started, 1e-3)
            logger.info("downloading %s: %s of %s (%.0f%%), %s/s", repo_id, _size(got), _size(total), share,
                        _size(rate))

    thread = threading.Thread(target=report, name=f"progress {repo_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _dir_bytes(directory: Path) -> int:
    total = 0
    for path in directory.glob("*") if directory.is_dir() else ():
        try:
            total += path.stat().st_size
        except OSError:  # renamed or removed meanwhile
            pass
    return total


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
