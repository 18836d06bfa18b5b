"""float8 training: torchao's ``convert_to_float8_training`` (validated on the CPU) and
TransformerEngine FP8 under Megatron-Core (derived from its source, unvalidated).

``float8="tensorwise"`` / ``"rowwise"`` (torchao 0.18, ``Float8LinearConfig.from_recipe_name``):
every ``nn.Linear`` of the decoder layers becomes a ``Float8Linear``; the LM head is left in high
precision (the ``module_filter_fn`` torchtitan's float8 converter and the validation runs use),
and so are a Mixtral-style model's router and experts, which are no ``nn.Linear`` (a 2-D router
weight and grouped-mm expert tensors): only q/k/v/o are converted there.

What it changes in memory, derived from torchao/float8/float8_linear.py (0.18):

* **Saved activations: nothing.** ``matmul_with_hp_or_float8_args.forward`` calls
  ``ctx.save_for_backward(input_hp, weight_hp_t)`` before any cast (float8_linear.py line 45): the linear's high-precision input and a view of its weight are saved, exactly
  what ``nn.Linear`` saves. No fp8 activation and no fp8 weight copy outlives its matmul in eager
  mode (fp8 activations saved for backward need torch.compile's partitioner, not modelled).
* **Transient casts.** Each operand is cast on the fly by ``hp_tensor_to_float8_dynamic``
  (float8_scaling_utils.py): ``abs`` (freed once the amax is taken, float8_utils.py lines 65/69),
  then in ``_ToFloat8ConstrFunc.forward`` ``tensor.to(float32) * scale`` (float8_training_tensor.py
  line 153: 4 B/element, kept in a local), ``clamp`` (4 B) and ``.to(float8)`` (1 B; float8_utils.py
  lines 136-137): 9 bytes per element alive at the last op. The forward casts the input then the weight and runs the mm (its output in
  the compute dtype); the backward keeps its locals until it returns: grad_output in fp8 (dim 0),
  the weight in fp8, grad_input, grad_output in fp8 again (dim 1), then casts the input (9 B) and
  runs the weight-gradient mm. Tensorwise scales are fp32 scalars; rowwise ones one fp32 per row
  or column of each cast operand.
* So float8 raises a phase's peak only where a cast's temporaries exceed what the phase's usual
  peak holds that the cast's moment does not (the logits and cross-entropy at the forward's end
  and the backward's start). The terms below are those excesses, ``max(0, cast moment - the
  phase's modelled moment)``: the last layer's last converted linear in the forward, its first one
  in the backward, and the first layer's linears at the backward's end (approximate: said).

``added_step_time`` prices the casts' memory traffic, not the fp8 matmuls' speed-up.
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP, MemoryTerm

from . import term_keys as K
from .checkpointing import keeps_everything as _keeps_everything

TORCHAO = ("tensorwise", "rowwise")
TRANSFORMER_ENGINE = "transformer-engine"
CHOICES = TORCHAO + (TRANSFORMER_ENGINE,)
FAMILIES = ("llama", "mixtral")
UNVALIDATED = ("float8='transformer-engine' is unvalidated: derived from TransformerEngine's source "
               "(module/base.py, quantization.py, module/linear.py), never measured (TransformerEngine needs CUDA)")

# The model's post-layer terms at the loss (model.py model_activation_terms and the loss's, by key): the final
# norm's, the logits' (whole, every chunk's or one chunk's) and the cross-entropy's.
_POST_FORWARD = (K.FINAL_NORM, K.FINAL_NORM_OUTPUT, K.LOG_SOFTMAX, K.SHIFTED_LABELS, K.LOGITS, K.CHUNKS_LOGITS,
                 K.CHUNK_LOGITS)
_POST_BACKWARD = (K.FINAL_NORM, K.FINAL_NORM_OUTPUT, K.LOG_SOFTMAX, K.SHIFTED_LABELS, K.CE_BACKWARD)


def _n(x) -> str:
    return f"{x:,.0f}"


# --- options --------------------------------------------------------------------------------

def memory_named(registry, value):
    """``float8``: one of ``CHOICES`` (case ignored), or a name of the one list every entry point takes
    (``mlsysim_core.search.float8_names``: a registered float8 implementation's name, case and
    separators ignored) read as the memory it declares (``Float8Casts.memory``); ``check`` says what is
    wrong with anything else. A name the list does not hold is an error listing it and how each is
    read; an implementation that declares no memory is refused naming it."""
    if not isinstance(value, str) or value.strip().lower() in CHOICES:
        return value
    from mlsysim_core.registry import name_key
    from mlsysim_core.search import float8_names, float8_readings
    names = float8_names(registry)
    found = [n for n in names if name_key(n) == name_key(value)]
    if not found:
        raise InvalidInputError("float8", value, f"one of: {', '.join(names or CHOICES)}",
                                float8_readings(names) or None)
    _, memory = names[found[0]]
    if memory is None:
        raise NotModelledError("float8", value, "a name whose memory is modelled: " + ", ".join(
            n for n, (_, m) in names.items() if m is not None),
            f"the float8 implementation {found[0]!r} declares no memory (Float8Casts.memory): "
            f"`mlsysim-core time --float8 {found[0]}` times it")
    return memory


def also_named(registry) -> str | None:
    """What the ``float8`` option takes beyond ``CHOICES`` with these plugins installed (its flag's help;
    None: nothing more)."""
    from mlsysim_core.search import float8_names, float8_readings
    names = float8_names(registry)
    if len(names) <= len(CHOICES):
        return None
    return ("or a float8 implementation's name, as `time --float8` takes it, read as the memory it declares "
            f"({float8_readings(names)})")


def check(plan, value):
    """``float8``: validated and the plan's notes extended (``options.prepare``)."""
    if not isinstance(value, str):
        raise InvalidInputTypeError("float8", value, f"one of {', '.join(CHOICES)}, or None")
    key = value.strip().lower()
    if key not in CHOICES:
        raise InvalidInputError("float8", value, f"one of {', '.join(CHOICES)}, or None")
    o = plan.profile_options
    regime = o.regime
    if key == TRANSFORMER_ENGINE:
        if not regime.main_grad:
            raise NotModelledError("float8", key, "float8='transformer-engine' only with regime='mixed-bf16-main-grad'",
                                   "TransformerEngine FP8 is modelled inside Megatron-Core's layers only")
        if o.lora is not None:
            raise NotModelledError("float8", key, "no LoRA", "TransformerEngine FP8 with LoRA is not modelled")
        return attrs.evolve(plan, profile_options=attrs.evolve(o, float8=key), notes=plan.notes + (
            UNVALIDATED, "TransformerEngine FP8 (DelayedScaling): fp8 weight workspaces (data and transpose, "
                         "cached across micro-batches) and amax histories per quantizer are added; the linears' "
                         "saved inputs are still counted in 16 bits (an overestimate: TE saves them in fp8)"))
    family = o.architecture.name
    why = None
    parallel = plan.rank is not None or plan.tp_size * plan.pp_size * plan.cp_size * plan.ep_size * plan.dp_size > 1
    layout = (f"a parallel layout ({_layout(plan)}): float8 is validated on one device (fp8 all-gather under FSDP2, "
              "float8 tensor parallelism and float8 linears under ZeRO are not modelled)") if parallel else ""
    if regime.main_grad:
        why = "Megatron-Core's layers run TransformerEngine's FP8, not torchao's: use float8='transformer-engine'"
    elif regime.autocast:
        why = ("under autocast Float8Linear casts its input to torch.get_autocast_gpu_dtype() (float8_linear.py, "
               "forward) and keeps fp32 weights uncached: not measured, not modelled")
    elif regime.compute != regime.residual or regime.gather:
        why = (f"regime {regime.name!r}: float8 is modelled with pure bf16 or fp32 weights and activations "
               "(FSDP2's fp8 all-gather, enable_fsdp_float8_all_gather, is not modelled)")
    elif family not in FAMILIES:
        why = (f"the {family!r} family: float8 is modelled for Llama-style and Mixtral-style layers (which "
               "linears torchao converts and when their casts happen)")
    elif o.lora is not None:
        why = "LoRA with float8 linears is not modelled"
    elif not _keeps_everything(plan):     # declared, not named
        why = (f"activation_checkpointing={plan.activation_checkpointing!r}: the recomputed forward's casts "
               "are not modelled (measured without checkpointing only)")
    elif parallel:
        why = layout
    elif plan.gradient_accumulation_steps > 1:
        why = "gradient accumulation with float8 is not modelled (the backward's-end moment changes)"
    if why and parallel and why != layout:      # (a launch file's FSDP or ZeRO is named whatever refused first)
        why += "; and " + layout
    if why:
        raise NotModelledError("float8", key, "a single-device bf16 or fp32 run of a Llama- or Mixtral-style "
                               "model without checkpointing", why)
    note = (f"float8={key!r} (torchao convert_to_float8_training, LM head left in high precision"
            + (", router and experts stay in the weights' dtype: only q/k/v/o are Float8Linear" if family == "mixtral"
               else "") + "): saved activations unchanged (torchao saves the high-precision input); "
            "its casts' temporaries are added where they set a phase's peak")
    return attrs.evolve(plan, profile_options=attrs.evolve(o, float8=key), notes=plan.notes + (note,))


def _layout(plan) -> str:
    """The plan's parallel layout in words (a refusal names it): its sizes above 1 and its sharding rules."""
    sizes = [f"{axis} {n}" for axis, n in (("tp", plan.tp_size), ("pp", plan.pp_size), ("cp", plan.cp_size),
                                            ("ep", plan.ep_size), ("dp", plan.dp_size)) if n > 1]
    rules = [f"{axis}={rule}" for axis, rule in sorted((plan.rules or {}).items())
             if {"tp": plan.tp_size, "pp": plan.pp_size, "cp": plan.cp_size, "ep": plan.ep_size,
                 "dp": plan.dp_size}.get(axis, 1) > 1]
    out = " x ".join(sizes) or "one rank of a layout"
    if plan.zero_stage:
        out += f", ZeRO-{plan.zero_stage}"
    return out + (f", {', '.join(rules)}" if rules else "")


# --- what a launch file's torchao module filter may leave out -------------------------------------

def filter_left_out(model, *, first_linear: bool) -> str | None:
    """Why this option cannot express a torchao ``module_filter_fn`` that keeps, besides the LM head, the
    model's linears whose sizes are not multiples of 16 (accelerate's ``filter_linear_layers``) and, with
    ``first_linear``, the model's first ``nn.Linear`` (layer 0's q_proj: accelerate's default filter,
    ``find_first_last_linear_layers``, huggingface/accelerate@16cb6eb8 src/accelerate/utils/ao.py:32-143) in
    high precision; None when nothing modelled changes. ``model``: a TransformerWorkload.

    The option converts every decoder linear (the module docstring). A linear not a multiple of 16: it would
    cast nothing and every term is of converted linears: refused. Layer 0's q_proj: the forward term is the last
    layer's down_proj (o_proj for Mixtral); the backward's-end term is layer 0's largest cast moment, among which
    (Llama-style) q_proj's and o_proj's casts alone. With heads x head_dim == hidden both linears are hidden x
    hidden and ``_backward_cast`` gives them the same bytes, so leaving q_proj out changes no maximum (measured:
    validation/techniques/float8's ``-accelerate`` runs, every phase byte-identical to their twins). Otherwise
    (or Mixtral-style, whose o_proj is costed at another moment) q_proj's cast may be the maximum: refused."""
    h, heads = model.hidden_dim, model.heads
    if h is None or heads is None:
        return "the model's hidden size and heads are unknown (which linears the filter keeps cannot be told)"
    head_dim = model.head_dim or h // heads
    q, kv, ffn = heads * head_dim, (model.kv_heads or heads) * head_dim, model.ffn_dim or 4 * h
    odd = [f"{name} {n}" for name, n in (("hidden", h), ("heads x head_dim", q), ("kv_heads x head_dim", kv),
                                        ("ffn", ffn)) if n % 16]
    if odd:
        return (f"{', '.join(odd)} not a multiple of 16: the filter keeps those linears in high precision, the float8 "
                "option converts every decoder linear")
    if first_linear and (model.is_sparse or q != h):
        return ("the filter keeps the model's first nn.Linear (layer 0's q_proj) in high precision; the float8 option "
                "converts it, and here its cast may set the first layer's backward moment ("
                + ("a Mixtral-style layer" if model.is_sparse else f"heads x head_dim {q} != hidden {h}") + ")")
    return None


def check_compile(plan, value):
    """``compile``: refused whatever its value, with the reason (options.prepare)."""
    raise NotModelledError(
        "compile", value, "None",
        "torch.compile is not modelled: inductor fuses element-wise ops and AOTAutograd's min-cut partitioner "
        "chooses which tensors are saved for backward, so the op-by-op derivation of what autograd saves no "
        "longer holds; and it cannot be measured here: under MemTracker (a TorchDispatchMode) an inductor-compiled "
        "tiny Llama measured the eager run's bytes to the byte in every phase, with eager's unfused ops at the peaks "
        "(validation/techniques/float8/compile_probe.py; docs/validation.md, float8 and torch.compile)")


# --- torchao: the casts' moments ----------------------------------------------------------------

@attrs.frozen
class _Linear:
    name: str
    fan_in: int
    fan_out: int


def _linears(s):
    """The converted linears in forward order."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [_Linear("q_proj", s.hidden, q), _Linear("k_proj", s.hidden, kv), _Linear("v_proj", s.hidden, kv),
           _Linear("o_proj", q, s.hidden)]
    if not s.experts:
        out += [_Linear("gate_proj", s.hidden, s.ffn), _Linear("up_proj", s.hidden, s.ffn),
                _Linear("down_proj", s.ffn, s.hidden)]
    return out


def _forward_cast(lin, T, c, rowwise):
    """Peak bytes of one converted linear's forward above what was alive before it: the input cast
    (9 B/element), the weight cast beside the fp8 input, the mm beside both fp8 operands."""
    n_in, w = T * lin.fan_in, lin.fan_in * lin.fan_out
    scales = 4 * (T + lin.fan_out) if rowwise else 8
    return max(9 * n_in, n_in + 9 * w, n_in + w + c * T * lin.fan_out) + scales


def _backward_cast(lin, T, c, rowwise):
    """Peak bytes of one converted linear's backward above what was alive before it (its grad_output
    included): every cast's locals live until the backward returns."""
    g, n_in, w = T * lin.fan_out, T * lin.fan_in, lin.fan_in * lin.fan_out
    scales = 4 * (T + 2 * lin.fan_in + lin.fan_out) if rowwise else 16
    return max(9 * g, g + 9 * w, g + w + c * n_in + 9 * g, 2 * g + w + c * n_in + 9 * n_in,
               2 * g + w + c * n_in + n_in + c * w + g) + scales


def _backward_steps(linears, mixtral, T, c, gb, rowwise):
    """(name, bytes) of each modelled backward moment of a layer, above the alive bytes before its first
    converted linear's backward. Llama's MLP, as autograd runs it: down_proj (its casts); up_proj (down's
    weight gradient born, down's input and the product's saved silu and up outputs freed, the product's two
    input gradients alive: one is up's grad_output); gate_proj (up's gradient born, silu's saved gate output
    freed too, gate's grad_output from silu's backward and up's grad_input waiting to be summed with gate's).
    Mixtral: o_proj (its casts)."""
    by = {lin.name: lin for lin in linears}
    if mixtral:
        return [("o_proj", _backward_cast(by["o_proj"], T, c, rowwise))]
    down, up, gate = by["down_proj"], by["up_proj"], by["gate_proj"]
    w, f, h = down.fan_in * down.fan_out, down.fan_in, down.fan_out
    return [("down_proj", _backward_cast(down, T, c, rowwise)),
            ("up_proj", gb * w - c * T * f + _backward_cast(up, T, c, rowwise)),
            ("gate_proj", 2 * gb * w - 3 * c * T * f + c * T * h + _backward_cast(gate, T, c, rowwise))]


def torchao_terms(plan, placement, terms, lb) -> list[MemoryTerm]:
    """The casts' excess over each phase's modelled moment (see the module docstring)."""
    from .shapes import shape_of
    s = shape_of(plan)
    o = plan.profile_options
    regime = o.regime
    rowwise = o.float8 == "rowwise"
    T, h, c = plan.microbatch * plan.seq_len, s.hidden, regime.compute
    gb = regime.gradient or 4
    linears = _linears(s)
    mixtral = bool(s.experts)
    parts = {p.name: p.nbytes for p in lb.parts}
    mlp_parts = sum(p.nbytes for p in lb.parts if p.module == "mlp")
    mid_norm = parts.get("mid residual (post-attention norm input)", 0) + parts.get("post-attention norm", 0)
    out_last = lb.output if lb.output_saved_by_next else 0
    # Alive during the forward though nobody saves them in bf16 (the norms save fp32 copies): the layer's
    # input (the decoder loop's reference), the mid residual (after the attention's add), the embedding
    # output (LlamaModel.forward's ``inputs_embeds`` local, another tensor than the last layer's input when
    # L > 1). In fp32 each is saved by a norm and counted already. Position ids (int64, 1 x s) both ways.
    streams = (1 + (not mixtral) + (plan.model.layers > 1)) if not lb.output_saved_by_next else 0
    residual_alive = streams * c * T * h + 8 * plan.seq_len

    def post(keys, phase):
        return sum(t.nbytes for t in terms if phase in t.phases and t.key in keys)

    out = []
    # Forward: the last layer's last converted linear (down_proj; Mixtral: o_proj, before the MoE block).
    last = linears[-1]
    after = (mid_norm + mlp_parts) if mixtral else 0
    moment = residual_alive + _forward_cast(last, T, c, rowwise)
    gone = post(_POST_FORWARD, FORWARD) + out_last + after
    if moment > gone:
        out.append(MemoryTerm(
            component=ACTIVATIONS, label=f"float8 casts: last layer's {last.name} forward ({o.float8})",
            nbytes=moment - gone, phases=(FORWARD,),
            formula=f"{last.name} cast moment {_n(moment)} B (fp8 input, weight cast at 9 B/element, mm output"
                    f", residual streams and position ids) - the loss's {_n(gone)} B it precedes"))
    # Backward: the MLP's linears of the last layer (Mixtral: o_proj, after the MoE block's backward: its
    # saved tensors freed, its gradients born), each at its own moment, relative to the first one's.
    first = linears[-1]
    steps = _backward_steps(linears, mixtral, T, c, gb, rowwise)
    name, step = max(steps, key=lambda item: item[1])
    lm_head_grad = gb * s.embedding_parameters
    born = lm_head_grad + gb * h                       # LM head and final norm gradients
    if mixtral:
        moe = sum(wt.elements for wt in s.layer_weights() if wt.name not in ("q_proj", "k_proj", "v_proj", "o_proj"))
        born += gb * moe
    moment = born + c * T * h + step
    gone = post(_POST_BACKWARD, BACKWARD) + out_last + (after if mixtral else 0)
    if moment > gone:
        out.append(MemoryTerm(
            component=ACTIVATIONS, label=f"float8 casts: last layer's {name} backward ({o.float8})",
            nbytes=moment - gone, phases=(BACKWARD,),
            formula=f"LM head/final norm gradients {_n(born)} B + grad_output {_n(c * T * h)} B + {name}'s casts and "
                    f"the gradients/activations changed since {first.name} {_n(step)} B - the cross-entropy's moment "
                    f"{_n(gone)} B"))
    # End of the backward: layer 0's MLP linears (Mixtral: o_proj), against the modelled end (every gradient
    # but the embedding's, which is being computed, and the embedding output's gradient). At layer 0's first
    # converted linear, its saved tensors (less the MoE block's, freed) and the RoPE tables are alive, its
    # gradients (less the MoE block's) are not, nor the embedding's; the residual gradient stands where the
    # embedding output's will. Llama's attention linears (later, with most of the layer's gradients born
    # and its MLP activations freed) are costed with their casts alone (approximate, an upper bound on
    # their moments; their casts are the smaller ones).
    attention = sum(wt.elements for wt in s.layer_weights() if wt.name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    missing = gb * ((attention + h) if mixtral else s.layer_parameters())
    emb = gb * s.embedding_parameters
    rope = post((K.ROPE_TABLES,), BACKWARD)
    embedded = post((K.EMBEDDING_OUTPUT,), BACKWARD)
    first_moments = [st + lb.saved - after + rope + embedded - missing for _, st in steps]
    best = max(first_moments + [_backward_cast(lin, T, c, rowwise) for lin in linears
                                if lin.name in ("q_proj", "k_proj", "v_proj") or (lin.name == "o_proj" and not mixtral)])
    excess = best - emb
    if excess > 0:
        out.append(MemoryTerm(
            component=ACTIVATIONS, label=f"float8 casts: first layer's backward ({o.float8}, approximate)",
            nbytes=excess, phases=(BACKWARD_END,),
            formula=f"layer 0's largest cast moment {_n(best)} B over the backward's modelled end (saved tensors "
                    f"still alive less gradients not yet born) - the embedding gradient {_n(emb)} B not yet computed"))
    return out


# --- TransformerEngine (Megatron-Core), derived ------------------------------------------------

def transformer_engine_terms(plan, placement) -> list[MemoryTerm]:
    """TransformerEngine FP8 (DelayedScaling, TransformerEngine main at d0067d0):

    * each TE linear module allocates, per direction, ``scale`` (num_quantizers fp32) and
      ``amax_history`` (amax_history_len x num_quantizers fp32; quantization.py
      DelayedScalingRecipeState.__init__, lines 1436-1443), with 3 quantizers forward and 2 backward
      per GEMM (module/base.py line 1139); amax_history_len defaults to 1024
      (common/recipe/__init__.py line 255);
    * the weight is quantized each forward with its column-wise (transposed) copy when grad is
      enabled (module/linear.py lines 467-475) and, when Megatron passes ``is_first_microbatch``, kept
      in the module's ``_fp8_workspaces`` cache (linear.py lines 1958-1960, 2068-2071): 2 bytes per
      weight element (fp8 data and transpose) for every TE linear, alive throughout.

    Four TE linear modules per layer (QKV, projection, fc1, fc2) as Megatron-Core's GPT layer."""
    from .shapes import shape_of
    s = shape_of(plan)
    L = placement.layers_per_stage
    t = placement.tensor_shards
    matrices = sum(w.elements for w in s.layer_weights() if not w.bias and w.name not in ("router",)) / t
    history = 1024 * (3 + 2) * 4 + (3 + 2) * 4
    return [
        MemoryTerm(component=ACTIVATIONS, label="TransformerEngine fp8 weight workspaces (data + transpose, unvalidated)",
                   nbytes=2 * matrices * L, phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
                   formula=f"{L} layers x {_n(matrices)} matrix elements x 2 B (module/linear.py _fp8_workspaces)"),
        MemoryTerm(component=ACTIVATIONS, label="TransformerEngine amax histories and scales (unvalidated)",
                   nbytes=4 * L * history, phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
                   formula=f"{L} layers x 4 TE linears x (1024 x 5 + 5) x 4 B (amax_history_len 1024, 3 fwd + 2 bwd "
                           "quantizers)"),
    ]


def terms(plan, placement, model_terms, lb) -> list[MemoryTerm]:
    """float8's terms for ``model.model_activation_terms`` (called only when ``float8`` is set)."""
    if plan.profile_options.float8 == TRANSFORMER_ENGINE:
        return transformer_engine_terms(plan, placement)
    return torchao_terms(plan, placement, model_terms, lb)


# --- step time ---------------------------------------------------------------------------------

def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None, memory_bandwidth=None):
    """``(seconds or None, how)``: the casts' memory traffic per step over the memory bandwidth.

    Per converted linear and step (eager torchao): the forward casts input and weight, the backward
    grad_output twice, the weight and the input again; each cast reads the 16-bit tensor twice
    (``abs``/amax, then ``to(float32)``) and writes/reads 4-byte temporaries (the fp32 copy, the
    scaled tensor, the clamp) and 1 byte of fp8: about 2c + 4 + 4 + 4 + 4 + 4 + 1 = 25 bytes per
    element moved for c = 2. Bytes = 25 x sum over linears (2 x T x in + T x out x 2 + 2 x in x out).
    torch.compile fuses these casts (not priced); the fp8 matmuls' speed-up is not priced either."""
    from .shapes import shape_of
    o = plan.profile_options
    if o.float8 is None:
        return 0.0, "float8 off"
    if o.float8 == TRANSFORMER_ENGINE:
        return None, "TransformerEngine's fused cast kernels are not priced (unvalidated)"
    if not memory_bandwidth:
        from .technique_fit import given_as
        return None, f"needs the accelerator's memory bandwidth (bytes/s: {given_as('memory bandwidth B/s')})"
    s = shape_of(plan)
    T = plan.microbatch * plan.seq_len
    elements = sum(2 * T * lin.fan_in + 2 * T * lin.fan_out + 2 * lin.fan_in * lin.fan_out for lin in _linears(s))
    moved = 25 * elements * plan.model.layers * plan.gradient_accumulation_steps
    return moved / memory_bandwidth, (f"float8 casts: 25 B x {_n(elements)} cast elements x {plan.model.layers} layers "
                                      f"= {_n(moved)} B / memory bandwidth; the fp8 matmul speed-up is not priced")
