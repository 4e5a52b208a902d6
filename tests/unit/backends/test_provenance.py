"""A stable_reinforce batch against the stability records it names (tx/backends/provenance.py): sampled rows take
the recorded logprobs; a claim the record contradicts is refused, naming the datum, the row and the sequence."""

from __future__ import annotations

import numpy as np
import pytest

from tx.backends.provenance import apply_records
from tx.types import Datum, ForwardBackwardInput, ModelInput, ProvenanceSpan, StabilityRecord, UserError

RECORD = StabilityRecord("s:1:0", "base", 4, prompt_length=3, tokens=np.array([7, 8, 9]),
                         logprobs=np.array([-0.25, -0.5, -0.75], np.float32))


def _batch(spans: tuple[ProvenanceSpan, ...], targets: list[int], **inputs: np.ndarray) -> ForwardBackwardInput:
    datum = Datum(ModelInput.from_tokens(list(range(len(targets)))),
                  {"target_tokens": np.array(targets), **inputs}, spans)
    return ForwardBackwardInput([datum], "stable_reinforce")


def test_sampled_rows_take_the_recorded_logprobs_and_prompt_rows_keep_the_clients() -> None:
    spans = (ProvenanceSpan("s:1:0", 1, 2, sampled=False), ProvenanceSpan("s:1:0", 1, 2, sampled=True))
    sent = _batch(spans, [1, 2, 8, 9], logprobs=np.array([-1.0, -2.0, -3.0, -4.0]))
    assert apply_records(sent, {"s:1:0": RECORD}, "base").data[0].loss_fn_inputs["logprobs"].tolist() == [
        -1.0, -2.0, -0.5, -0.75]
    without = _batch(spans, [1, 2, 8, 9])  # a client may leave logprobs out: the record has them
    assert apply_records(without, {"s:1:0": RECORD}, "base").data[0].loss_fn_inputs["logprobs"].tolist() == [
        0.0, 0.0, -0.5, -0.75]
    untiled = _batch(spans[:1], [1, 2, 8, 9])  # left as it is, for datums.py's own refusal
    assert apply_records(untiled, {"s:1:0": RECORD}, "base").data[0] is untiled.data[0]


@pytest.mark.parametrize(("spans", "targets", "base", "refusal"), [
    ((ProvenanceSpan("s:1:0", 0, 4, sampled=True),), [7, 8, 9, 9], "base",
     r"datum 0: a sampled span covers tokens \[0, 4\) of sequence 's:1:0', which sampled 3 tokens"),
    ((ProvenanceSpan("s:1:0", 0, 3, sampled=True),), [7, 9, 9], "base",
     "datum 0: target row 1 holds token 9, but sequence 's:1:0' sampled token 8 at position 1"),
    ((ProvenanceSpan("s:1:0", 1, 3, sampled=False),), [1, 2, 3], "base",
     r"datum 0: a prompt span covers positions \[1, 4\) of the prompt of sequence 's:1:0', which had 3 tokens"),
    ((ProvenanceSpan("s:1:0", 0, 3, sampled=True),), [7, 8, 9], "other",
     "datum 0: sequence 's:1:0' was sampled from 'base', but this model trains 'other'"),
])
def test_a_claim_the_record_contradicts_is_refused(spans, targets, base, refusal) -> None:
    with pytest.raises(UserError, match=refusal):
        apply_records(_batch(spans, targets), {"s:1:0": RECORD}, base)
