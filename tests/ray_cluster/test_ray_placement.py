"""Placement logic (pure: no Ray needed): bundles, per-actor claims, validation."""

from __future__ import annotations

import sys

import pytest

from tx.ray.placement import ActorPlacement, PlacementSpec


def test_separate_engines_take_whole_gpus_after_the_trainer():
    spec = PlacementSpec(num_engines=2, num_trainer_workers=2)
    assert spec.bundles() == [{"GPU": 1, "CPU": 1.0}] * 4 and spec.strategy == "PACK"
    assert [spec.trainer(r).bundle_index for r in range(2)] == [0, 1]
    assert spec.engine(0) == ActorPlacement(2, 1, 1.0, (2,))
    assert spec.engine(1) == ActorPlacement(3, 1, 1.0, (3,))


def test_colocated_actors_share_bundles_with_fractions():
    spec = PlacementSpec(num_engines=2, num_trainer_workers=2, colocate=True, gpu_fraction=0.2)
    assert spec.num_bundles == 2 and spec.num_gpus == 2
    for i in range(2):
        trainer, engine = spec.trainer(i), spec.engine(i)
        assert trainer.bundle_index == engine.bundle_index == i
        assert trainer.num_gpus == engine.num_gpus == 0.2
        assert trainer.num_cpus == engine.num_cpus == pytest.approx(0.2)


def test_colocated_group_is_as_wide_as_its_widest_side():
    assert PlacementSpec(num_engines=1, num_trainer_workers=4, colocate=True).num_bundles == 4
    assert PlacementSpec(num_engines=3, num_trainer_workers=1, colocate=True).num_bundles == 3


def test_tensor_parallel_engine_spans_bundles_and_claims_none_itself():
    spec = PlacementSpec(num_engines=2, tensor_parallel_size=2, num_trainer_workers=4, colocate=True,
                         gpu_fraction=0.4)
    second = spec.engine(1)
    assert (second.bundle_index, second.bundle_indices) == (2, (2, 3))
    assert (second.num_gpus, second.num_cpus) == (0, 0)  # the launcher hands it the GPUs of bundles 2 and 3


def test_cpu_only_bundles():
    spec = PlacementSpec(num_engines=2, use_gpu=False, cpus_per_bundle=0.5)
    assert spec.bundles() == [{"CPU": 0.5}] * 2 and spec.num_gpus == 0
    assert spec.engine(1) == ActorPlacement(1, 0, 0.5, (1,))


@pytest.mark.parametrize("kwargs, message", [
    ({"num_engines": 0}, "num_engines"),
    ({"num_engines": 1, "tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"num_engines": 1, "num_trainer_workers": -1}, "num_trainer_workers"),
    ({"num_engines": 1, "colocate": True, "gpu_fraction": 0.6}, "gpu_fraction"),
    ({"num_engines": 1, "gpu_fraction": 0}, "gpu_fraction"),
    ({"num_engines": 1, "cpus_per_bundle": 0}, "cpus_per_bundle"),
    ({"num_engines": 1, "strategy": "pack"}, "strategy"),
    ({"num_engines": 1, "colocate": True, "use_gpu": False}, "use_gpu"),
])
def test_invalid_specs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PlacementSpec(**kwargs)


def test_indices_out_of_range():
    spec = PlacementSpec(num_engines=1, num_trainer_workers=1)
    with pytest.raises(ValueError, match="engine index 1"):
        spec.engine(1)
    with pytest.raises(ValueError, match="trainer rank 1"):
        spec.trainer(1)


def test_cluster_without_enough_gpus_is_a_clear_error():
    spec = PlacementSpec(num_engines=4, num_trainer_workers=2)
    spec.check_fits({"GPU": 6.0, "CPU": 16.0})
    with pytest.raises(ValueError, match=r"needs 6 GPU .* has 4"):
        spec.check_fits({"GPU": 4.0, "CPU": 16.0})
    with pytest.raises(ValueError, match=r"needs 6 GPU .* has 0"):
        spec.check_fits({"CPU": 16.0})
    with pytest.raises(ValueError, match=r"needs 6 CPU .* has 2"):
        spec.check_fits({"GPU": 8.0, "CPU": 2.0})


def test_node_labels_give_each_bundle_its_sides_selector():
    spec = PlacementSpec(num_engines=1, num_trainer_workers=2, use_gpu=False,
                         trainer_labels={"tx-node": "a"}, engine_labels={"tx-node": "b"})
    assert spec.label_selectors() == [{"tx-node": "a"}, {"tx-node": "a"}, {"tx-node": "b"}]
    assert PlacementSpec(num_engines=2, use_gpu=False).label_selectors() is None  # Ray is not asked
    engines_only = PlacementSpec(num_engines=2, num_trainer_workers=1, engine_labels={"pool": "gen"})
    assert engines_only.label_selectors() == [{}, {"pool": "gen"}, {"pool": "gen"}]


def test_colocated_bundles_ask_for_both_sides_labels():
    spec = PlacementSpec(num_engines=1, num_trainer_workers=2, colocate=True,
                         trainer_labels={"zone": "x"}, engine_labels={"gpu": "h100"})
    assert spec.label_selectors() == [{"zone": "x", "gpu": "h100"}] * 2
    with pytest.raises(ValueError, match="differ on tx-node"):
        PlacementSpec(num_engines=1, num_trainer_workers=1, colocate=True,
                      trainer_labels={"tx-node": "a"}, engine_labels={"tx-node": "b"})


def test_a_label_no_node_carries_is_a_clear_error():
    spec = PlacementSpec(num_engines=1, num_trainer_workers=2, use_gpu=False,
                         trainer_labels={"tx-node": "a"}, engine_labels={"tx-node": "b"})
    nodes = [{"ray.io/node-id": "1", "tx-node": "a"}, {"ray.io/node-id": "2", "tx-node": "b", "zone": "x"}]
    spec.check_labels(nodes)
    with pytest.raises(ValueError, match=r"no node .* has the labels tx-node=b \(the nodes carry: tx-node=a\)"):
        spec.check_labels(nodes[:1])
    PlacementSpec(num_engines=1, use_gpu=False).check_labels([])  # no labels asked: nothing to check


def test_missing_ray_names_the_extra(monkeypatch):
    from tx.ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'tx\[ray\]'"):
        import_ray()
