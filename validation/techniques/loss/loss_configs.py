"""Loss-technique runs (issue 16, item 2): Hugging Face's cross-entropy (today's numbers),
torchtune's chunked cross-entropy and Liger's fused linear cross-entropy, on a Llama-style
dense model and a Mixtral-style MoE model, each at two sizes, in fp32, bf16 and AMP.

Same schema as ``validation/configs.py`` plus ``loss`` (cross_entropy | chunked |
fused_linear) and ``loss_chunks`` (chunked only) and ``solve_options`` (the keywords the
prediction is solved with).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # validation/

from configs import MODELS as _BASE, _cfg, _mixtral  # noqa: E402

# A second MoE size (wider, 4 KV heads, 48k vocabulary: the loss's share differs from mixtral-tiny's).
MIXTRAL_TINY2 = _mixtral(384, 768, 4, 8, 4, 48000)
_BASE.setdefault("mixtral-tiny2", ("mixtral", MIXTRAL_TINY2))


def _run(model, b, s, regime, loss, chunks=None, checkpointing="none"):
    tag = {"cross_entropy": "ce", "chunked": f"chunked{chunks}", "fused_linear": "fused"}[loss]
    cfg = _cfg(f"loss-{model}-b{b}-s{s}-{regime}-{tag}" + ("-ckpt" if checkpointing == "full" else ""),
               model, b, s, regime=regime, checkpointing=checkpointing)
    cfg["loss"] = loss
    cfg["loss_chunks"] = chunks
    opts = {} if loss == "cross_entropy" else {"loss": loss}
    if chunks is not None:
        opts["loss_chunks"] = chunks
    cfg["solve_options"] = opts
    return cfg


CONFIGS = [_run("gqa-tiny", 2, 256, "fp32", "cross_entropy"), _run("gqa-tiny", 2, 256, "bf16", "cross_entropy")]
for model, b, s, regime in (("gqa-tiny", 2, 256, "fp32"), ("gqa-tiny", 2, 256, "bf16"), ("gqa-tiny", 2, 256, "amp-bf16"),
                            ("llama-small", 2, 512, "bf16"), ("mixtral-tiny", 2, 256, "bf16"),
                            ("mixtral-tiny2", 2, 256, "amp-bf16")):
    CONFIGS.append(_run(model, b, s, regime, "chunked", 8))
    CONFIGS.append(_run(model, b, s, regime, "fused_linear"))
CONFIGS += [_run("gqa-tiny", 2, 256, "bf16", "chunked", 4),
            _run("gqa-tiny", 2, 256, "bf16", "chunked", 8, checkpointing="full")]
