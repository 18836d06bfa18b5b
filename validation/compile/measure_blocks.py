#!/usr/bin/env python
"""Per-block ``torch.compile`` (torchtune ``compile: True``, torchtitan ``compile.enable``) measured with the
profiler's memory timeline, on torchtune's own model builders.

    nice -n 10 /tmp/lossvenv/bin/python validation/compile/measure_blocks.py [--only ID ...]
    # writes validation/compile/blocks_measurements.json; /tmp/lossvenv: torch==2.13.0 (CPU), torchtune==0.6.1,
    # torchao==0.13.0 (torchtune 0.6.1 imports torchao.dtypes.nf4tensor, gone from torchao 0.18)

What runs, as torchtune 0.6.1's ``full_finetune_single_device`` recipe runs it:

* the model: ``torchtune.models.llama3_2._component_builders.llama3_2`` (Llama 3.2's layers: RMSNorm, its
  scaled RoPE, SDPA with ``is_causal`` and no mask, k and v expanded to the query heads when grouped
  (torchtune/modules/attention.py:285-291), SwiGLU; tied embeddings: ``TiedLinear``), in the run's dtype
  (pure bf16 or fp32: ``model.to(dtype)``);
* compile: ``torchtune.training.compile_model(model)`` (every ``TransformerSelfAttentionLayer`` compiled in
  place with ``m.compile(backend="inductor")``; the embedding, the final norm and the LM head
  ``self.output(h).float()`` stay eager);
* the loss: ``torch.nn.CrossEntropyLoss`` as the recipe's ``_loss_step`` calls it (labels shifted by
  ``hstack`` with an ignore column, logits and labels flattened, ``del logits``). The recipe calls
  ``training.compile_loss(self._loss_fn)`` and discards its return value
  (recipes/full_finetune_single_device.py:293-294): for a loss other than the chunked ones
  (``compile_loss`` patches ``compute_cross_entropy`` in place only for ``CEWithChunkedOutputLoss``) the loss
  the recipe runs is the eager module. ``loss="chunked"``: ``CEWithChunkedOutputLoss`` with
  ``model.set_num_output_chunks`` and ``compile_loss`` (its ``compute_cross_entropy`` compiled);
* ``policy="op-sac"``: torchtitan's per-op selective checkpointing around each block (parallelize_llama.py
  ``_apply_ac_to_transformer_block`` of 9dec370: ``create_selective_checkpoint_contexts`` with ``_save_list``
  {mm, SDPA's flash/efficient/CPU-flash ops, max, abs}, every second mm recomputed) applied with
  ``checkpoint_wrapper`` before the block is compiled (torchtitan's order: apply_ac, then apply_compile);
* ``policy="full"``: torchtune's ``training.set_activation_checkpointing(model, auto_wrap_policy=
  {TransformerSelfAttentionLayer})`` after ``compile_model`` (the recipe's order: each compiled layer wrapped
  in ``checkpoint_wrapper``, non-reentrant);
* AdamW (foreach), the harness's protocol (two warm-ups, the third iteration measured).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402  (validation/harness.py)
import torch  # noqa: E402

TINY = dict(vocab_size=32000, num_layers=2, num_heads=8, num_kv_heads=8, embed_dim=256, max_seq_len=512,
            intermediate_dim=688, tie_word_embeddings=True)

# peft-style module names of each torchtune LoRA set (the profile's LoRAConfig target_modules)
LORA = {"qv": {"attn": ["q_proj", "v_proj"], "mlp": False, "targets": ["q_proj", "v_proj"]},
        "all": {"attn": ["q_proj", "k_proj", "v_proj", "output_proj"], "mlp": True,
                "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}}


def _cfg(regime, compile, *, b=1, seq=512, layers=2, kv=8, vocab=32000, tied=True, loss="ce", policy="none",
         layout=None, lora=None, ffn=688, qlora=False):
    tt = dict(TINY, num_layers=layers, num_kv_heads=kv, vocab_size=vocab, tie_word_embeddings=tied, max_seq_len=seq,
              intermediate_dim=ffn)
    rid = (f"tt-llama3_2-{layers}l-v{vocab}" + (f"-kv{kv}" if kv != 8 else "") + (f"-f{ffn}" if ffn != 688 else "")
           + ("" if tied else "-untied")
           + f"-{regime}-{compile}" + (f"-{policy}" if policy != "none" else "") + (f"-{loss}" if loss != "ce" else "")
           + (f"-{layout}-w2r0" if layout else "") + (f"-{'q' if qlora else ''}lora-{lora}" if lora else "")
           + f"-b{b}-s{seq}")
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": tt["embed_dim"],
          "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": 8,
          "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": tied, "head_dim": 32,
          "max_position_embeddings": seq, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    return {"id": rid, "torchtune": tt, "hf_config": hf, "batch_size": b, "seq_len": seq, "regime": regime,
            "compile": compile, "loss": loss, "policy": policy, "optimizer": "adamw", "optimizer_impl": "foreach",
            **({"lora": dict(LORA[lora], rank=8, alpha=16, **({"quantize_base": True} if qlora else {}))} if lora else {}),
            **({"layout": {"kind": layout, "world_size": 2, "rank": 0}} if layout else {})}


CONFIGS = [
    _cfg("bf16", "eager"), _cfg("bf16", "blocks"),
    _cfg("fp32", "eager"), _cfg("fp32", "blocks"),
    _cfg("fp32", "blocks", kv=2),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3),
    _cfg("fp32", "eager", policy="op-sac"), _cfg("fp32", "blocks", policy="op-sac"),
    _cfg("fp32", "blocks", loss="chunked"), _cfg("bf16", "blocks", loss="chunked"),
    # torchtune's full activation checkpointing with compile: compile_model first, then
    # set_activation_checkpointing wraps each (compiled) layer in checkpoint_wrapper (the recipe's _setup_model).
    _cfg("fp32", "eager", policy="full"), _cfg("fp32", "blocks", policy="full"),
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, policy="full"),
    # torchtitan's order (apply_ac, then apply_compile): each block wrapped in checkpoint_wrapper (full, non-reentrant,
    # preserve_rng_state False as torchtitan's _apply_ac_to_transformer_block), then the wrapped block compiled
    # (fullgraph): the checkpoint inside the compiled graph.
    _cfg("fp32", "blocks", policy="full-in"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, policy="full-in"),
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, kv=2, policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, kv=2, policy="full-in"),
    _cfg("bf16", "eager", vocab=1024, b=1, seq=256, layers=3, policy="full"),
    _cfg("bf16", "blocks", vocab=1024, b=1, seq=256, layers=3, policy="full-in"),
    # FSDP2 (rank 0 of 2, the fake process group; torchtitan's order: each block compiled, then fully_shard on
    # it, reshard_after_forward True, the root fully_shard'ed last): eager and per-block compiled.
    _cfg("fp32", "eager", layout="fsdp2"), _cfg("fp32", "blocks", layout="fsdp2"),
    # LoRA (torchtune 0.6.1's lora_llama3_2 builder, lora_finetune_single_device with compile: True): rank 8,
    # alpha 16, no dropout, adapters in the model's dtype; "qv": q_proj and v_proj (the recipes' smallest
    # set), "all": q, k, v, output_proj and the MLP (w1, w2, w3); the LM head frozen.
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, lora="qv"), _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, lora="qv"),
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, lora="all"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, lora="all"),
    _cfg("fp32", "eager", lora="qv"), _cfg("fp32", "blocks", lora="qv"),
    _cfg("bf16", "eager", vocab=1024, layers=3, seq=256, lora="all"),
    _cfg("bf16", "blocks", vocab=1024, layers=3, seq=256, lora="all"),
    # Tensor parallelism (rank 0 of 2, the fake process group): torchtune 0.6.1's own plan (base_llama_tp_plan:
    # vocab-parallel embedding, column-parallel q/k/v/w1/w3, row-parallel output_proj/w2, the LM head
    # column-parallel with its logits all-gathered; the embedding left replicated: _tp) after prepare_mha_for_tp,
    # then each block compiled (torchtitan's order: apply_tp, then apply_compile); untied.
    _cfg("fp32", "eager", vocab=1024, layers=2, b=2, tied=False, layout="tp"),
    _cfg("fp32", "blocks", vocab=1024, layers=2, b=2, tied=False, layout="tp"),
]



def _op_sac_context():
    """torchtitan 9dec370 parallelize_llama.py ``_apply_ac_to_transformer_block``, mode "selective", "op"."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default, aten.abs.default, aten.max.default}

    def policy():
        meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

        def fn(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            key = f"{mode}_mm_count"
            if func == aten.mm.default:
                meta[key] += 1
            to_save = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(fn)
    return policy


class Step(torch.nn.Module):
    """The recipe's ``_loss_step`` behind the harness's ``model(input_ids=, labels=, use_cache=).loss``."""

    def __init__(self, model, loss_fn, ignore_index=-100):
        super().__init__()
        self.model, self.loss_fn, self.ignore_index = model, loss_fn, ignore_index

    def forward(self, input_ids, labels, use_cache=False):
        logits = self.model(input_ids)
        ignore = torch.full((labels.shape[0], 1), self.ignore_index, dtype=labels.dtype, device=labels.device)
        labels = torch.hstack((labels[..., 1:], ignore))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = self.loss_fn(logits, labels)
        del logits
        return types.SimpleNamespace(loss=loss)


def titan_cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan v0.2.2's loss, verbatim (pytorch/torchtitan 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce,
    torchtitan/components/loss.py ``cross_entropy_loss``; ``build_cross_entropy_loss`` wraps it in
    ``torch.compile(loss_fn, backend=job_config.compile.backend)`` when ``compile.enable`` and "loss" is in
    ``compile.components``)."""
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum",
                                             ignore_index=-100)


class TitanStep(torch.nn.Module):
    """torchtitan v0.2.2's ``forward_backward_step`` without pipelining (torchtitan/train.py at 73a0e69, lines
    527-542): ``pred = model(inputs)``, ``loss_sum = self.loss_fn(pred, labels)``, ``loss = loss_sum /
    global_valid_tokens``, ``del pred`` before the backward. The labels shifted as ``Step`` shifts them (torchtitan's
    dataloader gives them shifted: here one int64 tensor made in the forward, as in every other run)."""

    def __init__(self, model, loss_fn, ignore_index=-100):
        super().__init__()
        self.model, self.loss_fn, self.ignore_index = model, loss_fn, ignore_index

    def forward(self, input_ids, labels, use_cache=False):
        pred = self.model(input_ids)
        ignore = torch.full((labels.shape[0], 1), self.ignore_index, dtype=labels.dtype, device=labels.device)
        labels = torch.hstack((labels[..., 1:], ignore))
        loss_sum = self.loss_fn(pred, labels)
        loss = loss_sum / labels.numel()
        del pred
        return types.SimpleNamespace(loss=loss)


def measure(cfg: dict) -> dict:
    if not cfg.get("layout"):
        return _measure(cfg)
    from fakepg import fake_world      # validation/fakepg.py
    lay = cfg["layout"]
    with fake_world(lay["rank"], lay["world_size"]):
        return _measure(cfg)


def _fsdp2(model, world):
    """torchtitan's apply_fsdp (9dec370) without a mixed-precision policy: every block, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh)


def _shard_torchtune(model, layout):
    """torchtune 0.6.1's ``training.shard_model`` as its distributed recipes call it (after ``compile_model`` and
    ``set_activation_checkpointing``): ``fully_shard`` on every module ``get_shard_conditions`` names (``layers.i``:
    the checkpoint wrapper around the compiled layer), bottom-up, then on the root; ``reshard_after_forward=True``;
    ``fsdp_cpu_offload``: ``CPUOffloadPolicy`` (``pin_memory=False``: no accelerator to pin for on this CPU build)."""
    from functools import partial

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy
    import torchtune.training._distributed as distributed
    from torchtune import training
    mesh = init_device_mesh("cpu", (layout["world_size"],))
    policy = distributed.CPUOffloadPolicy
    distributed.CPUOffloadPolicy = lambda: CPUOffloadPolicy(pin_memory=False)
    try:
        # custom_sharded_layers (measure_blocks_fsdp.py's -custom runs): names_to_match, as the recipe passes it
        training.shard_model(model, [partial(training.get_shard_conditions,
                                             names_to_match=layout.get("custom_sharded_layers"))],
                             cpu_offload=bool(layout.get("cpu_offload")), reshard_after_forward=True, dp_mesh=mesh)
    finally:
        distributed.CPUOffloadPolicy = policy


def _tp(model, world):
    """torchtune 0.6.1's tensor parallelism (recipes/full_finetune_distributed.py: prepare_mha_for_tp, then
    parallelize_module with base_llama_tp_plan)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torchtune import training
    from torchtune.models.llama3._parallelism import base_llama_tp_plan
    mesh = init_device_mesh("cpu", (world,))
    training.prepare_mha_for_tp(model, mesh)
    # The embedding stays replicated: with torch 2.13 the vocab-parallel embedding's all-reduce backward
    # (RowwiseParallel(input_layouts=Replicate())) receives a plain tensor from the compiled first block's
    # backward and fails ("AttributeError: 'Tensor' object has no attribute '_local_tensor'",
    # torch/distributed/tensor/_redistribute.py); the eager twin runs the same plan, and the blocks' graphs do
    # not depend on it (compare_blocks.py compares the compile delta).
    plan = {k: v for k, v in base_llama_tp_plan().items() if k != "tok_embeddings"}
    parallelize_module(model, mesh, plan)


def _measure(cfg: dict) -> dict:
    from torchtune import training
    from torchtune.models.llama3_2._component_builders import llama3_2
    from torchtune.modules import TransformerSelfAttentionLayer
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg["regime"]]
    if cfg.get("lora"):
        from torchtune.models.llama3_2._component_builders import lora_llama3_2
        from torchtune.modules.peft import get_adapter_params, set_trainable_params
        lo = cfg["lora"]
        if lo.get("quantize_base"):
            # QLoRA (torchtune's qlora_* builders: LoRALinear(quantize_base=True), the base to_nf4'd): built in the
            # run's dtype as the recipe's _setup_model does (training.set_default_dtype; a later .to(dtype) would
            # go through NF4Tensor's own .to), the base frozen by set_trainable_params before compile_model as the
            # recipe orders them (with the NF4 base still requiring grad, torch 2.13 miscompiles its backward:
            # probe_nf4_compile.py)
            with training.set_default_dtype(dtype):
                model = lora_llama3_2(lo["attn"], lo["mlp"], False, **cfg["torchtune"], lora_rank=lo["rank"],
                                      lora_alpha=lo["alpha"], quantize_base=True)
        else:
            model = lora_llama3_2(lo["attn"], lo["mlp"], False, **cfg["torchtune"], lora_rank=lo["rank"],
                                  lora_alpha=lo["alpha"]).to(dtype)
        set_trainable_params(model, get_adapter_params(model))
    else:
        model = llama3_2(**cfg["torchtune"]).to(dtype)
    tp = (cfg.get("layout") or {}).get("kind") == "tp"
    torchtune_shard = (cfg.get("layout") or {}).get("kind") == "fsdp2-torchtune"      # measure_blocks_fsdp.py
    if tp:
        _tp(model, cfg["layout"]["world_size"])
    if cfg["policy"] == "op-sac":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer, context_fn=_op_sac_context(), preserve_rng_state=False)
    if cfg["policy"] == "full-in":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    if cfg["compile"] == "blocks":
        if cfg["policy"] in ("none", "full") and (not cfg.get("layout") or torchtune_shard):
            training.compile_model(model, verbose=False)        # torchtune: each TransformerSelfAttentionLayer
        else:                                                   # torchtitan: each (wrapped) block
            for i, layer in enumerate(model.layers):
                model.layers[i] = torch.compile(layer, fullgraph=True)
        assert any(isinstance(m, TransformerSelfAttentionLayer) for m in model.modules())
    if cfg["policy"] == "full":     # torchtune recipes: after compile_model
        training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
    if torchtune_shard:
        _shard_torchtune(model, cfg["layout"])
    elif cfg.get("layout") and not tp:
        _fsdp2(model, cfg["layout"]["world_size"])
    if cfg["loss"] == "chunked":
        loss_fn = CEWithChunkedOutputLoss()
        if cfg["compile"] == "blocks":
            training.compile_loss(loss_fn, verbose=False)
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    elif cfg["loss"] in ("titan", "titan-compiled"):     # torchtitan v0.2.2's loss and step (TitanStep)
        loss_fn = titan_cross_entropy_loss
        if cfg["loss"] == "titan-compiled":                # build_cross_entropy_loss, "loss" in compile.components
            loss_fn = torch.compile(loss_fn, backend="inductor")
        # torchtitan's Transformer.forward returns ``self.output(h)``: the logits in the model's dtype (torchtune's
        # unembed upcasts them with .float(): not torchtitan's)
        model.unembed = types.MethodType(lambda self, h: self.output(self.norm(h)), model)
    else:
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
        if cfg["compile"] == "blocks":
            training.compile_loss(loss_fn, verbose=False)        # the recipe discards the return value
    step = TitanStep(model, loss_fn) if cfg["loss"].startswith("titan") else Step(model, loss_fn)
    params = [p for p in model.parameters() if p.requires_grad]
    if tp:      # the norms' weights stay plain tensors (FSDP makes them DTensors in the recipe): foreach AdamW
        # refuses a DTensor and a plain tensor in one group, so they are a group of their own (a step's
        # temporaries are per group: the larger group's, here the sharded one's, set the step's peak)
        groups = [[p for p in params if hasattr(p, "to_local")], [p for p in params if not hasattr(p, "to_local")]]
        params = [{"params": g} for g in groups if g]
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True) if not cfg.get("optimizer_in_backward") else \
        _InBackward(params, cfg.get("optimizer_impl", "foreach"))
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, cfg["torchtune"]["vocab_size"], (cfg["batch_size"], cfg["seq_len"]), generator=g)
    t0 = time.perf_counter()
    prof = harness.profiled_iteration(step, optimizer, input_ids, warmup=2)
    wall = time.perf_counter() - t0
    tensors = [*model.parameters(), *model.buffers(), input_ids,
               *(v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))]
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]      # FSDP2's DTensors: the shard
    # torchao's NF4Tensor (QLoRA's base) is a wrapper subclass: its bytes are its inner tensors' (the packed codes,
    # the quantized scalers, their factors and mean, the 16-entry lookup table)
    tensors = [inner for t in tensors for inner in ([getattr(t, a) for a in t.__tensor_flatten__()[0]]
                                                    if type(t).__name__ == "NF4Tensor" else [t])]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    record = harness.memory_timeline(prof)
    del prof
    torch._dynamo.reset()
    return {**record, "baseline_bytes": int(sum(storages.values())), "wall_s": round(wall, 1),
            "parameters": sum(p.numel() for p in model.parameters())}


class _InBackward(harness.Nothing):
    """torchtune 0.6.1's ``optimizer_in_bwd`` (torchtune/training/memory.py: one optimizer per parameter,
    ``register_optim_in_bwd_hooks``: ``optim_dict[p].step(); optim_dict[p].zero_grad()`` on each parameter's
    post-accumulate-grad hook); the loop's ``zero_grad`` and ``step`` do nothing. ``state`` gathers the
    per-parameter optimizers' state (the baseline's bytes)."""

    def __init__(self, params, impl):
        kw = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
        self.optims = {p: torch.optim.AdamW([p], lr=1e-4, **kw) for p in params}

        def step(param):
            self.optims[param].step()
            self.optims[param].zero_grad(set_to_none=True)

        for p in self.optims:
            p.register_post_accumulate_grad_hook(step)

    @property
    def state(self):
        return {p: st for o in self.optims.values() for p, st in o.state.items()}


def document(args, runs, ctx) -> dict:
    import torchtune
    return {"generator": "/tmp/lossvenv/bin/python validation/compile/measure_blocks.py", "python": platform.python_version(),
            "torch": torch.__version__, "torchtune": torchtune.__version__, "device": "cpu",
            "threads": torch.get_num_threads(), "timeline": "harness.profiled_iteration / memory_timeline", "runs": runs}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "blocks_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<50} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
