"""Units of work and what they need: a deployment, or one of its `replicas` data-parallel shards.

A unit's items are fixed by position (every `shards`-th item of each suite), not by what is pending, so a
unit retried or resumed later owns exactly the same items and only runs those still without a record.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Unit:
    """One engine load: `deployment`'s items i with i % shards == shard."""

    deployment: str
    shard: int = 0
    shards: int = 1

    @property
    def unit_id(self) -> str:
        return self.deployment if self.shards == 1 else f"{self.deployment}[{self.shard + 1}/{self.shards}]"


def shard_of(items: Sequence[T], shard: int, shards: int) -> list[T]:
    """Round-robin split: shards stay balanced across categories, which suites list grouped."""
    return [it for i, it in enumerate(items) if i % shards == shard]


@dataclass(frozen=True)
class UnitResources:
    """What one unit asks Ray for.

    `num_cpus`/`num_gpus` are held by the unit's own process (Ray sets CUDA_VISIBLE_DEVICES to those GPUs;
    a task's GPUs are always on one node). `gpu_bundles` > 0 reserves a STRICT_PACK placement group of that
    many {GPU: gpus_per_bundle, CPU: 1} bundles on one node for the engine's own workers (vLLM tensor
    parallelism runs one Ray actor per rank inside the unit's placement group, one GPU per bundle).
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    gpu_bundles: int = 0
    gpus_per_bundle: float = 1.0

    def bundles(self) -> list[dict[str, float]]:
        return [{"CPU": 1.0, "GPU": self.gpus_per_bundle} for _ in range(self.gpu_bundles)]

    def largest_node_need(self) -> dict[str, float]:
        """What one node must offer for this unit ever to start (it all sits on one node)."""
        if self.gpu_bundles:
            return {"CPU": float(self.gpu_bundles), "GPU": self.gpu_bundles * self.gpus_per_bundle}
        need = {"CPU": self.num_cpus}
        if self.num_gpus:
            need["GPU"] = self.num_gpus
        return need


def ray_resources(declared: Any) -> UnitResources:
    """An engine's declared `UnitResources` (evalkit.engines.spec: num_cpus, num_gpus, bundles) as Ray
    asks for them: GPUs split over several bundles (tensor parallelism) become a placement group; GPUs in
    one bundle are held by the unit's process itself."""
    cpus, gpus, bundles = float(declared.num_cpus), float(declared.num_gpus), int(declared.bundles or 1)
    if gpus and bundles > 1:
        return UnitResources(num_cpus=cpus, num_gpus=0.0, gpu_bundles=bundles, gpus_per_bundle=gpus / bundles)
    return UnitResources(num_cpus=cpus, num_gpus=gpus)


def engine_resources(engine: str, options: Any) -> UnitResources:
    """What a deployment's unit needs, from its engine's declaration (`EngineSpec.resources(options)`)."""
    from evalkit.engines import engine_spec

    return ray_resources(engine_spec(engine).resources(options))
