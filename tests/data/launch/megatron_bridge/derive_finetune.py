"""Derive ``llama32_1b_lora_squad_derived.yaml`` from the real dump ``llama32_1b_pretrain_h100x8.yaml``.

    python tests/data/launch/megatron_bridge/derive_finetune.py

No resolved Megatron-Bridge ConfigContainer with a ``peft`` section or a finetuning dataset was found
in any public source searched (SOURCE.md says where). This script makes one from the real pretraining
dump by replacing exactly the sections below, each as ``ConfigContainer.to_yaml`` writes a dataclass
(NVIDIA-NeMo/Megatron-Bridge v0.1.0rc3 bf71eba07bae8d36f08b796c106d1197d46ad541
src/megatron/bridge/training/utils/config_utils.py ``_convert_value_to_dict``: ``_target_`` = module +
qualname, then every dataclass field not starting with ``_``, ``init=False`` ones included;
``yaml.safe_dump(..., default_flow_style=False)``, so sorted keys; a function is
``{_target_, _call_: false}``, src/megatron/bridge/utils/yaml_utils.py ``_function_representer``; a
``set`` is PyYAML's ``!!set``). ``yaml.safe_dump(yaml.safe_load(real))`` gives the real file back byte
for byte, so every line not changed here is the real dump's.

The values are those of Megatron-Bridge's own finetuning recipe (v0.2.0
7af9601c9da746d21481194356295bfe23df3737 src/megatron/bridge/recipes/llama/llama3.py
``llama32_1b_finetune_config``: ``default_peft_config("lora")`` = ``LoRA()``, ``default_squad_config(2048,
packed_sequence=False)``, ``cross_entropy_loss_fusion = False`` under PEFT), on the dataclasses of the
version the real dump ran (v0.1.0rc3, which has no finetuning recipe of its own).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REAL = HERE / "llama32_1b_pretrain_h100x8.yaml"
OUT = HERE / "llama32_1b_lora_squad_derived.yaml"

# src/megatron/bridge/peft/lora.py at bf71eba: @dataclass class LoRA(PEFT, ModuleMatcher); PEFT's
# params_to_save (base.py: set, init=False), ModuleMatcher's exclude_modules ([]) and canonical_mapping
# (module_matcher.py: defaultdict(set), a dict: {}), LoRA's own fields at their defaults.
PEFT = {
    "_target_": "megatron.bridge.peft.lora.LoRA",
    "params_to_save": set(),
    "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
    "exclude_modules": [],
    "canonical_mapping": {},
    "dim": 32,
    "alpha": 32,
    "dropout": 0.0,
    "dropout_position": "pre",
    "lora_A_init_method": "xavier",
    "lora_B_init_method": "zero",
    "a2a_experimental": False,
    "lora_dtype": None,
}

# src/megatron/bridge/data/builders/hf_dataset.py at bf71eba: @dataclass(kw_only=True) class
# HFDatasetConfig(FinetuningDatasetConfig) (training/config.py: FinetuningDatasetConfig(DataloaderConfig)).
# Values: v0.2.0's default_squad_config(2048, packed_sequence=False); the rest the dataclasses' defaults.
DATASET = {
    "_target_": "megatron.bridge.data.builders.hf_dataset.HFDatasetConfig",
    # DataloaderConfig
    "dataloader_type": "batch", "num_workers": 1, "data_sharding": True, "pin_memory": True,
    "persistent_workers": False,
    # FinetuningDatasetConfig
    "dataset_root": None, "seq_length": 2048, "seed": 5678, "memmap_workers": 1, "max_train_samples": None,
    "packed_sequence_specs": None, "dataset_kwargs": {}, "do_validation": True, "do_test": False,
    # HFDatasetConfig
    "dataset_name": "squad",
    "process_example_fn": {"_target_": "megatron.bridge.data.hf_processors.squad.process_squad_example",
                           "_call_": False},
    "dataset_subset": None, "dataset_dict": None, "split": None, "download_mode": None, "val_proportion": 0.1,
    "split_val_from_train": True, "delete_raw": False, "rewrite": False, "hf_kwargs": None,
    "hf_filter_lambda": None, "hf_filter_lambda_kwargs": None,
}


def derive() -> str:
    text = REAL.read_text()
    document = yaml.safe_load(text)
    assert yaml.safe_dump(document, default_flow_style=False) == text     # the dumper reproduces the real file
    document["peft"] = PEFT
    document["dataset"] = DATASET
    # training/config.py ConfigContainer.validate at bf71eba: model.seq_length == dataset.seq_length, and PEFT
    # requires checkpoint.pretrained_checkpoint
    document["model"]["seq_length"] = DATASET["seq_length"]
    document["model"]["cross_entropy_loss_fusion"] = False
    document["checkpoint"]["pretrained_checkpoint"] = "/checkpoints/llama32_1b"
    return yaml.safe_dump(document, default_flow_style=False)


if __name__ == "__main__":
    derived = derive()
    OUT.write_text(derived)
    print(OUT.name, hashlib.sha256(derived.encode()).hexdigest())
