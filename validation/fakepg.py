"""One rank of a fake process-group world, as the measure scripts that shard a model play it.

``torch.distributed.init_process_group("fake", store=FakeStore(), rank=r, world_size=W)``: collectives allocate
their outputs and move no data, so one process measures what rank ``r`` of ``W`` holds (fsdp_no_sync/measure.py,
lora_fsdp1/measure.py, parallel/measure_parallel.py, published/torchtitan_measure.py, lora_parallel/measure_lora_tp_pp.py,
compile/measure_blocks.py)."""

from __future__ import annotations

import contextlib
import gc

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore


@contextlib.contextmanager
def fake_world(rank: int, world_size: int, *, collect: bool = False):
    """Rank ``rank`` of a fake world of ``world_size`` inside the block; the process group destroyed on the way
    out, whatever happened inside, and with ``collect`` a ``gc.collect()`` after it (what the rank built freed
    before the next configuration)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        if collect:
            gc.collect()
