#!/usr/bin/env python
"""TRL's chunked NLL (``loss_type="chunked_nll"``, SFTTrainer's default) under autocast and under LoRA/QLoRA, measured
with TRL's own code.

    PYTHONPATH=/tmp/peft0212 nice -n 10 /tmp/tvenv/bin/python validation/trl_loss/measure.py [--only ID ...]
    # writes validation/trl_loss/measurements.json; /tmp/tvenv: torch==2.13.0 (CPU), transformers==5.23.0,
    # bitsandbytes==0.50.2, trl==1.10.0 (pip install --no-deps trl==1.10.0), peft==0.21.2 (/tmp/peft0212)
    python validation/trl_loss/measure.py --report     # the project's environment, no torch: the measured
    # profile's loss='trl_chunked_nll' against them, every phase

TRL 1.10.0 is the release nearest huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8 (1.10.0.dev0), the
commit published_losses.py cites: trl/trainer/sft_trainer.py lines 87-235 (``_chunk``, ``_chunked_cross_entropy_loss``)
are the same at both. Each run is the harness's (validation/harness.py: MemTracker, three iterations, the third
measured; AdamW foreach) on a random-weight Hugging Face Llama whose ``forward`` is patched as SFTTrainer patches it
(``trl.trainer.sft_trainer._patch_chunked_ce_lm_head(model, chunk_size=256)``, sft_trainer.py line 1319: under peft
the inner causal LM, ``model.get_base_model()``), then called as the Trainer calls it, ``model(input_ids=...,
labels=...)``: the decoder, then TRL's ``_chunked_cross_entropy_loss`` on its last hidden state and
``lm_head.weight``. ``share`` runs set the first half of each sequence's labels to -100 (a prompt masked out, as
SFT's completion-only loss does); solved with ``loss_token_share=0.5``.

* Full fine-tuning under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (``amp-bf16``: fp32 weights, TRL's
  default: the model loaded in float32, ``bf16=True``).
* LoRA (peft 0.21.2 ``get_peft_model``, measure_lora.py's build: fp32 adapters, ``autocast_adapter_dtype=True``)
  over a bf16 base (``bf16``) or an fp32 base under autocast (``amp-bf16``), q/v or all-linear (peft's all-linear
  leaves the LM head out: frozen, no gradient), and QLoRA (bitsandbytes nf4 on the CPU; the LM head is not
  quantized by transformers' BitsAndBytesConfig).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, VALIDATION)
sys.path.insert(0, os.path.join(VALIDATION, "families"))

PATH = os.path.join(HERE, "measurements.json")
TRL = "huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8 (= trl 1.10.0) trl/trainer/sft_trainer.py"
CHUNK = 256
IGNORE = -100
GENERATOR = "PYTHONPATH=/tmp/peft0212 /tmp/tvenv/bin/python validation/trl_loss/measure.py"
ENVIRONMENT = ("/tmp/tvenv: torch==2.13.0 (CPU), transformers==5.23.0, bitsandbytes==0.50.2; pip install --no-deps "
               "trl==1.10.0; peft==0.21.2 on PYTHONPATH (pip install --no-deps --target /tmp/peft0212 peft==0.21.2)")


def _full(model, b, s, regime, share=None, checkpointing="none"):
    from configs import _cfg
    cfg = _cfg(f"trl-full-{model}-{regime}" + ("-ckpt" if checkpointing == "full" else "") + f"-b{b}-s{s}"
               + ("-share50" if share else ""), model, b, s, regime=regime, checkpointing=checkpointing)
    cfg.update(loss="trl_chunked_nll", share=share,
               solve_options={"loss": "trl_chunked_nll", **({"loss_token_share": share} if share else {})})
    return cfg


def _lora(model, b, s, regime, targets, rank=8, quantization=None, share=None, ckpt=None):
    import measure_lora
    t = "qv" if targets == ["q_proj", "v_proj"] else "all"
    kind = f"q{quantization}" if quantization else "lora"
    # ckpt: the Trainer's gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # after get_peft_model ("nr"), and with TRL's own model.enable_input_require_grads() (sft_trainer.py line 1133,
    # whenever peft and gradient_checkpointing: "nr-eirg")
    cfg = measure_lora._cfg(f"trl-{kind}-{model}-{regime}-r{rank}-{t}" + (f"-ckpt-{ckpt}" if ckpt else "")
                            + f"-b{b}-s{s}" + ("-share50" if share else ""),
                            model, b, s, rank=rank, targets=targets, regime=regime, quantization=quantization,
                            double_quant=bool(quantization), checkpointing="full" if ckpt else "none",
                            gc_kwargs={"use_reentrant": False} if ckpt else None)
    if ckpt == "nr-eirg":
        cfg["enable_input_require_grads"] = True
    cfg.update(loss="trl_chunked_nll", share=share,
               solve_options={"loss": "trl_chunked_nll", "lora": cfg["lora"],
                              **({"loss_token_share": share} if share else {})})
    return cfg


QV = ["q_proj", "v_proj"]
ALL = "all-linear"
# h = 384 against TRL's 256-token chunks and V = 16,000: t x V, V x h and t x h all differ (gqa-tiny's h = t = 256)
H384 = dict(hidden=384, ffn=1024, layers=2, heads=6, kv=2, vocab=16000)
V8K = dict(hidden=320, ffn=864, layers=2, heads=5, kv=1, vocab=8000)


def _register():
    import configs as base
    import measure_lora
    spec = ("llama-gqa", base._llama(*H384.values()))
    base.MODELS.setdefault("gqa-h384", spec)
    measure_lora.MODELS.setdefault("gqa-h384", spec)
    v8k = ("llama-gqa", base._llama(*V8K.values()))       # T = 2048: eight chunks, V = 8,000
    base.MODELS.setdefault("gqa-v8k", v8k)
    measure_lora.MODELS.setdefault("gqa-v8k", v8k)


def configs():
    _register()
    return [
        _full("gqa-tiny", 2, 256, "amp-bf16"),
        _full("gqa-tiny", 2, 256, "amp-bf16", share=0.5),
        _full("llama-tiny", 2, 512, "amp-bf16"),
        _full("gqa-tiny", 1, 1024, "amp-bf16"),
        _lora("gqa-tiny", 2, 256, "bf16", QV),
        _lora("gqa-tiny", 2, 256, "bf16", ALL, rank=16),
        _lora("gqa-tiny", 2, 256, "bf16", QV, share=0.5),
        _lora("llama-tiny", 2, 512, "bf16", ALL, rank=16),
        _lora("gqa-tiny", 2, 256, "amp-bf16", QV),
        _lora("llama-tiny", 2, 512, "amp-bf16", ALL, rank=16),
        _lora("gqa-tiny", 2, 256, "fp32", QV),
        _lora("gqa-tiny", 2, 256, "bf16", ALL, rank=16, quantization="nf4"),
        _lora("llama-tiny", 2, 512, "bf16", QV, quantization="nf4"),
        _full("gqa-h384", 2, 256, "amp-bf16"),
        _full("gqa-h384", 1, 1024, "amp-bf16"),
        _lora("gqa-h384", 2, 256, "bf16", ALL, rank=16),
        _lora("gqa-h384", 2, 256, "amp-bf16", QV),
        _lora("gqa-h384", 2, 384, "fp32", QV),
        _lora("gqa-h384", 2, 256, "bf16", QV, quantization="nf4"),
        _full("gqa-v8k", 1, 2048, "amp-bf16"),
        _lora("gqa-v8k", 1, 2048, "bf16", ALL, rank=16),
        _full("gqa-h384", 2, 256, "amp-bf16", checkpointing="full"),
    ]
# Not in CONFIGS (measured once, 2026-12-08: --only after adding them): QLoRA nf4 with the Trainer's non-reentrant
# checkpointing, with and without TRL's enable_input_require_grads (the same bytes): every phase 1.57 MB low, the
# optimizer step's too (-8.1 %), i.e. outside the loss (3 x h x ffn x 2 B: one layer's MLP weights in bf16), the
# checkpointed QLoRA terms' (lora.py, validation/measure_lora.py --checkpointed)
CKPT_QLORA = ("_lora('gqa-h384', 2, 256, 'bf16', QV, quantization='nf4', ckpt='nr' | 'nr-eirg')",)


# --- measuring (torch) -------------------------------------------------------------------------------------------

def _masked(labels, share):
    if not share:
        return labels
    labels = labels.clone()
    labels[:, : labels.shape[1] // 2] = IGNORE          # the prompt's half ignored
    return labels


class _Step:
    """What the protocol calls: the patched model, with the run's labels (the prompt masked for ``share``)."""

    def __init__(self, model, share):
        self.model, self.share = model, share

    def __call__(self, input_ids, labels, use_cache=False):
        return self.model(input_ids=input_ids, labels=_masked(labels, self.share), use_cache=use_cache)


def measure(cfg: dict) -> dict:
    import harness
    from trl.trainer.sft_trainer import _patch_chunked_ce_lm_head
    if "lora" in cfg:
        # peft 0.21.2 refuses torchao < 0.16 when it finds one (is_torchao_available raises): no torchao layer is
        # used here, so the installed torchao 0.13.0 is hidden from it (find_spec returns None for a None module)
        sys.modules.setdefault("torchao", None)
        import measure_lora

        def step(model):
            if cfg.get("enable_input_require_grads"):
                model.enable_input_require_grads()
            _patch_chunked_ce_lm_head(model.get_base_model(), chunk_size=CHUNK)
            return _Step(model, cfg["share"])
        return measure_lora.measure(cfg, step=step)
    import time
    from harness import peak_record, run_protocol
    with harness.training_run(cfg, prepare=lambda m: _patch_chunked_ce_lm_head(m, chunk_size=CHUNK)) as run:
        alive, _ = run_protocol(run.mt, _Step(run.model, cfg["share"]), run.optimizer, run.input_ids,
                                autocast=harness.autocast_for(cfg))
        return {**peak_record(run.mt), "alive": alive,
                "parameters": int(sum(p.numel() for p in run.model.parameters())),
                "parameter_dtype": str(next(run.model.parameters()).dtype).replace("torch.", ""),
                "wall_s": round(time.perf_counter() - run.t0, 1)}


def _versions() -> dict:
    import bitsandbytes
    import peft
    import torch
    import transformers
    import trl
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "bitsandbytes": bitsandbytes.__version__, "trl": trl.__version__}


def document(args, runs, ctx) -> dict:
    kept = {k: ctx.previous[k] for k in ("checkpointed_qlora_runs",) if k in (ctx.previous or {})}    # CKPT_QLORA
    return {"generator": GENERATOR, "environment": ENVIRONMENT, "source": TRL, **_versions(), "device": "cpu",
            "runs": runs, **kept}


# --- the comparison (no torch) -----------------------------------------------------------------------------------

def solve(run: dict, **changes):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    from report import REFERENCE_PRECISION
    model = from_hf_config(run["hf_config"], name=run["id"])
    big = HardwareNode(name="unbounded", memory_capacity=2**60)
    options = dict(regime=run["regime"], optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                   device="cpu", dropout=0.0, runtime_overheads=False, **run["solve_options"])
    options.update(changes)
    return TrainingMemoryModel().solve(model, big, run["batch_size"], run["seq_len"],
                                       REFERENCE_PRECISION[run["regime"]], run["optimizer"], run["checkpointing"],
                                       profile="measured", **options)


PHASES = ("forward", "backward", "optimizer")


def compare(path: str = PATH) -> list[dict]:
    """Per run: the prediction's error per phase (the backward: the larger of the backward and its end), against
    MemTracker's peak per phase plus bitsandbytes' QuantState tensors (alive, unseen by the tracker)."""
    import json

    from mlsysim_core.errors import NotModelledError
    from report_families import predicted_phases
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    rows = []
    for run in runs:
        m = run["measured"]
        q = m.get("quant_state_bytes", 0)
        try:
            result = solve(run)
        except NotModelledError as e:
            rows.append({"run": run, "refused": e})
            continue
        pred = predicted_phases(result)
        meas = {p: m["peak_by_phase"][p]["bytes"] + q for p in PHASES}
        rows.append({"run": run, "result": result, "predicted": pred, "measured": meas,
                     "errors": {p: (pred[p] - meas[p]) / meas[p] for p in PHASES},
                     "delta": {p: pred[p] - meas[p] for p in PHASES}})
    return rows


def table(path: str = PATH) -> str:
    out = ["| run | measured peak MiB (phase) | forward | backward | optimizer step |", "|---|---:|---:|---:|---:|"]
    for row in compare(path):
        m = row["run"]["measured"]
        head = f"| {row['run']['id']} | {m['peak_bytes'] / 2**20:.2f} ({m['peak_phase']}) |"
        if "refused" in row:
            out.append(f"{head} refused: `{row['refused'].parameter}` | | |")
            continue
        out.append(head + " " + " | ".join(f"{100 * row['errors'][p]:+.2f} %" for p in PHASES) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    import harness
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=configs(), measure_run=measure,
                 document=document, out=PATH, versions=_versions, summary=harness.mib_summary(9, 2, wall=5),
                 incremental=True, keep_previous="always", threads=2,
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<46} {msg}")
    return 0


if __name__ == "__main__":
    if "--report" in sys.argv:
        print(table())
        raise SystemExit(0)
    raise SystemExit(main())
