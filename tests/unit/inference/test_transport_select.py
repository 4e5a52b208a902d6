"""The weight transport decision (`weight_sync.transport`) with stubbed facts, and the manager's use of it.

No GPU and no network: device facts are made up, the route lookup is a stub (or runs against loopback only),
and the manager talks to a fake client; senders are fakes, so the IPC and NCCL branches of the manager are
checked for what they send where, not for moving tensors (tests/gpu does that).
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import torch

from tx.inference.manager import publisher as publisher_module
from tx.inference.manager.groups import EngineSettings, EngineSlot
from tx.inference.manager.publisher import Publisher
from tx.inference.protocol import (
    ROUTE_HEALTH,
    ROUTE_WEIGHTS_INIT,
    ROUTE_WEIGHTS_UPDATE,
    ROUTE_WEIGHTS_UPDATE_IPC,
    HealthResponse,
    IpcWeightsUpdateRequest,
    LoraSpec,
)
from tx.inference.weight_sync import (
    CudaIpcHandle,
    EngineFacts,
    IpcBucket,
    IpcTensorSpec,
    IpcUpdate,
    TrainerFacts,
    TransferInit,
    choose_transport,
    local_address_towards,
    trainer_facts,
)
from tx.inference.weight_sync import transport as transport_module
from tx.inference.weight_sync.transport import is_loopback, master_address

GPU_A = "11111111-2222-3333-4444-555555555555"
GPU_B = "99999999-8888-7777-6666-555555555555"
LOCAL_URL = "http://127.0.0.1:8123"
REMOTE_URL = "http://10.1.2.3:8123"
ROUTE = "10.1.2.250"  # what the stubbed route lookup answers


class Routes:
    """A stub for `route_address` that records the hosts it was asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, host: str) -> str:
        self.asked.append(host)
        return ROUTE


def cuda_trainer(uuid: str | None = GPU_A, hostname: str = "trainer-host") -> TrainerFacts:
    return TrainerFacts(device="cuda:0", gpu_uuid=uuid, hostname=hostname)


def engine(url: str = LOCAL_URL, device: str = "cuda:0", uuid: str | None = GPU_A,
           hostname: str | None = "trainer-host", transports=("gloo", "nccl", "ipc")) -> EngineFacts:
    return EngineFacts(url=url, device=device, gpu_uuid=uuid, hostname=hostname, transports=tuple(transports))


# ---- the decision table


def test_cpu_trainer_uses_gloo_whatever_the_engine_is():
    routes = Routes()
    trainer = TrainerFacts(device="cpu", hostname="trainer-host")
    for facts in (engine(), engine(device="cpu", uuid=None, transports=("gloo",))):
        choice = choose_transport(trainer, facts, routes)
        assert (choice.kind, choice.master_address) == ("gloo", "127.0.0.1")
        assert "trainer is on cpu" in choice.reason
    assert routes.asked == []  # loopback: no route lookup


def test_cpu_trainer_and_a_remote_engine_meet_at_the_trainers_address_towards_it():
    routes = Routes()
    remote_cpu = engine(url=REMOTE_URL, device="cpu", uuid=None)
    choice = choose_transport(TrainerFacts(device="cpu"), remote_cpu, routes)
    assert (choice.kind, choice.master_address) == ("gloo", ROUTE)
    assert routes.asked == ["10.1.2.3"]


def test_manager_makes_room_for_every_tensor_parallel_worker(monkeypatch):
    health = health_of(device="cuda:0", gpu_uuid=GPU_B, hostname="node-2", weight_transports=["gloo", "nccl"],
                       transfer_ranks=4)
    slot, _, _ = run_push(monkeypatch, cuda_trainer(), REMOTE_URL, health, Routes())
    assert slot.transport.receivers == 4
    (sender,) = FakeBroadcastSender.made
    assert (sender.init.world_size, sender.init.rank_offset) == (5, 1)


def test_cuda_trainer_and_a_cpu_engine_use_gloo():
    choice = choose_transport(cuda_trainer(), engine(device="cpu", uuid=None, transports=("gloo",)), Routes())
    assert (choice.kind, choice.master_address) == ("gloo", "127.0.0.1")
    assert "engine is on cpu" in choice.reason


def test_colocated_on_one_gpu_uses_cuda_ipc_without_a_group():
    routes = Routes()
    choice = choose_transport(cuda_trainer(), engine(), routes)
    assert (choice.kind, choice.master_address) == ("ipc", None)
    assert routes.asked == []


def test_same_gpu_recognised_by_hostname_when_the_url_is_not_loopback():
    routes = Routes()
    choice = choose_transport(cuda_trainer(), engine(url="http://10.0.0.7:9000"), routes)
    assert (choice.kind, choice.master_address) == ("ipc", None)
    assert routes.asked == []


def test_same_gpu_without_ipc_falls_back_to_gloo_never_nccl():
    """The embedded engine has no IPC route, and NCCL refuses two ranks on one GPU."""
    choice = choose_transport(cuda_trainer(), engine(transports=("gloo", "nccl")), Routes())
    assert (choice.kind, choice.master_address) == ("gloo", "127.0.0.1")
    assert "NCCL" in choice.reason


def test_another_gpu_on_the_same_host_uses_nccl_on_loopback():
    routes = Routes()
    choice = choose_transport(cuda_trainer(), engine(uuid=GPU_B), routes)
    assert (choice.kind, choice.master_address) == ("nccl", "127.0.0.1")
    assert routes.asked == []


def test_an_engine_on_another_host_uses_nccl_at_the_routed_address():
    routes = Routes()
    choice = choose_transport(cuda_trainer(), engine(url=REMOTE_URL, uuid=GPU_B, hostname="node-2"), routes)
    assert (choice.kind, choice.master_address) == ("nccl", ROUTE)
    assert routes.asked == ["10.1.2.3"]


def test_an_equal_uuid_on_another_host_is_not_colocated():
    choice = choose_transport(cuda_trainer(), engine(url=REMOTE_URL, hostname="node-2"), Routes())
    assert (choice.kind, choice.master_address) == ("nccl", ROUTE)


def test_a_cuda_engine_without_nccl_gets_gloo():
    for url, hostname, master in ((LOCAL_URL, "trainer-host", "127.0.0.1"), (REMOTE_URL, "node-2", ROUTE)):
        facts = engine(url=url, uuid=GPU_B, hostname=hostname, transports=("gloo",))
        choice = choose_transport(cuda_trainer(), facts, Routes())
        assert (choice.kind, choice.master_address) == ("gloo", master)


def test_an_unknown_gpu_uuid_on_the_same_host_is_not_risked_with_nccl():
    for trainer, facts in ((cuda_trainer(), engine(uuid=None)), (cuda_trainer(uuid=None), engine())):
        choice = choose_transport(trainer, facts, Routes())
        assert (choice.kind, choice.master_address) == ("gloo", "127.0.0.1")


def test_an_unknown_gpu_uuid_on_another_host_still_uses_nccl():
    choice = choose_transport(cuda_trainer(), engine(url=REMOTE_URL, uuid=None, hostname="node-2"), Routes())
    assert (choice.kind, choice.master_address) == ("nccl", ROUTE)


# ---- facts


def test_engine_facts_from_a_health_answer():
    health = HealthResponse(paused=False, sleeping_level=0, model="m", device="cuda:1", gpu_uuid=GPU_B,
                            hostname="node-2", weight_transports=["gloo", "nccl"]).model_dump(mode="json")
    facts = EngineFacts.from_health(REMOTE_URL, health)
    assert facts == EngineFacts(url=REMOTE_URL, device="cuda:1", gpu_uuid=GPU_B, hostname="node-2",
                                transports=("gloo", "nccl"))
    assert facts.host == "10.1.2.3" and facts.on_cuda


def test_health_defaults_and_an_engine_that_reports_nothing_read_as_cpu_and_gloo():
    health = HealthResponse(paused=False, sleeping_level=0, model="m").model_dump(mode="json")
    assert (health["device"], health["gpu_uuid"], health["weight_transports"]) == ("cpu", None, ["gloo"])
    silent = EngineFacts.from_health(LOCAL_URL, {"paused": False, "sleeping_level": 0, "model": "m"})
    assert silent == EngineFacts(url=LOCAL_URL)
    odd = EngineFacts.from_health(LOCAL_URL, {"device": "cuda:0", "weight_transports": ["rdma"]})
    assert odd.transports == ("gloo",)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("LOCALHOST", True), ("::1", True),
    ("[::1]", True), ("10.0.0.1", False), ("0.0.0.0", False), ("node-2", False), ("fe80::1", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_master_address_of_urls():
    routes = Routes()
    assert master_address("http://127.0.0.1:1", routes) == "127.0.0.1"
    assert master_address("http://localhost:1", routes) == "127.0.0.1"
    assert master_address("http://[::1]:1", routes) == "127.0.0.1"
    assert routes.asked == []
    assert master_address("http://node-2:1/", routes) == ROUTE
    assert routes.asked == ["node-2"]
    with pytest.raises(ValueError, match="no host"):
        master_address("not a url")


def test_local_address_towards_loopback_is_loopback():
    assert local_address_towards("127.0.0.1") == "127.0.0.1"  # a UDP connect: nothing is sent


def test_trainer_facts_on_cpu():
    assert trainer_facts("cpu") == TrainerFacts(device="cpu", gpu_uuid=None, hostname=socket.gethostname())


def test_trainer_facts_on_cuda_read_the_gpus_uuid(monkeypatch):
    from tx.inference.weight_sync import ipc

    monkeypatch.setattr(ipc, "cuda_device_uuid", lambda index: {0: GPU_A, 2: GPU_B}[index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    host = socket.gethostname()
    assert trainer_facts("cuda:2") == TrainerFacts(device="cuda:2", gpu_uuid=GPU_B, hostname=host)
    assert trainer_facts("cuda") == TrainerFacts(device="cuda:0", gpu_uuid=GPU_A, hostname=host)


def test_what_the_engines_report_about_themselves_on_cpu(tmp_path):
    from tx.inference.engines.embedded.engine import _placement as embedded_placement
    from tx.inference.engines.vllm.config import VllmEngineConfig
    from tx.inference.engines.vllm.placement import placement as vllm_placement
    from tx.inference.engines.vllm.placement import tensor_parallel_size

    expected = {"device": "cpu", "gpu_uuid": None, "hostname": socket.gethostname(),
                "weight_transports": ["gloo"]}
    assert embedded_placement(torch.device("cpu")) == expected
    if not torch.cuda.is_available():
        config = VllmEngineConfig(model_dir=tmp_path, cluster_secret="s" * 16)
        assert vllm_placement(config) == {**expected, "transfer_ranks": 1}
    assert tensor_parallel_size([]) == 1
    assert tensor_parallel_size(["--max-num-seqs", "4", "--tensor-parallel-size", "2"]) == 2
    assert tensor_parallel_size(["--tensor-parallel-size=4"]) == 4


def test_the_embedded_engine_reports_a_gpu_it_runs_on(monkeypatch):
    from tx.inference.engines.embedded import engine as embedded

    monkeypatch.setattr(embedded, "cuda_device_uuid", lambda index: {1: GPU_B}[index])
    placement = embedded._placement(torch.device("cuda", 1))
    assert placement == {"device": "cuda:1", "gpu_uuid": GPU_B, "hostname": socket.gethostname(),
                         "weight_transports": ["gloo", "nccl", "ipc"]}
    HealthResponse(paused=False, sleeping_level=0, model="m", **placement)  # fits the contract


# ---- the manager: which transport it picks and what it sends where


class FakeClient:
    """Answers /health with given facts and records posts."""

    def __init__(self, url: str, health: dict) -> None:
        self.engines = {"e-0": url}
        self.health = health
        self.gets: list[str] = []
        self.posts: list[tuple[str, dict]] = []

    async def get(self, name: str, path: str, timeout_s: float) -> dict:
        self.gets.append(path)
        return self.health

    async def post(self, name: str, path: str, body: dict, timeout_s: float | None = None) -> dict:
        self.posts.append((path, body))
        return {}

    async def aclose(self) -> None:
        pass


class FakeBroadcastSender:
    made: list[FakeBroadcastSender] = []

    def __init__(self, init: TransferInit, device: torch.device | None = None) -> None:
        self.init, self.device, self.sent = init, device, []
        FakeBroadcastSender.made.append(self)

    def connect(self) -> None:
        pass

    def send(self, named, update) -> None:
        self.sent.append(([n for n, _ in named], update))

    def close(self) -> None:
        pass


class FakeIpcSender:
    made: list[FakeIpcSender] = []

    def __init__(self, device: torch.device) -> None:
        self.device, self.released = device, False
        FakeIpcSender.made.append(self)

    def share(self, named) -> IpcUpdate:
        name, tensor = named[0]
        handle = CudaIpcHandle(device_uuid=GPU_A, storage_handle_b64="aGFuZGxl", storage_size_bytes=64,
                               storage_offset_bytes=0, ref_counter_handle_b64=None, ref_counter_offset=0,
                               event_handle_b64=None, event_sync_required=False, numel=64)
        spec = IpcTensorSpec(name=name, dtype="float32", shape=list(tensor.shape), offset=0)
        return IpcUpdate(buckets=[IpcBucket(handle=handle, tensors=[spec])])

    def release(self) -> None:
        self.released = True


NAMED = [("base_model.model.layer.lora_A.weight", torch.ones(2, 4)),
         ("base_model.model.layer.lora_B.weight", torch.zeros(4, 2))]
SPEC = LoraSpec(r=2, lora_alpha=4, target_modules=["layer"])


def run_push(monkeypatch, trainer: TrainerFacts, url: str, health: dict, routes: Routes | None = None):
    """One push through a real Publisher; what the engine then holds, the client, and where tensors went."""
    publisher, slot, client, moved = push(monkeypatch, trainer, url, health, routes)
    return publisher.held(slot), client, moved


def push(monkeypatch, trainer: TrainerFacts, url: str, health: dict, routes: Routes | None = None):
    """One push through a manager whose trainer has the facts `trainer`; returns (slot, client, moved)."""
    FakeBroadcastSender.made.clear()
    FakeIpcSender.made.clear()
    moved: list[torch.device | None] = []
    monkeypatch.setattr(publisher_module, "trainer_facts", lambda device: trainer)
    monkeypatch.setattr(publisher_module, "BroadcastSender", FakeBroadcastSender)
    monkeypatch.setattr(publisher_module, "IpcSender", FakeIpcSender)
    monkeypatch.setattr(transport_module, "local_address_towards", routes or Routes())
    monkeypatch.setattr(publisher_module, "free_port", lambda host="127.0.0.1": 29500)  # ROUTE is not ours

    def fake_send(sender, named, update, device):
        moved.append(device)  # a cpu-only torch cannot move tensors to cuda: record where they would go
        sender.send(named, update)

    monkeypatch.setattr(publisher_module, "_send", fake_send)
    client = FakeClient(url, health)
    publisher = Publisher(EngineSettings(trainer_device=trainer.device), client)
    slot = EngineSlot("e-0")
    asyncio.run(publisher.push(slot, "v-1", NAMED, SPEC))
    return publisher, slot, client, moved


def health_of(**facts) -> dict:
    return HealthResponse(paused=False, sleeping_level=0, model="m", **facts).model_dump(mode="json")


def test_manager_on_cpu_builds_todays_loopback_gloo_group(monkeypatch):
    slot, client, moved = run_push(monkeypatch, TrainerFacts(device="cpu"), LOCAL_URL, health_of())
    assert client.gets == [ROUTE_HEALTH]
    assert slot.transport.kind == "gloo"
    (sender,) = FakeBroadcastSender.made
    assert sender.init.backend == "gloo" and sender.init.master_address == "127.0.0.1"
    assert (sender.init.world_size, sender.init.rank_offset) == (2, 1)
    assert sender.device is None and moved == [None]  # packed on cpu, as before
    assert [path for path, _ in client.posts] == [ROUTE_WEIGHTS_INIT, ROUTE_WEIGHTS_UPDATE]
    assert client.posts[0][1] == sender.init.model_dump()
    assert client.posts[1][1]["adapter"] == "v-1"


def test_manager_pushes_over_nccl_from_the_trainers_gpu(monkeypatch):
    routes = Routes()
    health = health_of(device="cuda:0", gpu_uuid=GPU_B, hostname="node-2", weight_transports=["gloo", "nccl"])
    slot, client, moved = run_push(monkeypatch, cuda_trainer(), REMOTE_URL, health, routes)
    assert slot.transport.kind == "nccl"
    (sender,) = FakeBroadcastSender.made
    assert sender.init.backend == "nccl"
    assert (sender.init.master_address, sender.init.master_port) == (ROUTE, 29500)
    assert sender.device == torch.device("cuda", 0) and moved == [torch.device("cuda", 0)]
    assert routes.asked == ["10.1.2.3"]
    assert [path for path, _ in client.posts] == [ROUTE_WEIGHTS_INIT, ROUTE_WEIGHTS_UPDATE]
    assert client.posts[0][1]["backend"] == "nccl"


def test_manager_pushes_over_cuda_ipc_to_an_engine_on_its_gpu(monkeypatch):
    health = health_of(device="cuda:0", gpu_uuid=GPU_A, hostname="elsewhere",
                       weight_transports=["gloo", "nccl", "ipc"])
    slot, client, _ = run_push(monkeypatch, cuda_trainer(), LOCAL_URL, health)
    assert slot.transport.kind == "ipc" and slot.sender is None
    assert FakeBroadcastSender.made == []
    (sender,) = FakeIpcSender.made
    assert sender.device == torch.device("cuda", 0) and sender.released
    (path, body), = client.posts
    assert path == ROUTE_WEIGHTS_UPDATE_IPC
    request = IpcWeightsUpdateRequest.model_validate(body)
    assert request.adapter == "v-1" and request.lora == SPEC
    assert request.ipc.buckets[0].tensors[0].name == NAMED[0][0]


def test_manager_sends_to_a_colocated_engine_without_ipc_over_gloo(monkeypatch):
    health = health_of(device="cuda:0", gpu_uuid=GPU_A, weight_transports=["gloo", "nccl"])
    slot, client, moved = run_push(monkeypatch, cuda_trainer(), LOCAL_URL, health)
    assert slot.transport.kind == "gloo"
    (sender,) = FakeBroadcastSender.made
    assert sender.init.backend == "gloo" and sender.device is None and moved == [None]


def test_manager_asks_again_after_an_engine_restart(monkeypatch):
    publisher, slot, _, _ = push(monkeypatch, TrainerFacts(device="cpu"), LOCAL_URL, health_of())
    assert publisher.held(slot).transport is not None and publisher.held(slot).sender is not None
    publisher.forget(slot)  # what the supervisor tells it when the engine's process is replaced
    assert publisher.held(slot).transport is None and publisher.held(slot).sender is None


def test_ipc_request_needs_adapter_and_lora_together():
    update = IpcUpdate(buckets=[])
    with pytest.raises(ValueError, match="both"):
        IpcWeightsUpdateRequest(ipc=update, adapter="a")
    IpcWeightsUpdateRequest(ipc=update)
