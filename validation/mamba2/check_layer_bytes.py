#!/usr/bin/env python
"""Check ``layer_bytes.py`` (the plugin's closed forms) against ``measurements.json``. No torch needed.

    python3 validation/mamba2/check_layer_bytes.py [--parts ID]

For every measured run: each decoder layer's ``layer_forward_retained_bytes`` against ``saved + output``
of the formula; the model's and every layer's parameter count; and the activations alive at the end of
the forward against the sum over layers (``saved``, plus ``output`` where the next layer saves it) plus
the model-level terms mlsysim already models for Llama-style models (embedding output saved by the first
norm in fp32, RoPE cos/sin at Bamba's half rotary dim, final norm 8Th + 4T, fp32 log-softmax 4TV,
int64 shifted labels 8T). Exits 1 on any per-layer or parameter mismatch. ``--parts ID`` prints the
named parts of each layer kind for one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LB_PATH = os.path.join(ROOT, "examples", "plugins", "mlsysim-mamba2-hybrid", "src", "mlsysim_mamba2", "layer_bytes.py")


def load_layer_bytes():
    spec = importlib.util.spec_from_file_location("mamba2_layer_bytes", LB_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measurements", default=os.path.join(HERE, "measurements.json"))
    ap.add_argument("--parts", metavar="ID")
    args = ap.parse_args(argv)
    lb = load_layer_bytes()
    doc = json.load(open(args.measurements))
    bad = 0
    print(f"{'run':36s} {'kind':9s} {'measured':>12s} {'formula':>12s} {'diff':>6s}")
    for r in doc["runs"]:
        m = r.get("measured")
        if m is None:
            print(f"{r['id']}: error {r.get('error')}")
            bad += 1
            continue
        shape = lb.bamba_shape(r["hf_config"])
        c = 4 if r["regime"] == "fp32" else 2
        b, s = r["batch_size"], r["seq_len"]
        T = b * s
        layers = lb.bamba_layer_bytes(shape, batch=b, seq_len=s, compute_bytes=c, residual_bytes=c,
                                      attention=r["attention"])
        seen = set()
        for i, (got, want, kind) in enumerate(zip(m["layer_forward_retained_bytes"], layers, shape.layer_types)):
            ok = got == want.retained
            bad += not ok
            if kind not in seen or not ok:
                print(f"{r['id']:36s} {kind:9s} {got:12,d} {want.retained:12,d} {got - want.retained:+6d}"
                      + ("" if ok else f"  MISMATCH layer {i}"))
            seen.add(kind)
        # parameters
        P = lb.bamba_parameters(shape)
        per_layer = [lb.mamba2_layer_parameters(hidden=shape.hidden, d_inner=shape.d_inner, n_heads=shape.n_heads,
                                                d_state=shape.d_state, n_groups=shape.n_groups,
                                                conv_kernel=shape.conv_kernel, ffn=shape.ffn,
                                                proj_bias=shape.proj_bias, conv_bias=shape.conv_bias,
                                                mlp_bias=shape.mlp_bias)
                     if k == "mamba" else
                     lb.attention_layer_parameters(hidden=shape.hidden, heads=shape.heads, kv_heads=shape.kv_heads,
                                                   head_dim=shape.head_dim, ffn=shape.ffn,
                                                   attention_bias=shape.attention_bias, mlp_bias=shape.mlp_bias)
                     for k in shape.layer_types]
        if P != m["parameters"] or per_layer != m["layer_parameters"]:
            print(f"{r['id']}: parameters {m['parameters']} vs {P}, per layer {m['layer_parameters']} vs {per_layer}")
            bad += 1
        if [{"linear_attention": "mamba", "full_attention": "attention"}[t] for t in m["layer_types"]] \
                != list(shape.layer_types):
            print(f"{r['id']}: layer types {m['layer_types']} vs {shape.layer_types}")
            bad += 1
        # activations alive at the end of the forward
        layers_alive = sum(x.saved + (x.output if x.output_saved_by_next else 0) for x in layers)
        model_level = ((4 * T * shape.hidden if c == 4 else 0) + lb.rope_table_bytes(shape, seq_len=s, compute_bytes=c)
                       + (8 * shape.hidden + 4) * T + 4 * T * shape.vocab + 8 * T)
        act = m["alive"]["end_of_forward"]["by_category"]["activation"]
        r["_eof"] = (act, layers_alive + model_level)
    print()
    print(f"{'run':36s} {'end-of-forward activations':>28s} {'layers + model terms':>21s} {'diff':>5s}")
    for r in doc["runs"]:
        if "_eof" in r:
            act, est = r["_eof"]
            print(f"{r['id']:36s} {act:28,d} {est:21,d} {act - est:+5d}")
    if args.parts:
        r = {x["id"]: x for x in doc["runs"]}[args.parts]
        shape = lb.bamba_shape(r["hf_config"])
        c = 4 if r["regime"] == "fp32" else 2
        for kind, x in zip(shape.layer_types, lb.bamba_layer_bytes(
                shape, batch=r["batch_size"], seq_len=r["seq_len"], compute_bytes=c, residual_bytes=c,
                attention=r["attention"])):
            print(f"\n{args.parts}: {kind} layer")
            for name, nbytes in x.parts:
                print(f"  {nbytes:12,d}  {name}")
            by_next = "saved" if x.output_saved_by_next else "not saved"
            print(f"  {x.output:12,d}  layer output ({by_next} by the next layer)")
            print(f"  {x.retained:12,d}  retained (saved + output)")
            if kind == "mamba":
                break
    print(f"\n{'OK' if not bad else f'{bad} mismatches'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
