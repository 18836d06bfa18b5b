"""The optimizer step in the backward combined with what torchtune's recipes run beside it
(issue 16, items 2-5): torchtune's chunked cross-entropy, bitsandbytes' AdamW8bit, activation
offloading (save_on_cpu) and the activation-checkpointing policies.

Schema of ``validation/configs.py`` plus ``technique`` ("optimizer_in_backward"), ``loss``
(cross_entropy | chunked), ``loss_chunks``, ``offload`` (None | save_on_cpu), ``policy_options``
(the checkpointing policy's plugin options) and ``solve_options`` (the keywords the prediction is
solved with). Models: a Llama-style dense model at two sizes (and the small one with tied
embeddings, as Llama 3.2 3B has) and a Mixtral-style MoE at two sizes, real tensors on the CPU.
"""

from __future__ import annotations

import copy
import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs.py")
_spec = importlib.util.spec_from_file_location("validation_configs", _path)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)           # validation/configs.py (the model shapes)
GQA_TINY, MIXTRAL_TINY, _llama, _mixtral = _base.GQA_TINY, _base.MIXTRAL_TINY, _base._llama, _base._mixtral

MODELS = {
    "gqa-tiny": ("llama-gqa", GQA_TINY),                                   # h 256, L 4, V 32,000
    "gqa-tiny-tied": ("llama-gqa", _llama(256, 688, 4, 8, 2, 32000, tie=True)),
    "gqa-wide": ("llama-gqa", _llama(512, 1376, 6, 8, 4, 8000)),           # h 512, L 6, V 8,000
    "mixtral-tiny": ("mixtral", MIXTRAL_TINY),                             # h 256, L 4, 8 experts, V 32,000
    "mixtral-wide": ("mixtral", _mixtral(384, 768, 4, 8, 2, 8000, experts=4)),   # h 384, L 4, 4 experts, V 8,000
}


def _cfg(model, *, regime="fp32", optimizer="adamw", impl="foreach", loss="cross_entropy", chunks=None,
         checkpointing="none", policy_options=None, offload=None, b=1, s=128):
    family, base = MODELS[model]
    hf = copy.deepcopy(base)
    hf["use_cache"] = False
    hf["attention_dropout"] = 0.0
    opt_tag = {"adamw": "adamw", "adamw-8bit-bnb": "bnb8", "adamw-32bit-bnb": "bnb32"}[optimizer]
    tag = "-".join(x for x in (
        "oib", model, regime, opt_tag, impl if optimizer == "adamw" else None,
        None if loss == "cross_entropy" else f"chunked{chunks}", None if checkpointing == "none" else checkpointing,
        offload, f"b{b}s{s}") if x)
    solve = {"optimizer_in_backward": True}
    if loss != "cross_entropy":
        solve.update(loss=loss, loss_chunks=chunks)
    if offload:
        solve["activation_offload"] = offload
    return {"id": tag, "family": family, "model": model, "hf_config": hf, "batch_size": b, "seq_len": s,
            "regime": regime, "optimizer": optimizer, "optimizer_impl": impl, "checkpointing": checkpointing,
            "attention": "sdpa", "dropout": 0.0, "method": "real", "sweep": None,
            "technique": "optimizer_in_backward", "loss": loss, "loss_chunks": chunks, "offload": offload,
            "policy_options": dict(policy_options or {}), "solve_options": solve}


CH = dict(loss="chunked", chunks=8)
CONFIGS = [
    # torchtune's chunked cross-entropy (8 chunks), the LM head's hook after every chunk's partial
    _cfg("gqa-tiny", **CH),
    _cfg("gqa-tiny", regime="bf16", **CH, b=2, s=256),
    _cfg("gqa-wide", regime="bf16", **CH),
    _cfg("mixtral-tiny", regime="bf16", **CH),
    _cfg("mixtral-wide", **CH),
    _cfg("gqa-tiny", impl="for-loop", **CH),
    # AMP: the LM head's step (fp32 gradient + fp32 temporary) outgrows the bf16 partials' sum
    _cfg("gqa-tiny", regime="amp-bf16", **CH),
    _cfg("mixtral-wide", regime="amp-bf16", **CH),
    _cfg("gqa-tiny", regime="amp-bf16"),
    # bitsandbytes AdamW8bit, one optimizer per parameter
    _cfg("gqa-tiny", optimizer="adamw-8bit-bnb"),
    _cfg("gqa-wide", regime="bf16", optimizer="adamw-8bit-bnb"),
    _cfg("mixtral-tiny", regime="bf16", optimizer="adamw-8bit-bnb"),
    _cfg("mixtral-wide", optimizer="adamw-8bit-bnb"),
    # torchtune's ladder: chunked + full AC + optimizer in backward (+ 8-bit AdamW), tied embeddings
    _cfg("gqa-tiny", regime="bf16", optimizer="adamw-8bit-bnb", checkpointing="full", **CH),
    _cfg("mixtral-tiny", regime="bf16", optimizer="adamw-8bit-bnb", checkpointing="full", **CH),
    _cfg("gqa-tiny-tied", regime="bf16"),
    _cfg("gqa-tiny-tied", regime="bf16", **CH),
    _cfg("gqa-tiny-tied", regime="bf16", checkpointing="full", **CH),
    _cfg("gqa-tiny-tied", regime="bf16", optimizer="adamw-8bit-bnb", checkpointing="full", **CH),
    # bitsandbytes' 32-bit AdamW (torchtune's bitsandbytes.optim.PagedAdamW in llama2/7B_full_low_memory.yaml: the
    # same fp32 states; paging needs CUDA), one optimizer per parameter (FP8READ)
    _cfg("gqa-tiny", optimizer="adamw-32bit-bnb"),
    _cfg("gqa-wide", regime="bf16", optimizer="adamw-32bit-bnb"),
    _cfg("mixtral-tiny", regime="bf16", optimizer="adamw-32bit-bnb"),
    _cfg("gqa-tiny", regime="bf16", optimizer="adamw-32bit-bnb", checkpointing="full", **CH),
    # activation offloading (save_on_cpu around the base model, as torchtune places it)
    _cfg("gqa-tiny", offload="save_on_cpu"),
    _cfg("mixtral-tiny", offload="save_on_cpu"),
    _cfg("gqa-tiny", regime="bf16", checkpointing="full", offload="save_on_cpu", **CH),
    # the checkpointing policies
    _cfg("gqa-tiny", checkpointing="op-sac"),
    _cfg("gqa-wide", checkpointing="every-k", policy_options={"k": 2}),
    _cfg("mixtral-tiny", checkpointing="mlp-only"),
    _cfg("mixtral-wide", checkpointing="attention-only"),
    _cfg("gqa-tiny", checkpointing="save-list", policy_options={"ops": ["mm", "sdpa"]}),
]
