"""An accelerate config YAML (``accelerate launch --config_file``) as a launch format
(docs/launch-hf.md): the world size (num_processes over num_machines), the distributed type
(DDP, FSDP1/FSDP2, DeepSpeed with its config file), mixed precision, and the parallelism config
(tensor, context, hybrid-sharded data parallelism)."""

from __future__ import annotations

from mlsysim_core import hookimpl

from .hookspecs import LaunchFormatSpec
from . import _hf
from ._hf import ACCELERATE, Reading, is_true, whole

SOURCE = "huggingface/accelerate@16cb6eb8 src/accelerate/commands/config/config_args.py"
IGNORED = {"compute_environment", "debug", "machine_rank", "main_training_function", "rdzv_backend", "same_network",
           "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "downcast_bf16", "gpu_ids", "main_process_ip",
           "main_process_port", "enable_cpu_affinity", "tpu_name", "tpu_zone", "commands", "command_file",
           "ipex_config", "mpirun_config", "num_cpu_threads_per_process", "deepspeed_multinode_launcher"}
DS_IGNORED = {"deepspeed_multinode_launcher", "zero3_init_flag", "zero3_save_16bit_model", "gradient_clipping",
              "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
              "seq_parallel_communication_data_type"}


def recognizes(path, document) -> bool:
    return isinstance(document, dict) and "distributed_type" in document


def read(path, document, context):
    r = Reading("accelerate", path, ACCELERATE, context)
    doc = document
    kind = str(doc.get("distributed_type", "NO")).upper()
    r.seen.add("distributed_type")
    if kind not in ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED"):
        r.refuse("distributed_type", kind, "NO, MULTI_GPU, FSDP or DEEPSPEED", "Megatron-LM through accelerate, "
                 "TPU/XLA, CPU or other accelerators: not read here")
    procs = doc.get("num_processes")
    machines = doc.get("num_machines", 1)
    if procs is not None:
        n = whole(r, "num_processes", procs)
        r.world["gpus"] = ("num_processes", n)
        r.seen.add("num_processes")
        r.notes.append(f"num_processes {n}: accelerate's total over all machines ({machines} machine(s))")
    elif kind == "NO":
        r.world["single_device"] = ("distributed_type", True)
    if "num_machines" in doc:
        whole(r, "num_machines", machines)
        r.seen.add("num_machines")
    mixed = str(doc.get("mixed_precision", "no")).lower()
    if mixed == "fp8":
        r.refuse("mixed_precision", mixed, "no, bf16 or fp16", "fp8 training through accelerate (TE/torchao/MS-AMP): "
                 "use the float8 option of the measured profile by hand")
    if mixed not in ("no", "bf16", "fp16"):
        r.refuse("mixed_precision", mixed, "no, bf16 or fp16", "unknown mixed precision")
    if "mixed_precision" in doc:
        if mixed in ("bf16", "fp16"):     # (a training-arguments file's bf16/fp16 true wins: _hf.MIXED_PRECEDENCE)
            r.set("mixed_precision", doc["mixed_precision"], "precision", mixed, _hf.MIXED_PRECEDENCE, yields=True)
        else:
            r.ignore("mixed_precision")
    m = mixed if mixed in ("bf16", "fp16") else None
    if kind == "FSDP":     # FSDP's regime: the run's mixed precision, this file's or the training arguments'
        _hf.fsdp_config(r, "fsdp_config", doc.get("fsdp_config") or {}, None)
        r.seen.add("fsdp_config")
        # none: no policy (fsdp_utils.py line 768, MixedPrecisionPolicy()) and no upcast ("if
        # accelerator.mixed_precision != 'no'": accelerator.py line 1970, fsdp_utils.py line 801): the model is
        # sharded and trained in the dtype it was loaded in, the regime another file (the model's dtype) says
        r.derived("mixed_precision", doc.get("mixed_precision", "no"), "regime", _hf.fsdp_regime(None), own=m,
                  also=("lora",))     # (QLoRA: another file's 4-bit base, _hf.fsdp_regime)
    elif "fsdp_config" in doc:
        r.ignore("fsdp_config")
    if kind == "DEEPSPEED":
        _deepspeed(r, doc.get("deepspeed_config") or {}, m)
        r.seen.add("deepspeed_config")
    elif "deepspeed_config" in doc:
        r.ignore("deepspeed_config")
    _parallelism(r, doc.get("parallelism_config"))
    dyn = doc.get("dynamo_config")
    backend = str(dyn.get("dynamo_backend", "NO")).upper() if isinstance(dyn, dict) else "NO"
    if backend == "INDUCTOR" and str(dyn.get("dynamo_mode") or "default") == "default":
        # accelerate's prepare: torch.compile(model, backend="inductor") around the whole model
        r.set("dynamo_config.dynamo_backend", dyn.get("dynamo_backend"), "compile", True,
              "torch.compile of the whole model by accelerate (docs/compile.md)")
    elif backend not in ("NO", "NONE"):
        r.refuse("dynamo_config.dynamo_backend", dyn.get("dynamo_backend"), "NO or INDUCTOR (mode default)",
                 "a compile backend or mode other than Inductor's defaults: not modelled (docs/compile.md)")
    elif "dynamo_config" in doc:
        r.ignore("dynamo_config")
    if is_true(doc.get("use_cpu")):
        r.refuse("use_cpu", True, "false", "training on the CPU")
    for k, v in doc.items():
        if k in r.seen or k in ("dynamo_config", "use_cpu", "parallelism_config"):
            r.seen.add(k)
            continue
        if k in IGNORED:
            r.ignore(k)
        elif k == "fp8_config":
            r.refuse(k, v, "absent", "fp8 training through accelerate: not read here")
        else:
            r.unknown(k, v, f"the keys of accelerate's config file ({SOURCE})")
    return r.done()


def _deepspeed(r: Reading, cfg: dict, mixed):
    if not isinstance(cfg, dict):
        r.refuse("deepspeed_config", cfg, "a table", "not a table")
    if cfg.get("deepspeed_config_file"):
        r.seen.add("deepspeed_config.deepspeed_config_file")
        _hf.read_deepspeed_file(r, "deepspeed_config.deepspeed_config_file", cfg["deepspeed_config_file"],
                                trainer={"mixed": mixed, "derived": True})
    if "zero_stage" in cfg:
        stage = whole(r, "deepspeed_config.zero_stage", cfg["zero_stage"], 0)
        r.set("deepspeed_config.zero_stage", cfg["zero_stage"], "zero_stage", stage)
    off_o = str(cfg.get("offload_optimizer_device", "none")).lower()
    off_p = str(cfg.get("offload_param_device", "none")).lower()
    for k, dev in (("offload_optimizer_device", off_o), ("offload_param_device", off_p)):
        if dev not in ("none", "cpu", "nvme"):
            r.refuse(f"deepspeed_config.{k}", dev, "none, cpu or nvme", "unknown device")
    if off_p != "none":
        r.set("deepspeed_config.offload_param_device", off_p, "offload",
              "optimizer+gradients+parameters" if "nvme" not in (off_o, off_p) else
              {"optimizer": off_o if off_o != "none" else "cpu", "parameters": off_p}, "ZeRO-Infinity")
        r.seen.add("deepspeed_config.offload_optimizer_device")
    elif off_o != "none":
        stage = cfg.get("zero_stage", 0)
        what = "optimizer+gradients" if isinstance(stage, int) and stage >= 2 else "optimizer"
        r.set("deepspeed_config.offload_optimizer_device", off_o, "offload",
              what if off_o == "cpu" else {"optimizer": "nvme"}, "ZeRO-Offload")
    if not cfg.get("deepspeed_config_file"):     # the run's mixed precision: this file's or the training arguments'
        r.derived("mixed_precision", mixed or "no", "regime", _hf.deepspeed_regime(), own=mixed)
    if "gradient_accumulation_steps" in cfg:
        r.set("deepspeed_config.gradient_accumulation_steps", cfg["gradient_accumulation_steps"],
              "gradient_accumulation_steps", whole(r, "deepspeed_config.gradient_accumulation_steps",
                                                   cfg["gradient_accumulation_steps"]))
    for k, v in cfg.items():
        key = f"deepspeed_config.{k}"
        if key in r.seen or k in ("zero_stage", "offload_optimizer_device", "offload_param_device",
                                  "gradient_accumulation_steps", "deepspeed_config_file"):
            r.seen.add(key)
        elif k in DS_IGNORED:
            r.ignore(key)
        elif k == "deepspeed_moe_layer_cls_names":
            r.refuse(key, v, "absent", "DeepSpeed MoE layers: not modelled")
        else:
            r.unknown(key, v, "accelerate's DeepSpeedPlugin keys")


def _parallelism(r: Reading, cfg):
    if not cfg:
        return
    if not isinstance(cfg, dict):
        r.refuse("parallelism_config", cfg, "a table", "not a table")
    for k, v in cfg.items():
        key = f"parallelism_config.{k}"
        if k == "parallelism_config_tp_size":
            if whole(r, key, v) > 1:
                r.set(key, v, "tp_size", int(v), "PyTorch DTensor tensor parallelism (the model's tp_plan)")
            else:
                r.ignore(key)
        elif k == "parallelism_config_cp_size":
            if whole(r, key, v) > 1:
                r.set(key, v, "cp_size", int(v), "PyTorch context parallelism (ring attention)")
            else:
                r.ignore(key)
        elif k == "parallelism_config_dp_replicate_size":
            if whole(r, key, v) > 1:
                r.set(key, v, "data_parallel", "hsdp", f"HSDP: {v} replicas of the sharded group")
            else:
                r.ignore(key)
        elif k == "parallelism_config_dp_shard_size":
            whole(r, key, v)
            r.note(key, v, "the data-parallel shard group: the world over replicas x tp x cp")
        elif k in ("parallelism_config_cp_comm_strategy", "parallelism_config_cp_backend"):
            if str(v).lower() in ("alltoall", "deepspeed"):
                r.set(key, v, "sharding_rules", {"cp": "cp-ulysses"}, "Ulysses all-to-all context parallelism")
            else:
                r.ignore(key)
        elif k == "parallelism_config_sp_size":
            if whole(r, key, v) > 1:
                r.refuse(key, v, "1", "DeepSpeed ALST sequence parallelism through accelerate: give --cp with "
                         "--rule cp=cp-ulysses instead")
            r.ignore(key)
        elif k.startswith("parallelism_config_sp_"):
            r.ignore(key)
        else:
            r.unknown(key, v, "accelerate's ParallelismConfig (dp_replicate, dp_shard, tp, cp sizes)")


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="accelerate", description="accelerate config YAML (DDP, FSDP1/2, DeepSpeed, "
                             "TP/CP/HSDP)", framework=ACCELERATE, suffixes=(".yaml", ".yml"), recognizes=recognizes,
                             read=read)]
