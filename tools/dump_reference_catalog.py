"""Dump the catalog data files from the reference registry of ``mlsysim==0.3.0``.

Writes ``mlsysim_core/catalog/models.json`` (every ``Models.Language.*`` entry) and
``mlsysim_core/catalog/hardware.json`` (every ``Hardware.Cloud.*`` and
``Hardware.Workstation.*`` entry) with exactly the reference's numbers
(parameter counts as ints, capacities and bandwidths in exact int bytes).
Architecture details the reference registry lacks are added from the models'
public HF ``config.json`` / papers (curated below, each named in ``sources``).

The project never depends on mlsysim; run from a scratch virtualenv:

    python3 -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install mlsysim==0.3.0
    /tmp/refvenv/bin/python tools/dump_reference_catalog.py            # writes into mlsysim_core/catalog/
    /tmp/refvenv/bin/python tools/dump_reference_catalog.py OUT_DIR    # or elsewhere

Every entry is keyed in the ``mlsysim:`` namespace (``mlsysim:llama3-8b``). Where a
curated entry describes the same model or accelerator (``COUNTERPARTS`` below: same shapes,
same memory), the reference entry's aliases and display name are namespaced too and it
records ``curated_counterpart``; the short names (``llama3-8b``, ``h100``) are aliases of
the curated entry (``curated_models.json``, ``curated_hardware.json``, kept by hand). A
reference entry without a counterpart keeps its short names as aliases (``bert-base``).

Output is deterministic. The script validates both files (unique keys and
aliases across entries, integer fields) before writing them.
"""
from __future__ import annotations

import json
import sys
import warnings
from fractions import Fraction
from pathlib import Path

warnings.filterwarnings("ignore")

REF = "mlsysim 0.3.0 registry"
NAMESPACE = "mlsysim:"

# Reference key -> the curated entry that describes the same model (layers, hidden size,
# heads checked equal; only the counts differ: textbook round numbers vs exact) or the same
# accelerator (memory capacity equal). The tests check both.
COUNTERPARTS = {
    "deepseek-v3": "deepseek-ai/deepseek-v3",
    "gpt2": "openai-community/gpt2-xl",
    "gpt2-small": "openai-community/gpt2",
    "gpt3": "openai/gpt-3-175b",
    "llama2-7b": "meta-llama/llama-2-7b-hf",
    "llama2-13b": "meta-llama/llama-2-13b-hf",
    "llama2-70b": "meta-llama/llama-2-70b-hf",
    "llama3-8b": "meta-llama/llama-3.1-8b",
    "llama3-70b": "meta-llama/llama-3.1-70b",
    "llama3-405b": "meta-llama/llama-3.1-405b",
    "mixtral-8x7b": "mistralai/mixtral-8x7b-v0.1",
    "a100": "nvidia/a100-sxm4-80gb",
    "a100-40gb": "nvidia/a100-sxm4-40gb",
    "b200": "nvidia/b200",
    "h100": "nvidia/h100-sxm5-80gb",
    "h100-pcie": "nvidia/h100-pcie-80gb",
    "h200": "nvidia/h200-sxm-141gb",
    "gaudi2": "intel/gaudi2",
    "gaudi3": "intel/gaudi3",
    "mi250x": "amd/mi250x",
    "mi300x": "amd/mi300x",
    "mi325x": "amd/mi325x",
    "t4": "nvidia/t4",
    "tpuv4": "google/tpu-v4",
    "tpuv5p": "google/tpu-v5p",
    "tpuv6e": "google/tpu-v6e",
    "trainium2": "aws/trainium2",
    "v100": "nvidia/v100-sxm2-32gb",
}


def namespaced(rec):
    """A dumped row in the ``mlsysim:`` namespace (see the module docstring)."""
    key, counterpart = rec["key"], COUNTERPARTS.get(rec["key"])
    out = {}
    for field, value in rec.items():
        if field == "key":
            out["key"] = NAMESPACE + key
        elif field == "aliases":
            out["aliases"] = [NAMESPACE + a for a in value] if counterpart else [key, *value]
        elif field == "name":
            out["name"] = NAMESPACE + value if counterpart else value
            if counterpart:
                out["curated_counterpart"] = counterpart
        else:
            out[field] = value
    return out


def _load_reference():
    global Hardware, Models, ureg, SparseTransformerWorkload
    from mlsysim import Hardware, Models
    from mlsysim.core.units import ureg
    from mlsysim.models.types import SparseTransformerWorkload

# --------------------------------------------------------------------- models
# key, extra aliases, curated fields {field: value}, source of curated fields, notes
MODEL_EXTRA = {
    "BERT_Base": dict(
        key="bert-base", aliases=["bert-base-uncased"],
        add=dict(kv_heads=12, vocab_size=30522, ffn_dim=3072, gated_mlp=False, tied_embeddings=True),
        src="HF config.json of google-bert/bert-base-uncased (vocab_size, intermediate_size, "
            "num_attention_heads as kv_heads (MHA), hidden_act gelu (not gated), MLM decoder tied "
            "to word embeddings)"),
    "BERT_Large": dict(
        key="bert-large", aliases=["bert-large-uncased"],
        add=dict(kv_heads=16, vocab_size=30522, ffn_dim=4096, gated_mlp=False, tied_embeddings=True,
                 context_length=512),
        src="HF config.json of google-bert/bert-large-uncased (vocab_size, intermediate_size, "
            "num_attention_heads as kv_heads (MHA), max_position_embeddings, gelu (not gated), "
            "MLM decoder tied to word embeddings)"),
    "DeepSeek_V3": dict(
        key="deepseek-v3", aliases=[],
        add=dict(vocab_size=129280, gated_mlp=True, tied_embeddings=False, context_length=163840),
        src="HF config.json of deepseek-ai/DeepSeek-V3 (vocab_size, hidden_act silu / SwiGLU, "
            "tie_word_embeddings false, max_position_embeddings)",
        notes="Reference heads=56 kept as stored; the public config.json has num_attention_heads=128. "
              "ffn_dim left null: 3 dense layers use intermediate_size 18432, the MoE layers use "
              "moe_intermediate_size 2048 per routed expert plus 1 shared expert. kv_heads null (MLA)."),
    "GPT2": dict(
        key="gpt2", aliases=["gpt2-xl", "gpt-2-xl"],
        add=dict(kv_heads=25, ffn_dim=6400, gated_mlp=False, tied_embeddings=True),
        src="HF config.json of openai-community/gpt2-xl (n_inner null -> 4*n_embd, gelu_new, "
            "tied lm_head, MHA)",
        notes="Registry GPT2 is GPT-2 XL (1.5B); the key 'gpt2' follows the reference name, "
              "whereas on HF 'gpt2' is the 124M model (here gpt2-small)."),
    "GPT2_Small": dict(
        key="gpt2-small", aliases=["gpt-2-small"],
        add=dict(kv_heads=12, ffn_dim=3072, gated_mlp=False, tied_embeddings=True, context_length=1024),
        src="HF config.json of openai-community/gpt2 (n_positions 1024, n_inner null -> 4*n_embd, "
            "gelu_new, tied lm_head, MHA)"),
    "GPT3": dict(
        key="gpt3", aliases=["gpt-3", "gpt3-175b"],
        add=dict(kv_heads=96, ffn_dim=49152, gated_mlp=False),
        src="Brown et al. (2020), Sec. 2.1 (d_ff = 4 * d_model, GPT-2-style dense MHA blocks)"),
    "GPT4": dict(key="gpt4", aliases=["gpt-4"], add={}, src=None,
                 notes="Architecture not public; registry values are estimates as stored upstream."),
    "Llama2_13B": dict(
        key="llama2-13b", aliases=["llama-2-13b"],
        add=dict(kv_heads=40, vocab_size=32000, ffn_dim=13824, gated_mlp=True, tied_embeddings=False,
                 context_length=4096),
        src="HF config.json of meta-llama/Llama-2-13b-hf"),
    "Llama2_70B": dict(
        key="llama2-70b", aliases=["llama-2-70b"],
        add=dict(vocab_size=32000, ffn_dim=28672, gated_mlp=True, tied_embeddings=False,
                 context_length=4096),
        src="HF config.json of meta-llama/Llama-2-70b-hf"),
    "Llama2_7B": dict(
        key="llama2-7b", aliases=["llama-2-7b"],
        add=dict(kv_heads=32, vocab_size=32000, ffn_dim=11008, gated_mlp=True, tied_embeddings=False,
                 context_length=4096),
        src="HF config.json of meta-llama/Llama-2-7b-hf"),
    "Llama3_405B": dict(
        key="llama3-405b", aliases=["llama3.1-405b"],
        add=dict(vocab_size=128256, ffn_dim=53248, gated_mlp=True, tied_embeddings=False,
                 context_length=131072),
        src="HF config.json of meta-llama/Llama-3.1-405B"),
    "Llama3_70B": dict(
        key="llama3-70b", aliases=["llama3.1-70b"],
        add=dict(vocab_size=128256, ffn_dim=28672, gated_mlp=True, tied_embeddings=False),
        src="HF config.json of meta-llama/Llama-3.1-70B"),
    "Llama3_8B": dict(
        key="llama3-8b", aliases=["llama3.1-8b"],
        add=dict(vocab_size=128256, ffn_dim=14336, gated_mlp=True, tied_embeddings=False),
        src="HF config.json of meta-llama/Llama-3.1-8B"),
    "Mixtral_8x7B": dict(
        key="mixtral-8x7b", aliases=["mixtral"],
        add=dict(vocab_size=32000, ffn_dim=14336, gated_mlp=True, tied_embeddings=False,
                 context_length=32768),
        src="HF config.json of mistralai/Mixtral-8x7B-v0.1 (ffn_dim = intermediate_size of one expert)"),
    "OPT_13B": dict(
        key="opt-13b", aliases=[],
        add=dict(kv_heads=40, vocab_size=50272, ffn_dim=20480, gated_mlp=False, tied_embeddings=True),
        src="HF config.json of facebook/opt-13b (vocab_size, ffn_dim, relu (not gated), "
            "tie_word_embeddings, MHA)"),
    "PaLM_540B": dict(
        key="palm-540b", aliases=["palm"],
        add=dict(gated_mlp=True, tied_embeddings=True, context_length=2048),
        src="Chowdhery et al. (2022), Sec. 2 (SwiGLU, shared input-output embeddings) and "
            "Sec. 5 (sequence length 2048)",
        notes="Vocabulary is '256k' SentencePiece tokens (exact size not certain, left null)."),
}

MODEL_FIELDS = ["parameters", "layers", "hidden_dim", "heads", "kv_heads", "head_dim", "vocab_size",
                "ffn_dim", "gated_mlp", "tied_embeddings", "context_length", "active_parameters",
                "experts", "active_experts_per_token", "kv_lora_rank", "qk_rope_head_dim"]
REF_MODEL_FIELDS = ["layers", "hidden_dim", "heads", "kv_heads", "head_dim", "vocab_size",
                    "context_length", "kv_lora_rank", "qk_rope_head_dim"]


def _exact_int(q, unit):
    """Exact int value of a pint quantity in ``unit`` (through the stored magnitude)."""
    mag = q.magnitude
    factor = (1 * q.units).to(unit).magnitude
    v = Fraction(repr(mag)) * Fraction(repr(factor)) if isinstance(mag, float) or isinstance(factor, float) \
        else Fraction(mag) * Fraction(factor)
    # Also cross-check against pint's float conversion.
    f = q.to(unit).magnitude
    assert v.denominator == 1, (q, unit, v)
    assert abs(float(v) - f) <= 1e-9 * abs(f), (q, unit, v, f)
    return int(v)


def _entries(ns):
    return [(n, getattr(ns, n)) for n in sorted(dir(ns)) if not n.startswith("_") and n != "list"]


def dump_models():
    out = []
    for attr, m in _entries(Models.Language):
        assert attr in MODEL_EXTRA, "no curated entry for " + attr
        x = MODEL_EXTRA[attr]
        path = "Models.Language." + attr
        sparse = isinstance(m, SparseTransformerWorkload)
        rec = {"key": x["key"], "aliases": [], "name": m.name,
               "kind": "sparse_transformer" if sparse else "transformer"}
        vals = {f: None for f in MODEL_FIELDS}
        vals["parameters"] = _exact_int(m.parameters, ureg.count)
        from_ref = ["parameters"]
        for f in REF_MODEL_FIELDS:
            v = getattr(m, f)
            if v is not None:
                vals[f] = v
                from_ref.append(f)
        if sparse:
            vals["active_parameters"] = _exact_int(m.active_parameters, ureg.count)
            vals["experts"] = m.experts
            vals["active_experts_per_token"] = m.active_experts_per_token
            from_ref += ["active_parameters", "experts", "active_experts_per_token"]
        added = []
        for f, v in x["add"].items():
            if vals[f] is not None:
                # never override the reference; curated value must agree if present
                assert vals[f] == v, (attr, f, vals[f], v)
                continue
            vals[f] = v
            added.append(f)
        rec.update(vals)
        aliases = [attr.lower(), m.name.lower()] + list(x["aliases"])
        seen = {rec["key"]}
        for a in aliases:
            if a not in seen:
                rec["aliases"].append(a)
                seen.add(a)
        rec["reference_path"] = path
        rec["sources"] = {", ".join(from_ref): "%s (%s)" % (REF, path)}
        if added:
            rec["sources"][", ".join(added)] = x["src"]
        rec["reference_provenance"] = m.metadata.provenance.ref if m.metadata and m.metadata.provenance else None
        if x.get("notes"):
            rec["notes"] = x["notes"]
        out.append(namespaced(rec))
    return {"schema": 1, "source": "mlsysim 0.3.0 (PyPI) Models.Language registry, "
                                   "generated by tools/dump_reference_catalog.py", "models": out}


# ------------------------------------------------------------------- hardware
HW_EXTRA = {
    "A100": ("a100", ["a100-80gb", "a100-sxm"]),
    "A100_40GB": ("a100-40gb", []),
    "B200": ("b200", []),
    "Cerebras_CS3": ("cerebras-cs3", ["cs3", "wse-3"]),
    "DMatrix_Corsair": ("dmatrix-corsair", []),
    "GB200_NVL72": ("gb200-nvl72", []),
    "Gaudi2": ("gaudi2", []),
    "Gaudi3": ("gaudi3", []),
    "Graphcore_GC200": ("graphcore-gc200", ["gc200"]),
    "Groq_LPU": ("groq-lpu", []),
    "H100": ("h100", ["h100-sxm"]),
    "H100_PCIe": ("h100-pcie", []),
    "H200": ("h200", []),
    "IntelSGX": ("intel-sgx", []),
    "K80": ("k80", []),
    "MI250X": ("mi250x", []),
    "MI300X": ("mi300x", []),
    "MI325X": ("mi325x", []),
    "P100": ("p100", []),
    "ReferenceCPU": ("reference-cpu", []),
    "T4": ("t4", []),
    "TPUv1": ("tpuv1", []),
    "TPUv2": ("tpuv2", []),
    "TPUv3": ("tpuv3", []),
    "TPUv4": ("tpuv4", []),
    "TPUv5p": ("tpuv5p", []),
    "TPUv6": ("tpuv6e", ["trillium"]),
    "Trainium2": ("trainium2", ["trn2"]),
    "Untether_speedAI240": ("untether-speedai240", []),
    "V100": ("v100", []),
    "V100_PCIe": ("v100-pcie", []),
    "DGX_Spark": ("dgx-spark", ["gb10"]),
    "GTX580_3GB": ("gtx580", ["gtx580-3gb"]),
    "MacBookM3Max": ("macbook-m3-max", ["m3-max"]),
}
HW_NOTES = {
    "GB200_NVL72": "Whole 72-GPU rack modelled as one node (13.5 TiB pooled HBM), as stored upstream.",
    "K80": "One GK210 GPU of the dual-GPU K80 board (12 GiB), as stored upstream.",
    "Cerebras_CS3": "Capacity is on-wafer SRAM (44 GiB), as stored upstream.",
    "Groq_LPU": "Capacity is on-chip SRAM (230 MiB), as stored upstream.",
    "DGX_Spark": "Unified LPDDR5x memory shared with the CPU.",
    "MacBookM3Max": "Unified memory shared with the CPU.",
}


def dump_hardware():
    out = []
    for tier, ns in (("cloud", Hardware.Cloud), ("workstation", Hardware.Workstation)):
        for attr, h in _entries(ns):
            assert attr in HW_EXTRA, "no curated entry for " + attr
            key, extra = HW_EXTRA[attr]
            path = "Hardware.%s.%s" % (tier.capitalize(), attr)
            cap = _exact_int(h.memory.capacity, ureg.byte)
            bw = h.memory.bandwidth
            bw_int = _exact_int(bw, ureg.byte / ureg.second) if bw is not None else None
            rec = {"key": key, "aliases": [], "name": h.name, "tier": tier,
                   "memory_capacity": cap, "memory_capacity_stated": str(h.memory.capacity),
                   "memory_bandwidth": bw_int,
                   "memory_bandwidth_stated": str(bw) if bw is not None else None,
                   "devices_per_node": h.accelerator_count, "host_memory": None,
                   "reference_path": path}
            seen = {key}
            for a in [attr.lower(), h.name.lower()] + extra:
                if a not in seen:
                    rec["aliases"].append(a)
                    seen.add(a)
            fields = "memory_capacity, memory_bandwidth" + (
                ", devices_per_node" if h.accelerator_count is not None else "")
            rec["sources"] = {fields: "%s (%s)" % (REF, path),
                              "host_memory": "not in the reference registry (null)"}
            prov = h.metadata.provenance if h.metadata else None
            rec["reference_provenance"] = prov.ref if prov else None
            if attr in HW_NOTES:
                rec["notes"] = HW_NOTES[attr]
            out.append(namespaced(rec))
    return {"schema": 1, "source": "mlsysim 0.3.0 (PyPI) Hardware.Cloud and Hardware.Workstation "
                                   "registries, generated by tools/dump_reference_catalog.py",
            "hardware": out}


# ------------------------------------------------------------------- validation
def _is_int(v):
    return type(v) is int


def validate(doc, list_key, int_fields, nullable_int_fields):
    names = {}
    for e in doc[list_key]:
        key = e["key"]
        assert key == key.lower() and " " not in key, key
        for n in [key] + e["aliases"]:
            assert isinstance(n, str) and n == n.lower() and n.strip() == n and n, n
            assert n not in names, "name %r of %s collides with %s" % (n, key, names[n])
            names[n] = key
        for f in int_fields:
            assert _is_int(e[f]) and e[f] > 0, (key, f, e[f])
        for f in nullable_int_fields:
            assert e[f] is None or (_is_int(e[f]) and e[f] > 0), (key, f, e[f])
    return len(doc[list_key]), len(names)


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "mlsysim_core" / "catalog"
    _load_reference()
    models, hardware = dump_models(), dump_hardware()
    nm = validate(models, "models", ["parameters", "layers"],
                  ["hidden_dim", "heads", "kv_heads", "head_dim", "vocab_size", "ffn_dim",
                   "context_length", "active_parameters", "experts", "active_experts_per_token",
                   "kv_lora_rank", "qk_rope_head_dim"])
    for e in models["models"]:
        for f in ("gated_mlp", "tied_embeddings"):
            assert e[f] is None or type(e[f]) is bool, (e["key"], f)
        assert (e["kind"] == "sparse_transformer") == (e["experts"] is not None)
    nh = validate(hardware, "hardware", ["memory_capacity"],
                  ["memory_bandwidth", "devices_per_node", "host_memory"])
    root.mkdir(parents=True, exist_ok=True)
    for name, doc in (("models.json", models), ("hardware.json", hardware)):
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        assert json.loads(text) == doc
        (root / name).write_text(text, encoding="utf-8")
    print("models: %d entries, %d names; hardware: %d entries, %d names -> %s"
          % (nm[0], nm[1], nh[0], nh[1], root), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
