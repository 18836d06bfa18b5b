"""PyTorch's CUDA caching allocator: what it reserves beyond the bytes a training step allocates.

``torch.cuda.max_memory_reserved`` counts the segments the caching allocator holds (cudaMalloc'd,
or mapped pages of an expandable segment); ``max_memory_allocated`` the blocks it hands out. The
difference is made of:

* **block and segment rounding** (``round_size``, ``get_allocation_size``, ``should_split``): every
  request is rounded to 512 B; a request of at most 1 MiB comes from the small pool, packed into
  2 MiB segments; one below 10 MiB from a 20 MiB segment it splits; a larger one gets a segment of
  its size rounded up to 2 MiB. A large-pool block is split only if more than 1 MiB remains, so a
  remainder of up to 1 MiB stays with the block. The model states (weights, gradients, optimizer
  moments) are allocated once and never freed: what their rounding reserves is exact, and this
  module computes it by allocating the rank's tensors through ``CachingAllocator``.
* **one pool per stream**: a block freed on one stream is reused only by requests on that stream
  (``get_free_block`` looks up ``(stream, size)``). A side stream's high-water mark stays reserved while
  the default stream peaks. FSDP2 (torch 2.13 ``_fsdp_collectives.py``) allocates the reduce-scatter
  output, which becomes the sharded gradients, on its reduce-scatter stream (``foreach_reduce``:
  ``with device_handle.stream(reduce_scatter_stream): reduce_output = ...allocate(...)``) and the flat
  all-gather output on its all-gather copy-in stream (``foreach_all_gather``). The sharded gradients
  die at ``zero_grad`` before the next forward, so at the activations' peak that pool is idle but
  reserved; the all-gather outputs are held until the next unshard (the root group's, then one
  layer's beside it). A data-parallel rule declares its pools through its options object's
  ``allocator_streams(plan, placement)`` (FSDP's rules do), which ``stream_pool_terms`` prices.
* **fragmentation** of the default stream's pool: a freed block that later requests do not fit
  (or fit only in part), which depends on the order and sizes of every activation's allocation
  and free. The profile knows the bytes alive in each phase, not that order: it is not priced, and
  the term's formula says so. ``validation/reserved/`` measures it by replaying recorded CPU
  allocation traces through ``CachingAllocator`` (docs/profiles.md).

``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, set by torchtitan's
and torchtune's launch scripts): one segment per (stream, pool), grown by mapping 20 MiB pages
(2 MiB for the small pool) at its end (``ExpandableSegment``, ``try_allocate_expandable_block``);
blocks split whenever at least 512 B remain. The model states then pack contiguously: their
rounding is the 512 B of each block and the last page. Pools per stream stay.

Source: pytorch/pytorch eb42ad6eca0ce61e7c581212b4bf32f991425571 ``c10/cuda/CUDACachingAllocator.cpp``
(the functions named above and in ``CachingAllocator``); not cited functions (events, ``record_stream``,
``empty_cache``, garbage collection, CUDA graph pools, ``max_split_size_mb``, ``roundup_power2_divisions``)
are at their defaults, which do nothing here.
"""

from __future__ import annotations

import bisect
import itertools

import attrs

from mlsysim_core.memo import memoize

# pytorch/pytorch eb42ad6eca0ce61e7c581212b4bf32f991425571 c10/cuda/CUDACachingAllocator.cpp, the constants at
# the top of namespace Native (kLargeBuffer in namespace CUDACachingAllocator):
K_MIN_BLOCK_SIZE = 512            # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1_048_576          # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2_097_152        # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20_971_520       # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
K_MIN_LARGE_ALLOC = 10_485_760    # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2_097_152         # kRoundLarge: round up large allocations to 2 MiB
SOURCE = "pytorch/pytorch eb42ad6e c10/cuda/CUDACachingAllocator.cpp"

DEFAULT_STREAM = "default"


def round_size(size: int) -> int:
    """``DeviceCachingAllocator::round_size`` (roundup_power2_divisions unset: 512 B multiples)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a (rounded) request no cached block serves."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class _Block:
    __slots__ = ("stream", "small", "size", "ptr", "allocated", "mapped", "prev", "next", "expandable")

    def __init__(self, stream, small, size, ptr, *, mapped=True, expandable=False):
        self.stream, self.small, self.size, self.ptr = stream, small, size, ptr
        self.allocated, self.mapped, self.expandable = False, mapped, expandable
        self.prev = self.next = None

    def key(self):
        return (self.size, self.ptr)


class CachingAllocator:
    """A re-implementation of ``DeviceCachingAllocator``'s block, segment and pool logic (one device,
    no events, no CUDA graphs, default configuration), enough to replay an allocation trace:
    ``malloc(size, stream) -> handle``, ``free(handle)``, and the statistics ``allocated`` (the
    blocks handed out, as ``allocated_bytes``), ``requested``, ``reserved`` (``reserved_bytes``) with
    their peaks, and ``reserved_by_stream``.

    Pools: ``(stream, small)`` -> free blocks ordered by ``(size, ptr)`` (``BlockComparatorSize``
    within one stream). ``malloc`` follows ``DeviceCachingAllocator::malloc``: ``round_size``, the
    pool by size (``get_pool``: at most kSmallSize is small), best fit (``get_free_block``: the
    smallest cached block of the stream at least the size, the lowest address among equals), else a
    new segment (``alloc_block``: ``get_allocation_size``; with expandable segments
    ``try_allocate_expandable_block``), then ``alloc_found_block`` splits when ``should_split``.
    ``free`` is ``free_block``: merge with free neighbours of the same segment (``try_merge_blocks``)."""

    def __init__(self, expandable_segments: bool = False, capacity: int = 2**40):
        self.expandable = bool(expandable_segments)
        self.capacity = capacity          # an expandable segment's address space (no OOM is modelled)
        self._free: dict[tuple, list] = {}        # (stream, small) -> sorted [(size, ptr, block)]
        self._unmapped: dict[tuple, list] = {}    # (stream, small) -> [block] (expandable segments)
        self._live: dict[int, tuple[_Block, int]] = {}
        self._ids = itertools.count()
        self._next_ptr = 0
        self.allocated = self.requested = self.reserved = 0
        self.peak_allocated = self.peak_requested = self.peak_reserved = 0
        self.reserved_by_stream: dict[object, int] = {}
        self.segments = 0

    # ------------------------------------------------------------------ the free-block sets
    def _insert(self, b: _Block) -> None:
        bisect.insort(self._free.setdefault((b.stream, b.small), []), (b.size, b.ptr, b))

    def _erase(self, b: _Block) -> None:
        lst = self._free[(b.stream, b.small)]
        i = bisect.bisect_left(lst, (b.size, b.ptr))
        assert lst[i][2] is b
        del lst[i]

    def _address(self, size: int) -> int:
        ptr = self._next_ptr
        self._next_ptr += size + K_LARGE_BUFFER       # segments never touch: no merge across them
        return ptr

    # ------------------------------------------------------------------ malloc / free
    def malloc(self, orig_size: int, stream=DEFAULT_STREAM) -> int:
        size = round_size(orig_size)
        small = size <= K_SMALL_SIZE                                      # get_pool
        block = self._get_free_block(stream, small, size)
        if block is None:
            block = (self._alloc_expandable(stream, small, size) if self.expandable
                     else self._alloc_block(stream, small, allocation_size(size)))
        if self._should_split(block, size):                               # alloc_found_block
            rest = _Block(stream, small, block.size - size, block.ptr + size, expandable=block.expandable)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.allocated = True
        handle = next(self._ids)
        self._live[handle] = (block, orig_size)
        self.allocated += block.size
        self.requested += orig_size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        return handle

    def free(self, handle: int) -> None:
        block, orig_size = self._live.pop(handle)
        self.allocated -= block.size
        self.requested -= orig_size
        block.allocated = False
        for other in (block.prev, block.next):                            # free_block -> try_merge_blocks
            self._try_merge(block, other)
        self._insert(block)

    def _try_merge(self, dst: _Block, src: _Block | None) -> None:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            self._erase(src)
        else:
            self._unmapped[(src.stream, src.small)].remove(src)
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return remaining > K_SMALL_SIZE          # max_split_size unset (SIZE_MAX): always below it

    def _get_free_block(self, stream, small, size) -> _Block | None:
        lst = self._free.get((stream, small))
        if not lst:
            return None
        i = bisect.bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        if lst[i][2].expandable:
            # get_free_block: an expandable block is judged by the size it can grow to (its size plus an
            # unmapped block after it): walk on while the next block's is smaller.
            def grow(b):
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while lst[i][2].expandable and i + 1 < len(lst) and grow(lst[i + 1][2]) < grow(lst[i][2]):
                i += 1
        block = lst.pop(i)[2]
        return block

    def _grow_reserved(self, stream, nbytes: int) -> None:
        self.reserved += nbytes
        self.reserved_by_stream[stream] = self.reserved_by_stream.get(stream, 0) + nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _alloc_block(self, stream, small, alloc_size) -> _Block:
        """``alloc_block``: a new cudaMalloc'd segment of ``get_allocation_size`` bytes."""
        self.segments += 1
        self._grow_reserved(stream, alloc_size)
        return _Block(stream, small, alloc_size, self._address(alloc_size))

    def _alloc_expandable(self, stream, small, size) -> _Block:
        """``try_allocate_expandable_block``: ``find_expandable_block`` (the lowest-address unmapped range
        of the stream's segment, from the free block before it when there is one; a new segment of the
        device's address space when none has room), then ``map_block`` until the candidate holds
        ``size`` (whole pages, ``ExpandableSegment::map``: kSmallBuffer pages for the small pool,
        kLargeBuffer for the large), each mapped range merged with the free block before it."""
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        unmapped = self._unmapped.setdefault((stream, small), [])

        def allocatable(b):
            return b is not None and not b.allocated

        def room(b):
            n = 0
            while n < size and allocatable(b):
                n, b = n + b.size, b.next
            return n >= size

        candidate = None
        for c in sorted(unmapped, key=lambda b: b.ptr):
            if allocatable(c.prev):
                c = c.prev
            if room(c):
                candidate = c
                break
        if candidate is None:
            pages = -(-self.capacity // page)
            self.segments += 1
            candidate = _Block(stream, small, pages * page, self._address(pages * page), mapped=False,
                               expandable=True)
            unmapped.append(candidate)
        if not candidate.mapped:
            self._map_block(candidate, min(candidate.size, size), page)
        while candidate.size < size:
            nxt = candidate.next
            self._map_block(nxt, min(size - candidate.size, nxt.size), page)
            candidate = nxt
        self._erase(candidate)
        return candidate

    def _map_block(self, to_map: _Block, size: int, page: int) -> None:
        """``map_block``: map the first ``size`` bytes (in whole pages) of an unmapped block; the rest stays
        unmapped after it; merge with the free mapped block before it; into the free blocks."""
        mapped = -(-size // page) * page
        unmapped = self._unmapped[(to_map.stream, to_map.small)]
        unmapped.remove(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = _Block(to_map.stream, to_map.small, to_map.size - mapped, to_map.ptr + mapped, mapped=False,
                          expandable=True)
            rest.prev, rest.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            unmapped.append(rest)
            to_map.size = mapped
        self._try_merge(to_map, to_map.prev)
        self._try_merge(to_map, to_map.next)
        self._insert(to_map)
        self._grow_reserved(to_map.stream, mapped)


def replay(events, *, expandable_segments: bool = False) -> dict:
    """Replay an allocation trace: ``events`` is a sequence of ``("alloc", key, nbytes[, stream])``,
    ``("free", key)`` and ``("phase", name)``; a free of a key never allocated (alive before the
    trace) is skipped. Returns the peaks of ``reserved``, ``allocated`` (blocks) and ``requested``
    (the bytes asked for), overall and per phase (``by_phase``: a phase runs from its marker to the
    next; its values start at the running ones), and the reserved bytes per stream at the end."""
    a = CachingAllocator(expandable_segments)
    handles: dict = {}
    by_phase: dict[str, dict] = {}
    current = None

    def bump():
        if current is not None:
            p = by_phase[current]
            p["reserved"] = max(p["reserved"], a.reserved)
            p["allocated"] = max(p["allocated"], a.allocated)
            p["requested"] = max(p["requested"], a.requested)

    for ev in events:
        kind = ev[0]
        if kind == "alloc":
            handles[ev[1]] = a.malloc(ev[2], ev[3] if len(ev) > 3 else DEFAULT_STREAM)
        elif kind == "free":
            h = handles.pop(ev[1], None)
            if h is not None:
                a.free(h)
        elif kind == "phase":
            current = ev[1]
            by_phase[current] = {"reserved": a.reserved, "allocated": a.allocated, "requested": a.requested}
        bump()
    return {"peak_reserved": a.peak_reserved, "peak_allocated": a.peak_allocated,
            "peak_requested": a.peak_requested, "by_phase": by_phase, "segments": a.segments,
            "reserved_by_stream": dict(a.reserved_by_stream)}


@memoize
def rounding_reserve(sizes: tuple, expandable_segments: bool) -> int:
    """Bytes reserved beyond ``sizes`` (``(nbytes, stream)`` pairs) when a fresh allocator allocates them
    in that order and frees none: the block and segment rounding of the model states."""
    a = CachingAllocator(expandable_segments)
    for nbytes, stream in sizes:
        a.malloc(nbytes, stream)
    return a.reserved - sum(n for n, _ in sizes)


@attrs.frozen
class StreamPool:
    """A side stream's pool: ``nbytes`` its high-water mark the default stream's peak cannot reuse."""
    stream: str
    nbytes: int
    formula: str


@attrs.frozen
class SideStream:
    """A side stream's allocations and frees over a step, in order, as a data-parallel rule declares them
    (its options object's ``allocator_streams(plan, placement)``): ``events`` of ``("alloc", key, bytes)``
    and ``("free", key)``; what they hold; and ``counted``: the bytes of them the peak allocated already
    counts (alive at the peak), so that only the rest of the pool is reserve."""
    stream: str
    events: tuple[tuple, ...]
    holds: str
    counted: int = 0

    @property
    def blocks(self) -> int:
        return sum(1 for e in self.events if e[0] == "alloc")

    @property
    def peak_bytes(self) -> int:
        live, alive, peak = {}, 0, 0
        for e in self.events:
            if e[0] == "alloc":
                live[e[1]] = e[2]
                alive += e[2]
                peak = max(peak, alive)
            else:
                alive -= live.pop(e[1])
        return peak


def fsdp2_streams(plan, placement) -> tuple[SideStream, ...]:
    """FSDP2's side-stream pools (torch 2.13 ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``),
    as the CPU trace of ``validation/reserved/record_traces.py`` (FSDP2 on a fake process group, each
    allocation tagged with the stream FSDP2 entered) shows them:

    * ``foreach_reduce`` allocates each group's reduce-scatter output (``reduce_dtype``; it becomes the
      group's sharded gradients) inside ``device_handle.stream(reduce_scatter_stream)``: one flat block a
      layer (last layer first) and the root group's (embedding, LM head, final norm) last, all alive after
      the backward. They die at ``zero_grad(set_to_none=True)``, so at the activations' peak of the next
      step (forward, backward) the pool is idle; under gradient accumulation they live through every phase
      (counted).
    * ``foreach_all_gather`` allocates inside ``device_handle.stream(all_gather_copy_in_stream)`` the
      all-gather input (``_get_param_all_gather_inputs``' foreach copy of the shards into ``param_dtype``,
      only under a mixed-precision cast) and the flat output (the group's gathered bytes); the input dies
      when the copy-in returns, the output once the next group's output is allocated. The root group is
      gathered first, then each layer. The profile's allocated terms count the copied-out parameters (the
      default stream), not these blocks.

    The reduce-scatter input is allocated on the default stream in torch 2.13 (torch of late 2024 allocated
    it on the reduce-scatter stream too: a version difference, docs/profiles.md)."""
    from .buffers import gathered_bytes
    from .shapes import shape_of
    n = placement.weight_shards
    if n == 1:
        return ()
    shape = shape_of(plan)
    layers = placement.layers_per_stage
    root = shape.embedding_parameters * (1 if shape.tied else 2) + shape.hidden
    layer = shape.layer_parameters()
    regime = plan.profile_options.regime
    g = regime.gradient or 4
    grads = [-(-layer // n) * g] * layers + [-(-root // n) * g]
    accumulating = plan.gradient_accumulation_steps > 1
    gathered = gathered_bytes(plan)
    cast = gathered != regime.weight          # the shards are copied into param_dtype before the all-gather
    gather, previous = [], None
    for i, group in enumerate([root] + [layer] * min(layers, 2)):
        if cast:
            gather.append(("alloc", f"in{i}", -(-group // n) * gathered))
        gather.append(("alloc", f"out{i}", -(-group // n) * n * gathered))
        if cast:
            gather.append(("free", f"in{i}"))
        if previous is not None:
            gather.append(("free", previous))
        previous = f"out{i}"
    inputs = f"the {gathered} B shards' copies and " if cast else ""
    return (SideStream("reduce-scatter", tuple(("alloc", i, b) for i, b in enumerate(grads)),
                       f"the sharded gradients ({layers} layers and the root group, {g} B a parameter / {n}; dead "
                       "from zero_grad to the backward: idle at the activations' peak, counted twice were the peak "
                       "the optimizer step's)", counted=sum(grads) if accumulating else 0),
            SideStream("all-gather copy-in", tuple(gather),
                       f"{inputs}the flat all-gather outputs of the root group, then the layers, each freed once "
                       f"the next is allocated ({gathered} B a parameter)"))


def deepspeed_flat_states(plan, placement, tensors) -> tuple[tuple[int, str], ...]:
    """DeepSpeed ZeRO-1/2's model states on one rank (deepspeed 0.19.8 ``runtime/zero/stage_1_and_2.py``,
    ``DeepSpeedZeroOptimizer.__init__``), allocated once and kept, in order, from the rank's parameter tensors
    (``tensors``: their element counts before data-parallel sharding):

    * the flat parameter buffer (``flatten_dense_tensors_aligned``: every parameter of the group copied into one
      tensor, padded to a multiple of ``nccl_start_alignment_factor`` 2 x dp elements; the parameters become its
      views), in the parameters' dtype: ``ceil(N / 2dp) x 2dp`` elements (``parameter_alignment`` off, the default);
    * the fp32 partition of the master weights (``single_partition_of_fp32_groups``: this rank's slice of the flat
      buffer cloned to ``master_weights_and_grads_dtype``, fp32): flat / dp elements x 4 B;
    * the optimizer's moments over that flat partition (torch's AdamW given one tensor: each moment one block of
      partition elements), created in the first step.

    The gradients are not among them: autograd's per-parameter gradients, the ipg bucket (``reduce_bucket_size``
    elements, allocated at the backward's first hook) and the flat fp32 gradient partition of the step live and die
    within each step (the trace's requested bytes, not this rounding)."""
    from .optimizer_step import step_of
    d = placement.optimizer_state_shards
    align = 2 * d
    flat = -(-sum(tensors) // align) * align
    regime = plan.profile_options.regime
    moments = step_of(plan.profile_options.optimizer_spec).moments
    part = flat // d
    return ((flat * regime.weight, f"the flat parameter buffer ({flat:,} elements x {regime.weight} B)"),
            (part * 4, f"the fp32 master partition ({part:,} elements x 4 B)")) + tuple(
        (part * regime.state, f"moment {i + 1} ({part:,} x {regime.state} B)") for i in range(moments))


def deepspeed_zero3_states(plan, placement, tensors, reduce_bucket_size: int, contiguous_gradients: bool,
                           persistence_threshold: int) -> tuple[tuple[int, str], ...]:
    """DeepSpeed ZeRO-3's blocks allocated once and kept on one rank (deepspeed 0.19.8 ``runtime/zero/stage3.py``
    ``DeepSpeedZeroOptimizer_Stage3.__init__`` and the first step), in order, from the rank's parameter tensors
    (``tensors``: element counts before sharding): the flat buffer of the parameters' partitions
    (``fp16_partitioned_groups_flat``: each parameter's ``ceil(numel / dp)``, in its dtype), the fp32 master
    partition (``fp32_partitioned_groups_flat``), the ipg bucket (``reduce_bucket_size`` elements in the
    parameters' dtype, with ``contiguous_gradients``; allocated at init and kept), the flat gradient partitions
    (``grad_partitions_flat_buffer``), the optimizer's moments over the fp32 partition; and the persistent
    parameters (fewer than ``stage3_param_persistence_threshold`` elements: never released, whole on every rank,
    re-gathered after each step). The gathered layers and the prefetch are the rule's buffers, not these."""
    from .optimizer_step import step_of
    d = placement.weight_shards
    part = sum(-(-e // d) for e in tensors)
    regime = plan.profile_options.regime
    w, g = regime.weight, regime.gradient or regime.weight
    moments = step_of(plan.profile_options.optimizer_spec).moments
    states = [(part * w, f"the parameters' partitions ({part:,} elements x {w} B)"),
              (part * 4, f"the fp32 master partition ({part:,} x 4 B)")]
    if contiguous_gradients:
        states.append((reduce_bucket_size * w, f"the ipg bucket ({reduce_bucket_size:,} x {w} B)"))
    states.append((part * g, f"the gradient partitions ({part:,} x {g} B)"))
    states += [(part * regime.state, f"moment {i + 1} ({part:,} x {regime.state} B)") for i in range(moments)]
    persistent = [e for e in tensors if e < persistence_threshold]
    if persistent:
        states += [(e * w, "a persistent parameter") for e in persistent]
    return tuple(states)


def _refuse(allowed: str, detail: str):
    from mlsysim_core.errors import NotModelledError
    raise NotModelledError("runtime_overheads.allocator", "segments", allowed, detail)


def reserve_terms(plan, placement, overheads) -> list:
    """The caching allocator's reserve of one rank (``runtime_overheads.allocator="segments"``): the rounding
    of the model states on the default stream and each side stream's pool (module docstring)."""
    from .optimizer_step import step_of
    o = plan.profile_options
    if placement is None:
        raise ValueError("allocator reserve terms need the rank's placement")
    if placement.expert_shards > 1:
        _refuse("a layout without expert parallelism (tensor, pipeline and data parallelism)",
                "expert parallelism's per-rank tensors: not modelled")
    if o.offload:
        _refuse("the model states on the device", "offload's tensors: not modelled")
    if o.regime.main_grad:
        _refuse("a regime whose gradients are per-parameter tensors",
                f"regime {o.regime.name!r} accumulates into a contiguous fp32 main-grad buffer (Megatron-Core's "
                "DistributedDataParallel): its buffers are not modelled")
    if o.lora is not None:
        return list(_lora_terms(plan, placement, overheads))
    if plan.trainable_fraction != 1:
        _refuse("every parameter trained (trainable_fraction 1)", f"trainable_fraction={plan.trainable_fraction}")
    step = step_of(o.optimizer_spec)
    if step is None or step.moments is None:
        _refuse("an optimizer whose state is parameter-shaped moments (OptimizerStep.moments)",
                f"{plan.optimizer!r} declares none")
    dp_options = plan.options.get(plan.rules.get("dp"))
    declared = getattr(dp_options, "allocator_streams", None)
    streams = tuple(declared(plan, placement)) if declared is not None else ()
    kept = getattr(dp_options, "allocator_model_states", None)
    sharded = max(placement.weight_shards, placement.gradient_shards, placement.optimizer_state_shards)
    model_parallel = _model_parallel(plan, placement)
    states = None
    if sharded > 1 and kept is not None:
        shape = _shape(plan)
        tensors = (rank_tensors(shape, *model_parallel[:5]) if model_parallel is not None
                   else [rows * max(cols, 1) for rows, cols in shape.matrix_shapes()])
        states = tuple(kept(plan, placement, tuple(tensors)))
    if streams and model_parallel is not None:
        _refuse("side-stream pools (FSDP's) on a rank that holds whole layers",
                "the data-parallel rule's stream pools under tensor or pipeline parallelism (2-D layouts): "
                "not modelled")
    if sharded > 1 and not streams and states is None:
        _refuse("sharded model states only under a data-parallel rule that declares its allocations "
                "(its options' allocator_streams or allocator_model_states: FSDP's rules, ZeRO-1/2)",
                "this rule's sharded tensors: not modelled")
    regime = o.regime
    if states is not None:
        return list(_declared_terms(states, overheads.expandable_segments))
    return list(_reserve_terms(_shape(plan), placement.weight_shards, regime.weight, regime.master,
                               0 if streams else (regime.gradient or 4), step.moments, regime.state, streams,
                               overheads.expandable_segments, model_parallel))


@memoize
def _declared_terms(states: tuple, expandable: bool) -> tuple:
    """The rounding of the model states a data-parallel rule declares (``allocator_model_states``: ``(bytes,
    what)`` in the order it allocates them, all on the default stream, none freed)."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP, RUNTIME_OVERHEADS, MemoryTerm
    total = sum(n for n, _ in states)
    nbytes = rounding_reserve(tuple((n, DEFAULT_STREAM) for n, _ in states), expandable)
    how = ("expandable segments: one segment grown in 20 MiB pages, blocks of 512 B" if expandable
           else "each above 10 MiB a segment of its own rounded to 2 MiB")
    return (MemoryTerm(
        component=RUNTIME_OVERHEADS, label="allocator: block and segment rounding (model states)", nbytes=nbytes,
        phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
        formula=(f"the data-parallel rule's {len(states)} model-state allocations ({'; '.join(w for _, w in states)}; "
                 f"{total:,} B) through the caching allocator: {how} ({SOURCE}). Not priced: the default stream's "
                 "fragmentation, which depends on the order of the step's allocations")),)


def _lora_terms(plan, placement, overheads) -> tuple:
    """LoRA on a rank that holds the whole model (one device, or data parallelism that shards nothing): the frozen
    base's tensors when the model is built (``base_weight_bytes``), then peft's adapters (``lora.adapter_matrices``:
    per layer and adapted linear ``lora_A`` r x in and ``lora_B`` out x r, DoRA's magnitude vectors; most of them
    at most 1 MiB, packed in the small pool's 2 MiB segments) and, for the adapters only, a master copy where the
    regime keeps one, the gradients in the first backward and the moments in the first step."""
    from . import lora
    from .optimizer_step import step_of
    o = plan.profile_options
    cfg = o.lora
    counts = lora.counts(plan)
    if cfg.quantization is not None or counts.saved_modules:
        _refuse("LoRA over a base in its own dtype without modules_to_save copies",
                "QLoRA's quantized linears and modules_to_save's copies: not modelled")
    sharded = max(placement.weight_shards, placement.gradient_shards, placement.optimizer_state_shards)
    if sharded > 1 or _model_parallel(plan, placement) is not None:
        _refuse("LoRA on a rank holding the whole model (one device, or replicated data parallelism)",
                "LoRA's sharded and model-parallel tensors: not modelled")
    step = step_of(o.optimizer_spec)
    if step is None or step.moments is None:
        _refuse("an optimizer whose state is parameter-shaped moments (OptimizerStep.moments)",
                f"{plan.optimizer!r} declares none")
    regime = o.regime
    base = tuple(rows * max(cols, 1) for rows, cols in _shape(plan).matrix_shapes())
    adapters = tuple(rows * max(cols, 1) for rows, cols in lora.adapter_matrices(plan))
    return _lora_rounding(base, lora.base_weight_bytes(regime), adapters, regime.weight, regime.master,
                          regime.gradient or 4, step.moments, regime.state, overheads.expandable_segments)


@memoize
def _lora_rounding(base: tuple, base_b: int, adapters: tuple, weight: int, master: int, gradient: int,
                   moments: int, state: int, expandable: bool) -> tuple:
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP, RUNTIME_OVERHEADS, MemoryTerm
    sizes = [(e * base_b, DEFAULT_STREAM) for e in base]
    sizes += [(e * b, DEFAULT_STREAM) for b in (weight, master, gradient) if b for e in adapters]
    sizes += [(e * state, DEFAULT_STREAM) for _ in range(moments) for e in adapters]
    total = sum(n for n, _ in sizes)
    small = sum(1 for n, _ in sizes if n <= K_SMALL_SIZE)
    how = ("expandable segments: one segment per pool grown in 20 MiB pages (2 MiB small), blocks of 512 B"
           if expandable else "512 B blocks; at most 1 MiB from 2 MiB segments, up to 10 MiB split from 20 MiB "
                              "ones, larger a segment each rounded to 2 MiB")
    return (MemoryTerm(
        component=RUNTIME_OVERHEADS, label="allocator: block and segment rounding (model states)",
        nbytes=rounding_reserve(tuple(sizes), expandable), phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
        formula=(f"{len(base)} frozen base tensors ({base_b} B) and {len(adapters)} LoRA adapter tensors with their "
                 f"{'master copies, ' if master else ''}gradients and {moments} moment{'s' if moments != 1 else ''} "
                 f"({len(sizes)} blocks, {small} of at most 1 MiB; {total:,} B) through the caching allocator: {how} "
                 f"({SOURCE}). Not priced: the default stream's fragmentation")),)


def _model_parallel(plan, placement) -> tuple | None:
    """What tensor and pipeline parallelism leave this rank: ``rank_tensors``' arguments after the shape, and
    whether the embedding's gradient is whole (PyTorch tensor parallelism: DTensor's vocabulary-sharded embedding
    receives its gradient as a full V x h tensor, ``parallel.rank_gradient_terms``); None when they split nothing."""
    from . import model as _model
    from .parallel import expert_tensor_shards
    rank = plan.rank
    t = placement.tensor_shards
    if t == 1 and (rank is None or (rank.first and rank.last)):
        return None
    first, last = (True, True) if rank is None else (rank.first, rank.last)
    layers = placement.layers_per_stage if rank is None else rank.layers
    whole_grad = first and t > 1 and not _model.megatron(plan.profile_options.regime)
    return (t, expert_tensor_shards(plan, placement), layers, first, last, whole_grad)


def rank_tensors(shape, t: int, expert_t: int, layers: int, first: bool, last: bool) -> list[int]:
    """Element counts of the parameter tensors one rank of a model-parallel layout allocates, in registration order:
    the first stage's embedding (vocabulary-parallel: / t) and learned positions, each of the stage's ``layers``
    decoder layers' weights as the family declares their split (``LayerWeight.split``: ``tp`` / t, ``experts`` /
    expert_t, ``replicated`` whole) and its norms (whole), the last stage's final norm and LM head (/ t; a tied head
    is the embedding itself on a single stage, a copy on the last of several). Each split tensor is rank 0's shard,
    the largest: ``ceil(elements / t)`` (DTensor's ``Shard`` and Megatron's partitions; exact when t divides the
    split dimension)."""
    from .layers import EXPERTS, TP
    h, norm = shape.hidden, shape.family.norm
    block = [-(-w.elements // (t if w.split == TP else expert_t if w.split == EXPERTS else 1))
             for w in shape.layer_weights()]
    block += [h] * (shape.family.layer_norms * norm.parameters)
    head = -(-shape.embedding_parameters // t)
    tensors = ([head] + ([shape.learned_positions * h] if shape.learned_positions else [])) if first else []
    tensors += block * layers
    if last:
        tensors += [h] * norm.parameters + ([] if shape.tied and first else [head])
    return tensors


def _shape(plan):
    from .shapes import shape_of
    return shape_of(plan)


@memoize
def _reserve_terms(shape, n: int, weight: int, master: int, gradient: int, moments: int, state: int,
                   streams: tuple, expandable: bool, model_parallel: tuple | None = None) -> tuple:
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP, RUNTIME_OVERHEADS, MemoryTerm
    phases = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)
    if model_parallel is None:
        elements = [-(-rows // n) * max(cols, 1) for rows, cols in shape.matrix_shapes()]
    else:
        elements = [-(-e // n) for e in rank_tensors(shape, *model_parallel[:5])]
    grads = elements
    if model_parallel is not None and model_parallel[5]:
        grads = [shape.embedding_parameters] + elements[1:]      # the first tensor: the embedding, its gradient whole
    # The order PyTorch allocates them: the weights (and a master copy) when the model is built, the
    # gradients in the first backward, each parameter's moments in the optimizer's first step.
    sizes = [(e * weight, DEFAULT_STREAM) for e in elements]
    sizes += [(e * master, DEFAULT_STREAM) for e in elements if master]
    sizes += [(e * gradient, DEFAULT_STREAM) for e in grads if gradient]
    sizes += [(e * state, DEFAULT_STREAM) for e in elements for _ in range(moments)]
    a = CachingAllocator(expandable)
    for nbytes, stream in sizes:
        a.malloc(nbytes, stream)
    for s in streams:
        handles = {}
        for e in s.events:
            if e[0] == "alloc":
                handles[e[1]] = a.malloc(e[2], s.stream)
            else:
                a.free(handles.pop(e[1]))
    how = ("expandable segments: one segment per stream grown in 20 MiB pages (2 MiB small), blocks of 512 B"
           if expandable else "512 B blocks; at most 1 MiB from 2 MiB segments, up to 10 MiB split from 20 MiB "
                              "ones, larger a segment each rounded to 2 MiB")
    default_bytes = sum(b for b, st in sizes if st == DEFAULT_STREAM)
    where = "" if model_parallel is None else (
        f" of this rank (tp {model_parallel[0]}: each split as its weight declares; {model_parallel[2]} layers"
        + (", the embedding" if model_parallel[3] else "") + (", the final norm and LM head" if model_parallel[4] else "")
        + (", the embedding's gradient whole" if model_parallel[5] else "") + ")")
    what = ["weights"] + (["master weights"] if master else []) + (["gradients"] if gradient else []) \
        + ([f"{moments} moment{'s' if moments != 1 else ''}"] if moments else [])
    terms = [MemoryTerm(
        component=RUNTIME_OVERHEADS, label="allocator: block and segment rounding (model states)",
        nbytes=a.reserved_by_stream.get(DEFAULT_STREAM, 0) - default_bytes, phases=phases,
        formula=(f"{len(elements)} parameter tensors{where} ({', '.join(what)}; {default_bytes:,} B) through the caching "
                 f"allocator: {how} ({SOURCE}). Not priced: the default stream's fragmentation (freed activation "
                 "blocks that later requests do not fit), which depends on the order of the step's allocations"))]
    for s in streams:
        reserved = a.reserved_by_stream.get(s.stream, 0)
        counted = f", {s.counted:,} B of them alive at the peak (counted)" if s.counted else ""
        terms.append(MemoryTerm(
            component=RUNTIME_OVERHEADS, label=f"allocator: {s.stream} stream pool", nbytes=reserved - s.counted,
            phases=phases,
            formula=(f"{s.holds}: {s.blocks} blocks, at most {s.peak_bytes:,} B alive, {reserved:,} B reserved on "
                     f"its own stream{counted} (a block freed on one stream is not reused by another: idle "
                     "while the default stream peaks)")))
    return tuple(terms)
