"""Write mlsysim_core/catalog/hf_defaults.json: transformers' config defaults for every
``model_type`` that ``mlsysim_core.hf`` reads.

Rerun it (transformers only: no torch, no network, nothing downloaded) in a scratch
virtualenv, never the project's own (transformers is not a dependency of mlsysim-core):

    python3 -m venv /tmp/tfvenv
    /tmp/tfvenv/bin/pip install "transformers==5.23.0"     # the version the hf tests pin
    /tmp/tfvenv/bin/python tools/make_hf_defaults.py       # from the repository root

What it records, per model type (the keys of ``_FAMILIES`` and ``_NESTED`` in
mlsysim_core/hf.py, read from its source, so the table follows the code):

* ``config_class``: the transformers class (``CONFIG_MAPPING[model_type]``);
* ``defaults``: every field the class declares, with its declared default (transformers 5
  config classes are dataclasses: ``dataclasses.fields(cls)``), keyed by the attribute a
  config.json key lands on (``attribute_map``: DeepSeek-V3's ``num_mtp_layers`` field
  sets ``num_nextn_predict_layers``). These are the values ``from_dict`` starts from when
  a config.json omits the key. A default of ``None`` means "derived" (``__post_init__``
  computes it from other fields: ``head_dim = hidden_size // num_attention_heads``,
  ``num_key_value_heads = num_attention_heads``, ...): mlsysim_core.hf derives those itself.
  PretrainedConfig's bookkeeping fields (``architectures``, ``id2label``, ...) are left out;
* ``attribute_map``: the other names a config.json may use for a field (GPT-2's
  ``hidden_size`` for ``n_embd``);
* ``default_theta``: the class's RoPE base when the config gives none (a class attribute,
  not a field; Gemma 3's is one per attention type);
* ``sub_configs``: for a multimodal config, the model type its ``text_config`` is read as
  when the config.json's text_config says none (``Gemma3Config(text_config={})``).

``quantization`` records the ``quant_method`` values transformers knows
(``QuantizationMethod``) and the keyword defaults of ``BitsAndBytesConfig`` (a plain class:
``inspect.signature``; ``None`` there means float32 for ``bnb_4bit_compute_dtype`` and uint8
for ``bnb_4bit_quant_storage``, as its ``__init__`` sets them), what a ``quantization_config``
that omits a key is read with.

``not_in_transformers`` lists the types hf.py reads that transformers has no class for
(``kimi_k2``, read as ``deepseek_v3``, whose config is its checkpoint's own remote code):
they have no defaults.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "mlsysim_core" / "hf.py"
OUT = ROOT / "mlsysim_core" / "catalog" / "hf_defaults.json"

# PretrainedConfig's own fields: what the checkpoint was saved with, label maps, output flags.
BOOKKEEPING = {"transformers_version", "architectures", "output_hidden_states", "return_dict",
               "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type"}


def hf_model_types() -> tuple[list[str], list[str], list[str]]:
    """(families, nested multimodal types, aliases): the keys of hf.py's dispatch dicts."""
    tree = ast.parse(HF.read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id in ("_FAMILIES", "_NESTED", "_ALIASES"):
            found[target.id] = [ast.literal_eval(k) for k in node.value.keys]
    return found["_FAMILIES"], found["_NESTED"], found["_ALIASES"]


def jsonable(value):
    """The value as JSON, or a ValueError (a default that is not plain data)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(value)
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__}: {value!r}")


def entry(cls) -> dict:
    attribute_map = dict(getattr(cls, "attribute_map", {}) or {})
    defaults, skipped = {}, []
    for field in dataclasses.fields(cls):
        if field.name in BOOKKEEPING:
            continue
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue            # required by the class: no default to record
        try:
            value = jsonable(value)
        except ValueError:
            skipped.append(field.name)
            continue
        defaults[attribute_map.get(field.name, field.name)] = value
    out = {"config_class": cls.__name__, "defaults": dict(sorted(defaults.items()))}
    if attribute_map:
        out["attribute_map"] = dict(sorted(attribute_map.items()))
    theta = getattr(cls, "default_theta", None)
    if theta is not None:
        out["default_theta"] = jsonable(theta)
    if skipped:
        out["not_recorded"] = sorted(skipped)      # defaults that are not plain data
    return out


def quantization() -> dict:
    import inspect
    from transformers import BitsAndBytesConfig
    from transformers.utils.quantization_config import QuantizationMethod
    params = inspect.signature(BitsAndBytesConfig.__init__).parameters.items()
    return {"methods": sorted(m.value for m in QuantizationMethod),
            "bitsandbytes": {"config_class": BitsAndBytesConfig.__name__,
                             "defaults": {k: jsonable(v.default) for k, v in params
                                          if v.default is not inspect.Parameter.empty
                                          and v.kind is not inspect.Parameter.VAR_KEYWORD}}}


def main() -> int:
    import transformers
    from transformers import CONFIG_MAPPING

    families, nested, aliases = hf_model_types()
    table, missing = {}, []
    for model_type in sorted(set(families) | set(nested) | set(aliases)):
        if model_type not in CONFIG_MAPPING:
            missing.append(model_type)
            continue
        cls = CONFIG_MAPPING[model_type]
        table[model_type] = entry(cls)
        if model_type in nested:
            # the text model's type when a config.json's text_config names none
            text = cls(text_config={}).text_config
            table[model_type]["sub_configs"] = {"text_config": text.model_type}
    unknown = [t for t in missing if t not in aliases]
    if unknown:
        print(f"transformers {transformers.__version__} has no config class for {unknown}", file=sys.stderr)
        return 1
    doc = {
        "_comment": ("transformers' config defaults for the model types mlsysim_core.hf reads; generated by "
                     "tools/make_hf_defaults.py (its header says how to rerun it), do not edit by hand"),
        "transformers_version": transformers.__version__,
        "generated_by": "tools/make_hf_defaults.py",
        "not_in_transformers": sorted(missing),
        "model_types": table,
        "quantization": quantization(),
    }
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(table)} model types, transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
