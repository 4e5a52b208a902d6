"""StableReinforce through the real SDK: samples of a `record_stability_info` client are recorded under their
sequence_ids, `stable_reinforce` trains on the recorded logprobs, and a sequence the request may not name
(missing, another session's, another key's, expired) is a 400 naming it; records survive a restart.

The store is the server's own SQLite file: the expiry tests move a record's last use back in it (a day cannot
be waited out in a test), the way the clock would."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import pytest
import tinker
from sqlalchemy import select
from tinker import types

from tx.store.store import Store
from tx.store.tables import StabilityRecordRow
from txserver import TxServer

BASE = "tiny-qwen3"
PROMPT = [11, 12, 13, 14, 15]
PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, stop=[])


@pytest.fixture(scope="module")
def rl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """A server of its own: the restart test restarts it, the expiry tests edit its store."""
    with TxServer(tmp_path_factory.mktemp("tx-rl"), env={"TX_JANITOR_INTERVAL_S": "3600"}) as srv:
        yield srv


@dataclass
class Rollouts:
    tc: tinker.TrainingClient
    sequences: list[types.SampledSequence]


def rollouts(client: tinker.ServiceClient, n: int = 2, **create) -> Rollouts:
    tc = client.create_lora_training_client(BASE, rank=8, seed=0, **create).result()
    sampler = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
    result = sampler.sample(types.ModelInput.from_ints(PROMPT), num_samples=n, sampling_params=PARAMS).result()
    return Rollouts(tc, list(result.sequences))


def rl_datum(seq: types.SampledSequence, advantage: float, logprobs: list[float] | None = None) -> types.Datum:
    """The cookbook's datum for one rollout (rl_loop.py): prompt + sampled tokens, shifted, with provenance."""
    sampled, ob = list(seq.tokens), len(PROMPT) - 1
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT + sampled[:-1]),
        loss_fn_inputs={"target_tokens": PROMPT[1:] + sampled,
                        "logprobs": [0.0] * ob + (logprobs if logprobs is not None else list(seq.logprobs)),
                        "advantages": [0.0] * ob + [advantage] * len(sampled)},
    )
    sid = seq.sequence_id
    return datum.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=len(PROMPT)),
                     types.SampledProvenanceSpan(sequence_id=sid, length=len(sampled) - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=ob),
                        types.SampledProvenanceSpan(sequence_id=sid, length=len(sampled))],
    )


def sampled_logprobs(tc: tinker.TrainingClient, seqs: list[types.SampledSequence]) -> np.ndarray:
    out = tc.forward([rl_datum(s, 0.0) for s in seqs], "cross_entropy").result().loss_fn_outputs
    return np.concatenate([o["logprobs"].to_numpy()[len(PROMPT) - 1:] for o in out])


@contextmanager
def records_of(server: TxServer, sequence_ids: list[str]) -> Iterator[list[StabilityRecordRow]]:
    """The records in the server's store, changes written back on exit."""
    store = Store.from_url(f"sqlite:///{server.data_dir / 'tx.db'}")
    try:
        with store._sessions.begin() as db:
            yield list(db.scalars(select(StabilityRecordRow).where(StabilityRecordRow.sequence_id.in_(sequence_ids))))
    finally:
        store.close()


def age(server: TxServer, sequence_ids: list[str], by: timedelta) -> None:
    """Move the records' last use `by` into the past, as the clock would."""
    with records_of(server, sequence_ids) as rows:
        for row in rows:
            row.last_used_at = row.last_used_at - by


def test_stable_reinforce_trains_on_recorded_samples(rl_server: TxServer) -> None:
    with rl_server.client() as client:
        run = rollouts(client, n=4)
        seqs = run.sequences
        with records_of(rl_server, [s.sequence_id for s in seqs]) as rows:  # what the server recorded
            recorded = {r.sequence_id: r for r in rows}
            for seq in seqs:
                row = recorded[seq.sequence_id]
                assert np.frombuffer(row.tokens, "<i4").tolist() == list(seq.tokens)
                assert np.frombuffer(row.logprobs, "<f4").tolist() == list(seq.logprobs)
                assert row.prompt_length == len(PROMPT) and row.weights_version is not None
        # the loss reads the recorded logprobs: what the client sends in `logprobs` changes nothing
        honest = run.tc.forward([rl_datum(s, 1.0) for s in seqs], "stable_reinforce").result().metrics["loss:sum"]
        junk = [rl_datum(s, 1.0, logprobs=[-20.0] * len(s.tokens)) for s in seqs]
        assert run.tc.forward(junk, "stable_reinforce").result().metrics["loss:sum"] == pytest.approx(honest)

        before = sampled_logprobs(run.tc, seqs)
        for _ in range(3):  # positive advantages raise the sampled tokens
            run.tc.forward_backward([rl_datum(s, 1.0) for s in seqs], "stable_reinforce",
                                    loss_fn_config={"kl_coeff": 0.01}).result()
            run.tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert (sampled_logprobs(run.tc, seqs) - before).sum() > 0

        forged = rl_datum(seqs[0], 1.0)
        forged.loss_fn_inputs["target_tokens"] = types.TensorData.from_numpy(
            np.array(PROMPT[1:] + [(seqs[0].tokens[0] + 1) % 2000] + list(seqs[0].tokens[1:])))
        with pytest.raises(tinker.BadRequestError, match=f"target row {len(PROMPT) - 1} holds token .* but "
                                                         f"sequence '{seqs[0].sequence_id}' sampled token"):
            run.tc.forward_backward([forged], "stable_reinforce").result()


def test_only_the_sampling_session_may_train_on_its_records(rl_server: TxServer) -> None:
    with rl_server.client() as client, rl_server.client() as other_session, \
            rl_server.client(api_key="tml-someone-else") as other_key:
        seq = rollouts(client, n=1).sequences[0]
        refusals = {other_session: f"sequence_id '{seq.sequence_id}' was sampled in another session",
                    other_key: f"no stability record of sequence_id '{seq.sequence_id}'"}  # no leak to another key
        for other, refusal in refusals.items():
            tc = other.create_lora_training_client(BASE, rank=8).result()
            with pytest.raises(tinker.BadRequestError, match=refusal):
                tc.forward_backward([rl_datum(seq, 1.0)], "stable_reinforce").result()


def test_a_record_lives_one_day_from_its_last_use(rl_server: TxServer) -> None:
    with rl_server.client() as client:
        run = rollouts(client, n=2)
        used, unused = run.sequences
        age(rl_server, [used.sequence_id, unused.sequence_id], timedelta(hours=23))
        run.tc.forward_backward([rl_datum(used, 1.0)], "stable_reinforce").result()  # its day starts again
        age(rl_server, [used.sequence_id, unused.sequence_id], timedelta(hours=2))
        run.tc.forward_backward([rl_datum(used, 1.0)], "stable_reinforce").result()
        with pytest.raises(tinker.BadRequestError, match=f"record of sequence_id '{unused.sequence_id}' expired"):
            run.tc.forward_backward([rl_datum(unused, 1.0)], "stable_reinforce").result()


def test_records_survive_a_restart(rl_server: TxServer) -> None:
    with rl_server.client() as client:
        run = rollouts(client, n=2)
        path = run.tc.save_state("before-restart").result().path
        rl_server.stop()
        rl_server.start()
        tc = client.create_training_client_from_state(path).result()  # the same session, a restarted server
        tc.forward_backward([rl_datum(s, 1.0) for s in run.sequences], "stable_reinforce").result()
