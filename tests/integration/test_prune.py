"""`tx checkpoints prune`: a key's checkpoints by run, kind or age, shown and confirmed before any is deleted, each
deletion in the audit log; another key's checkpoints never touched (docs/operations.md#cleaning-up-checkpoints)."""

from __future__ import annotations

import pytest
import tinker
from sdk_datums import sft_datum
from txserver import API_KEY, TxServer

from tx import cli
from tx.client_commands import prune

OTHER_KEY = "tml-prune-other"


def saved_run(server: TxServer, key: str) -> tuple[str, list[str]]:
    """A run of `key` with a training state and two sampler saves: (run id, their paths)."""
    with server.client(api_key=key) as service:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4, seed=0).result()
        tc.forward_backward([sft_datum([5, 6, 7, 8])], "cross_entropy").result()
        paths = [tc.save_state("state").result().path,
                 *(tc.save_weights_for_sampler(name).result().path for name in ("s1", "s2"))]
        return tc.model_id, paths


def listed(server: TxServer, key: str, run_id: str) -> set[str]:
    rest = tinker.RestClient(base_url=server.url, api_key=key)
    return {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}


@pytest.fixture
def as_user(server: TxServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)


@pytest.mark.usefixtures("as_user")
def test_prune_shows_asks_and_deletes_only_what_matches(server: TxServer, capsys: pytest.CaptureFixture) -> None:
    run_id, (state, *samplers) = saved_run(server, API_KEY)
    other_run, other_paths = saved_run(server, OTHER_KEY)
    assert prune([run_id], None, ["sampler_weights"], False, None, confirm=lambda _q: False) == (0, 0)
    assert listed(server, API_KEY, run_id) == {state, *samplers}  # declined: nothing deleted
    assert cli.main(["checkpoints", "prune", "--run", run_id, "--older-than", "1h", "--yes"]) == 0
    assert "no checkpoint matches" in capsys.readouterr().out  # all of them are newer
    asked: list[str] = []
    deleted, size = prune([run_id, other_run], None, ["sampler_weights"], False, None,
                          confirm=lambda q: asked.append(q) or True)
    assert deleted == 2 and size > 0 and "2 checkpoints" in asked[0]
    shown = capsys.readouterr().out
    assert all(path in shown for path in samplers) and state not in shown
    assert listed(server, API_KEY, run_id) == {state}
    assert listed(server, OTHER_KEY, other_run) == set(other_paths)  # another key's: never seen, never touched
    entries = tinker.AdminClient(base_url=server.url, api_key=API_KEY).get_audit_log().result().entries
    assert {e.tinker_path for e in entries if e.event == "checkpoint_delete"} >= set(samplers)


@pytest.mark.usefixtures("as_user")
def test_prune_refuses_to_guess(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["checkpoints", "prune", "--yes"]) == 2
    assert "--run RUN_ID and/or --older-than" in capsys.readouterr().err
    assert cli.main(["checkpoints", "prune", "--older-than", "soon", "--yes"]) == 2
    assert "number and a unit" in capsys.readouterr().err


@pytest.mark.usefixtures("as_user")
def test_prune_without_a_terminal_needs_yes(server: TxServer, capsys: pytest.CaptureFixture) -> None:
    run_id, paths = saved_run(server, API_KEY)
    assert cli.main(["checkpoints", "prune", "--run", run_id]) == 2  # pytest's stdin is no terminal
    assert "pass --yes" in capsys.readouterr().err
    assert listed(server, API_KEY, run_id) == set(paths)
