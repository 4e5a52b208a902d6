"""A run's name and tags (tx/core/run_labels.py), and the base-weights check of a loaded checkpoint
(tx/core/base_models.py): one rule for the SDK's user_metadata and the console's PATCH."""

from __future__ import annotations

from typing import cast

import pytest

from tx.backends.base import TrainingBackend
from tx.core.base_models import BaseModels
from tx.core.run_labels import MAX_TAGS, RunLabels, labels_of_metadata, run_labels
from tx.models.fingerprint import ModelProvenance
from tx.store.tables import TrainingRunRow
from tx.types import UserError


def test_labels_are_tidied_and_deduplicated() -> None:
    assert run_labels("  my run ", [" a", "b ", "", "a"]) == RunLabels("my run", ("a", "b"))
    assert run_labels("   ", []) == RunLabels(None, ())


@pytest.mark.parametrize(("name", "tags", "words"), [
    ("x" * 121, [], "at most 120 characters"),
    (None, ["t" * 41], "at most 40 characters"),
    (None, [f"t{i}" for i in range(MAX_TAGS + 1)], "at most 16 tags"),
    (None, ["a,b"], "no comma"),
    ("a\x00b", [], "control character"),
    (None, ["line\nbreak"], "control character"),
])
def test_labels_past_their_bounds_are_refused_naming_the_bound(name, tags, words) -> None:
    with pytest.raises(UserError, match=words):
        run_labels(name, tags)


def test_user_metadata_names_and_tags_a_run() -> None:
    assert labels_of_metadata({"name": "sft lr 1e-4", "tags": "sft, qwen,", "other": "kept"}) == RunLabels(
        "sft lr 1e-4", ("sft", "qwen"))
    assert labels_of_metadata(None) == RunLabels()
    with pytest.raises(UserError, match="must be a string"):
        labels_of_metadata({"tags": ["a"]})


def _run(fingerprint: str | None) -> TrainingRunRow:
    return TrainingRunRow(run_id="s:train:0", base_model="tiny-qwen3", base_fingerprint=fingerprint,
                          base_revision="a" * 40 if fingerprint else None)


def test_a_checkpoint_of_other_base_weights_is_refused_naming_both() -> None:
    backend = cast(TrainingBackend, object())  # the check asks the backend nothing
    models = BaseModels(backend, {"tiny-qwen3": ModelProvenance(None, "sha256:served")})
    with pytest.raises(UserError, match=r"fingerprint sha256:recorded \(revision a{40}\).*fingerprint sha256:served"):
        models.check_same_weights(_run("sha256:recorded"), "tinker://s:train:0/weights/x")
    models.check_same_weights(_run("sha256:served"), "same weights")
    models.check_same_weights(_run(None), "a run recorded before migration 0009")
