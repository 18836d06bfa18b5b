"""LLaMA-Factory's fp8 path (hiyouga/LLaMA-Factory@ff6d4d12 src/llamafactory/train/sft/trainer.py:62-65:
configure_fp8_environment sets ACCELERATE_MIXED_PRECISION=fp8 when the trainer is built, after
TrainingArguments.__post_init__ ran) under transformers' Trainer: which mixed precision does the Accelerator
get, is fp8 enabled? Run: /tmp/tvenv/bin/python validation/launch_fp8/lf_fp8_probe.py bf16 (or: no).
Measured (CPU, transformers 5.23.0, accelerate 1.16.0): results.txt."""
import os
import sys

import accelerate
import transformers
from transformers import TrainingArguments, Trainer, LlamaConfig, LlamaForCausalLM
bf16 = sys.argv[1] == "bf16"
args = TrainingArguments(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "lf_fp8_probe"), bf16=bf16, use_cpu=True, report_to=[])
os.environ["ACCELERATE_MIXED_PRECISION"] = "fp8"     # LLaMA-Factory fp8_utils.py:134
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=128)
t = Trainer(model=LlamaForCausalLM(cfg), args=args)
a = t.accelerator
print(f"transformers {transformers.__version__} accelerate {accelerate.__version__} bf16={bf16}: "
      f"args.mixed_precision={args.mixed_precision!r} accelerator.mixed_precision={a.mixed_precision!r} "
      f"fp8_enabled={a.fp8_enabled}")
