"""An accelerate config YAML (``accelerate launch --config_file``) as a launch format
(docs/launch-hf.md): the world size (num_processes over num_machines), the distributed type
(DDP, FSDP1/FSDP2, DeepSpeed with its config file), mixed precision (``fp8`` with ``fp8_config.backend: AO``:
the measured profile's ``float8``; ``ao_float8``, which axolotl's reader shares), and the parallelism config
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
    if mixed not in ("no", "bf16", "fp16", "fp8"):
        r.refuse("mixed_precision", mixed, "no, bf16, fp16 or fp8", "unknown mixed precision")
    if mixed == "fp8":
        _fp8(r, doc, kind)
        # (DeepSpeed's and FSDP's plugins take fp8 as bf16: utils/dataclasses.py 1415-1427, 2092-2097)
        mixed = "bf16"
    elif "mixed_precision" in doc:
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
        elif k == "fp8_config":     # (mixed_precision fp8 read it; otherwise accelerate never looks at it)
            r.ignore(k)
        else:
            r.unknown(k, v, f"the keys of accelerate's config file ({SOURCE})")
    return r.done()


# --- fp8: what accelerate runs for mixed_precision fp8 ----------------------------------------------------

ACC = "huggingface/accelerate@16cb6eb8"
BACKENDS = f"{ACC} src/accelerate/accelerator.py:478-503 (fp8_backend, the recipe handlers)"
AUTOCAST = (f"under fp8 accelerate autocasts the forward in bf16 ({ACC} accelerator.py:600-603, "
            "utils/modeling.py:2087-2101)")
AO_RUN = f"torchao's convert_to_float8_training ({ACC} accelerator.py:2070-2089 _prepare_ao, utils/ao.py:104-143)"
AO_FILTER = ("accelerate's default module filter keeps the model's first and last nn.Linear (layer 0's q_proj, the "
             "LM head) and any linear not a multiple of 16 in high precision (utils/ao.py:32-91, 138-143)")
AO_DEFAULTS = (f"AORecipeKwargs() builds Float8LinearConfig(pad_inner_dim=True, enable_fsdp_float8_all_gather=True): "
               f"torchao's default recipe, tensorwise dynamic scaling ({ACC} src/accelerate/utils/dataclasses.py:313-357)")
AO_KEYS = ("backend", "enable_fsdp_float8_all_gather", "pad_inner_dim")
TE_KEYS = ("amax_history_len", "amax_compute_algo", "fp8_format", "interval", "margin", "override_linear_precision",
           "use_autocast_during_eval", "opt_level")


def _model_shape(model):
    """A reading's model (a catalog name or a config.json path) as a TransformerWorkload; None if unknown."""
    import json
    from pathlib import Path
    from mlsysim_core.errors import MlsysimError
    try:
        if isinstance(model, (str, Path)) and str(model).endswith(".json") and Path(str(model)).is_file():
            from mlsysim_core.hf import from_hf_config
            return from_hf_config(json.loads(Path(str(model)).read_text()))
        if isinstance(model, str):
            from mlsysim_core.catalog import find_model
            return find_model(model).value
    except (MlsysimError, OSError, ValueError):
        return None
    return model if getattr(model, "hidden_dim", None) is not None else None


def ao_float8(r: Reading, key, value, recipe: str, how: str, *, first_linear: bool = True) -> None:
    """``key`` runs torchao's float8 training with ``recipe`` (tensorwise or rowwise) through a module filter
    that keeps the LM head, the linears not multiples of 16 and, with ``first_linear``, the model's first
    nn.Linear in high precision: the measured profile's ``float8`` option (measured/float8.py), once the
    run's model is known (another file's, or -m) and the option expresses that filter
    (``float8.filter_left_out``); refused naming ``key`` otherwise. ``how``: where it comes from."""
    from mlsysim_core.errors import NotModelledError
    from ..measured.float8 import filter_left_out
    given = getattr(r.context, "model", None)
    path = r.path

    def derive(mixed, merged):
        model = given or merged.get("model")
        shape = _model_shape(model)
        if shape is None:
            return (recipe, f"{how}: float8={recipe!r}; whether the option expresses the filter is checked once the "
                            "model is known", True)
        why = filter_left_out(shape, first_linear=first_linear)
        if why:
            raise NotModelledError(f"{path}: {key}", value, "a model whose float8 linears the measured profile's "
                                   "float8 option describes", f"{how}: {why}")
        return (recipe, how + ("; layer 0's q_proj left out changes no term (its cast is o_proj's, hidden x "
                               "hidden)" if first_linear else ""))

    r.derived(key, value, "float8", derive, own=None, also=("model",))


def _fp8(r: Reading, doc: dict, kind: str) -> None:
    """``mixed_precision: fp8``: the backend ``fp8_config.backend`` names (AO: torchao's float8 training, read as
    the measured profile's float8 option; TE and MS-AMP refused), under bf16 autocast."""
    cfg = doc.get("fp8_config") or {}
    if not isinstance(cfg, dict):
        r.refuse("fp8_config", cfg, "a table", "not a table")
    backend = str(cfg.get("backend") or "").strip().upper()
    r.seen.add("fp8_config")
    if not backend:
        r.refuse("fp8_config.backend", cfg.get("backend"), "AO (torchao)", "mixed_precision fp8 without a backend: "
                 "accelerate takes torchao, else TransformerEngine, else MS-AMP, whichever is installed "
                 f"({BACKENDS}): not known from the file")
    if backend == "TE":
        r.refuse("fp8_config.backend", cfg["backend"], "AO (torchao)", "TransformerEngine through accelerate "
                 f"(convert_model swaps te.Linear/te.LayerNorm in, fp8_autocast; {ACC} src/accelerate/accelerator.py:"
                 "2105-2135): the measured profile's float8='transformer-engine' describes Megatron-Core's layers only")
    if backend in ("MSAMP", "MS-AMP"):
        r.refuse("fp8_config.backend", cfg["backend"], "AO (torchao)", "MS-AMP (fp8 weights, gradients and optimizer "
                 "state: msamp.initialize): not modelled")
    if backend != "AO":
        r.refuse("fp8_config.backend", cfg["backend"], "AO, TE or MSAMP", "unknown fp8 backend")
    gather = str(cfg.get("enable_fsdp_float8_all_gather", True)).strip().lower() not in ("false", "0", "no")
    if kind == "FSDP" and gather:
        r.refuse("fp8_config.enable_fsdp_float8_all_gather", cfg.get("enable_fsdp_float8_all_gather", True),
                 "false", "FSDP2's float8 all-gather (torchao WeightWithDynamicFloat8CastTensor: the weights gathered "
                 "in fp8, their scales precomputed after each step) is not modelled; " + AO_DEFAULTS.split(":")[0]
                 + " with it on by default")
    r.set("mixed_precision", doc["mixed_precision"], "precision", "bf16", AUTOCAST, yields=True)
    ao_float8(r, "fp8_config.backend", cfg["backend"], "tensorwise", f"{AO_RUN}; {AO_DEFAULTS}; {AO_FILTER}")
    for k, v in cfg.items():
        key = f"fp8_config.{k}"
        if k in ("backend", "enable_fsdp_float8_all_gather"):
            r.seen.add(key)
        elif k == "pad_inner_dim":
            r.note(key, v, "pads a matmul's inner dimension to a multiple of 16; the linears the float8 option "
                   "converts already are (filter_left_out checks it)")
        elif k in TE_KEYS:
            r.ignore(key)     # (TransformerEngine's and MS-AMP's settings: unused by the AO backend)
        else:
            r.unknown(key, v, "accelerate's fp8_config keys (backend, enable_fsdp_float8_all_gather, pad_inner_dim; "
                      "TE's and MS-AMP's)")


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
