#!/usr/bin/env python
"""Every phase of one tensor-parallel rank under the TP plans users actually run.

    python3 validation/parallel/tp_plans/measure_tp_plans.py --out validation/parallel/tp_plans/measurements.json
    python3 validation/parallel/tp_plans/measure_tp_plans.py --out ... --only ID [ID ...]   # merged into --out
    python3 validation/parallel/tp_plans/measure_tp_plans.py --list

Plans (see README.md for the sources, with file and line):

* ``torchtitan``: torchtitan's Llama-3 ``apply_tp`` mapped onto HF module names: sequence parallelism on the norms
  (``SequenceParallel``), ``PrepareModuleInput`` Shard(1) -> Replicate before attention and MLP, colwise q/k/v/
  gate/up, rowwise o/down with a reduce-scatter to Shard(1), vocab-parallel embedding reduce-scattered to Shard(1),
  LM head colwise from Shard(1) with a vocab-sharded DTensor output, and ``loss_parallel()`` around forward and
  backward (torchtitan's default, ``disable_loss_parallel=False``).
* ``hf``: the model's own plan, ``LlamaConfig.base_model_tp_plan`` + ``LlamaForCausalLM._tp_plan`` (+ the embedding
  rule transformers adds), resolved by ``PreTrainedModel._resolve_parallel_plans`` and applied by
  ``transformers.distributed.tensor_parallel.apply_tensor_parallelism``, the code ``from_pretrained(tp_plan="auto")``
  runs. No SP (not wired up in transformers 5.23), no loss parallelism (logits gathered: ``colwise_gather_output``),
  norms plain replicated parameters.
* ``megatron`` / ``megatron-sp``: Megatron-Core's GPT layout emulated with PyTorch DTensor on the HF modules:
  column-parallel QKV and fc1 (here q/k/v and gate/up), row-parallel proj and fc2 (o, down), vocab-parallel
  embedding (all-reduced; reduce-scattered to the sequence with SP), column-parallel output layer with
  ``parallel_output=True`` (vocab-sharded logits) and vocab-parallel cross-entropy (emulated with ``loss_parallel()``),
  without and with ``--sequence-parallel``. With SP, the DTensor styles are those of ``torchtitan`` (see README for
  what Megatron's own kernels keep differently).

Reuses ``../tp_phases/measure_tp_phases.py`` (imported: its provenance tracker, model registrations and
``measure_one``) and through it ``../measure_parallel.py`` (configuration record, fake process group, FakeTensorMode
build, protocol: 3 iterations, AdamW foreach, the 3rd measured, MemTracker). The only hooks: ``measure_parallel.
apply_tp`` is replaced, for the duration of one run, by the run's plan, and a ``loss_parallel()`` context is entered
around the whole run when the plan uses it (the context only re-routes DTensor's log-softmax / NLL ops; the
backward must run inside it too). Needs torch==2.13.0 (CPU) and transformers==5.23.0.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PARALLEL = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(PARALLEL, "tp_phases"))
sys.path.insert(0, PARALLEL)

import measure_tp_phases as tpp  # noqa: E402  (installs its provenance tracker into measure_parallel)

mp = tpp.mp
configs = mp._configs
import harness  # noqa: E402  (validation/harness.py)

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

B, S = 1, 2048
LAYERS_8B = (2, 4)
TPS_8B = (2, 4, 8)
# a ~125M Llama with 4 KV heads (h 768, f 2048, 12 heads, 4 KV heads, 12 layers, V 32000, untied: 124.7M
# parameters), split over tp=4 ranks: one KV head per rank
LLAMA_125M_KV4 = configs._llama(768, 2048, 12, 12, 4, 32000)
mp.MODELS["llama-125m-kv4"] = ("llama-gqa", LLAMA_125M_KV4)

TORCHTITAN_SRC = ("pytorch/torchtitan@9810191bbb0385d8ac91cd31abbc7f4156a0d462 "
                  "torchtitan/models/llama3/parallelize.py:175-260 (apply_tp), :106 (loss_parallel=not "
                  "disable_loss_parallel), torchtitan/config/configs.py:126 (disable_loss_parallel=False), "
                  "torchtitan/distributed/utils.py:231-236 (loss_parallel() around forward and backward)")
HF_SRC = ("transformers 5.23.0 models/llama/configuration_llama.py:49-57 (base_model_tp_plan), "
          "models/llama/modeling_llama.py:412 (_tp_plan lm_head colwise_gather_output), distributed/mixin.py:93-94 "
          "(embed_tokens embedding_rowwise), :233-301 (_resolve_parallel_plans), distributed/tensor_parallel.py:"
          "639-662 (apply_tensor_parallelism), :600-623 (styles)")
MEGATRON_SRC = ("NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/tensor_parallel/layers.py:"
                "232-389 (VocabParallelEmbedding: all-reduce, or reduce-scatter with SP), :580-700 "
                "(LinearWithGradAccumulationAndAsyncCommunication: SP all-gather), :932 (ColumnParallelLinear), "
                ":1328, 1561 (RowParallelLinear: reduce-scatter with SP); megatron/core/models/gpt/gpt_model.py:"
                "277-288 (output_layer ColumnParallelLinear, gather_output=not parallel_output); "
                "megatron/core/models/common/language_module/language_module.py:161-200 (vocab_parallel_cross_entropy)"
                "; megatron/core/tensor_parallel/cross_entropy.py:119-181; megatron/core/models/common/embeddings/"
                "language_model_embedding.py:59-63")


# --------------------------------------------------------------------------- plans
def _layer_plan_sp() -> dict:
    """torchtitan apply_tp's per-block plan (parallelize.py:231-255) on HF names: attention_norm ->
    input_layernorm, attention -> self_attn (its input is the kwarg hidden_states in HF), wq/wk/wv/wo -> q/k/v/o_proj,
    ffn_norm -> post_attention_layernorm, feed_forward -> mlp, w1/w3/w2 -> gate/up/down_proj."""
    return {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def _layer_plan_no_sp() -> dict:
    return {
        "input_layernorm": mp.ReplicateParallel(),
        "post_attention_layernorm": mp.ReplicateParallel(),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


def apply_sp_loss_parallel(model, mesh) -> dict:
    """torchtitan's plan (and Megatron-Core's with --sequence-parallel): SP + loss parallelism."""
    _, layers = mp._decoder(model)
    for layer in layers:
        parallelize_module(layer, mesh, _layer_plan_sp())
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    return {"embedding": "RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)) (vocab-sharded, "
                         "reduce-scatter to the sequence)",
            "norms": "SequenceParallel (input_layernorm, post_attention_layernorm, model.norm)",
            "attention": "PrepareModuleInput hidden_states Shard(1)->Replicate (all-gather), ColwiseParallel q/k/v, "
                         "RowwiseParallel(output_layouts=Shard(1)) o (reduce-scatter)",
            "mlp": "PrepareModuleInput Shard(1)->Replicate, ColwiseParallel gate/up, "
                   "RowwiseParallel(output_layouts=Shard(1)) down",
            "lm_head": "ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) "
                       "(vocab-sharded DTensor logits)",
            "loss": "loss_parallel(): HF's ForCausalLMLoss (logits.float(), cross_entropy) on the vocab-sharded "
                    "DTensor logits",
            "position_ids": "passed explicitly (arange(s)), as ../measure_parallel.py does for tp+sp"}


def apply_megatron_no_sp(model, mesh) -> dict:
    """Megatron-Core without --sequence-parallel: the residual stream and norms replicated, row-parallel outputs
    all-reduced (reduce_from_tensor_model_parallel_region), vocab-parallel embedding all-reduced, output layer
    column-parallel with parallel_output=True (no gather) and vocab-parallel cross-entropy."""
    _, layers = mp._decoder(model)
    for layer in layers:
        parallelize_module(layer, mesh, _layer_plan_no_sp())
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "model.norm": mp.ReplicateParallel(),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    return {"embedding": "RowwiseParallel(input_layouts=Replicate()) (vocab-sharded, output all-reduced)",
            "norms": "ReplicateParallel (replicated DTensor weight, local in/out)",
            "attention": "ColwiseParallel q/k/v, RowwiseParallel o (all-reduce)",
            "mlp": "ColwiseParallel gate/up, RowwiseParallel down (all-reduce)",
            "lm_head": "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) (vocab-sharded DTensor "
                       "logits: parallel_output=True)",
            "loss": "loss_parallel() (emulates vocab_parallel_cross_entropy)"}


def apply_hf(model, mesh) -> dict:
    """transformers' own TP: the model's resolved plan applied by apply_tensor_parallelism (what
    from_pretrained(tp_plan="auto") / distributed_config=DistributedConfig(tp_size=...) runs after init)."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism
    plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=mesh.size()))
    apply_tensor_parallelism(model, mesh, plan)
    generic = dict(model.tp_plan)
    return {"resolved_plan_rules": generic,
            "norms": "not in the plan: plain (non-DTensor) replicated parameters",
            "lm_head": "colwise_gather_output: ColwiseParallel(input Replicate, output Replicate) (logits all-gathered)",
            "embedding": "embedding_rowwise: EmbeddingParallel(shard_dim=0) (vocab-sharded, output all-reduced)",
            "loss": "HF's ForCausalLMLoss on the full (gathered) logits"}


PLANS = {
    "torchtitan": dict(apply=apply_sp_loss_parallel, sequence_parallel=True, loss_parallel=True,
                       source=TORCHTITAN_SRC),
    "hf": dict(apply=apply_hf, sequence_parallel=False, loss_parallel=False, source=HF_SRC),
    "megatron": dict(apply=apply_megatron_no_sp, sequence_parallel=False, loss_parallel=True, source=MEGATRON_SRC),
    "megatron-sp": dict(apply=apply_sp_loss_parallel, sequence_parallel=True, loss_parallel=True,
                        source=MEGATRON_SRC + "; DTensor styles identical to the torchtitan plan's"),
}


# --------------------------------------------------------------------------- tracker: no shadow tensors
from torch.distributed.tensor._sharding_prop import ShardingPropagator  # noqa: E402

_orig_propagate_meta = ShardingPropagator._propagate_tensor_meta_non_cached
_IN_META_PROPAGATION = [0]


def _propagate_meta_marked(self, op_schema):
    _IN_META_PROPAGATION[0] += 1
    try:
        return _orig_propagate_meta(self, op_schema)
    finally:
        _IN_META_PROPAGATION[0] -= 1


ShardingPropagator._propagate_tensor_meta_non_cached = _propagate_meta_marked


class Tracker(tpp.ProvenanceTracker):
    """tp_phases' provenance tracker, not counting two kinds of tensors that hold no memory in a real run:

    * DTensor's shape propagation: to know an op's output shape, ``ShardingPropagator.
      _propagate_tensor_meta_non_cached`` (torch/distributed/tensor/_sharding_prop.py:520-577) runs the op on
      GLOBAL-shaped fake tensors. In a real run it does so in its own FakeTensorMode and only once per op schema
      (``lru_cache``); under our FakeTensorMode ``_are_we_tracing()`` is true (_functional_collectives.py:1388-1399),
      so it runs at every DTensor op, inside our fake mode, and MemTracker would count those global-shaped tensors
      (seen: two [2048, 32000] fp32 tensors at loss_parallel's ``_log_softmax``, a +2·T·V·4 B forward peak that no
      real run has);
    * tensors on the meta device: transformers' TP styles build ``torch.empty(shape, device="meta")`` to compute a
      DTensor stride (distributed/tensor_parallel.py:121-127); MemTracker would count them on a second device.
    """

    def _track(self, reftype, t) -> None:
        if _IN_META_PROPAGATION[0] or t.device.type == "meta":
            return
        super()._track(reftype, t)


# --------------------------------------------------------------------------- foreach AdamW over a DTensor/plain mix
@contextlib.contextmanager
def _split_param_groups():
    """HF's plan leaves the norms plain tensors while the rest are DTensors; foreach AdamW refuses to mix them in
    one group (aten._foreach_* on DTensor and Tensor lists). The HF Trainer already separates them
    (trainer.py get_decay_parameter_names: norm weights and biases get weight_decay 0 in their own group), so
    the run does the same: one group of DTensors, one of plain tensors, in parameter order."""
    orig = harness.build_optimizer

    def build(params, name, impl):
        params = list(params)
        dt = [p for p in params if isinstance(p, DTensor)]
        plain = [p for p in params if not isinstance(p, DTensor)]
        if not dt or not plain:
            return orig(params, name, impl)
        opt = orig(dt, name, impl)
        opt.add_param_group({"params": plain, "weight_decay": 0.0})
        return opt

    harness.build_optimizer = build
    try:
        yield
    finally:
        harness.build_optimizer = orig


# --------------------------------------------------------------------------- configurations
def _cfg(plan: str, model: str, tp: int, *, regime: str, b: int, s: int, method: str, note: str) -> dict:
    p = PLANS[plan]
    kind = "tp+sp" if p["sequence_parallel"] else "tp"
    c = mp._cfg(kind, model, tp, 0, regime=regime, b=b, s=s, method=method, note=note)
    c["id"] = f"{plan}-{model}-{regime}-tp{tp}-b{b}-s{s}" + ("-fake" if method == "fake" else "") + "-r0"
    c["single_device_id"] = None
    c["plan"] = {"name": plan, "sequence_parallel": p["sequence_parallel"], "loss_parallel": p["loss_parallel"],
                 "source": p["source"]}
    c["tp"] = tp
    c["layers"] = c["hf_config"]["num_hidden_layers"]
    c["dtype"] = "bfloat16" if regime == "bf16" else "float32"
    return c


def build_configs() -> list[dict]:
    out = []
    for plan in PLANS:
        for L in LAYERS_8B:
            for tp in TPS_8B:
                out.append(_cfg(plan, tpp._model_name(L), tp, regime="bf16", b=B, s=S, method="fake",
                                note=f"Llama-3-8B shapes with {L} of 32 decoder layers"))
        out.append(_cfg(plan, "llama-125m-kv4", 4, regime="fp32", b=B, s=S, method="fake",
                        note="125M Llama, 4 KV heads over 4 ranks (one KV head per rank)"))
    return out


CONFIGS = build_configs()
assert len({c["id"] for c in CONFIGS}) == len(CONFIGS)


def _trim(rows: list, keep: int = 40) -> list:
    return rows[:keep]  # rows are sorted by bytes, largest first


def measure(cfg: dict) -> dict:
    plan = PLANS[cfg["plan"]["name"]]
    orig, orig_tracker = mp.apply_tp, mp.PhaseMemTracker
    mp.apply_tp = lambda model, mesh, sp: plan["apply"](model, mesh)  # called by measure_parallel._measure_in_pg
    mp.PhaseMemTracker = Tracker  # instantiated by measure_parallel._measure_in_pg by this global name
    try:
        with (loss_parallel() if plan["loss_parallel"] else contextlib.nullcontext()), _split_param_groups():
            m = tpp.measure_one(cfg)
    finally:
        mp.apply_tp, mp.PhaseMemTracker = orig, orig_tracker
    m["provenance_at_phase_peak"] = {k: _trim(v) for k, v in m["provenance_at_phase_peak"].items()}
    m["provenance_alive_at"] = {k: _trim(v) for k, v in m["provenance_alive_at"].items()}
    m["phase_peaks"] = {ph: v["bytes"] for ph, v in m["peak_by_phase"].items()}
    m["alive_points"] = {k: v["bytes"] for k, v in m["alive"].items()}
    return m


def document(args, runs, ctx) -> dict:
    return {
        "generator": "python3 validation/parallel/tp_plans/measure_tp_plans.py --out "
                     "validation/parallel/tp_plans/measurements.json",
        "environment": "python venv with torch==2.13.0 (CPU build) and transformers==5.23.0 "
                       "(pip install -r validation/requirements.txt); fake process group (one rank: 0)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "wall_s_this_invocation": round(ctx.elapsed, 1),
        "runs": runs,
    }


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--list", action="store_true")

    def before(args):
        if args.list:
            for c in CONFIGS:
                print(c["id"])
            return 0
        return None

    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, arguments=arguments, before=before, catch=False,
                        summary=lambda m: f"peak {m['peak_bytes'] / 2**30:8.3f} GiB in {m['peak_phase']:<9} "
                        + " ".join(f"{ph}={v / 2**30:.3f}" for ph, v in m["phase_peaks"].items())
                        + f" ({m['wall_s']}s)",
                        line=lambda n, t, c, msg: f"{c['id']:52} {msg}")


if __name__ == "__main__":
    sys.exit(main())
