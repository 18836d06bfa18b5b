#!/usr/bin/env python
"""Measure one pipeline stage of LoRA / QLoRA training (issue 25 item 2) with PyTorch's own tracker.

    python3 -m venv /tmp/pplvenv   # + torch==2.13.0 (CPU), transformers==5.23.0, peft==0.21.2, bitsandbytes==0.50.2
    /tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_pp.py --out validation/lora_parallel/pp_measurements.json

Each configuration is one stage of a pipeline of ``pp`` stages, measured alone in one process (nothing of the other
stages exists): the Hugging Face model is built from its config with random weights (QLoRA: saved and reloaded with
``BitsAndBytesConfig``, as ../measure_lora.py does), peft's adapters injected (``get_peft_model``, adapters the only
trainable parameters), then the stage keeps its own decoder layers (an even split: ``layers / pp`` each), the
token embedding on the first stage, the final norm and LM head on the last; everything else is dropped before the
tracker starts. The optimizer (``AdamW`` foreach) takes the stage's adapters.

The schedule is 1F1B (Megatron-LM's ``forward_backward_pipelining_without_interleaving``, which Megatron-Bridge's
PEFT recipes run): stage ``i`` of ``p`` runs ``min(p - i - 1, m)`` warm-up forwards, then one forward and one
backward per remaining micro-batch, then the cool-down backwards; it holds ``min(p - i, m)`` micro-batches of
activations at its peak. The communication is replaced by what a receive allocates on this stage: a non-first stage's
input is a fresh tensor of the residual stream's shape and dtype with ``requires_grad=True`` (Megatron's
``p2p_communication._communicate`` allocates its receive buffers with ``requires_grad=True``), a non-last stage's
backward starts from a fresh received gradient of its output's shape (``torch.autograd.backward(output,
grad)``). The stage's input and output are kept until its backward (as the schedule keeps ``input_tensors`` and
``output_tensors``); a sent input gradient is dropped once the backward returns. The tracker runs without its
module hooks (``StageMemTracker``); ``gc.collect()`` runs after each step. The protocol is ../harness.py's: three iterations, the tracker left
and re-entered before the third, which is recorded, every phase's peak (``forward``/``backward`` are the phases of
the forward and backward steps, whatever their order; ``optimizer`` the step).
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, VALIDATION)

from configs import GQA_TINY, LLAMA_TINY, _hf  # noqa: E402
import harness  # noqa: E402  (validation/harness.py)
from harness import peak_record  # noqa: E402
from measure_lora import FrozenAwareMemTracker  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

MODELS = {"llama-tiny": ("llama", LLAMA_TINY), "gqa-tiny": ("llama-gqa", GQA_TINY)}


def _cfg(model, regime, pp, stage, m, *, rank, targets, b=2, s=256, quantization=None, double_quant=False,
         checkpointing="none"):
    family, base = MODELS[model]
    short = "all" if targets == "all-linear" else "-".join(t.split("_")[0] for t in targets)
    q = f"-{quantization}" + ("-dq" if double_quant else "") if quantization else ""
    ck = "" if checkpointing == "none" else f"-{checkpointing}"
    return {"id": f"{'q' if quantization else ''}lora-{model}-{regime}{q}-r{rank}-{short}{ck}-pp{pp}-stage{stage}-m{m}"
                  f"-b{b}-s{s}",
            "family": family, "model": model, "hf_config": _hf(base, 0.0), "batch_size": b, "seq_len": s,
            "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach", "checkpointing": checkpointing,
            "attention": "sdpa", "dropout": 0.0, "method": "real",
            "layout": {"pp_size": pp, "stage": stage, "microbatches": m, "schedule": "1f1b"},
            "lora": {"rank": rank, "target_modules": targets, "quantization": quantization,
                     "double_quant": double_quant}}


QV = ["q_proj", "v_proj"]
ALL = "all-linear"
CONFIGS = [
    # two stages of two layers; 1F1B with m = 2: stage 0 holds 2 micro-batches, stage 1 one
    _cfg("llama-tiny", "fp32", 2, 0, 2, rank=16, targets=ALL),
    _cfg("llama-tiny", "fp32", 2, 1, 2, rank=16, targets=ALL),
    # four stages of one layer, m = 4 (in flight 4, 3, 2, 1): the first two stages
    # (its stage 2 is a middle stage that stage 1 dominates, no rank class of its own; its last stage, a bf16 LM
    # head and loss run 12 times, takes minutes on the CPU: the bf16 last stage is measured at pp 2 below)
    _cfg("llama-tiny", "bf16", 4, 0, 4, rank=8, targets=QV),
    _cfg("llama-tiny", "bf16", 4, 1, 4, rank=8, targets=QV),
    # autocast over an fp32 base, grouped-query attention
    _cfg("gqa-tiny", "amp-bf16", 2, 0, 4, rank=16, targets=ALL),
    _cfg("gqa-tiny", "amp-bf16", 2, 1, 4, rank=16, targets=ALL),
    # full activation checkpointing (transformers' gradient_checkpointing_enable on every layer)
    _cfg("llama-tiny", "fp32", 2, 0, 2, rank=16, targets=ALL, checkpointing="full"),
    _cfg("llama-tiny", "fp32", 2, 1, 2, rank=16, targets=ALL, checkpointing="full"),
    # QLoRA: the 4-bit base split the same way
    _cfg("llama-tiny", "bf16", 2, 0, 2, rank=16, targets=ALL, quantization="nf4", double_quant=True),
    _cfg("llama-tiny", "bf16", 2, 1, 2, rank=16, targets=ALL, quantization="nf4", double_quant=True),
]


def _base_model(cfg):
    from peft import LoraConfig, get_peft_model
    hf_config = harness.hf_config_of(cfg)
    dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    lora = cfg["lora"]
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
    if lora["quantization"] is not None:
        from transformers import BitsAndBytesConfig
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=lora["quantization"],
                                 bnb_4bit_use_double_quant=lora["double_quant"], bnb_4bit_compute_dtype=dtype)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=dtype,
                                                         attn_implementation=cfg["attention"], device_map="cpu")
    config = LoraConfig(r=lora["rank"], lora_alpha=2 * lora["rank"], lora_dropout=0.0,
                        target_modules=lora["target_modules"], bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.train()
    if cfg["checkpointing"] == "full":
        model.gradient_checkpointing_enable()
    model = model.get_base_model()
    return model, hf_config


class Stage(torch.nn.Module):
    """One pipeline stage of a Hugging Face causal LM: its decoder layers, the embedding on the first stage,
    the final norm, LM head and loss on the last; the model's own forward (``LlamaModel.forward``) runs it, with
    ``inputs_embeds`` the received tensor on a non-first stage and the norm an identity on a non-last one."""

    def __init__(self, model, lo, hi, first, last, kwargs=None):
        super().__init__()
        self.first, self.last = first, last
        self.kwargs = kwargs or {}      # more inputs of the model's forward (position ids under SP)
        inner = model.model
        inner.layers = torch.nn.ModuleList(list(inner.layers)[lo:hi])
        if not first:
            inner.embed_tokens = None
        if not last:
            inner.norm = torch.nn.Identity()
            model.lm_head = None
        self.model = model

    def forward(self, x, ids):
        if self.last:
            kw = {"input_ids": ids} if self.first else {"inputs_embeds": x}
            return self.model(labels=ids, use_cache=False, **kw, **self.kwargs).loss
        kw = {"input_ids": ids} if self.first else {"inputs_embeds": x}
        return self.model.model(use_cache=False, **kw, **self.kwargs).last_hidden_state


class _NoModules:
    """Stands for the tracker's ``ModTracker``: no module hooks (see ``StageMemTracker``)."""

    is_bw = False
    parents = {"Global"}

    def register_user_hooks(self, *hooks):
        pass

    def clear_user_hooks(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *args):
        pass


class StageMemTracker(FrozenAwareMemTracker):
    """``MemTracker`` without its module hooks: a stage runs its modules once per micro-batch, which the stock
    per-module bookkeeping refuses ("multiple iterative calls"), and ``ModTracker``'s multi-grad hooks on the
    inputs of a stage whose input requires grad keep the gradients they buffer (six T x h tensors per micro-batch
    on the CPU, alive through the optimizer step): an artifact of the tracker, not of the run. The bytes are the
    stock tracker's (every live tracked storage after every op); the adapters' gradient hooks are installed on
    the stage's trainable parameters once (``track_stage``) so that gradients are still told apart."""

    def __init__(self):
        super().__init__()
        self._mod_tracker = _NoModules()

    def track_stage(self, net, optimizer, *tensors):
        self.track_external(net, optimizer, *tensors)
        self._track_module_params_and_buffers(net, install_grad_hooks=True)     # (categories only)


def one_f_one_b(p, stage, m):
    """The order of stage ``stage``'s steps under 1F1B: ('F', i) and ('B', i) (Megatron-LM
    megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_without_interleaving:
    num_warmup_microbatches = min(p - stage - 1, m), then 1F1B steady state, then the cool-down)."""
    warm = min(p - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for k in range(m - warm):
        order += [("F", warm + k), ("B", k)]
    order += [("B", i) for i in range(m - warm, m)]
    return order


def measure(cfg: dict) -> dict:
    lay = cfg["layout"]
    p, stage = lay["pp_size"], lay["stage"]
    torch.manual_seed(0)
    model, hf_config = _base_model(cfg)
    L = hf_config.num_hidden_layers
    per = L // p
    net = Stage(model, stage * per, (stage + 1) * per, stage == 0, stage == p - 1)
    del model
    b, s, h = cfg["batch_size"], cfg["seq_len"], hf_config.hidden_size
    ids = torch.randint(0, hf_config.vocab_size, (b, s))
    return run_stage(cfg, net, ids, (b, s, h), StageMemTracker)


def run_stage(cfg: dict, net, ids, received: tuple, tracker) -> dict:
    """The measured protocol of one stage ``net`` (a ``Stage``) under 1F1B: ``received`` the shape of what a
    receive allocates (the stage input and its gradient), ``tracker`` the memory tracker's class."""
    lay = cfg["layout"]
    p, stage, m = lay["pp_size"], lay["stage"], lay["microbatches"]
    first, last = stage == 0, stage == p - 1
    per = len(net.model.model.layers)
    params = [q for q in net.parameters() if q.requires_grad]
    optimizer = harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
    residual = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    mt = tracker()
    # the token ids: the embedding's input on the first stage, the labels on the last; a middle stage has neither
    mt.track_stage(net, optimizer, *([ids] if first or last else []))
    autocast = harness.autocast_for(cfg)
    order = one_f_one_b(p, stage, m)

    def iteration():
        gc.collect()
        optimizer.zero_grad(set_to_none=True)
        inputs, outputs = {}, {}
        for kind, i in order:
            if kind == "F":
                mt.phase = "forward"
                x = None if first else torch.empty(received, dtype=residual, requires_grad=True)   # the receive
                with autocast():
                    outputs[i] = net(x, ids)
                inputs[i] = x
                del x        # (held by the schedule only)
            else:
                mt.phase = "backward"
                out = outputs.pop(i)
                if last:
                    out.backward()
                else:
                    torch.autograd.backward(out, torch.empty_like(out))    # the received gradient
                del out
                inputs.pop(i)        # its .grad sent to the previous stage
            gc.collect()     # (reference cycles a step may leave behind: not what a run keeps)
        mt.phase = "optimizer"
        optimizer.step()
        mt.phase = "idle"

    t0 = time.perf_counter()
    with mt:
        iteration()
        mt.reset_mod_stats()
        iteration()
    mt.reset_mod_stats()
    mt.reset_phase_stats()
    with mt:
        mt.phase = "start"
        iteration()
    quant = harness.quant_state_storages(net)
    storage = {}
    for t in list(net.parameters()) + list(net.buffers()):
        st = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()    # (a DTensor's local shard)
        storage[st.data_ptr()] = st.nbytes()
    return {**peak_record(mt), "order": [f"{k}{i}" for k, i in order],
            "in_flight": max(sum(1 for k, j in order[:n + 1] if k == "F") - sum(1 for k, j in order[:n + 1] if k == "B")
                             for n in range(len(order))),
            "stage_layers": per, "trainable_parameters": int(sum(q.numel() for q in params)),
            "parameter_tensors": len(params), "parameters_and_buffers_bytes": int(sum(storage.values())),
            "quant_state_bytes": int(sum(quant.values())), "wall_s": round(time.perf_counter() - t0, 1)}


def _versions() -> dict:
    import peft
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    try:
        import bitsandbytes
        out["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        out["bitsandbytes"] = None
    return out


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_pp.py "
                         "--out validation/lora_parallel/pp_measurements.json",
            "environment": "torch==2.13.0 (CPU), transformers==5.23.0, peft==0.21.2, bitsandbytes==0.50.2",
            "python": platform.python_version(), **_versions(), "device": "cpu",
            "total_wall_s": None if args.only else round(ctx.elapsed, 1), "runs": runs}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, versions=_versions, summary=harness.mib_summary(9, 2, wall=5),
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<58} {msg}")


if __name__ == "__main__":
    sys.exit(main())
