"""The caching allocator's reserve (``runtime_overheads.allocator="segments"``, measured/allocator.py):
the re-implementation of PyTorch's DeviceCachingAllocator against hand-derived cases from its source
(pytorch/pytorch eb42ad6e c10/cuda/CUDACachingAllocator.cpp), the mechanism's terms, its refusals, and
the recorded replays of CPU allocation traces (validation/reserved/)."""

import gzip
import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_plugins.measured.allocator import CachingAllocator, allocation_size, replay, round_size
from scripttools import load_script

MiB = 2**20
ROOT = Path(__file__).resolve().parents[2]
RESERVED = ROOT / "validation" / "reserved"


# ---------------------------------------------------------------------------------------------- the allocator
def test_round_size_and_allocation_size_follow_the_source():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert allocation_size(MiB) == 2 * MiB                      # kSmallSize and below: a 2 MiB segment
    assert allocation_size(MiB + 512) == 20 * MiB               # below kMinLargeAlloc: kLargeBuffer
    assert allocation_size(10 * MiB) == 10 * MiB                # from 10 MiB: rounded to kRoundLarge (2 MiB)
    assert allocation_size(10 * MiB + 512) == 12 * MiB


def test_small_requests_pack_into_one_2_mib_segment():
    a = CachingAllocator()
    for _ in range(4096):                # 4096 x 512 B = 2 MiB: exactly one small segment
        a.malloc(100)
    assert (a.reserved, a.segments, a.allocated, a.requested) == (2 * MiB, 1, 2 * MiB, 409_600)
    a.malloc(100)
    assert (a.reserved, a.segments) == (4 * MiB, 2)


def test_mid_size_requests_split_a_20_mib_segment_and_reuse_its_remainder():
    a = CachingAllocator()
    a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB                   # one kLargeBuffer segment, split (15 MiB > kSmallSize remains)
    a.malloc(15 * MiB)                              # the remainder, best fit: no new segment
    assert (a.reserved, a.segments, a.allocated) == (20 * MiB, 1, 20 * MiB)


def test_a_large_remainder_of_at_most_1_mib_stays_with_the_block():
    a = CachingAllocator()
    a.malloc(11 * MiB + 1)           # rounded to 11 MiB + 512 B; its segment 12 MiB; 1 MiB - 512 B left: no split
    assert (a.reserved, a.allocated) == (12 * MiB, 12 * MiB)


def test_freed_neighbours_merge_and_serve_a_larger_request():
    a = CachingAllocator()
    x, y = a.malloc(5 * MiB), a.malloc(15 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(20 * MiB)                              # the merged 20 MiB block
    assert (a.reserved, a.segments) == (20 * MiB, 1)


def test_a_block_freed_on_one_stream_is_not_reused_by_another():
    a = CachingAllocator()
    a.free(a.malloc(100 * MiB, "side"))
    a.malloc(100 * MiB)
    assert a.reserved == 200 * MiB
    assert a.reserved_by_stream == {"side": 100 * MiB, "default": 100 * MiB}


def test_expandable_segments_map_20_mib_pages_and_grow_the_free_tail():
    a = CachingAllocator(expandable_segments=True)
    x = a.malloc(5 * MiB)                           # one 20 MiB page mapped, 15 MiB free after the block
    assert (a.reserved, a.segments) == (20 * MiB, 1)
    a.malloc(30 * MiB)                              # the free 15 MiB + one more page: 35 MiB, split at 30
    assert (a.reserved, a.allocated, a.segments) == (40 * MiB, 35 * MiB, 1)
    a.free(x)
    a.malloc(4 * MiB)                               # fits the freed 5 MiB block
    assert a.reserved == 40 * MiB


def test_replay_pairs_frees_and_tracks_each_phase():
    events = [("phase", "a"), ("alloc", 0, 5 * MiB), ("alloc", 1, 30 * MiB), ("free", 0), ("phase", "b"),
              ("alloc", 2, 6 * MiB), ("free", 99)]
    r = replay(events)
    # 5 MiB splits a 20 MiB segment, 30 MiB gets its own; freed, the 5 MiB block merges with the free 15 MiB
    # after it, and the 6 MiB request is split from that 20 MiB block: no new segment, 99 was never allocated.
    assert r["peak_reserved"] == 50 * MiB
    assert r["by_phase"]["a"] == {"reserved": 50 * MiB, "allocated": 35 * MiB, "requested": 35 * MiB}
    assert r["by_phase"]["b"] == {"reserved": 50 * MiB, "allocated": 36 * MiB, "requested": 36 * MiB}


# ---------------------------------------------------------------------------------------------- the mechanism
LLAMA = "meta-llama/llama-3.1-8b"
FSDP = dict(precision="bf16", regime="fsdp-bf16", optimizer="adamw", optimizer_impl="foreach",
            activation_checkpointing="op-sac", data_parallel="fsdp")


def _h100_96():
    from mlsysim_core import HardwareNode
    return HardwareNode(name="H100 96 GB", memory_capacity=96 * 10**9)


def _solve(overheads, **kw):
    settings = {**FSDP, **kw}
    dp = settings.pop("dp_size", 8)
    return TrainingMemoryModel("measured").solve(LLAMA, _h100_96(), 2 * dp, 8192, dp_size=dp,
                                                 runtime_overheads=overheads, **settings)


def test_fsdp2_pools_hand_derived():
    """Llama 3.1 8B, FSDP over 8 ranks: one layer 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096 =
    218,112,000 parameters, the root group 2 x 128,256 x 4096 + 4096 = 1,050,677,248. Reduce-scatter stream:
    each layer's fp32 shard 218,112,000 / 8 x 4 = 109,056,000 B gets a segment rounded to 2 MiB (53 x 2 MiB
    = 111,149,056 B), the root's 525,338,624 B 251 x 2 MiB = 526,385,152 B: 32 x 111,149,056 + 526,385,152 =
    4,083,154,944 B. All-gather copy-in stream (bf16 casts of fp32 shards): the root's input copy 262,669,312 B
    (126 x 2 MiB = 264,241,152), its output 2,101,354,496 B (1003 x 2 MiB = 2,103,443,456); the input freed,
    a layer's input 54,528,000 B is split from its block, the layer's output 436,224,000 B fits no free block
    (209 x 2 MiB = 438,304,768); the next layer's output is split from the root's freed output:
    264,241,152 + 2,103,443,456 + 438,304,768 = 2,805,989,376 B."""
    r = _solve({"cuda_context": 0, "nccl_buffers": 0, "allocator": "segments"})
    terms = {t.label: t for t in r.terms_of("runtime_overheads")}
    assert terms["allocator: reduce-scatter stream pool"].nbytes == 4_083_154_944
    assert terms["allocator: all-gather copy-in stream pool"].nbytes == 2_805_989_376
    assert "4,015,130,624 B" in terms["allocator: reduce-scatter stream pool"].formula
    rounding = terms["allocator: block and segment rounding (model states)"]
    assert "Not priced: the default stream's fragmentation" in rounding.formula
    assert 0 <= rounding.nbytes < 291 * 3 * 2 * MiB     # at most one 2 MiB rounding a tensor copy
    assert "allocator reserve and fragmentation" not in terms


def test_segments_changes_only_the_runtime_overheads():
    fraction = _solve({"cuda_context": 0, "nccl_buffers": 0})
    segments = _solve({"cuda_context": 0, "nccl_buffers": 0, "allocator": "segments"})
    assert segments.allocated_memory == fraction.allocated_memory
    for component in ("weights", "gradients", "optimizer_state", "activations", "communication_buffers"):
        assert getattr(segments, component) == getattr(fraction, component)
    pools = sum(t.nbytes for t in segments.terms_of("runtime_overheads"))
    assert segments.total_memory == segments.allocated_memory + pools


def test_gradient_accumulation_counts_the_reduce_scatter_pool_alive():
    r = _solve({"cuda_context": 0, "nccl_buffers": 0, "allocator": "segments"}, gradient_accumulation_steps=2,
               dp_size=8)
    pool = {t.label: t for t in r.terms_of("runtime_overheads")}["allocator: reduce-scatter stream pool"]
    assert pool.nbytes == 4_083_154_944 - 4_015_130_624           # only its rounding is reserve
    assert "4,015,130,624 B of them alive at the peak (counted)" in pool.formula


def test_expandable_segments_pack_the_pools():
    r = _solve({"cuda_context": 0, "nccl_buffers": 0, "allocator": "segments", "expandable_segments": True})
    pools = {t.label: t.nbytes for t in r.terms_of("runtime_overheads")}
    # one segment per stream, 20 MiB pages: ceil(4,015,130,624 / 20 MiB) = 192 pages
    assert pools["allocator: reduce-scatter stream pool"] == 192 * 20 * MiB
    # the root's input 13 pages (262,669,312 B), its output the 9,960,448 B left + 100 pages, a layer's input
    # split from the root's freed input, its output the 5,757,952 B left + 21 pages: 134 pages
    assert pools["allocator: all-gather copy-in stream pool"] == 134 * 20 * MiB


def test_single_device_has_no_side_stream_pools():
    r = TrainingMemoryModel("measured").solve("llama3-8b", "h100", 1, 1024, optimizer="adamw",
                                              runtime_overheads={"allocator": "segments"})
    labels = sorted(t.label for t in r.terms_of("runtime_overheads"))
    assert labels == ["CUDA context", "allocator: block and segment rounding (model states)", "cuBLAS workspaces"]


@pytest.mark.parametrize("model, kw, detail", [
    ("mixtral-8x7b", {"ep_size": 2, "dp_size": 2}, "expert parallelism's per-rank tensors: not modelled"),
    ("llama3-8b", {"dp_size": 2, "data_parallel": "fsdp-grad-op"},
     r"allocator_streams or allocator_model_states.*this rule's sharded tensors: not modelled"),
    ("llama3-8b", {"offload": "optimizer"}, "offload's tensors: not modelled"),
    ("llama3-8b", {"regime": "mixed-bf16-main-grad", "tp_size": 2}, "contiguous fp32 main-grad buffer"),
    ("llama3-8b", {"tp_size": 2, "dp_size": 2, "data_parallel": "fsdp"}, r"stream pools under tensor or pipeline"),
    ("llama3-8b", {"lora": {"rank": 16, "quantization": "nf4"}}, "QLoRA's quantized linears"),
    ("llama3-8b", {"lora": {"rank": 16}, "dp_size": 2, "data_parallel": "fsdp"}, "LoRA's sharded and model-parallel"),
])
def test_layouts_it_does_not_describe_are_refused(model, kw, detail):
    with pytest.raises(NotModelledError, match=detail) as e:
        TrainingMemoryModel("measured").solve(model, "h100", 4, 1024, optimizer="adamw",
                                              runtime_overheads={"allocator": "segments"}, **kw)
    assert e.value.parameter == "runtime_overheads.allocator" and e.value.value == "segments"


# ------------------------------------------------------------------ tensor parallelism and DeepSpeed ZeRO-1/2
# The traces' model: Llama h 1024, 2 layers, 16 heads (4 KV, head 64), MLP 2816, vocabulary 16,000, untied.
TRACE_LLAMA = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
               "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 16000,
               "max_position_embeddings": 4096, "tie_word_embeddings": False}


def _trace_terms(expandable=False, **layout):
    from mlsysim_core import HardwareNode
    from mlsysim_core.hf import from_hf_config
    r = TrainingMemoryModel("measured").solve(
        from_hf_config(TRACE_LLAMA, name="trace-llama"), HardwareNode(name="cpu", memory_capacity=2**40),
        layout.pop("batch", 1), 256, optimizer="adamw", regime=layout.pop("regime", "fp32"),
        precision=layout.pop("precision", "fp32"), device="cpu",
        runtime_overheads={"cuda_context": 0, "cublas_workspace": 0, "nccl_buffers": 0, "allocator": "segments",
                           "expandable_segments": expandable}, **layout)
    return {t.label: t.nbytes for t in r.terms_of("runtime_overheads")}


def test_tensor_parallel_rank_tensors_hand_derived():
    """tp 2: the vocabulary-parallel embedding and LM head 16,000 x 1024 / 2 = 8,192,000, q and o 1024^2 / 2 =
    524,288, k and v 256 x 1024 / 2 = 131,072, gate, up and down 2816 x 1024 / 2 = 1,441,792, the norms whole."""
    from mlsysim_core.hf import from_hf_config
    from mlsysim_plugins.measured.allocator import rank_tensors
    from mlsysim_plugins.measured.shapes import ModelShape
    shape = ModelShape.of(from_hf_config(TRACE_LLAMA, name="trace-llama"))
    layer = [524_288, 131_072, 131_072, 524_288, 1_441_792, 1_441_792, 1_441_792, 1024, 1024]
    assert rank_tensors(shape, 2, 2, 2, True, True) == [8_192_000] + layer * 2 + [1024, 8_192_000]
    # a pipeline stage: the first holds the embedding and its layers, the last its layers, the final norm and head
    assert rank_tensors(shape, 1, 1, 1, True, False) == [16_384_000] + [2 * x if x > 1024 else x for x in layer]
    assert rank_tensors(shape, 2, 2, 1, False, True) == layer + [1024, 8_192_000]


def test_pipeline_stages_round_their_own_tensors():
    """pp 2 over the traces' 2-layer Llama: the first stage holds the embedding and layer 1, the last layer 2, the
    final norm and the LM head; each rank's rounding is its own tensors' (weight, gradient, two moments, fp32)
    through the allocator. By hand for the weights of the first stage: the embedding 65,536,000 B a segment of 32 x
    2 MiB (+1,572,864), q 4 MiB split from a 20 MiB segment whose rest serves o (4 MiB) and gate (11,534,336 B in
    the 12 MiB left: 1 MiB stays with the block), k and v 1 MiB each filling one small segment, up and down a 12 MiB
    segment each, the two norms (4096 B) a small segment."""
    from mlsysim_plugins.measured.allocator import CachingAllocator, rounding_reserve
    layer = [1_048_576, 262_144, 262_144, 1_048_576, 2_883_584, 2_883_584, 2_883_584, 1024, 1024]
    first, last = [16_384_000] + layer, layer + [1024, 16_384_000]
    a = CachingAllocator()
    for e in first:
        a.malloc(4 * e)
    assert a.reserved == 32 * 2 * MiB + 20 * MiB + 2 * MiB + 2 * 12 * MiB + 2 * MiB
    from mlsysim_core import HardwareNode
    from mlsysim_core.hf import from_hf_config
    r = TrainingMemoryModel("measured").solve(
        from_hf_config(TRACE_LLAMA, name="trace-llama"), HardwareNode(name="cpu", memory_capacity=2**40), 4, 256,
        optimizer="adamw", pp_size=2, regime="fp32", precision="fp32", device="cpu",
        runtime_overheads={"cuda_context": 0, "cublas_workspace": 0, "nccl_buffers": 0, "allocator": "segments"})
    label = "allocator: block and segment rounding (model states)"
    for rank, tensors in zip(r.ranks, (first, last)):
        order = tensors + tensors + [e for e in tensors for _ in range(2)]    # weights, gradients, each one's moments
        expected = rounding_reserve(tuple((4 * e, "default") for e in order), False)
        assert {t.label: t.nbytes for t in rank.terms if t.component == "runtime_overheads"}[label] == expected > 0


def _alive_at_end(run_id):
    """The sizes of the blocks of 1 MiB and more alive at the end of a trace: the rank's model states."""
    from collections import Counter
    with gzip.open(RESERVED / "traces" / f"{run_id}.json.gz", "rt") as f:
        events = json.load(f)
    live = {}
    for e in events:
        if e[0] == "alloc":
            live[e[1]] = e[2]
        elif e[0] == "free":
            live.pop(e[1], None)
    return Counter(n for n in live.values() if n >= MiB)


def test_tensor_parallel_model_states_are_the_traces():
    """The tp 2 trace (DTensor, rank 0 of 2) keeps exactly the tensors the mechanism allocates: each shard's
    weight, gradient and two AdamW moments (fp32), the embedding's gradient whole (V x h x 4 = 65,536,000 B:
    DTensor's vocabulary-sharded embedding receives it in full)."""
    from collections import Counter
    from mlsysim_core.hf import from_hf_config
    from mlsysim_plugins.measured.allocator import rank_tensors
    from mlsysim_plugins.measured.shapes import ModelShape
    shards = [4 * e for e in rank_tensors(ModelShape.of(from_hf_config(TRACE_LLAMA, name="x")), 2, 2, 2, True, True)]
    grads = [65_536_000] + shards[1:]
    expected = Counter(n for n in shards * 3 + grads if n >= MiB)
    assert _alive_at_end("tp2-llama-h1024-l2-fp32-b1-s256") == expected
    terms = _trace_terms(tp_size=2)
    assert terms["allocator: block and segment rounding (model states)"] == \
        _recorded_run("tp2-llama-h1024-l2-fp32-b1-s256")["segments"]["mechanism_rounding"] > 0


def test_deepspeed_zero12_flat_states_hand_derived():
    """DeepSpeed ZeRO-1/2 over 2 ranks: 2 x 16,384,000 + 2 x (1,048,576 x 2 + 262,144 x 2 + 2,883,584 x 3 + 2048)
    + 1024 = 55,317,504 parameters, a multiple of 2 x dp = 4: the flat fp32 buffer 221,270,016 B (106 x 2 MiB =
    222,298,112 reserved: +1,028,096), the fp32 partition and AdamW's two moments 110,635,008 B each (53 x 2 MiB
    = 111,149,056: +514,048 each): 1,028,096 + 3 x 514,048 = 2,570,240 B. The trace keeps exactly those four."""
    for stage in (1, 2):
        terms = _trace_terms(dp_size=2, zero_stage=stage, batch=2)
        rounding = terms["allocator: block and segment rounding (model states)"]
        assert rounding == 2_570_240
        assert _alive_at_end(f"zero{stage}-w2-llama-h1024-l2-fp32-b1-s256") == {221_270_016: 1, 110_635_008: 3}
    # DeepSpeed's bf16 (regime mixed-bf16): the flat buffer in bf16, 55,317,504 x 2 = 110,635,008 B, the size of the
    # fp32 partition and of each fp32 moment: 4 x (53 x 2 MiB - 110,635,008) = 4 x 514,048 = 2,056,192 B
    bf16 = _trace_terms(dp_size=2, zero_stage=2, batch=2, regime="mixed-bf16", precision="bf16")
    assert bf16["allocator: block and segment rounding (model states)"] == 2_056_192
    assert _alive_at_end("zero2-w2-llama-h1024-l2-mixed-bf16-b1-s256") == {110_635_008: 4}
    # expandable segments: one segment, 20 MiB pages: 221,270,016 + 3 x 110,635,008 = 553,175,040 B (each a multiple
    # of 512 B: no block rounding) in 27 pages (566,231,040 B): +13,056,000
    assert _trace_terms(True, dp_size=2, zero_stage=1, batch=2)[
        "allocator: block and segment rounding (model states)"] == 27 * 20 * MiB - 553_175_040 == 13_056_000


def test_lora_model_states_are_the_traces():
    """LoRA r 16 on every linear (peft, fp32): the frozen base (5 norms of 4096 B, k and v 256 x 1024 x 4 = 1 MiB
    each: the small pool, q and o 4 MiB, gate, up, down 11,534,336 B, embedding and LM head 65,536,000 B), then per
    layer 18 adapters of 16 x 1024 or 1024 x 16 x 4 = 65,536 B, 4 of 256 x 16 x 4 = 16,384 B (k's and v's B),
    6 of 16 x 2816 or 2816 x 16 x 4 = 180,224 B (gate's and up's B, down's A), each with its gradient and two
    moments: what the trace holds when the measured step's optimizer begins; every adapter block from the small
    pool's 2 MiB segments."""
    from collections import Counter
    with gzip.open(RESERVED / "traces" / "lora-r16-all-llama-h1024-l2-fp32-b1-s256.json.gz", "rt") as f:
        events = json.load(f)
    live = {}
    for e in events[:events.index(["phase", "2:optimizer"])]:
        if e[0] == "alloc":
            live[e[1]] = e[2]
        elif e[0] == "free":
            live.pop(e[1], None)
    base = {4096: 5, MiB: 4, 4 * MiB: 4, 11_534_336: 6, 65_536_000: 2}
    adapters = {65_536: 18, 16_384: 4, 180_224: 6}
    assert Counter(n for n in live.values() if n >= 4096) == Counter(base) + Counter({n: 4 * k for n, k in
                                                                                       adapters.items()})
    terms = _trace_terms(lora={"rank": 16, "target_modules": "all-linear", "quantization": None})
    rounding = terms["allocator: block and segment rounding (model states)"]
    assert rounding == _recorded_run("lora-r16-all-llama-h1024-l2-fp32-b1-s256")["segments"]["mechanism_rounding"]
    # the adapters alone (112 blocks of 9,306,112 B, none freed) take at least ceil(9,306,112 / 2 MiB) = 5 small
    # segments; the base's small tensors (4 x 1 MiB, 5 x 4096 B) at least 3 more: 16 MiB of small pool, whose
    # unfilled part and the large tensors' 2 MiB rounding make the term
    assert rounding >= 16 * MiB - 9_306_112 - 4 * MiB - 5 * 4096


def test_deepspeed_zero3_kept_blocks_hand_derived():
    """DeepSpeed ZeRO-3 over 2 ranks (fp32, its defaults): the parameters' partitions, the fp32 master partition,
    the flat gradient partitions and two moments, 27,658,752 x 4 = 110,635,008 B each (+514,048 each), the ipg
    bucket 5e8 x 4 = 2,000,000,000 B kept from init (954 x 2 MiB: +683,008) and the 5 persistent norms (1024
    elements < 1e5, 4096 B each) in one 2 MiB small segment (+2,076,672): 5,329,920 B. The trace keeps exactly
    those blocks."""
    terms = _trace_terms(dp_size=2, zero_stage=3, batch=2)
    assert terms["allocator: block and segment rounding (model states)"] == 5 * 514_048 + 683_008 + 2_076_672 \
        == 5_329_920
    assert _alive_at_end("zero3-w2-llama-h1024-l2-fp32-b1-s256") == {2_000_000_000: 1, 110_635_008: 5}
    # without contiguous_gradients (a DeepSpeed option the rule takes) no bucket is kept
    from mlsysim_core import HardwareNode
    from mlsysim_core.hf import from_hf_config
    r = TrainingMemoryModel("measured").solve(
        from_hf_config(TRACE_LLAMA, name="trace-llama"), HardwareNode(name="cpu", memory_capacity=2**40), 2, 256,
        optimizer="adamw", regime="fp32", precision="fp32", device="cpu", dp_size=2, zero_stage=3,
        plugin_options={"zero3": {"contiguous_gradients": False}},
        runtime_overheads={"cuda_context": 0, "cublas_workspace": 0, "nccl_buffers": 0, "allocator": "segments"})
    assert {t.label: t.nbytes for t in r.terms_of("runtime_overheads")}[
        "allocator: block and segment rounding (model states)"] == 5 * 514_048 + 2_076_672


def _recorded_run(run_id):
    return next(r for r in _recorded()["runs"] if r["id"] == run_id)


def test_an_unknown_allocator_model_is_an_input_error():
    with pytest.raises(InvalidInputError, match="runtime_overheads.allocator='slabs' is not allowed: fraction "
                                                "or segments"):
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", 1, 1024, runtime_overheads={"allocator": "slabs"})


# ---------------------------------------------------------------------------------------------- the replays
def _recorded():
    return json.loads((RESERVED / "replay_results.json").read_text())


def test_replaying_the_recorded_traces_gives_the_recorded_results():
    """The committed traces (record_traces.py, torch 2.13 CPU) replay to the committed results, and the
    mechanism's rounding term for each run is what the measured profile computes now."""
    replay_run = _script("replay_traces").replay_run
    runs = {r["id"]: r for r in json.loads((RESERVED / "traces.json").read_text())["runs"]}
    for recorded in _recorded()["runs"]:
        assert replay_run(runs[recorded["id"]]) == recorded


def test_traces_are_what_the_summary_says():
    for run in json.loads((RESERVED / "traces.json").read_text())["runs"]:
        with gzip.open(RESERVED / run["trace"], "rt") as f:
            events = json.load(f)
        assert sum(1 for e in events if e[0] == "alloc") == run["allocations"]


def _script(name):
    return load_script(RESERVED / f"{name}.py")


def test_published_rows_are_what_the_profile_predicts_now():
    published = _script("published")
    recorded = json.loads((RESERVED / "published_results.json").read_text())
    assert published.rows() == recorded["rows"]
    segments = [abs(r["segments"]["error"]) for r in recorded["rows"]]
    assert max(segments) < 0.10            # the target: torchtitan's rows within 10 % of reserved


def test_docs_validation_shows_the_generated_tables():
    text = (ROOT / "docs" / "validation.md").read_text()
    assert _script("published").table(json.loads((RESERVED / "published_results.json").read_text())) in text
    assert _script("replay_traces").table(_recorded()) in text


def test_fsdp2_side_stream_pools_equal_the_replayed_trace():
    """The FSDP2 trace (rank 0 of 2, each allocation tagged with its stream) replays to exactly the pools the
    mechanism declares, with expandable segments off and on; the default stream is not priced."""
    runs = [r for r in _recorded()["runs"] if "streams" in r]
    assert runs
    for run in runs:
        for kind in ("segments", "expandable"):
            streams = run["streams"][kind]
            assert set(streams) == {"default", "reduce-scatter", "all-gather-copy-in"}
            for name in ("reduce-scatter", "all-gather-copy-in"):
                assert streams[name]["mechanism"] == streams[name]["replayed_reserved"] > 0
            assert "mechanism" not in streams["default"]


def test_expandable_segments_without_the_segments_model_is_refused():
    with pytest.raises(InvalidInputError, match=r"runtime_overheads.expandable_segments=True .*"
                                                r"False unless allocator='segments'.*allocator='fraction'"):
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, runtime_overheads={"expandable_segments": True})


def test_cli_allocator_flags_are_the_python_options(capsys):
    from mlsysim_core.cli import main
    expected = TrainingMemoryModel("measured").solve(
        "llama3-8b", "h100", 8, runtime_overheads={"allocator": "segments", "expandable_segments": True})
    assert main(["estimate", "-m", "llama3-8b", "-b", "8", "--allocator", "segments", "--expandable-segments",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_memory"] == expected.total_memory
    assert data["runtime_overheads"] == expected.runtime_overheads != TrainingMemoryModel("measured").solve(
        "llama3-8b", "h100", 8).runtime_overheads
    assert main(["estimate", "--no-runtime-overheads", "--allocator", "segments"]) == 2
    assert ("--allocator='segments' is not allowed: not given with --no-runtime-overheads "
            "(--no-runtime-overheads sets runtime_overheads=False, which has no --allocator)") in capsys.readouterr().err
    assert main(["estimate", "--expandable-segments"]) == 2
    assert "False unless allocator='segments'" in capsys.readouterr().err
