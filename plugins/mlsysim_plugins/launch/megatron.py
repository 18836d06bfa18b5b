"""Megatron-LM launch configs (issue 26): the arguments of ``pretrain_gpt.py``.

Two shapes of one thing, read by one reader (format ``megatron-args``):

* a functional-test / ``--yaml-cfg``-style YAML whose ``MODEL_ARGS`` maps ``--flag: value``
  (``tests/functional_tests/test_cases/**/model_config.yaml`` in Megatron-LM), or a YAML that is
  that mapping itself;
* an argument list, as a string (``read_arguments("--num-layers 12 ...")``) or a launch script
  (``.sh``/``.args``, the ``pretrain_gpt.py`` arguments after it or in bash arrays; shell
  variables are not expanded: a ``$VAR`` value is refused naming its flag). The launch framework
  hands a ``.sh``/``.bash``/``.args`` file's raw text to this reader (``--from script.sh``);
  ``read_arguments`` is the entry point for a string.

The model is built from the explicit architecture arguments (Megatron's GPT: LayerNorm or RMSNorm,
learned or rotary positions, GELU or SwiGLU MLP, biases, grouped-query attention with
``--num-query-groups``); the vocabulary is ``--vocab-size`` or the GPT-2 BPE's 50,257 for
``--vocab-file``, padded as Megatron pads it (a multiple of ``--make-vocab-size-divisible-by`` x
tp). Training runs as Megatron-Core does: the regime ``mixed-bf16-main-grad`` (bf16 weights, the
fp32 main-grad buffer, fp32 master weights and Adam state), the fused Adam step (no temporaries),
the data-parallel rule ``mcore-distopt`` (``--use-distributed-optimizer``) or ``mcore-ddp``.

Defaults are Megatron-LM's at ``MEGATRON_COMMIT`` (``megatron/training/arguments.py``,
``megatron/core/transformer/transformer_config.py``): docs/launch-megatron.md lists them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError

from .hookspecs import LaunchFormatSpec
from ._common import Reading, as_bool, as_int

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
VERSION = f"Megatron-LM {MEGATRON_COMMIT[:10]} (2026-08-22)"
ARGS = "megatron/training/arguments.py"
TC = "megatron/core/transformer/transformer_config.py"
LOSS_FUSED = f"NVIDIA/Megatron-LM {MEGATRON_COMMIT[:10]} megatron/core/fusions/fused_cross_entropy.py"
LOSS_UNFUSED = f"NVIDIA/Megatron-LM {MEGATRON_COMMIT[:10]} megatron/core/tensor_parallel/cross_entropy.py"
GPT2_BPE_VOCAB = 50257      # --vocab-file gpt2-vocab.json (GPT2BPETokenizer)

# Flags that change nothing a memory estimate sees: logging, paths, data, schedules of the learning
# rate, checkpoint formats, determinism, launcher knobs, evaluation.
IGNORED_PREFIXES = ("--log-", "--tensorboard", "--wandb", "--save", "--load", "--data-", "--eval-", "--lr",
                    "--min-lr", "--ckpt-", "--no-ckpt-", "--no-save-", "--no-load-", "--dist-ckpt", "--async-save", "--use-persistent-ckpt",
                    "--exit-", "--timing-", "--train-", "--split", "--vocab-file", "--merge-file",
                    "--tokenizer-", "--mock-data", "--seed", "--init-method", "--adam-", "--weight-decay",
                    "--clip-grad", "--distributed-backend", "--use-mcore-models",
                    "--no-mmap-bin-files", "--fim-", "--override-opt", "--rerun-", "--check-", "--num-workers",
                    "--no-create-attention-mask", "--manual-gc", "--straggler", "--no-load-", "--finetune",
                    "--use-checkpoint-", "--auto-detect-ckpt", "--ft-", "--enable-ft", "--decoupled-lr",
                    "--decoupled-min-lr", "--calculate-per-token-loss", "--attention-softmax-in-fp32",
                    "--apply-query-key-layer-scaling",
                    "--overlap-grad-reduce", "--overlap-param-gather",
                    "--tp-comm-overlap", "--ddp-average-in-collective", "--no-bias-swiglu-fusion",
                    "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-masked-softmax-fusion",
                    "--no-persist-layer-norm", "--accumulate-allreduce-grads-in-fp32", "--step-batch-size-schedule",
                    "--rampup-batch-size", "--use-flash-attn", "--nproc-per-node", "--nnodes", "--master-",
                    "--node-rank", "--rdzv-", "--qk-layernorm", "--rotary-", "--use-rotary-position", "--norm-epsilon",
                    "--apply-residual-connection-post-layernorm", "--openai-gelu", "--squared-relu",
                    "--hybrid-", "--async-tensor-model-parallel-allreduce", "--empty-unused-memory-level",
                    "--overlap-p2p-comm", "--align-", "--defer-embedding-wgrad",
                    "--deallocate-pipeline-outputs", "--no-async-tensor", "--tensorboard-log-interval",
                    "--num-dataset-builder-threads", "--object-storage", "--full-validation",
                    "--disable-symmetric-registration", "--mid-level-dataset", "--per-split-data-args",
                    "--use-tokenizer-model-from", "--bf16-", "--logging-level", "--sequence-parallel-",
                    "--use-dist-ckpt", "--te-rng-tracker", "--inference-", "--cuda-graph-warmup")


def _arg(args: dict, name: str, default=None):
    return args.get(name, default)


def _normalise_mapping(mapping: dict, path) -> dict:
    out = {}
    for key, value in mapping.items():
        name = str(key)
        if not name.startswith("--"):
            raise InvalidInputError(name, value, "a Megatron argument spelled --flag", f"{path}: MODEL_ARGS")
        out[name.replace("_", "-")] = value
    return out


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def parse_argument_list(tokens) -> dict:
    """``--flag value`` / ``--flag`` (True) / ``--flag=value`` tokens -> {flag: value}; tokens
    before the first flag (``torchrun``, ``pretrain_gpt.py``) are dropped."""
    out, key, values = {}, None, []

    def close():
        if key is not None:
            out[key] = True if not values else (values[0] if len(values) == 1 else " ".join(values))
    for token in tokens:
        if token.startswith("--"):
            close()
            name, eq, value = token.partition("=")
            key, values = name.replace("_", "-"), [value] if eq else []
        elif _ASSIGNMENT.match(token) or token.startswith(("${", "torchrun", "python")) or token.endswith(".py"):
            close()      # a shell assignment or a command word ends the flag's values
            key, values = None, []
        elif key is not None:
            values.append(token)
    close()
    return out


def script_arguments(text: str) -> dict:
    """The arguments a launch script passes (every ``--flag`` token of the script, bash arrays and
    continuation lines included); comments dropped."""
    tokens = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            parts = shlex.split(line, comments=True)
        except ValueError:
            continue
        tokens += [p for p in parts if p not in ("(", ")")]
    # a value that a bash array put on its own line after its flag stays attached (parse_argument_list)
    return parse_argument_list([t.rstrip(")").lstrip("(") for t in tokens if t])


def _numeric(value, key, path, minimum=1):
    if isinstance(value, str) and value.startswith("$"):
        raise InvalidInputError(key, value, "a number (shell variables are not expanded)", str(path))
    return as_int(value, key, path, minimum)


def _float(value, key, path) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(key, value, "a number", str(path)) from None


def _flag(args, name, path) -> bool:
    value = args.get(name)
    return False if value is None else as_bool(value, name, path)


# The functional-test YAML's environment (``ENV_VARS``): the one variable that changes allocated bytes is
# CUBLAS_WORKSPACE_CONFIG (PyTorch's cuBLAS workspace per (handle, stream): ":SIZE_KiB:COUNT[:SIZE_KiB:COUNT...]",
# pytorch/pytorch 26a39059ec580351411f180816c47e2ef5134ae1 aten/src/ATen/cuda/CublasHandlePool.cpp
# parseChosenWorkspaceSize). The others steer kernels, NCCL's algorithm or the launcher, not the bytes.
ENV_IGNORED = ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NCCL_ALGO",
               "NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN")
# The functional-test YAML's other top-level keys: the test harness's (how it launches and what it compares).
HARNESS_KEYS = ("TEST_TYPE", "LAUNCHER", "METRICS", "MODE", "SPEC")
# --deterministic-mode: Megatron setdefaults CUBLAS_WORKSPACE_CONFIG=":4096:8" (NVIDIA/Megatron-LM d98e8a64
# megatron/training/determinism.py DETERMINISM_ENV_VAR_DEFAULTS, apply_determinism_env); before that file
# (2026-07) the test configs set it in ENV_VARS themselves (torch.use_deterministic_algorithms needs it).
DETERMINISTIC_WORKSPACE = ":4096:8"
DETERMINISM = f"NVIDIA/Megatron-LM {MEGATRON_COMMIT[:10]} megatron/training/determinism.py"
# TransformerEngine's GEMMs use TE's own workspace, one per device, allocated by torch.empty through the caching
# allocator (NVIDIA/TransformerEngine 4329ff84bfbdaa778a33cba02a15fb0807c64689, the revision Megatron-LM d98e8a64
# pyproject.toml pins, transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace_size_bytes /
# get_cublas_workspace): 32 MiB + 1,024 B where the compute capability's major is 9 or more, 4 MiB below.
TE_WORKSPACE_SM90 = 32 * 2**20 + 1024
TE_WORKSPACE_OTHER = 4 * 2**20
TE_SOURCE = ("NVIDIA/TransformerEngine 4329ff84 transformer_engine/pytorch/cpp_extensions/gemm.py "
             "get_cublas_workspace_size_bytes")


def workspace_config_bytes(text, key="CUBLAS_WORKSPACE_CONFIG", path="<env>") -> int:
    """The bytes of a CUBLAS_WORKSPACE_CONFIG value (":4096:8" -> 8 x 4096 KiB = 32 MiB), as PyTorch's
    parseChosenWorkspaceSize sums it: each ``:SIZE:COUNT`` pair is COUNT buffers of SIZE KiB."""
    pairs = re.fullmatch(r"(?::\d+:\d+)+", str(text).strip())
    if pairs is None:
        raise InvalidInputError(key, text, "':SIZE_KiB:COUNT' pairs, e.g. ':4096:8' (32 MiB) or ':16:8'",
                                f"{path}: PyTorch's CUBLAS_WORKSPACE_CONFIG syntax")
    numbers = [int(n) for n in str(text).strip().split(":")[1:]]
    return sum(size * 1024 * count for size, count in zip(numbers[::2], numbers[1::2]))


def _capability(hardware) -> str | None:
    """The compute capability the catalog records for the hardware priced (``-g``; h100 when not
    given, as ``from_launch``'s default); None where it records none."""
    from mlsysim_core.catalog import find_hardware
    name = "h100" if hardware is None else (hardware if isinstance(hardware, str) else getattr(hardware, "name", None))
    try:
        cc = find_hardware(name).extra.get("compute_capability")
    except Exception:       # (not in the catalog: a user's hardware file)
        return None
    return None if cc is None else str(cc)


def _read_env(r: Reading, env, args, impl, path, context) -> None:
    """The cuBLAS workspaces this launch allocates through PyTorch's caching allocator, as the measured
    profile's ``runtime_overheads.cublas_workspace`` (bytes): PyTorch's workspace (CUBLAS_WORKSPACE_CONFIG,
    the ``:4096:8`` that --deterministic-mode implies, else PyTorch's default for the GPU) for each of the
    two threads that run GEMMs, plus TransformerEngine's. Two threads: the workspace is kept per (handle,
    stream) and cuBLAS handles are per thread (CublasHandlePool.cpp: the thread_local PoolWindow reserves
    its own handle, ``cublas_handle_stream_to_workspace`` keys the workspace on it); the autograd engine runs
    the CUDA backward on its device thread, so the forward's PyTorch GEMMs (the output layer's, Megatron's
    ColumnParallelLinear) and the backward's each hold one. Left to the profile's default (said in a note)
    where a size depends on a compute capability the catalog does not record."""
    from mlsysim_plugins.measured.model import cublas_workspace_bytes
    env = dict(env or {})
    key, torch_ws, how, value = None, None, "", None
    if "CUBLAS_WORKSPACE_CONFIG" in env:
        value = env.pop("CUBLAS_WORKSPACE_CONFIG")
        key, torch_ws = "ENV_VARS.CUBLAS_WORKSPACE_CONFIG", workspace_config_bytes(value, path=path)
        how = f"CUBLAS_WORKSPACE_CONFIG={value}: {torch_ws / 2**20:g} MiB"
    elif _flag(args, "--deterministic-mode", path):
        key, value = "--deterministic-mode", args["--deterministic-mode"]
        torch_ws = workspace_config_bytes(DETERMINISTIC_WORKSPACE)
        how = (f"CUBLAS_WORKSPACE_CONFIG={DETERMINISTIC_WORKSPACE} ({DETERMINISM}: --deterministic-mode "
               f"setdefaults it): {torch_ws / 2**20:g} MiB")
    if str(env.get("PYTORCH_CUDA_ALLOC_CONF", "")).replace(" ", "") == "expandable_segments:True":
        r.note(f"ENV_VARS.PYTORCH_CUDA_ALLOC_CONF={env.pop('PYTORCH_CUDA_ALLOC_CONF')}: approximated: the caching "
               "allocator grows segments in place; the bytes allocated are unchanged, the reserve above them is "
               "priced as without it (runtime_overheads.allocator_fraction): the measured profile's allocator "
               "mechanism (runtime_overheads.allocator='segments') prices per-parameter tensors, not Megatron's "
               "contiguous gradient buffers and the distributed optimizer's shards, nor tp/pp/ep layouts")
    for name in sorted(env):
        if name not in ENV_IGNORED:
            raise InvalidInputError(f"ENV_VARS.{name}", env[name], "an environment variable this reader knows: "
                                    f"CUBLAS_WORKSPACE_CONFIG, {', '.join(ENV_IGNORED)}",
                                    f"{path}: {name} is not read; it is refused rather than dropped, as it may "
                                    "change memory")
        r.ignore(f"ENV_VARS.{name}")
    capability = _capability(getattr(context, "hardware", None))
    if capability is None and (torch_ws is None or impl == "transformer_engine"):
        r.note(f"{key or '--transformer-impl'}: the cuBLAS workspaces are left to the profile's default (the GPU's "
               "compute capability is not in the catalog: PyTorch's default workspace and TransformerEngine's "
               "depend on it)")
        return
    if torch_ws is None:
        torch_ws, default_how = cublas_workspace_bytes(capability)
        key, how = "--transformer-impl", default_how
    te = 0 if impl != "transformer_engine" else \
        TE_WORKSPACE_SM90 if int(capability.split(".")[0]) >= 9 else TE_WORKSPACE_OTHER
    total = 2 * torch_ws + te
    why = (f"the cuBLAS workspaces: PyTorch's, {how}, x 2 (the forward's thread and the autograd engine's device "
           "thread each hold a cuBLAS handle, and the workspace is kept per (handle, stream): pytorch/pytorch "
           "26a39059 aten/src/ATen/cuda/CublasHandlePool.cpp)"
           + (f" + TransformerEngine's, {te:,} B on compute capability {capability} ({TE_SOURCE})" if te else "")
           + f" = {total:,} B")
    if key == "--transformer-impl" and key not in args:
        r.default(key, "runtime_overheads", {"cublas_workspace": total}, TE_SOURCE, why)
    else:
        r.set(key, value if value is not None else args.get(key, impl), "runtime_overheads",
              {"cublas_workspace": total}, why)


def read_arguments(source, *, path: str | Path = "<arguments>", context=None):
    """A ``LaunchReading`` of a Megatron argument list: a string of arguments, a dict of
    ``--flag: value``, or the text of a launch script."""
    if isinstance(source, dict):
        args = _normalise_mapping(source, path)
    else:
        text = str(source)
        for other in ("pretrain_bert.py", "pretrain_t5.py", "pretrain_mamba.py", "pretrain_vlm.py"):
            if other in text:
                raise NotModelledError("--from", str(path), "the arguments of pretrain_gpt.py",
                                       f"{path}: a {other} launch; only Megatron's GPT models are read")
        args = script_arguments(text)
    return _read(args, path, context)


# --- the mapping ---------------------------------------------------------------------------------

def _read(args: dict, path, context, env=None, harness=()):
    r = Reading("megatron-args", path, VERSION)
    for key in harness:     # the functional-test harness's keys (TEST_TYPE, LAUNCHER, ...): no effect on memory
        r.ignore(key)
    used: set[str] = {"--deterministic-mode"}     # read with the environment (_read_env)

    def take(name, default=None):
        used.add(name)
        return args.get(name, default)

    def refuse(name, why, allowed="leave it out"):
        raise NotModelledError(name, args.get(name), allowed, f"{path}: {why}")

    # --- model ----------------------------------------------------------------------------------
    missing = [n for n in ("--num-layers", "--hidden-size", "--num-attention-heads") if n not in args]
    if missing:
        raise InvalidInputError(missing[0], None, "the model's explicit architecture arguments "
                                "(--num-layers, --hidden-size, --num-attention-heads), or give -m",
                                f"{path}: Megatron builds the model from its arguments")
    L = _numeric(take("--num-layers"), "--num-layers", path)
    h = _numeric(take("--hidden-size"), "--hidden-size", path)
    heads = _numeric(take("--num-attention-heads"), "--num-attention-heads", path)
    gqa = _flag(args, "--group-query-attention", path)
    used.add("--group-query-attention")
    groups = _numeric(take("--num-query-groups"), "--num-query-groups", path) if gqa and "--num-query-groups" in args \
        else heads
    if not gqa and "--num-query-groups" in args:
        used.add("--num-query-groups")
        r.note("--num-query-groups is ignored by Megatron without --group-query-attention")
    kv_channels = _numeric(take("--kv-channels"), "--kv-channels", path) if "--kv-channels" in args else h // heads
    swiglu = _flag(args, "--swiglu", path)
    used.add("--swiglu")
    ffn = _numeric(take("--ffn-hidden-size"), "--ffn-hidden-size", path) if "--ffn-hidden-size" in args else (
        int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h)
    if "--ffn-hidden-size" not in args:
        r.note(f"--ffn-hidden-size absent: {ffn} ({ARGS}, validate_args: "
               + ("int(4h x 2/3 / 64) x 64 with --swiglu)" if swiglu else "4 x hidden)"))
    seq = _numeric(take("--seq-length"), "--seq-length", path) if "--seq-length" in args else None
    if seq is None:
        raise InvalidInputError("--seq-length", None, "the sequence length", f"{path}")
    r.set("--seq-length", seq, "seq_len", seq, "pretraining: every sample is --seq-length tokens")
    positions = str(take("--position-embedding-type", "learned_absolute"))
    if positions not in ("learned_absolute", "rope"):
        refuse("--position-embedding-type", "only learned_absolute and rope positions are modelled",
               "learned_absolute or rope")
    max_pos = _numeric(take("--max-position-embeddings"), "--max-position-embeddings", path) \
        if "--max-position-embeddings" in args else seq
    normalization = str(take("--normalization", "LayerNorm"))
    if normalization not in ("LayerNorm", "RMSNorm"):
        refuse("--normalization", "only LayerNorm and RMSNorm", "LayerNorm or RMSNorm")
    bias = not _flag(args, "--disable-bias-linear", path)
    used.add("--disable-bias-linear")
    qkv_bias = bias or _flag(args, "--add-qkv-bias", path)
    used.add("--add-qkv-bias")
    untied = _flag(args, "--untie-embeddings-and-output-weights", path)
    used.add("--untie-embeddings-and-output-weights")
    tp = _numeric(take("--tensor-model-parallel-size", 1), "--tensor-model-parallel-size", path)
    divisible = _numeric(take("--make-vocab-size-divisible-by", 128), "--make-vocab-size-divisible-by", path)
    if "--vocab-size" in args:
        raw_vocab = _numeric(take("--vocab-size"), "--vocab-size", path)
        vocab_key = "--vocab-size"
    elif "--vocab-file" in args:
        raw_vocab, vocab_key = GPT2_BPE_VOCAB, "--vocab-file"
    else:
        raise InvalidInputError("--vocab-size", None, "--vocab-size, or --vocab-file (the GPT-2 BPE)",
                                f"{path}: the vocabulary size is not given")
    multiple = divisible * tp
    vocab = -(-raw_vocab // multiple) * multiple
    experts = take("--num-experts")
    if experts is not None:
        refuse("--num-experts", "Megatron's MoE layers (router, token dispatcher, grouped GEMM buffers) are "
               "not read from Megatron arguments yet", "a dense model")
    if _flag(args, "--multi-latent-attention", path):
        refuse("--multi-latent-attention", "multi-latent attention is not read from Megatron arguments yet")
    for name in ("--mtp-num-layers", "--fp8-format", "--fp8", "--fp4", "--num-layers-at-start-in-bf16"):
        if args.get(name) not in (None, False):
            refuse(name, "not modelled for Megatron runs")

    q_dim, kv_dim = heads * kv_channels, groups * kv_channels
    norm = 2 * h if normalization == "LayerNorm" else h
    layer = (norm + h * (q_dim + 2 * kv_dim) + (q_dim + 2 * kv_dim if qkv_bias else 0) + q_dim * h
             + (h if bias else 0) + norm + h * ffn * (2 if swiglu else 1) + ((2 if swiglu else 1) * ffn if bias else 0)
             + ffn * h + (h if bias else 0))
    parameters = (vocab * h + (max_pos * h if positions == "learned_absolute" else 0) + L * layer + norm
                  + (vocab * h if untied else 0))
    arch = "llama" if swiglu else "gpt2"
    model = {"name": f"megatron-gpt-{L}l-{h}h", "parameters": parameters, "layers": L, "hidden_dim": h,
             "heads": heads, "kv_heads": groups, "head_dim": kv_channels, "vocab_size": vocab, "ffn_dim": ffn,
             "gated_mlp": swiglu, "tied_embeddings": not untied, "context_length": max_pos, "architecture": arch}
    r.set("--num-layers/--hidden-size/--num-attention-heads/--num-query-groups/--ffn-hidden-size", [L, h, heads, groups, ffn],
          "model", model,
          f"Megatron GPT: {parameters:,} parameters ({normalization}, {positions} positions, "
          f"{'SwiGLU' if swiglu else 'GELU'} MLP, {'biases' if bias else 'no biases'}"
          f"{', tied' if not untied else ', untied'} embeddings; vocabulary {raw_vocab:,} from {vocab_key} padded to "
          f"{vocab:,} = multiple of {divisible} x tp {tp})")

    # --- precision, optimizer, data parallelism --------------------------------------------------
    bf16, fp16 = _flag(args, "--bf16", path), _flag(args, "--fp16", path)
    used.update(("--bf16", "--fp16"))
    if not (bf16 or fp16):
        refuse("--bf16", "fp32 Megatron training (neither --bf16 nor --fp16) is not modelled", "--bf16 or --fp16")
    if bf16:
        r.set("--bf16", True, "regime", "mixed-bf16-main-grad",
              "Megatron mixed precision: 16-bit weights, fp32 master weights and Adam state, the main-grad buffer")
        r.set("--bf16", True, "precision", "bf16")
    else:     # the regime decides every dtype: fp16's bytes are bf16's (the loss scaler's few scalars aside)
        r.approx("--fp16", True, "regime", "mixed-bf16-main-grad",
                 "Megatron fp16 mixed precision priced as the bf16 regime (the same 2-byte weights and activations, "
                 "fp32 master weights, Adam state and main-grad buffer); the dynamic loss scaler's state is not "
                 "counted")
    optimizer = str(take("--optimizer", "adam"))
    if optimizer != "adam":
        refuse("--optimizer", "only Megatron's Adam (AdamW) is read", "adam")
    r.default("--optimizer", "optimizer", "adam", f"{ARGS} (--optimizer default 'adam': decoupled weight decay)")
    r.default("--optimizer", "optimizer_impl", "fused", "megatron/core/optimizer/__init__.py (TE/Apex FusedAdam: "
              "one fused kernel, no step temporaries)")
    distopt = _flag(args, "--use-distributed-optimizer", path)
    used.add("--use-distributed-optimizer")
    grad_bf16 = _flag(args, "--grad-reduce-in-bf16", path) or (fp16 and not _flag(
        args, "--accumulate-allreduce-grads-in-fp32", path))
    used.add("--grad-reduce-in-bf16")
    rule = "mcore-distopt" if distopt else "mcore-ddp"
    r.set("--use-distributed-optimizer", distopt, "data_parallel", rule,
          "fp32 master weights and Adam state / dp x cp; the main-grad buffer whole" if distopt
          else "Megatron DDP: nothing sharded; gradients all-reduced in place in the main-grad buffer")
    # --gradient-accumulation-fusion is Megatron-LM's default (arguments.py: --no-gradient-accumulation-fusion
    # is store_false): the weight gradients written into main_grad by the GEMMs, TransformerEngine's cached
    # dummy weight gradients returned (the rule's option gradient_accumulation_fusion; megatron.py).
    fused = not _flag(args, "--no-gradient-accumulation-fusion", path)
    used.add("--no-gradient-accumulation-fusion")
    options = {**({"grad_reduce_in_bf16": True} if grad_bf16 else {}),
               **({"gradient_accumulation_fusion": True} if fused else {})}
    if grad_bf16:       # (each field carries the rule's whole options: a later field's table replaces it)
        r.set("--grad-reduce-in-bf16" if bf16 else "--fp16", True, "plugin_options",
              {rule: options}, "a 16-bit main-grad buffer")
    if fused:
        local = "; the local implementation's layers take TransformerEngine's dummy when it is installed, as in " \
            "NVIDIA's containers (megatron/core/tensor_parallel/layers.py)" \
            if str(args.get("--transformer-impl", "transformer_engine")) == "local" else ""
        how = ("the weight gradients go into main_grad from the GEMMs: TransformerEngine's cached dummy weight "
               "gradients priced (one 16-bit tensor per distinct weight shape), and with tied embeddings the "
               f"embedding's gradient as Megatron's hook makes it{local}")
        if "--no-gradient-accumulation-fusion" in args:
            r.set("--no-gradient-accumulation-fusion", False, "plugin_options", {rule: options}, how)
        else:
            r.default("--no-gradient-accumulation-fusion", "plugin_options", {rule: options},
                      f"{ARGS} (--no-gradient-accumulation-fusion is store_false: the fusion is on)", how)

    # --- parallelism -----------------------------------------------------------------------------
    r.set("--tensor-model-parallel-size", tp, "tp_size", tp)
    pp = _numeric(take("--pipeline-model-parallel-size", 1), "--pipeline-model-parallel-size", path)
    r.set("--pipeline-model-parallel-size", pp, "pp_size", pp)
    cp = _numeric(take("--context-parallel-size", 1), "--context-parallel-size", path)
    if cp > 1:
        r.set("--context-parallel-size", cp, "cp_size", cp)
        if str(take("--cp-comm-type", "p2p")) != "p2p":
            refuse("--cp-comm-type", "only ring (p2p) context parallelism is read", "p2p")
    ep = _numeric(take("--expert-model-parallel-size", 1), "--expert-model-parallel-size", path)
    if ep > 1:
        refuse("--expert-model-parallel-size", "expert parallelism needs --num-experts, which is not read yet")
    sp = _flag(args, "--sequence-parallel", path)
    used.add("--sequence-parallel")
    if tp > 1:
        r.set("--sequence-parallel", sp, "sequence_parallel", sp)
    elif sp:
        r.note("--sequence-parallel with tp 1 does nothing (Megatron turns it off)")
    vp = args.get("--num-layers-per-virtual-pipeline-stage")
    used.add("--num-layers-per-virtual-pipeline-stage")
    if vp is not None and pp > 1:
        vp = _numeric(vp, "--num-layers-per-virtual-pipeline-stage", path)
        chunks = L // (pp * vp)
        if chunks > 1:
            r.set("--num-layers-per-virtual-pipeline-stage", vp, "pipeline_schedule", "interleaved-1f1b")
            r.set("--num-layers-per-virtual-pipeline-stage", vp, "virtual_stages", chunks,
                  f"{L} layers / (pp {pp} x {vp}) = {chunks} model chunks per rank")
        else:
            r.note(f"--num-layers-per-virtual-pipeline-stage {vp}: one chunk per rank, plain 1F1B")
    if args.get("--pipeline-model-parallel-layout") is not None:
        refuse("--pipeline-model-parallel-layout", "a layout string (embedding, loss and MTP stages placed by hand) is "
               "not read")
    uneven = {n: args.get(n) for n in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
              if args.get(n) is not None}
    if uneven:
        # Megatron-Core's get_num_layers_to_build (megatron/core/transformer/transformer_block.py lines 103-145 at
        # MEGATRON_COMMIT): the first (last) stage builds the given count, the stages left split the layers left
        # evenly (divisible, else Megatron stops: transformer_config.py lines 2294-2345): the measured profile's
        # stage_layers, one count per pipeline stage.
        name = next(iter(uneven))
        if pp < 2:
            refuse(name, "uneven stages need --pipeline-model-parallel-size > 1", "leave it out with pp 1")
        if vp is not None and L // (pp * vp) > 1:
            refuse(name, "uneven stages with the virtual pipeline (model chunks per stage) are not read")
        for flag in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"):
            if _flag(args, flag, path):
                refuse(flag, "Megatron asserts it off with uneven stages (transformer_block.py)", "leave it out")
        first = _numeric(uneven["--decoder-first-pipeline-num-layers"], "--decoder-first-pipeline-num-layers", path) \
            if "--decoder-first-pipeline-num-layers" in uneven else None
        last = _numeric(uneven["--decoder-last-pipeline-num-layers"], "--decoder-last-pipeline-num-layers", path) \
            if "--decoder-last-pipeline-num-layers" in uneven else None
        left, stages = L - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if bool(left > 0) != bool(stages) or (stages and left % stages) or left < 0:
            raise InvalidInputError(name, uneven[name], f"first/last counts leaving {L} layers' rest divisible "
                                    f"by the {stages} middle stages", f"{path}: Megatron refuses this split "
                                    "(transformer_config.py: the middle stages' layers must divide evenly)")
        middle = left // stages if stages else 0
        split = [first if first is not None and i == 0 else last if last is not None and i == pp - 1 else middle
                 for i in range(pp)]
        r.set("/".join(uneven), "/".join(str(v) for v in uneven.values()), "stage_layers", split,
              f"Megatron-Core's get_num_layers_to_build (transformer_block.py): {L} layers as {split} over pp {pp}")
        used.update(uneven)
    account = [f for f in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
               if f in args]
    used.update(account)
    account = [f for f in account if _flag(args, f, path)]
    if account and not uneven and pp > 1:
        # get_num_layers_to_build (transformer_block.py lines 146-200 at MEGATRON_COMMIT): the embedding (loss)
        # counted as one layer of the even split, the first (last) stage building one decoder layer fewer.
        if vp is not None and L // (pp * vp) > 1:
            refuse(account[0], "the embedding or loss counted in the split of model chunks (virtual pipeline) is "
                   "not read")
        total = L + len(account)
        if total % pp:
            raise InvalidInputError(account[0], True, f"a split of {total} layers divisible by pp {pp}",
                                    f"{path}: Megatron asserts num_layers % pipeline_model_parallel_size == 0")
        split = [total // pp] * pp
        split[0] -= "--account-for-embedding-in-pipeline-split" in account
        split[-1] -= "--account-for-loss-in-pipeline-split" in account
        r.set("/".join(account), True, "stage_layers", split, f"Megatron-Core's get_num_layers_to_build: {L} "
              f"layers and the {' and the '.join(f.split('-')[4] for f in account)} in the split: {split} over pp {pp}")
    elif account and pp == 1:
        r.note(f"{', '.join(account)} with pp 1: one stage builds every layer")

    # --- batch -----------------------------------------------------------------------------------
    micro = _numeric(take("--micro-batch-size", 1), "--micro-batch-size", path)
    r.set("--micro-batch-size", micro, "micro_batch_size", micro)
    if "--global-batch-size" in args:
        gb = _numeric(take("--global-batch-size"), "--global-batch-size", path)
        r.set("--global-batch-size", gb, "global_batch_size", gb)
    else:
        r.note("--global-batch-size absent: Megatron's default is micro-batch x dp (no accumulation)")

    # --- activations: recompute, dropout, attention ----------------------------------------------
    granularity = take("--recompute-granularity")
    method = take("--recompute-method")
    layers = take("--recompute-num-layers")
    if granularity in (None, "null"):
        r.default("--recompute-granularity", "activation_checkpointing", "none", f"{TC} (recompute_granularity=None)")
    elif granularity == "selective":
        modules = take("--recompute-modules")
        if modules not in (None, "core_attn", ["core_attn"]):
            refuse("--recompute-modules", "only the core attention is recomputed selectively here "
                   "(Megatron's default, core_attn); layernorm/mlp/moe module recompute is not modelled", "core_attn")
        r.set("--recompute-granularity", granularity, "activation_checkpointing", "selective",
              "Megatron's selective recompute: the core attention (softmax, dropout) recomputed")
    elif granularity == "full":
        r.set("--recompute-granularity", granularity, "activation_checkpointing", "full")
        n = _numeric(layers, "--recompute-num-layers", path) if layers is not None else 1
        if method == "block":
            r.set("--recompute-method", method, "checkpointed_layers", n,
                  f"the first {n} layers of each stage recomputed, the rest keep their activations")
        elif method == "uniform" and n != 1:
            refuse("--recompute-num-layers", "uniform recompute of groups of several layers (the group's layers "
                   "alive together in its recompute) is not modelled", "1 with --recompute-method uniform")
        elif method not in ("uniform", None):
            refuse("--recompute-method", "unknown recompute method", "uniform or block")
    else:
        refuse("--recompute-granularity", "unknown granularity", "full or selective")

    hidden_dropout = _float(take("--hidden-dropout", 0.1), "--hidden-dropout", path)
    attention_dropout = _float(take("--attention-dropout", 0.1), "--attention-dropout", path)
    if (hidden_dropout > 0) != (attention_dropout > 0):
        refuse("--attention-dropout" if attention_dropout > 0 else "--hidden-dropout",
               f"--hidden-dropout {hidden_dropout} with --attention-dropout {attention_dropout}: the measured Megatron "
               "layer keeps the hidden dropout masks (1 B x h per token, twice) and the attention dropout mask "
               "(1 B per score, unfused attention) together or not at all",
               "both zero or both non-zero")
    if "--hidden-dropout" not in args and "--attention-dropout" not in args:
        r.default("--hidden-dropout/--attention-dropout", "dropout", 0.1,
                  f"{TC} (hidden_dropout=0.1, attention_dropout=0.1)",
                  "1-byte masks: two hidden dropouts per layer, the attention dropout (unfused attention only)")
    elif hidden_dropout > 0:
        r.set("--hidden-dropout/--attention-dropout", [hidden_dropout, attention_dropout], "dropout",
              max(hidden_dropout, attention_dropout),
              "1-byte masks: two hidden dropouts per layer, the attention dropout (unfused attention only: "
              "flash attention regenerates it)")
    else:
        r.set("--hidden-dropout/--attention-dropout", [0.0, 0.0], "dropout", 0.0)

    backend = str(take("--attention-backend", "auto"))
    impl = str(take("--transformer-impl", "transformer_engine"))
    if impl not in ("transformer_engine", "local"):
        refuse("--transformer-impl", "unknown implementation", "transformer_engine or local")
    _read_env(r, env, args, impl, path, context)
    if impl == "local":
        # The local spec's core attention is Megatron's own DotProductAttention, unfused, whatever the backend
        # (NVIDIA/Megatron-LM d98e8a64 megatron/core/models/backends.py LocalSpecProvider.core_attention)
        if backend not in ("auto", "local", "unfused"):
            refuse("--attention-backend", "the local implementation has only Megatron's unfused DotProductAttention",
                   "auto, local or unfused with --transformer-impl local")
        r.set("--transformer-impl", impl, "attention", "eager",
              "the local spec's DotProductAttention (megatron/core/models/backends.py LocalSpecProvider): unfused, "
              "the s x s softmax output (16-bit), dropout mask and output kept per head")
    elif "--attention-backend" not in args:
        pass
    elif backend == "unfused" or backend == "local":
        r.set("--attention-backend", backend, "attention", "eager",
              "unfused attention: the s x s softmax output (16-bit), dropout mask and output kept per head")
    elif backend in ("auto", "flash", "fused"):
        r.set("--attention-backend", backend, "attention", "sdpa",
              "fused/flash attention: the output and the fp32 log-sum-exp, no s x s scores")
    else:
        refuse("--attention-backend", "unknown backend", "auto, flash, fused, unfused or local")
    if "--attention-backend" not in args and impl != "local":
        r.default("--attention-backend", "attention", "sdpa", f"{TC} (attention_backend=AttnBackend.auto: "
                  "TransformerEngine's fused/flash attention on Hopper/Ampere)")
    # The loss: Megatron-Core's vocabulary-parallel cross-entropy, fused or not (language_module.py
    # compute_language_model_loss). Both upcast the rank's logits shard once (.float()) and work it in place
    # into the softmax they save. The fused path's functions are decorated with jit_fuser, torch.compile from
    # PyTorch 2.2 (megatron/core/jit.py), and its compiled backward computes the one-hot subtraction on the
    # saved softmax into a fresh fp32 buffer beside the softmax and the bf16 gradient: loss='megatron_fused'.
    # The unfused path is not compiled and works in place (the fp32 gradient cast to the logits' dtype by
    # autograd beside the softmax): loss='megatron_vocab_parallel'.
    impl = args.get("--cross-entropy-fusion-impl", "native")
    if "--cross-entropy-fusion-impl" in args:
        used.add("--cross-entropy-fusion-impl")
    if _flag(args, "--cross-entropy-loss-fusion", path):
        if impl != "native":
            refuse("--cross-entropy-fusion-impl", "TransformerEngine's cross-entropy fusion is refused by Megatron "
                   f"itself at this commit ({ARGS} validate_args: 'disabled due to stability issues')", "native")
        r.set("--cross-entropy-loss-fusion", True, "loss", "megatron_fused", f"{LOSS_FUSED} "
              "(cross_entropy_fusion_impl native), torch.compile'd as Megatron runs it (megatron/core/jit.py: "
              "jit_fuser = torch.compile from PyTorch 2.2): the logits shard upcast once, the softmax made in place "
              "and saved; the compiled calculate_gradients computes the one-hot subtraction on the saved softmax "
              "into a fresh fp32 buffer (4 B per token x V/tp) beside the softmax and the bf16 gradient")
    else:
        r.default("--cross-entropy-loss-fusion", "loss", "megatron_vocab_parallel", f"{LOSS_UNFUSED} (vocab_"
                  "parallel_cross_entropy, cross_entropy_loss_fusion=False)", "the unfused vocabulary-parallel "
                  "cross-entropy, not compiled: the logits shard upcast once (.float()), max, exp and divide in "
                  "place, the softmax saved (4 B per token x V/tp), and in the backward the fp32 gradient made in "
                  "place and cast to the logits' dtype by autograd (2 B per token x V/tp) beside it")
    used.add("--cross-entropy-loss-fusion")

    # --- world -------------------------------------------------------------------------------------
    if "--nproc-per-node" in args and "--nnodes" in args:
        try:
            nodes = _numeric(args["--nnodes"], "--nnodes", path)
            per_node = _numeric(args["--nproc-per-node"], "--nproc_per_node", path)
            r.world["nodes"], r.world["gpus_per_node"] = ("--nnodes", nodes), ("--nproc_per_node", per_node)
        except InvalidInputError:
            r.note("torchrun's --nproc_per_node/--nnodes are shell variables here: give --gpus")

    # --- every other key: ignored (listed) or refused ---------------------------------------------
    for key in args:
        if key in used or any(f.key.split("/")[0] == key for f in r.fields):
            continue
        if key.startswith(IGNORED_PREFIXES):
            r.ignore(key)
            continue
        raise InvalidInputError(key, args[key], "a Megatron argument this reader knows (docs/launch-megatron.md)",
                                f"{path}: {key} is not read; it is refused rather than dropped, as it may change "
                                "memory")
    return r.done()


# --- the format ----------------------------------------------------------------------------------

def _model_args(document):
    if isinstance(document, dict):
        if isinstance(document.get("MODEL_ARGS"), dict):
            return document["MODEL_ARGS"]
        if document and all(isinstance(k, str) and k.startswith("--") for k in document):
            return document
    return None


def read_mapping(args: dict, path, context=None):
    """A ``LaunchReading`` of a ``{--flag: value}`` mapping (the Megatron-Bridge reader,
    ``megatron_bridge.py``, builds one from a resolved ConfigContainer)."""
    return _read(_normalise_mapping(args, path), path, context)


def recognizes(path, document) -> bool:
    if _model_args(document) is not None:
        return True
    return isinstance(document, str) and "--num-layers" in document


def read(path, document, context):
    args = _model_args(document)
    if args is not None:
        env = document.get("ENV_VARS") if "MODEL_ARGS" in document else None
        if env is not None and not isinstance(env, dict):
            raise InvalidInputError("ENV_VARS", env, "a mapping of environment variables", str(path))
        for key in document:
            if "MODEL_ARGS" in document and key not in ("MODEL_ARGS", "ENV_VARS", *HARNESS_KEYS):
                raise InvalidInputError(key, document[key], f"MODEL_ARGS, ENV_VARS or the harness's keys "
                                        f"({', '.join(HARNESS_KEYS)})", f"{path}: {key} is not read; it is refused "
                                        "rather than dropped, as it may change memory")
        return _read(_normalise_mapping(args, path), path, context, env,
                     harness=[k for k in document if k in HARNESS_KEYS])
    return read_arguments(document, path=path, context=context)     # a launch script's text (parse_launch_file)


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(
        name="megatron-args", framework="Megatron-LM",
        description="pretrain_gpt.py arguments: a functional-test/--yaml-cfg MODEL_ARGS YAML, or an argument list",
        suffixes=(".yaml", ".yml", ".args", ".sh"), recognizes=recognizes, read=read)]
