"""A `stable_reinforce` batch against the stability records its provenance names (`tx/core/sampling/records.py`).

Each datum's `loss_fn_input_spans` tile its target rows: a sampled span claims rows are tokens
`[offset, offset + length)` of a recorded sequence's sampled tokens, a prompt span that they are positions of
that sequence's prompt. At submission, before the batch rules of `datums.py`, every claim is checked against
the record (a 400 names the datum, the row and the sequence) and the datum's `logprobs` at sampled rows become
the recorded ones: the loss weighs each sampled token by the sampler's own logprob of it, whatever the client
sent (or whether it sent any).

What this leaves to `datums.py`: a datum without spans, spans that do not tile the targets, targets of the
wrong shape or type (it refuses them with its own messages).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tx.backends.losses import TARGET_KEY
from tx.types import Datum, ForwardBackwardInput, ProvenanceSpan, StabilityRecord, UserError

RECORDED_LOSSES = frozenset({"stable_reinforce"})
"""The losses that train on recorded sampling: their datums name records, which must exist."""


def needs_records(batch: ForwardBackwardInput) -> bool:
    return batch.custom_loss is None and batch.loss_fn in RECORDED_LOSSES


def named_sequences(batch: ForwardBackwardInput) -> set[str]:
    """Every sequence_id the batch's target-row spans name."""
    return {span.sequence_id for datum in batch.data for span in datum.loss_fn_input_spans}


def apply_records(batch: ForwardBackwardInput, records: Mapping[str, StabilityRecord],
                  base_model: str) -> ForwardBackwardInput:
    """`batch` with each datum's sampled rows checked against, and their `logprobs` taken from, `records` (which
    hold every sequence the batch names); a UserError naming the first datum whose provenance is false."""
    data = [_applied(datum, records, base_model, index) for index, datum in enumerate(batch.data)]
    return ForwardBackwardInput(data, batch.loss_fn, batch.loss_fn_config, batch.forward_only, batch.custom_loss)


def _applied(datum: Datum, records: Mapping[str, StabilityRecord], base_model: str, index: int) -> Datum:
    spans = datum.loss_fn_input_spans
    targets = np.asarray(datum.loss_fn_inputs.get(TARGET_KEY, np.zeros(0)))
    if not spans or targets.ndim != 1 or sum(s.length for s in spans) != targets.shape[0]:
        return datum  # datums.py refuses it with its own message
    logprobs = _given_logprobs(datum, targets.shape[0])
    row = 0
    for span in spans:
        record = records[span.sequence_id]
        if record.base_model != base_model:
            raise UserError(f"datum {index}: sequence {span.sequence_id!r} was sampled from {record.base_model!r}, "
                            f"but this model trains {base_model!r}")
        if span.sampled:
            logprobs[row:row + span.length] = _sampled(span, record, targets[row:row + span.length], row, index)
        elif span.offset + span.length > record.prompt_length:
            raise UserError(
                f"datum {index}: a prompt span covers positions [{span.offset}, {span.offset + span.length}) of the "
                f"prompt of sequence {span.sequence_id!r}, which had {record.prompt_length} tokens")
        row += span.length
    return Datum(datum.model_input, {**datum.loss_fn_inputs, "logprobs": logprobs}, spans)


def _sampled(span: ProvenanceSpan, record: StabilityRecord, targets: np.ndarray, row: int, index: int) -> np.ndarray:
    """The recorded logprobs of the tokens a sampled span covers, once its target rows are those tokens."""
    end = span.offset + span.length
    if end > record.tokens.size:
        raise UserError(f"datum {index}: a sampled span covers tokens [{span.offset}, {end}) of sequence "
                        f"{span.sequence_id!r}, which sampled {record.tokens.size} tokens")
    sampled = record.tokens[span.offset:end]
    differ = np.flatnonzero(targets != sampled)
    if differ.size:
        k = int(differ[0])
        raise UserError(f"datum {index}: target row {row + k} holds token {int(targets[k])}, but sequence "
                        f"{span.sequence_id!r} sampled token {int(sampled[k])} at position {span.offset + k}")
    return record.logprobs[span.offset:end]


def _given_logprobs(datum: Datum, rows: int) -> np.ndarray:
    """The client's `logprobs` as a float32 copy where they fit the targets (prompt rows keep them), else zeros."""
    given = datum.loss_fn_inputs.get("logprobs")
    if given is not None and np.shape(given) == (rows,) and np.issubdtype(np.asarray(given).dtype, np.number):
        return np.array(given, dtype=np.float32)
    return np.zeros(rows, dtype=np.float32)
