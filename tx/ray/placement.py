"""Where engines and trainer workers go in a Ray placement group: pure logic, no Ray import.

Layout (docs/engines.md#engines-on-ray; after SkyRL's and vLLM's RLHF examples):
- One placement group of one-GPU bundles, `[{"GPU": 1, "CPU": c}] * n`, strategy PACK.
- Colocated: trainer rank i and the engines share the same bundles; every actor claims a fraction of
  its bundle's GPU (`gpu_fraction`, 0.2 by default), so Ray places two of them on one GPU and gives
  both the same CUDA_VISIBLE_DEVICES. Engine e with tensor parallel size t owns bundles
  `e*t .. e*t+t-1`; there are `max(trainer ranks, engines * t)` bundles.
- Not colocated: the trainer's bundles come first (`0 .. ranks-1`), the engines' after them, and
  every actor claims its bundle's whole GPU.
- An engine wider than one GPU (t > 1, vLLM only) is one actor with no resources of its own, scheduled
  on its first bundle; the launcher gives its engine the GPUs of its t bundles (CUDA_VISIBLE_DEVICES) and
  vLLM runs its tensor-parallel workers as its own processes (not vLLM's Ray executor: the engine is a
  child process of the actor, outside Ray). Its t bundles must be on one node (PACK does that when the
  nodes have t GPUs or more free; STRICT_PACK forces it for the whole group).
- Without GPUs (`use_gpu=False`) bundles hold CPUs only; useful for CPU clusters and tests.
- Named nodes: `trainer_labels` / `engine_labels` are Ray node labels (`ray start --labels k=v`) that the
  trainer's / the engines' bundles ask for (one label selector per bundle, exact matches), so the trainer
  workers and the engines land on the nodes an operator named (docs/operations.md#a-ray-cluster). Colocated
  bundles hold both, so they ask for both.

The launcher turns an `ActorPlacement` into Ray's actor options; nothing here starts anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class ActorPlacement:
    """Where one actor runs and what it claims from its bundle."""

    bundle_index: int
    num_gpus: float
    num_cpus: float
    bundle_indices: tuple[int, ...] = ()  # every bundle the actor's work spans (its TP ranks' GPUs)


@dataclass(frozen=True, kw_only=True)
class PlacementSpec:
    """How many engines, how wide, and whether they share GPUs with trainer workers."""

    num_engines: int
    tensor_parallel_size: int = 1  # GPUs (bundles) per engine
    num_trainer_workers: int = 0  # trainer ranks, one GPU (bundle) each
    colocate: bool = False  # trainer workers and engines share the same bundles
    gpu_fraction: float = 0.2  # share of a GPU each colocated actor claims (a logical amount)
    cpus_per_bundle: float = 1.0
    use_gpu: bool = True  # False: CPU-only bundles (no GPU claims)
    strategy: str = "PACK"
    trainer_labels: Mapping[str, str] = field(default_factory=dict)  # Ray node labels the trainer's bundles ask
    engine_labels: Mapping[str, str] = field(default_factory=dict)  # ... and the engines' bundles

    def __post_init__(self) -> None:
        if self.num_engines < 1:
            raise ValueError(f"num_engines must be at least 1, got {self.num_engines}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}")
        if self.num_trainer_workers < 0:
            raise ValueError(f"num_trainer_workers must be 0 or more, got {self.num_trainer_workers}")
        if not 0 < self.gpu_fraction <= 0.5:
            raise ValueError(
                f"gpu_fraction must be in (0, 0.5] so a trainer worker and an engine fit on one GPU, "
                f"got {self.gpu_fraction}"
            )
        if self.cpus_per_bundle <= 0:
            raise ValueError(f"cpus_per_bundle must be positive, got {self.cpus_per_bundle}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.colocate and not self.use_gpu:
            raise ValueError("colocate shares GPUs between trainers and engines: it needs use_gpu=True")
        if self.colocate:
            clash = [k for k, v in self.trainer_labels.items() if self.engine_labels.get(k, v) != v]
            if clash:
                raise ValueError(f"colocated trainer workers and engines share bundles, but their node labels "
                                 f"differ on {', '.join(clash)}")

    @property
    def engine_gpus(self) -> int:
        return self.num_engines * self.tensor_parallel_size

    @property
    def num_bundles(self) -> int:
        if self.colocate:
            return max(self.num_trainer_workers, self.engine_gpus)
        return self.num_trainer_workers + self.engine_gpus

    @property
    def num_gpus(self) -> int:
        """GPUs the whole group reserves."""
        return self.num_bundles if self.use_gpu else 0

    def bundles(self) -> list[dict[str, float]]:
        bundle = {"GPU": 1, "CPU": self.cpus_per_bundle} if self.use_gpu else {"CPU": self.cpus_per_bundle}
        return [dict(bundle) for _ in range(self.num_bundles)]

    def label_selectors(self) -> list[dict[str, str]] | None:
        """One Ray label selector per bundle (Ray's `bundle_label_selector`); None when no labels are asked."""
        if not self.trainer_labels and not self.engine_labels:
            return None
        if self.colocate:
            return [{**self.trainer_labels, **self.engine_labels} for _ in range(self.num_bundles)]
        trainer = [dict(self.trainer_labels) for _ in range(self.num_trainer_workers)]
        return trainer + [dict(self.engine_labels) for _ in range(self.engine_gpus)]

    def check_labels(self, node_labels: Iterable[Mapping[str, str]]) -> None:
        """ValueError, naming the selector and the labels there are, if no node carries the labels asked."""
        nodes = [dict(labels) for labels in node_labels]
        for selector in {tuple(sorted(s.items())) for s in self.label_selectors() or []}:
            if not any(all(node.get(k) == v for k, v in selector) for node in nodes):
                asked = ", ".join(f"{k}={v}" for k, v in selector)
                there = sorted({f"{k}={v}" for node in nodes for k, v in node.items()
                                if not k.startswith("ray.io/")})
                raise ValueError(f"no node of the Ray cluster has the labels {asked} (the nodes carry: "
                                 f"{', '.join(there) or 'none'}); start one with `ray start --labels ...`")

    def claim(self) -> tuple[float, float]:
        """(num_gpus, num_cpus) one actor claims from its bundle."""
        if self.colocate:
            return self.gpu_fraction, self.cpus_per_bundle * self.gpu_fraction
        return (1 if self.use_gpu else 0), self.cpus_per_bundle

    def engine(self, index: int) -> ActorPlacement:
        """Placement of engine `index` (0-based)."""
        if not 0 <= index < self.num_engines:
            raise ValueError(f"engine index {index} out of range: the group holds {self.num_engines} engines")
        tp = self.tensor_parallel_size
        first = (0 if self.colocate else self.num_trainer_workers) + index * tp
        indices = tuple(range(first, first + tp))
        num_gpus, num_cpus = self.claim()
        if tp == 1:
            return ActorPlacement(first, num_gpus, num_cpus, indices)
        return ActorPlacement(first, 0, 0, indices)  # the launcher hands it the GPUs of `indices`

    def trainer(self, rank: int) -> ActorPlacement:
        """Placement of trainer worker `rank` (0-based)."""
        if not 0 <= rank < self.num_trainer_workers:
            raise ValueError(
                f"trainer rank {rank} out of range: "
                f"the group holds {self.num_trainer_workers} trainer workers"
            )
        num_gpus, num_cpus = self.claim()
        return ActorPlacement(rank, num_gpus, num_cpus, (rank,))

    def check_fits(self, cluster_resources: Mapping[str, float]) -> None:
        """ValueError, naming what is short, if the cluster cannot hold the group's bundles."""
        need = {"GPU": float(self.num_gpus), "CPU": self.num_bundles * self.cpus_per_bundle}
        for resource, amount in need.items():
            have = float(cluster_resources.get(resource, 0))
            if amount > have:
                raise ValueError(
                    f"the placement needs {amount:g} {resource} ({self.num_bundles} bundles: "
                    f"{self.num_engines} engines x tensor parallel {self.tensor_parallel_size}, "
                    f"{self.num_trainer_workers} trainer workers, colocate={self.colocate}) "
                    f"but the Ray cluster has {have:g}"
                )
