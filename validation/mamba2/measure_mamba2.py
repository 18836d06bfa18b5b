#!/usr/bin/env python
"""Measure training iterations of a small Mamba-2 hybrid (transformers' ``bamba``) with PyTorch's tracker.

    /tmp/m2venv/bin/python validation/mamba2/measure_mamba2.py --out validation/mamba2/measurements.json [--only ID ...]

Needs ``torch==2.13.0`` (CPU build) and ``transformers==5.23.0`` (``validation/requirements.txt``). It reuses
``validation/harness.py`` (imported, not copied): its ``PhaseMemTracker``, optimizer builder, three-iteration
protocol (two warm-ups, then the tracker is re-entered and iteration 3 is measured), peak record, per-layer
forward deltas and command line. Only what ``harness.measure`` cannot do for this family is here: Bamba's final norm is
``model.model.final_layernorm`` (``harness._submodules`` looks for ``norm`` / ``ln_f``); every run also
records which decoder layers are Mamba-2 mixers and which are attention (``layer_types``), each layer's
parameter count (``layer_parameters``), and the peak while each decoder layer's backward is active
(``layer_backward_peaks``: bytes, split and op at that peak, and the layer's ``Pre-Backward`` total and split).

Every model is built from its config with random weights (nothing is downloaded), on real CPU tensors. The
mixer runs transformers' pure-torch path (``mamba_ssm`` / ``causal_conv1d`` are not installed, so
``mamba2_chunk_scan`` / ``causal_conv1d_fn`` fall back to their reference PyTorch implementations in
``transformers/models/bamba/modeling_bamba.py``): the same path runs on any device without those kernels.
"""

from __future__ import annotations

import copy
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))          # validation/: harness.py

import harness as M  # noqa: E402  (torch, transformers, the tracker, the protocol and the HF patches)

GENERATOR = "/tmp/m2venv/bin/python validation/mamba2/measure_mamba2.py --out validation/mamba2/measurements.json"
ENVIRONMENT = "python3 -m venv /tmp/m2venv && /tmp/m2venv/bin/pip install -r validation/requirements.txt"

# --------------------------------------------------------------------------- configurations
# A 4-layer Bamba: layers 0, 1, 3 are Mamba-2 mixer layers ("linear_attention"), layer 2 is attention
# ("full_attention", GQA 8/2 heads). Every layer has the SwiGLU MLP. The dimensions are chosen pairwise
# distinct where they enter the formulas (head_dim 64, d_state 48, chunk 32, n_heads 8, n_groups 2,
# d_inner 512, conv_dim 704, in_proj width 1224, MLP 640), so that every term can be told apart.
BAMBA_TINY = dict(
    model_type="bamba", vocab_size=2048, hidden_size=256, intermediate_size=640, num_hidden_layers=4,
    attn_layer_indices=[2], num_attention_heads=8, num_key_value_heads=2, hidden_act="silu",
    max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
    mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=2, mamba_d_state=48, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=32, mamba_conv_bias=True, mamba_proj_bias=False, attention_bias=False, mlp_bias=False,
    attention_dropout=0.0, use_cache=False,
)
# A second shape, to vary what the first keeps fixed: one group, 16 mamba heads of 32, d_state 64, conv
# kernel 3, chunk 16; attention layers at 1 and 3 (MHA, 4 heads of 64: rotary dim 32).
BAMBA_G1 = dict(
    BAMBA_TINY, attn_layer_indices=[1, 3], num_attention_heads=4, num_key_value_heads=4,
    mamba_n_heads=16, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=64, mamba_d_conv=3, mamba_chunk_size=16,
)
SHAPES = {"bamba-tiny": BAMBA_TINY, "bamba-g1": BAMBA_G1}


def _cfg(regime, b, s, *, attention="sdpa", chunk=None, model="bamba-tiny"):
    hf = copy.deepcopy(SHAPES[model])
    default_chunk = hf["mamba_chunk_size"]
    hf["mamba_chunk_size"] = chunk = chunk or default_chunk
    cid = f"{model}-{regime}-b{b}-s{s}" + (f"-q{chunk}" if chunk != default_chunk else "") + \
          (f"-{attention}" if attention != "sdpa" else "")
    return dict(id=cid, family="bamba", model=model, hf_config=hf, batch_size=b, seq_len=s,
                regime=regime, optimizer="adamw", optimizer_impl="foreach", checkpointing="none",
                attention=attention, dropout=0.0, method="real", sweep=None)


CONFIGS = (
    # the grid: 2 regimes x micro-batch 1, 2 x sequence 64, 128 (2 and 4 chunks of 32)
    [_cfg(r, b, s) for r in ("fp32", "bf16") for b in (1, 2) for s in (64, 128)]
    # sequence not a multiple of the chunk (the scan pads to 3 chunks of 32 / 2 chunks of 64)
    + [_cfg("fp32", 2, 80), _cfg("bf16", 1, 96, chunk=64)]
    # another chunk size at the same tokens (s = 128: 2 chunks of 64)
    + [_cfg("fp32", 1, 128, chunk=64)]
    # eager attention in the attention layer
    + [_cfg("fp32", 1, 128, attention="eager"), _cfg("bf16", 2, 64, attention="eager")]
    # activation-bound: the iteration's peak is in the backward
    + [_cfg("fp32", 2, 256), _cfg("bf16", 4, 256)]
    # the second shape (4 chunks of 16; 100 tokens padded to 7 chunks of 16)
    + [_cfg("fp32", 2, 64, model="bamba-g1"), _cfg("bf16", 1, 100, model="bamba-g1")]
)


# --------------------------------------------------------------------------- tracker
class LayerBackwardTracker(M.PhaseMemTracker):
    """``measure.PhaseMemTracker`` that also records, for every decoder layer, the peak (total, split, op) of
    the ops run while that layer's backward is active (ModTracker's ``parents``: from the first gradient of
    the layer's output to the last gradient of its input). Subtracting the layer's ``Pre-Backward`` total
    gives what its backward adds on top of what was alive when it began (its parameters' gradients and the
    backward's temporaries)."""

    def __init__(self, layer_names: list[str]) -> None:
        super().__init__()
        self._layer_names = layer_names
        self.layer_bw: dict[int, dict] = {}

    def reset_phase_stats(self) -> None:
        super().reset_phase_stats()
        self.layer_bw = {}

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        if self.phase != "backward" or not self._mod_tracker.is_bw:
            return
        parents = self._mod_tracker.parents
        for i, name in enumerate(self._layer_names):
            if name in parents:
                for dev, snap in self._curr_mem_snap.items():
                    rec = self.layer_bw.get(i)
                    if rec is None or rec["bytes"] < snap[M.TOTAL]:
                        self.layer_bw[i] = {"bytes": int(snap[M.TOTAL]), "by_category": M._cats(snap),
                                            "op": str(self._func)}
                break


def layer_backward_peaks(mt: LayerBackwardTracker, layers) -> list:
    out = []
    for i, layer in enumerate(layers):
        rec = mt.layer_bw.get(i)
        snaps = mt.memory_tracking[layer].snapshots.get(M._ModState.PRE_BW) if layer in mt.memory_tracking else None
        if rec is None or not snaps:
            out.append(None)
            continue
        pre = M._one_device(snaps[0])
        out.append({**rec, "pre_backward_bytes": int(pre[M.TOTAL]), "pre_backward_by_category": M._cats(pre)})
    return out


# --------------------------------------------------------------------------- one configuration
def _submodules(model):
    base = model.model
    named = {"embedding": model.get_input_embeddings(), "final_norm": base.final_layernorm,
             "lm_head": model.get_output_embeddings()}
    return list(base.layers), named


def measure(cfg: dict) -> dict:
    if cfg["method"] != "real" or cfg["regime"] not in ("fp32", "bf16") or cfg["checkpointing"] != "none":
        raise ValueError("this harness measures real fp32 / pure-bf16 runs without checkpointing only")

    def tracker():
        return LayerBackwardTracker([f"{type(run_model[0]).__name__}.model.layers.{i}" for i in range(len(layers))])

    run_model, layers = [], []

    def prepare(model):
        run_model.append(model)
        layers.extend(model.model.layers)

    with M.training_run(cfg, prepare=prepare, tracker=tracker) as run:
        model, mt = run.model, run.mt
        layers, named = _submodules(model)
        alive, t_measured = M.run_protocol(mt, model, run.optimizer, run.input_ids)
        t_end = time.perf_counter()
        return {
            **M.peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": M.layer_forward_deltas(mt, layers),
            "layer_backward_peaks": layer_backward_peaks(mt, layers),
            "layer_types": [layer.block_type for layer in layers],
            "module_snapshots": {name: M._mod_totals(mt, m) for name, m in named.items() if m is not None},
            **M.parameter_facts(model, run.params),
            "layer_parameters": [int(sum(p.numel() for p in layer.parameters())) for layer in layers],
            "attn_implementation": model.config._attn_implementation,
            "experts_implementation": None,
            "wall_s": round(t_end - run.t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }


# --------------------------------------------------------------------------- main
def document(args, runs, ctx) -> dict:
    return {"generator": GENERATOR, "environment": ENVIRONMENT, "python": platform.python_version(),
            **M._versions(), "device": "cpu", "threads": M.torch.get_num_threads(),
            "total_wall_s": None if args.only else round(ctx.elapsed, 1), "runs": runs}


def main(argv=None) -> int:
    M.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure, document=document,
           summary=M.mib_summary(8, 2), line=lambda n, t, c, msg: f"[{n:3d}/{t}] {c['id']:<36} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
