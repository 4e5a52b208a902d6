"""Two Ray nodes on this machine: `tx serve --ray-address` puts the trainer workers on node A and the engine on
node B (by node labels), and the real tinker SDK trains, samples and runs RL through them.

The cluster is two raylets of `ray.cluster_utils.Cluster`, each with its own CPUs and labels (`tx-node=a`: 2
CPUs for two trainer ranks; `tx-node=b`: 1 CPU for the engine). It runs under a Ray temp directory of its own,
so that no other process on the machine finds it as "the current cluster" (`ray.init()` with no address would).
Where each actor ran is read from the GCS's actor table (Ray's state as the cluster keeps it; the dashboard's
`ray.util.state` API is not in the [ray] extra). The engine on node B is another node's: it binds the node's
address, not loopback, and the weights reach it over gloo by that address, as on another machine.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from tinker import types

ray = pytest.importorskip("ray")
if not hasattr(ray, "init"):  # tests/ is on sys.path, so tests/ray can pose as the package
    pytest.skip("ray is not installed (pip install 'tx[ray]')", allow_module_level=True)
from ray.cluster_utils import Cluster
from rl_toy import assert_reward_rose, run_rl_toy
from sdk_datums import sft_datum
from txserver import TxServer

pytestmark = [pytest.mark.ray, pytest.mark.slow]
BASE = "tiny-qwen3"
NODE_A, NODE_B = {"tx-node": "a"}, {"tx-node": "b"}
OBJECT_STORE = 80 * 1024**2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp = tempfile.mkdtemp(prefix="txray-", dir="/tmp")  # short: Ray's socket paths live under it
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", temp)
        env.setenv("RAY_AUTH_MODE", "disabled")
        two = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "labels": NODE_A, "object_store_memory": OBJECT_STORE, "include_dashboard": False})
        try:
            two.add_node(num_cpus=1, labels=NODE_B, object_store_memory=OBJECT_STORE)
            yield two
        finally:
            two.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def server(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    args = ["--ray-address", cluster.address, "--trainer-workers", "2", "--no-engine-colocate",
            "--trainer-node-label", "tx-node=a", "--engine-node-label", "tx-node=b"]
    with TxServer(tmp_path_factory.mktemp("tx-two-nodes"), args=args,
                  env={"RAY_AUTH_MODE": "disabled"}).start(timeout_s=180) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client() as c:
        yield c


def nodes_of(cluster: Cluster, actor_class: str) -> set[str]:
    """The labels `tx-node` of the nodes where the cluster ran actors of `actor_class`, dead ones included."""
    label = {node["NodeID"]: node["Labels"].get("tx-node") for node in cluster.global_state.node_table()}
    actors = cluster.global_state.actor_table(None).values()
    return {label[a["Address"]["NodeID"]] for a in actors if a["ActorClassName"] == actor_class}


def assert_placed(cluster: Cluster, engines: bool) -> None:
    assert nodes_of(cluster, "TrainerActor") == {"a"}
    assert nodes_of(cluster, "EngineActor") == ({"b"} if engines else set())


def test_training_on_node_a_loss_falls(cluster: Cluster, client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(BASE, rank=8, seed=0).result()
    rng = np.random.default_rng(0)
    data = [sft_datum(rng.integers(10, 1990, size=33).tolist()) for _ in range(4)]
    losses = []
    for _ in range(12):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert losses[-1] <= 0.6 * losses[0], losses
    assert_placed(cluster, engines=False)  # a run that only trains starts no engine


def test_engine_on_node_b_samples_the_trainers_logprobs(cluster: Cluster, server: TxServer,
                                                        client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(BASE, rank=8, seed=3).result()
    prompt = [11, 12, 13, 14, 15, 16]
    for _ in range(3):  # trained weights: the engine must sample the pushed LoRA, not the base
        tc.forward_backward([sft_datum(prompt + [7, 8, 9])], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=0.7)).result()
    for seq in out.sequences:
        trainer = tc.forward([sft_datum(prompt + list(seq.tokens))], "cross_entropy").result()
        expected = trainer.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1:]
        np.testing.assert_allclose(seq.logprobs, expected, atol=1e-3)
    engine = next(e for g in server.engine_groups() for e in g["engines"])
    assert engine["alive"] and "127.0.0.1" not in engine["url"], engine  # served on its node's address
    assert engine["transport"]["kind"] == "gloo" and engine["transport"]["master_address"] != "127.0.0.1"
    assert_placed(cluster, engines=True)


def test_rl_loop_across_the_nodes_reward_rises(cluster: Cluster, client: tinker.ServiceClient) -> None:
    assert_reward_rose(run_rl_toy(client, BASE))
    assert_placed(cluster, engines=True)
