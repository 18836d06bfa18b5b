#!/usr/bin/env python
"""Measure the LoRA variants (issue 25 item 2): DoRA (peft's ``use_dora``), ``modules_to_save``
(peft's ``ModulesToSaveWrapper``) and torchtune's chunked cross-entropy over a LoRA model, with
measure_lora.py's protocol (peft 0.21.2 over transformers 5.23, MemTracker, three iterations, the
third measured; every phase recorded).

    /tmp/valvenv/bin/python validation/measure_lora_variants.py --out validation/lora_variant_measurements.json

/tmp/valvenv: torch==2.13.0 (CPU), transformers==5.23.0, peft==0.21.2, bitsandbytes==0.50.2
(validation/requirements.txt plus those two). The chunked runs load torchtune 0.6.1's
``torchtune/modules/loss/ce_chunked_output_loss.py`` (it imports only torch) from the file given by
``--torchtune-loss`` (default: /tmp/lossvenv's, validation/techniques/loss/measure_loss.py's environment):
torchtune 0.6.1 as a package needs torchao <= 0.13, which peft's environment does not have.

* DoRA: ``LoraConfig(use_dora=True)``; QLoRA-DoRA over bitsandbytes nf4 where peft supports it on the CPU.
* ``modules_to_save``: ``LoraConfig(modules_to_save=[...])``: a trainable copy of each named module, the
  original kept frozen.
* chunked: torchtune's recipe applied to the peft model as measure_loss.py applies it to a full model: the
  base model's last hidden state, the (frozen) LM head on each of ``loss_chunks`` sequence chunks, torchtune's
  ``CEWithChunkedOutputLoss``, then ``del logits`` before the backward.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import platform
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import measure_lora  # noqa: E402
from configs import GPT2_TINY, GQA_TINY, LLAMA_TINY, _hf, _llama  # noqa: E402
from families.llama_variants.configs import MODELS as VARIANTS  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

TORCHTUNE_LOSS = "/tmp/lossvenv/lib/python3.11/site-packages/torchtune/modules/loss/ce_chunked_output_loss.py"
IGNORE = -100
# llama-wide: a wide MLP and a small vocabulary, where DoRA's weight norm (in^2 + 3 in x out per linear) outgrows
# the loss's moment and is the forward's peak
BASES = {"llama-tiny": ("llama", _hf(LLAMA_TINY, 0.0)), "gqa-tiny": ("llama-gqa", _hf(GQA_TINY, 0.0)),
         "qwen3-tiny": ("qwen3", VARIANTS["qwen3-tiny"]), "gpt2-tiny": ("gpt2", _hf(GPT2_TINY, 0.0)),
         "llama-wide": ("llama", _hf(_llama(256, 2048, 2, 8, 8, 1024), 0.0))}


def _cfg(id, model, batch_size, seq_len, *, rank, targets, regime="fp32", use_dora=False, modules_to_save=None,
         quantization=None, loss=None, loss_chunks=None, adapter_dtype=None, lora_dropout=0.0):
    family, base = BASES[model]
    hf = copy.deepcopy(base)
    hf.update(use_cache=False, attention_dropout=0.0)
    lora = {"rank": rank, "target_modules": targets, "quantization": quantization, "double_quant": False}
    if use_dora:
        lora["use_dora"] = True
    if modules_to_save:
        lora["modules_to_save"] = list(modules_to_save)
    if adapter_dtype:
        lora["adapter_dtype"] = adapter_dtype
    if lora_dropout:
        lora["dropout"] = lora_dropout
    cfg = {"id": id, "family": family, "model": model, "hf_config": hf, "batch_size": batch_size, "seq_len": seq_len,
           "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach", "checkpointing": "none",
           "attention": "sdpa", "dropout": 0.0, "method": "real", "sweep": None, "lora": lora, "lora_dropout": lora_dropout}
    if loss:
        cfg.update(loss=loss, loss_chunks=loss_chunks)
    return cfg


QV = ["q_proj", "v_proj"]
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = "all-linear"
CONFIGS = [
    # DoRA: the magnitude vectors (trainable), the weight norm from W + s B A in every forward, what the
    # forward saves for the backward (the base result and the LoRA result, per adapted linear)
    _cfg("dora-llama-tiny-fp32-r16-all-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL, use_dora=True),
    _cfg("dora-llama-tiny-fp32-r8-qv-b4-s256", "llama-tiny", 4, 256, rank=8, targets=QV, use_dora=True),
    _cfg("dora-qwen3-tiny-fp32-r16-all-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL, use_dora=True),
    _cfg("dora-qwen3-tiny-fp32-r16-all-b8-s256", "qwen3-tiny", 8, 256, rank=16, targets=ALL, use_dora=True),
    _cfg("dora-llama-tiny-bf16-r8-qv-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV, regime="bf16",
         use_dora=True),
    _cfg("dora-qwen3-tiny-bf16-r16-all-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL, regime="bf16",
         use_dora=True),
    _cfg("dora-gqa-tiny-amp-r8-qv-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="amp-bf16",
         use_dora=True),
    _cfg("qdora-llama-tiny-bf16-nf4-r16-all-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL, regime="bf16",
         use_dora=True, quantization="nf4"),
    _cfg("dora-llama-wide-fp32-r16-all-b1-s64", "llama-wide", 1, 64, rank=16, targets=ALL, use_dora=True),
    _cfg("dora-llama-wide-bf16-r8-mlp-b1-s64", "llama-wide", 1, 64, rank=8, targets=["up_proj", "down_proj"],
         regime="bf16", use_dora=True),
    # DoRA with lora_dropout: peft's DoraLinearVariant recomputes the base layer on the dropped input
    _cfg("dora-qwen3-tiny-fp32-r16-all-dropout-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL, use_dora=True,
         lora_dropout=0.1),
    _cfg("dora-qwen3-tiny-bf16-r16-qkvo-dropout-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=QKVO, regime="bf16",
         use_dora=True, lora_dropout=0.1),
    _cfg("dora-gqa-tiny-amp-r8-qv-dropout-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="amp-bf16",
         use_dora=True, lora_dropout=0.05),
    _cfg("qdora-llama-tiny-bf16-nf4-r8-qv-dropout-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV, regime="bf16",
         use_dora=True, quantization="nf4", lora_dropout=0.1),
    _cfg("dora-gpt2-tiny-fp32-r8-cattn-b2-s128", "gpt2-tiny", 2, 128, rank=8, targets=["c_attn"], use_dora=True),
    # modules_to_save: a trainable copy of the LM head and/or the embedding
    _cfg("mts-llama-tiny-fp32-r8-qv-lmhead-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV,
         modules_to_save=["lm_head"]),
    _cfg("mts-llama-tiny-fp32-r8-qv-embed-lmhead-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV,
         modules_to_save=["embed_tokens", "lm_head"]),
    _cfg("mts-llama-tiny-fp32-r16-all-embed-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL,
         modules_to_save=["embed_tokens"]),
    _cfg("mts-qwen3-tiny-fp32-r16-qkvo-lmhead-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=QKVO,
         modules_to_save=["lm_head"]),
    _cfg("mts-llama-tiny-bf16-r8-qv-embed-lmhead-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV,
         regime="bf16", modules_to_save=["embed_tokens", "lm_head"]),
    # (refused by the profile: the copies stay bf16 while peft casts the adapters to fp32; measured to show it)
    _cfg("mts-qwen3-tiny-bf16-r16-qkvo-embed-lmhead-bf16adapters-b2-s256", "qwen3-tiny", 2, 256, rank=16,
         targets=QKVO, regime="bf16", modules_to_save=["embed_tokens", "lm_head"], adapter_dtype="base"),
    _cfg("mts-gpt2-tiny-fp32-r8-cattn-wte-lmhead-b2-s128", "gpt2-tiny", 2, 128, rank=8, targets=["c_attn"],
         modules_to_save=["wte", "lm_head"]),
    _cfg("mts-gqa-tiny-amp-r8-qv-lmhead-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="amp-bf16",
         modules_to_save=["lm_head"]),
    # torchtune's chunked cross-entropy over a LoRA model (the LM head frozen)
    _cfg("chunked-lora-llama-tiny-fp32-r16-all-n8-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL,
         loss="chunked", loss_chunks=8),
    _cfg("chunked-lora-qwen3-tiny-fp32-r16-qkvo-n4-b4-s256", "qwen3-tiny", 4, 256, rank=16, targets=QKVO,
         loss="chunked", loss_chunks=4),
    _cfg("chunked-lora-llama-tiny-bf16-r8-qv-n8-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV, regime="bf16",
         loss="chunked", loss_chunks=8),
    _cfg("chunked-lora-gqa-tiny-amp-r8-qv-n8-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="amp-bf16",
         loss="chunked", loss_chunks=8),
    # the chunked loss over a trainable LM head copy (modules_to_save): the weight-gradient partials return
    _cfg("chunked-mts-llama-tiny-fp32-r8-qv-lmhead-n8-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV,
         modules_to_save=["lm_head"], loss="chunked", loss_chunks=8),
    _cfg("chunked-mts-gqa-tiny-amp-r8-qv-lmhead-n8-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="amp-bf16",
         modules_to_save=["lm_head"], loss="chunked", loss_chunks=8),
    # torchtune's LinearCrossEntropyLoss (after 0.6.1: the model skips its output layer, the loss projects chunk by
    # chunk; validation/techniques/loss/published_sources.py's copy at the commit the profile cites) over LoRA
    _cfg("ttlinear-lora-llama-tiny-fp32-r16-all-n8-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL,
         loss="torchtune_linear", loss_chunks=8),
    _cfg("ttlinear-lora-qwen3-tiny-bf16-r16-qkvo-bf16adapters-n8-b2-s256", "qwen3-tiny", 2, 256, rank=16,
         targets=QKVO, regime="bf16", adapter_dtype="base", loss="torchtune_linear", loss_chunks=8),
    _cfg("ttlinear-lora-gqa-tiny-amp-r8-qv-n8-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="amp-bf16",
         loss="torchtune_linear", loss_chunks=8),
]

_LOSS = {}


def _torchtune_loss():
    """torchtune 0.6.1's CEWithChunkedOutputLoss, loaded from its file (it imports only torch)."""
    if "cls" not in _LOSS:
        spec = importlib.util.spec_from_file_location("ce_chunked_output_loss", _LOSS.get("path", TORCHTUNE_LOSS))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOSS["cls"] = module.CEWithChunkedOutputLoss
    return _LOSS["cls"]


def chunked_step(n):
    """measure_loss.py's ``chunked_forward`` over the peft model: the base model's hidden state, the frozen
    LM head per chunk (F.linear: MemTracker refuses a module called several times), torchtune's loss."""
    loss_fn = _torchtune_loss()(num_output_chunks=n, ignore_index=IGNORE)

    def step(model):
        base = model.get_base_model()

        def forward(input_ids, labels, use_cache=False):
            h = base.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
            logits = [F.linear(chunk, base.lm_head.weight) for chunk in h.chunk(n, dim=1)]
            del h
            labels = torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], IGNORE)))
            loss = loss_fn.forward(logits, labels)
            del logits                                                      # the recipe's `del logits`
            return types.SimpleNamespace(loss=loss)
        return forward
    return step


def _collect_after_dora():
    """MemTracker's module hooks make DoRA's weight-norm graph (``lora_B(lora_A(eye(in)))``: lora_A and lora_B
    called a second time in the iteration) cyclic garbage, freed only when Python's collector runs; a run
    without the tracker frees it by reference count when ``DoraLinearLayer.forward`` returns (measured: no
    tensor of it outlives the call). So the collector runs where the plain run frees it: after each DoRA
    forward. Returns the undo."""
    import gc

    from peft.tuners.lora import dora
    original = dora.DoraLinearLayer.forward

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        gc.collect()
        return out
    dora.DoraLinearLayer.forward = forward
    return lambda: setattr(dora.DoraLinearLayer, "forward", original)


def linear_ce_step(n):
    """measure_published.py's ``torchtune_linear`` over the peft model: the base model's hidden state, torchtune's
    LinearCrossEntropyLoss (published_sources.py) with the (frozen) LM head as ``F.linear`` on its weight."""
    spec = importlib.util.spec_from_file_location(
        "published_sources", os.path.join(HERE, "techniques", "loss", "published_sources.py"))
    src = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(src)

    def step(model):
        base = model.get_base_model()

        def head(x):
            return F.linear(x, base.lm_head.weight)

        def forward(input_ids, labels, use_cache=False):
            hidden = base.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
            shifted = torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], IGNORE)))
            return types.SimpleNamespace(loss=src.LinearCrossEntropyLoss(head, num_output_chunks=n).forward(hidden, shifted))
        return forward
    return step


def measure(cfg: dict) -> dict:
    import peft
    step = {"chunked": chunked_step, "torchtune_linear": linear_ce_step}[cfg["loss"]](cfg["loss_chunks"]) \
        if cfg.get("loss") else None
    undo = _collect_after_dora() if cfg["lora"].get("use_dora") else (lambda: None)
    original = peft.get_peft_model
    if cfg["lora"].get("adapter_dtype") == "base":      # measure_lora_families.py's: autocast_adapter_dtype=False
        peft.get_peft_model = lambda model, config, **kw: original(model, config, autocast_adapter_dtype=False, **kw)
    try:
        return measure_lora.measure(cfg, step=step)
    finally:
        undo()
        peft.get_peft_model = original


def _versions() -> dict:
    import bitsandbytes
    import peft
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "bitsandbytes": bitsandbytes.__version__}


def document(args, runs, ctx) -> dict:
    return {
        "generator": "/tmp/valvenv/bin/python validation/measure_lora_variants.py "
                     "--out validation/lora_variant_measurements.json",
        "environment": "/tmp/valvenv: torch==2.13.0 (CPU), transformers==5.23.0, peft==0.21.2, bitsandbytes==0.50.2; "
                       "torchtune 0.6.1's ce_chunked_output_loss.py loaded from its file",
        "torchtune_loss": "torchtune 0.6.1 torchtune/modules/loss/ce_chunked_output_loss.py",
        "python": platform.python_version(), **_versions(), "device": "cpu",
        "total_wall_s": None if args.only else round(ctx.elapsed, 1),
        "runs": runs,
    }


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--torchtune-loss", default=TORCHTUNE_LOSS,
                        help="torchtune 0.6.1's ce_chunked_output_loss.py (the chunked runs load it)")

    def before(args):
        _LOSS["path"] = args.torchtune_loss

    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                 document=document, versions=_versions, summary=harness.mib_summary(9, 2, wall=5),
                 arguments=arguments, before=before, incremental=True, threads=1,
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<52} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
