"""Shared passes through the real SDK (`tx serve --shared-pass on`): two keys' runs whose forward_backward calls are
ready together train in one pass (the /metrics counters say so), and each run's losses, logprobs and the
logprobs after its optimizer steps equal those of the same run trained alone, within 1e-5 (float32)."""

from __future__ import annotations

from collections.abc import Iterator
import httpx
import numpy as np
import pytest
import tinker
from prometheus_client.parser import text_string_to_metric_families
from tinker import types

from txserver import TxServer

OTHER_KEY = "tml-test-other-key"
STEPS = 3


@pytest.fixture(scope="module", params=["in-process", "workers"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """The trainer in the server process, or on 2 trainer workers (the base held whole on each)."""
    workers = ["--trainer-workers", "2"] if request.param == "workers" else []
    with TxServer(tmp_path_factory.mktemp("tx-shared"), args=["--shared-pass", "on", *workers]) as srv:
        yield srv


def datums(seed: int, lengths: list[int]) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        tokens = rng.integers(10, 1990, size=n + 1).tolist()
        out.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                               loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n}))
    return out


RUNS = {"a": (1, datums(1, [24, 9, 17])), "b": (2, datums(2, [31, 12]))}  # (LoRA seed, data)
BLOCKER = datums(3, [2000] * 12)  # a third run's forward, long enough that both calls queue behind it


def shared_counts(server: TxServer) -> tuple[float, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    return values["tx_shared_passes_total"], values["tx_shared_pass_calls_total"]


def outputs(future: tinker.APIFuture[types.ForwardBackwardOutput]) -> tuple[float, list[np.ndarray]]:
    out = future.result()
    return out.metrics["loss:sum"], [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]


def train(clients: dict[str, tinker.TrainingClient], blocker: tinker.TrainingClient | None) -> dict[str, list]:
    """STEPS steps of each run, then a forward: {run: [(loss, logprobs) of each forward_backward, then the
    forward's]}. With a blocker, each step's calls of every run are submitted together behind its forward."""
    seen: dict[str, list] = {name: [] for name in clients}
    for _ in range(STEPS):
        wait = blocker.forward(BLOCKER, "cross_entropy") if blocker is not None else None
        steps = {name: tc.forward_backward(RUNS[name][1], "cross_entropy") for name, tc in clients.items()}
        optims = [tc.optim_step(types.AdamParams(learning_rate=1e-2)) for tc in clients.values()]
        for name, future in steps.items():
            seen[name].append(outputs(future))
        for future in optims + ([wait] if wait is not None else []):
            future.result()
    forwards = {name: tc.forward(RUNS[name][1], "cross_entropy") for name, tc in clients.items()}
    for name, future in forwards.items():
        seen[name].append(outputs(future))
    return seen


def test_two_keys_runs_share_passes_and_train_as_if_alone(server: TxServer) -> None:
    with server.client() as mine, server.client(api_key=OTHER_KEY) as other:
        services = {"a": mine, "b": other}

        def create(name: str) -> tinker.TrainingClient:
            return services[name].create_lora_training_client("tiny-qwen3", rank=4, seed=RUNS[name][0]).result()

        alone = {name: train({name: create(name)}, None)[name] for name in RUNS}  # one run at a time
        passes, calls = shared_counts(server)
        together = train({name: create(name) for name in RUNS}, mine.create_lora_training_client("tiny-qwen3").result())
        passes_after, calls_after = shared_counts(server)
    print(f"shared passes {passes_after - passes:.0f}, calls in them {calls_after - calls:.0f}")
    assert passes_after - passes >= 1 and calls_after - calls >= 2  # a's and b's calls ran in one pass
    for name in RUNS:
        for (loss_alone, logprobs_alone), (loss, logprobs) in zip(alone[name], together[name], strict=True):
            assert loss == pytest.approx(loss_alone, rel=1e-5, abs=1e-5)
            for got, want in zip(logprobs, logprobs_alone, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
