"""Settings in sections, names flat: every flag and TX_* variable of the README's configuration tables sets the
field of the section it belongs to, as `tx serve` and the environment always named them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tx.cli import build_parser
from tx.config import Settings, flat_names

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_names() -> tuple[set[str], set[str]]:
    """(flags, variables) of the README's configuration tables: rows whose first cell is a flag or a dash."""
    flags, variables = set(), set()
    for line in README.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 2 and (cells[0].startswith("`--") or cells[0] == "—"):
            flags |= set(re.findall(r"`(--[a-z0-9-]+)`", cells[0]))
            variables |= set(re.findall(r"`(TX_[A-Z0-9_]+)`", cells[1]))
    return flags, variables


def serve_options() -> dict[str, str]:
    """{option string: dest} of `tx serve`."""
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    return {option: action.dest for option, action in serve._option_string_actions.items()
            if action.dest != "help"}


def test_every_flag_and_variable_of_the_readme_still_exists() -> None:
    flags, variables = readme_names()
    assert len(flags) > 35 and len(variables) > 40  # the tables were found
    assert flags - set(serve_options()) == set()
    assert {v.removeprefix("TX_").lower() for v in variables} - set(flat_names()) == set()


def test_every_flag_sets_a_field_and_flat_names_are_unique() -> None:
    names = flat_names()
    assert len(names) == len(set(names))
    assert set(serve_options().values()) - set(names) == set()


def test_flags_and_variables_land_in_their_sections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TX_TRAIN_DTYPE", "float16")
    monkeypatch.setenv("TX_ENGINE_MAX_ADAPTERS", "3")
    monkeypatch.setenv("TX_ENGINE_MAX_LORA_RANK", "64")
    monkeypatch.setenv("TX_ASSET_HOSTS", '["images.example"]')
    monkeypatch.setenv("TX_PORT", "9001")
    args = build_parser().parse_args([
        "serve", "--train-dtype", "bfloat16", "--trainer-workers", "2", "--engine", "vllm",
        "--no-engine-colocate", "--sampler-versions-kept", "4", "--image-max-bytes", "100",
        "--asset-root", str(tmp_path),
    ])
    settings = Settings(**{k: v for k, v in vars(args).items() if v is not None and k != "command"})
    assert settings.port == 9001
    assert (settings.trainer.dtype, settings.trainer.workers) == ("bfloat16", 2)  # the flag beats the variable
    assert (settings.engines.kind, settings.engines.colocate) == ("vllm", False)
    assert (settings.engines.versions_kept, settings.engines.max_adapters) == (4, 3)
    assert settings.engines.max_lora_rank == 64
    assert settings.images.max_bytes == 100 and settings.images.asset_roots == [tmp_path]
    assert settings.images.asset_hosts == ["images.example"]


def test_bad_values_name_the_flat_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TX_ENGINE_SLEEP_LEVEL", "3")
    with pytest.raises(ValueError, match="engine_sleep_level"):
        Settings()
    monkeypatch.delenv("TX_ENGINE_SLEEP_LEVEL")
    with pytest.raises(ValueError, match="train_dtype"):
        Settings(train_dtype="int8")
    with pytest.raises(ValueError, match="Extra inputs"):
        Settings(trian_dtype="float32")
    with pytest.raises(ValueError, match="(?s)engine_max_lora_rank.*one of 1, 8, 16, 32, 64"):
        Settings(engine_max_lora_rank=48)


@pytest.mark.parametrize(("fields", "dtype"), [
    ({"train_dtype": "bfloat16"}, "bfloat16"),
    ({"device": "cpu", "engine_dtype": "float16"}, "float16"),
    ({"device": "cpu"}, "float32"),
])
def test_engine_dtype_follows_the_trainer_unless_set(fields: dict, dtype: str) -> None:
    settings = Settings(**fields)
    assert settings.engines.resolved_dtype(settings.trainer) == dtype


def test_node_labels_from_flags_and_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TX_ENGINE_NODE_LABELS", "tx-node=b,pool=gen")
    args = build_parser().parse_args(["serve", "--ray-address", "auto", "--trainer-workers", "2",
                                      "--trainer-node-label", "tx-node=a", "--trainer-node-label", "zone=x"])
    settings = Settings(**{k: v for k, v in vars(args).items() if v is not None and k != "command"})
    assert settings.trainer.node_labels == {"tx-node": "a", "zone": "x"}
    assert settings.engines.node_labels == {"tx-node": "b", "pool": "gen"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"ray_address": "auto", "engine_node_labels": ["tx-node"]}, "key=value, got 'tx-node'"),
    ({"ray_address": "auto", "engine_node_labels": ["tx node=b"]}, "not a Ray node label"),
    ({"engine_node_labels": ["tx-node=b"]}, "set --ray-address"),
    ({"trainer_workers": 2, "trainer_node_labels": ["tx-node=a"]}, "set --ray-address"),
    ({"ray_address": "auto", "trainer_node_labels": ["tx-node=a"]}, "--trainer-workers 2 or more"),
])
def test_node_labels_refused_where_they_place_nothing(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**fields)


def test_shared_pass_is_on_with_cuda_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from tx.api.app import shares_passes

    auto = Settings()
    assert [shares_passes(auto, device) for device in ("cuda", "cuda:1", "cpu")] == [True, True, False]
    monkeypatch.setenv("TX_SHARED_PASS", "on")
    assert shares_passes(Settings(), "cpu")
    args = build_parser().parse_args(["serve", "--shared-pass", "off"])
    assert not shares_passes(Settings(**{k: v for k, v in vars(args).items() if v is not None and k != "command"}),
                             "cuda")


def test_key_labels_come_from_flags_or_the_variable_and_name_accepted_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = "0123456789abcdef0123456789abcdef"
    args = build_parser().parse_args(["serve", "--api-key", "tml-a", "--key-label", "tml-a=team a",
                                      "--key-label", f"{owner}=ops (night)"])
    settings = Settings(**{k: v for k, v in vars(args).items() if v is not None and k != "command"})
    assert settings.key_labels == {"tml-a": "team a", owner: "ops (night)"}
    monkeypatch.setenv("TX_KEY_LABELS", "tml-a=alpha,tml-b=beta")
    assert Settings(api_keys=["tml-a", "tml-b"]).key_labels == {"tml-a": "alpha", "tml-b": "beta"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"key_labels": ["tml-a"]}, "KEY=LABEL"),
    ({"key_labels": ["bob=b"]}, "an API key .'tml-...'. or a key's owner id"),
    ({"key_labels": ["tml-a=<script>"]}, "1-64 letters"),
    ({"key_labels": ["tml-a=" + "x" * 65]}, "1-64 letters"),
    ({"api_keys": ["tml-a"], "key_labels": ["tml-zzz=z"]}, "a key the server does not accept .tml-zzz"),
])
def test_bad_key_labels_are_refused_at_start(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**fields)
