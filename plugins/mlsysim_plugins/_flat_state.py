"""Reference-grade optimizer state: a flat number of bytes per trainable parameter, sharded
by the optimizer-state rules (the reference model's convention for every optimizer)."""

from mlsysim_core import OPTIMIZER_STATE, MemoryTerm

from ._fmt import n, shard


def flat_state_terms(placement, label: str, bytes_per_parameter: float, explained: str) -> list[MemoryTerm]:
    params = placement.trainable_parameters_per_rank
    shards = placement.optimizer_state_shards
    return [MemoryTerm(component=OPTIMIZER_STATE, label=label, nbytes=params * bytes_per_parameter / shards,
                       formula=f"{n(params)} trainable params/rank x {explained}"
                               + shard(shards, "optimizer state sharded: "
                                       + ", ".join(placement.shard_sources["optimizer_state_shards"])))]
