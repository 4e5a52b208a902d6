"""Ray on CPU: placement with logical GPUs, and two embedded engines as Ray actors behind tx's EngineManager.

One local Ray per module (`num_gpus` logical: this machine has none), with auth off and a small object
store. The engine tests share one manager on an event loop in a background thread, as the server's
loop is, so the training thread's entry point (`training_pass`) runs for real. They run in order:
routing, fan-out, then killed actors.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")
if not hasattr(ray, "init"):  # tests/ is on sys.path, so tests/ray can pose as the package
    pytest.skip("ray is not installed (pip install 'tx[ray]')", allow_module_level=True)

from live_manager import LiveManager

from tx.inference.launch.ray_launcher import RayEngine, RayLauncher, bundle_gpus, ray_options
from tx.inference.manager import EngineManager, EngineSettings
from tx.inference.manager.router import Router
from tx.models.tiny import write_tiny_text_model
from tx.ray import connect
from tx.ray.placement import PlacementSpec

pytestmark = pytest.mark.ray

LOGICAL_GPUS = 8
MODEL = "tiny"


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if ray.is_initialized():
        ray.shutdown()
    connect(num_cpus=2, num_gpus=LOGICAL_GPUS, object_store_memory=200 * 1024**2)
    yield
    ray.shutdown()


@ray.remote
class Probe:
    def devices(self) -> tuple[str | None, list]:
        return os.environ.get("CUDA_VISIBLE_DEVICES"), ray.get_gpu_ids()


def _probe(placement, group) -> tuple[str | None, list]:
    actor = Probe.options(**ray_options(placement, group)).remote()
    try:
        return ray.get(actor.devices.remote(), timeout=60)
    finally:
        ray.kill(actor)


def _group(launcher: RayLauncher):
    return asyncio.run(launcher.placement_group())


def test_colocated_actors_share_one_logical_gpu():
    spec = PlacementSpec(num_engines=1, num_trainer_workers=1, colocate=True, cpus_per_bundle=0.5)
    launcher = RayLauncher(spec, "unused-secret")
    group = _group(launcher)
    try:
        trainer_devices, trainer_ids = _probe(spec.trainer(0), group)
        engine_devices, engine_ids = _probe(spec.engine(0), group)
        assert trainer_devices == engine_devices and trainer_devices is not None
        assert len(trainer_ids) == 1 and trainer_ids == engine_ids
    finally:
        asyncio.run(launcher.close())


def test_separate_trainer_and_engine_get_different_gpus():
    spec = PlacementSpec(num_engines=1, num_trainer_workers=1, cpus_per_bundle=0.5)
    launcher = RayLauncher(spec, "unused-secret")
    group = _group(launcher)
    try:
        trainer_devices, _ = _probe(spec.trainer(0), group)
        engine_devices, _ = _probe(spec.engine(0), group)
        assert trainer_devices is not None and engine_devices is not None
        assert trainer_devices != engine_devices
    finally:
        asyncio.run(launcher.close())


def test_tensor_parallel_engine_gets_the_gpus_of_its_colocated_trainers():
    spec = PlacementSpec(num_engines=1, tensor_parallel_size=2, num_trainer_workers=2, colocate=True,
                         cpus_per_bundle=0.5)
    # the same two colocated bundles, from a launcher that needs no vLLM installed
    launcher = RayLauncher(PlacementSpec(num_engines=2, num_trainer_workers=2, colocate=True,
                                         cpus_per_bundle=0.5), "unused-secret")
    group = _group(launcher)
    try:
        trainers = [_probe(spec.trainer(r), group)[0] for r in range(2)]
        env = asyncio.run(bundle_gpus(spec.engine(0), group, spec))
        assert env == {"CUDA_VISIBLE_DEVICES": ",".join(trainers)} and len(set(trainers)) == 2
    finally:
        asyncio.run(launcher.close())


def test_embedded_engine_refuses_tensor_parallel():
    with pytest.raises(ValueError, match="needs the vLLM engine"):
        RayLauncher(PlacementSpec(num_engines=1, tensor_parallel_size=2), "unused-secret")


def test_placement_larger_than_the_cluster_is_refused():
    launcher = RayLauncher(PlacementSpec(num_engines=LOGICAL_GPUS + 1, cpus_per_bundle=0.1), "unused-secret")
    with pytest.raises(ValueError, match=rf"needs {LOGICAL_GPUS + 1} GPU .* has {LOGICAL_GPUS}"):
        _group(launcher)


# -- two embedded engines as actors, driven by the real EngineManager ---------------------------


class Live(LiveManager):
    def __init__(self, manager: EngineManager, launcher: RayLauncher) -> None:
        super().__init__(manager, MODEL)
        self.launcher = launcher

    def handle(self, name: str) -> RayEngine:
        (engine,) = [e for e in self.manager.engine_processes() if e.name == name]
        assert isinstance(engine, RayEngine)
        return engine


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Live]:
    model_dir = write_tiny_text_model(tmp_path_factory.mktemp("tiny-model"), preset="tiny", seed=0)
    launcher = RayLauncher(PlacementSpec(num_engines=2, cpus_per_bundle=0.5), "ray-test-" + uuid.uuid4().hex,
                           work_dir=tmp_path_factory.mktemp("engines"), num_threads=1, log_level="warning")
    manager = EngineManager({MODEL: model_dir}, EngineSettings(count=2, colocate=True), launcher)
    live = Live(manager, launcher)
    yield live
    live.close()


def _sampler_homes() -> dict[str, str]:
    """A sampler id whose home is each engine."""
    names = sorted(f"{MODEL}-{i}" for i in range(2))
    router, homes = Router(["0", "1"]), {}
    for i in range(100):
        homes.setdefault(names[int(router.pick(f"sampler-{i}"))], f"sampler-{i}")
    assert len(homes) == 2
    return homes


def _requests(engines: dict[str, dict]) -> dict[str, int]:
    return {name: e["health"]["stats"]["num_requests"] for name, e in engines.items()}


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"engine process {pid} outlived its actor")


def _wait_dead(engine: RayEngine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.alive:
        assert time.monotonic() < deadline, f"{engine.name} still reads as alive after its actor was killed"
        time.sleep(0.05)


def test_engines_start_as_actors_in_the_placement_group(live: Live):
    live.sample("warmup")
    engines = live.engines()
    assert set(engines) == {f"{MODEL}-0", f"{MODEL}-1"}
    handles = [live.handle(name) for name in engines]
    assert all(h.alive for h in handles)
    assert sorted(h.bundle_index for h in handles) == [0, 1]
    assert len({h.cuda_visible_devices for h in handles}) == 2  # one logical GPU each
    assert all(h.url.startswith("http://127.0.0.1:") for h in handles)  # loopback: same node as the server


def test_a_sessions_samples_stay_on_its_engine(live: Live):
    homes = _sampler_homes()
    before = _requests(live.engines())
    for sampler in homes.values():
        for seq in range(3):
            assert len(live.sample(sampler, seq).sequences[0].tokens) == 4
    after = _requests(live.engines())
    assert {name: after[name] - before[name] for name in after} == {name: 3 for name in homes}
    other = homes[f"{MODEL}-0"]
    before = after
    for seq in range(3, 7):
        live.sample(other, seq)
    after = _requests(live.engines())
    assert after[f"{MODEL}-0"] - before[f"{MODEL}-0"] == 4 and after[f"{MODEL}-1"] == before[f"{MODEL}-1"]


def test_sleep_and_wake_reach_both_engines(live: Live):
    with live.manager.training_pass():  # the training thread's entry point: colocated engines sleep
        pass
    engines = live.engines()
    assert all(e["health"]["sleeping_level"] == 1 for e in engines.values())
    live.sample("after-sleep")  # a cold sample wakes the whole group
    engines = live.engines()
    assert all(e["health"]["sleeping_level"] == 0 for e in engines.values())


def test_killed_actor_is_routed_around_and_restarted_in_the_background(live: Live):
    homes = _sampler_homes()
    victim = live.handle(f"{MODEL}-0")
    ray.kill(victim.actor)
    _wait_dead(victim)
    _wait_gone(victim.pid)  # the engine process goes with its actor

    assert len(live.sample(homes[f"{MODEL}-0"]).sequences[0].tokens) == 4  # served by the survivor
    deadline = time.monotonic() + 120  # the sample that skipped it started its restart
    while (restarted := live.handle(f"{MODEL}-0")) is victim or not restarted.alive:
        assert time.monotonic() < deadline, "the dead engine was not restarted"
        time.sleep(0.2)
    assert restarted is not victim and restarted.alive and restarted.pid != victim.pid
    assert restarted.bundle_index == victim.bundle_index  # it keeps its place in the group
    before = _requests(live.engines())
    live.sample(homes[f"{MODEL}-0"])
    after = _requests(live.engines())
    assert after[f"{MODEL}-0"] == before[f"{MODEL}-0"] + 1


def test_sampling_restarts_killed_actors(live: Live):
    homes = _sampler_homes()
    victims = [live.handle(name) for name in sorted(homes)]
    for victim in victims:
        ray.kill(victim.actor)
    for victim in victims:
        _wait_dead(victim)
        _wait_gone(victim.pid)

    result = live.sample(homes[f"{MODEL}-1"])  # no engine alive: its home engine restarts and serves it
    assert len(result.sequences[0].tokens) == 4
    restarted = live.handle(f"{MODEL}-1")
    assert restarted.alive and restarted.pid != victims[1].pid
    assert live.engines()[f"{MODEL}-1"]["health"]["stats"]["num_requests"] == 1
