"""The one harness of every validation script (``validation/**/measure_*.py``): what PyTorch measures of
a training iteration, and how the measurements are written.

    import harness    # with validation/ on sys.path (the scripts put it there)

* **building**: a Hugging Face model from its config with random weights, on real CPU tensors or under
  ``FakeTensorMode`` (``build_model``; the fake-tensor patches of transformers below), the regimes
  (``fp32``, ``amp-bf16``: ``autocast_for``, ``bf16``), the optimizers (``build_optimizer``);
* **the iteration protocol** (``run_protocol``): two warm-up iterations (the first step creates the
  optimizer state), then the tracker is left and re-entered (which resets its peak) and the third
  iteration is measured; ``zero_grad(set_to_none=True)``, forward (model + loss), backward, step;
* **phase bookkeeping**: ``PhaseTracking`` mixed into ``MemTracker`` (``PhaseMemTracker``) or
  ``FSDPMemTracker`` records the peak of every phase (``forward``, ``backward``, ``optimizer``, ...)
  and where the peak happened (``peak_record``); the bytes alive at each point (``alive``);
* **the profiler's memory timeline** (``timeline_iteration``): the same protocol measured with
  ``torch.profiler.profile(profile_memory=True)`` instead of a dispatch mode, so that compiled code runs
  compiled (``MemTracker`` is a ``TorchDispatchMode``: Dynamo does not compile frames under it);
* **the JSON record and the CLI** (``main``): every configuration or ``--only ID ...`` merged into the
  existing file, the runs in the configurations' order, the environment and the regenerating command.

Needs ``torch==2.13.0`` (CPU build) and ``transformers==5.23.0`` (``validation/requirements.txt``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
import types
import warnings

VALIDATION = os.path.dirname(os.path.abspath(__file__))
if VALIDATION not in sys.path:
    sys.path.insert(0, VALIDATION)

import torch  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.utils.import_utils import is_fake_tensor  # noqa: E402

ENVIRONMENT = "python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt"

CATEGORY = {
    _MemRefType.PARAM: "parameter",
    _MemRefType.BUFFER: "buffer",
    _MemRefType.GRAD: "gradient",
    _MemRefType.ACT: "activation",
    _MemRefType.TEMP: "temp",
    _MemRefType.OPT: "optimizer_state",
    _MemRefType.OTH: "other",
}
TOTAL = "Total"

# --------------------------------------------------------------------------- HF patches for fake tensors
# Both make a fake run take the code path a real run of the same configuration takes; the real/fake twin
# configurations check that the two agree to the byte.
import transformers.masking_utils as _mu  # noqa: E402

_orig_find_packed = _mu.find_packed_sequence_indices


def _find_packed_sequence_indices(position_ids):
    # HF checks the *values* of position_ids to detect packed sequences; on fake tensors it cannot, assumes
    # packing and builds an explicit (b, 1, s, s) mask that a real run (SDPA, no padding) never builds.
    # Our inputs are never packed: return what a real run returns.
    if is_fake_tensor(position_ids):
        return None
    return _orig_find_packed(position_ids)


_mu.find_packed_sequence_indices = _find_packed_sequence_indices

try:  # Mixtral experts (transformers' default experts_implementation="grouped_mm")
    import transformers.integrations.moe as _moe

    _orig_can_use_grouped_mm = _moe._can_use_grouped_mm

    def _can_use_grouped_mm(input, weight, offs):
        # torch's meta (fake) kernel of grouped_mm accepts only bf16, while the CPU kernel runs fp32 too:
        # on fake fp32 weights use transformers' own grouped_mm custom op (same outputs, same saved tensors).
        if is_fake_tensor(weight) and weight.dtype != torch.bfloat16:
            return False
        return _orig_can_use_grouped_mm(input, weight, offs)

    _moe._can_use_grouped_mm = _can_use_grouped_mm
except (ImportError, AttributeError):  # pragma: no cover - other transformers versions
    _moe = None


@contextlib.contextmanager
def fake_scalar_values():
    """Let ``.item()`` / ``float()`` of a fake tensor return 1 (or 1.0, True) instead of raising.

    ``torch.optim.Adafactor`` reads scalars from tensors (``step``, parameter and update norms) to compute its
    step size; on fake tensors that raises ``DataDependentOutputException``. The values only change the
    arithmetic of the update, not which tensors are allocated, so the step's memory is the same (checked by the
    real/fake Adafactor twin). Used only around ``optimizer.step()`` of fake Adafactor runs.
    """
    from torch._subclasses import fake_impls

    ops = [torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default]
    saved = {op: fake_impls.op_implementations_dict[op] for op in ops}

    def _const(fake_mode, func, arg):
        if arg.dtype.is_floating_point:
            return 1.0
        return True if arg.dtype == torch.bool else 1

    for op in ops:
        fake_impls.op_implementations_dict[op] = _const
    try:
        yield
    finally:
        fake_impls.op_implementations_dict.update(saved)


# --------------------------------------------------------------------------- tracker
class PhaseTracking:
    """Mixed into MemTracker (and FSDPMemTracker in validation/parallel/): also records where (phase, op,
    module) the peak happens and the peak of each phase.

    The per-module PEAK_FW / PEAK_BW snapshots of the stock tracker cost O(#modules) per op; they are skipped
    (the per-module PRE/POST forward/backward snapshots are kept). The global peak is computed exactly as the
    stock tracker does: after every op, from the bytes of all live tracked storages.
    """

    def _phase_init(self) -> None:
        self.phase = "start"
        self._func = None
        self.reset_phase_stats()

    def reset_phase_stats(self) -> None:
        self.phase_peaks: dict[str, dict] = {}
        self.peak_where: dict | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._func = func
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _where(self) -> dict:
        parents = [p for p in self._mod_tracker.parents if p != "Global"]
        module = max(parents, key=lambda p: (p.count("."), len(p))) if parents else ""
        return {
            "phase": self.phase,
            "op": str(self._func) if self._func is not None else None,
            "module": module,
            "in_backward_pass": bool(self._mod_tracker.is_bw),
        }

    def _update_peak_stats(self, peak_state) -> None:  # noqa: ARG002 - signature of the base class
        for dev, dev_snap in self._curr_mem_snap.items():
            tot = dev_snap[TOTAL]
            if self._peak_mem.get(dev, 0) < tot:
                self._peak_mem[dev] = tot
                self._peak_mem_snap[dev] = dict(dev_snap)
                self.peak_where = self._where()
            pp = self.phase_peaks.get(self.phase)
            if pp is None or pp["bytes"] < tot:
                self.phase_peaks[self.phase] = {"bytes": tot, "snap": dict(dev_snap), **self._where()}


class PhaseMemTracker(PhaseTracking, MemTracker):
    def __init__(self) -> None:
        MemTracker.__init__(self)
        self._phase_init()


def _cats(dev_snap: dict | None) -> dict:
    dev_snap = dev_snap or {}
    return {name: int(dev_snap.get(ref, 0)) for ref, name in CATEGORY.items()}


def _one_device(snapshot: dict) -> dict | None:
    devs = [d for d in snapshot if torch.device(d).type == "cpu"]
    if len(snapshot) > 1:
        raise RuntimeError(f"tracked memory on several devices: {list(snapshot)}")
    return snapshot[devs[0]] if devs else None


def _point(mt: MemTracker) -> dict:
    snap = _one_device(mt.get_tracker_snapshot("current"))
    return {"bytes": int(snap[TOTAL]) if snap else 0, "by_category": _cats(snap)}


# --------------------------------------------------------------------------- building
def build_optimizer(params, name: str, impl: str) -> torch.optim.Optimizer:
    kw = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}[impl]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.0, **kw)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw)
    if name == "adafactor":
        if impl == "fused":
            raise ValueError("torch.optim.Adafactor has no fused implementation")
        return torch.optim.Adafactor(params, lr=1e-2, **kw)
    raise ValueError(f"unknown optimizer {name}")


def enable_checkpointing(model) -> None:
    """Hugging Face's full activation checkpointing (transformers 5: ``gradient_checkpointing_enable()`` is a
    deprecated alias of ``activation_checkpointing_enable()``: non-reentrant ``torch.utils.checkpoint`` around
    every decoder layer)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def hf_config_of(cfg: dict):
    kw = dict(cfg["hf_config"])
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


def build_model(cfg, apply_policy=None, dtype=None, prepare=None):
    """The config's Hugging Face model (seed 0, from its config with random weights, train mode) and its
    input ids. ``bf16``: the parameters are created in bf16 (``model.to(torch.bfloat16)`` after an fp32
    build gives the same parameters but fails on fake tensors: "_apply(): Couldn't swap
    Embedding.weight"); ``dtype`` overrides. ``checkpointing == "full"``: Hugging Face's activation
    checkpointing; another policy than ``"none"``: ``apply_policy(model, policy, cfg["policy_options"])``
    where one is given; ``prepare(model)`` before the checkpointing (a conversion: float8, ...). Called
    inside ``FakeTensorMode`` for a fake run."""
    torch.manual_seed(0)
    hf_config = hf_config_of(cfg)
    if dtype is None:
        dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
    model.train()
    if prepare is not None:
        prepare(model)
    policy = cfg.get("checkpointing", "none")
    if policy == "full":
        enable_checkpointing(model)
    elif policy != "none" and apply_policy is not None:
        apply_policy(model, policy, cfg["policy_options"])
    input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    return model, input_ids


def autocast_for(cfg):
    """The forward's autocast context factory: bf16 autocast on the CPU under ``amp-bf16``."""
    if cfg["regime"] == "amp-bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def _submodules(model) -> tuple[list, dict]:
    """The decoder layers and a few named modules whose forward/backward snapshots are recorded
    (any HF causal LM: its base model's ``layers`` or ``h``, its final norm by any of the usual names)."""
    base = model.base_model
    if hasattr(base, "language_model"):          # a multimodal wrapper (Gemma 3, Llama 4, Mistral 3)
        base = base.language_model
    if not hasattr(base, "layers") and not hasattr(base, "h") and hasattr(base, "model"):
        base = base.model                        # base_model_prefix names no attribute (Llama4ForCausalLM)
    layers = list(getattr(base, "layers", None) or getattr(base, "h"))
    norm = next((getattr(base, n) for n in ("norm", "ln_f", "final_layer_norm", "final_layernorm")
                 if getattr(base, n, None) is not None), None)
    named = {"embedding": model.get_input_embeddings(), "final_norm": norm, "lm_head": model.get_output_embeddings()}
    return layers, named


def _mod_totals(mt: MemTracker, module) -> dict:
    stats = mt.memory_tracking.get(module)
    if stats is None:
        return {}
    out = {}
    for state in (_ModState.PRE_FW, _ModState.POST_FW, _ModState.PRE_BW, _ModState.POST_BW,
                  _ModState.PRE_FW_AC, _ModState.POST_FW_AC):
        snaps = stats.snapshots.get(state)
        if snaps:
            dev = _one_device(snaps[0])
            out[state.value] = int(dev[TOTAL]) if dev else 0
    return out


# --------------------------------------------------------------------------- one configuration
def peak_record(mt, cats=None) -> dict:
    """The tracker's peak: bytes and categories, the phase, op and module it happened in,
    and each phase's own peak. ``cats(snapshot)``: the categories (default ``_cats``)."""
    cats = cats or _cats
    peak = _one_device(mt.get_tracker_snapshot("peak"))
    where = mt.peak_where or {"phase": "start", "op": None, "module": ""}
    return {
        "peak_bytes": int(peak[TOTAL]),
        "by_category_at_peak": cats(peak),
        "peak_phase": where["phase"],
        "peak_op": where["op"],
        "peak_module": where["module"],
        "peak_by_phase": {
            ph: {"bytes": int(v["bytes"]), "by_category": cats(v["snap"]), "op": v["op"], "module": v["module"]}
            for ph, v in sorted(mt.phase_peaks.items())
        },
    }


def layer_forward_deltas(mt, layers) -> list:
    """Bytes each layer's forward left alive (after minus before its forward; None if unseen)."""
    deltas = []
    for layer in layers:
        tot = _mod_totals(mt, layer)
        pre, post = tot.get(_ModState.PRE_FW.value), tot.get(_ModState.POST_FW.value)
        deltas.append(None if pre is None or post is None else post - pre)
    return deltas


def run_protocol(mt, model, optimizer, input_ids, *, autocast=contextlib.nullcontext,
                 scalars=contextlib.nullcontext, point=None, model_kwargs=None, microbatches=1):
    """Three training iterations inside the tracker ``mt``: two warm-ups (the first step
    creates the optimizer state), then the tracker is left and re-entered, which resets its
    peak to what is alive at that moment, and the third is the measured one. Returns the
    bytes alive at each point of the measured iteration and when it started.

    ``point()``: what is alive now (default: ``_point(mt)``); ``model_kwargs``: more inputs
    of the model's forward (e.g. position ids); ``microbatches`` = m > 1: gradient accumulation,
    m times ``(loss / m).backward()`` before the step, each micro-batch's forward and backward a
    phase of its own (``forward.0``, ``backward.0``, ``forward.1``, ...; the points likewise)."""
    alive: dict[str, dict] = {}
    point = point or (lambda: _point(mt))
    model_kwargs = model_kwargs or {}
    m = microbatches

    def iteration() -> None:
        alive["start"] = point()
        mt.phase = "zero_grad"
        optimizer.zero_grad(set_to_none=True)
        alive["after_zero_grad"] = point()
        for i in range(m):
            at = "" if m == 1 else f".{i}"
            if i:
                mt.reset_mod_stats()    # MemTracker's module records take one forward per module; peaks stay
            mt.phase = "forward" + at
            with autocast():
                loss = model(input_ids=input_ids, labels=input_ids, use_cache=False, **model_kwargs).loss
                if m > 1:
                    loss = loss / m
            alive["end_of_forward" + at] = point()
            mt.phase = "backward" + at
            loss.backward()
            del loss
            alive["end_of_backward" + at] = point()
        mt.phase = "optimizer"
        with scalars():
            optimizer.step()
        alive["end_of_step"] = point()
        mt.phase = "idle"

    with mt:  # warm-up: the first step creates the optimizer state
        iteration()
        mt.reset_mod_stats()
        iteration()
    mt.reset_mod_stats()
    mt.reset_phase_stats()
    t_measured = time.perf_counter()
    with mt:  # re-entering resets the tracker's peak to what is alive now
        mt.phase = "start"
        iteration()
    return alive, t_measured


def quant_state_storages(model) -> dict:
    """{storage data_ptr: bytes} of bitsandbytes' QuantState tensors (absmax, code tables, nested
    statistics): attributes of the packed weights, neither parameters nor buffers, so no tracker sees them."""
    quant = {}
    for mod in model.modules():
        qs = getattr(getattr(mod, "weight", None), "quant_state", None)
        if qs is None:
            continue
        for t in (qs.absmax, qs.code, getattr(qs, "offset", None),
                  getattr(getattr(qs, "state2", None), "absmax", None),
                  getattr(getattr(qs, "state2", None), "code", None)):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                quant[st.data_ptr()] = st.nbytes()
    return quant


# --------------------------------------------------------------------------- techniques
def load(name, path):
    """The file at ``path`` as a module named ``name`` (the harness folders are not packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def versions(*dists) -> dict:
    """torch's version and each distribution's (None where it is not installed)."""
    def ver(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"torch": torch.__version__, **{d: ver(d) for d in dists}}


class Nothing:
    """The training loop's ``zero_grad`` and ``step`` under optimizer-in-backward: nothing to do."""

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


def optimizer_in_backward(model, make_optimizer, mt_cell):
    """torchtune 0.6.1 ``torchtune/training/memory.py``: ``optim_dict = {p: Optimizer([p]) for p in
    model.parameters()}``; ``register_optim_in_bwd_hooks``: ``optim_step(param)`` =
    ``optim_dict[param].step(); optim_dict[param].zero_grad()`` on every trainable parameter's
    post-accumulate-grad hook. ``make_optimizer([p])`` builds one parameter's optimizer; the
    tracker in ``mt_cell`` (once there) enters ``backward_after_lm_head`` after the LM head's step."""
    optims = {p: make_optimizer([p]) for p in model.parameters() if p.requires_grad}
    head = model.get_output_embeddings().weight

    def step(param):
        optims[param].step()
        optims[param].zero_grad()
        if param is head and mt_cell and mt_cell[0].phase == "backward":
            # (for the record only: the backward's peak after the LM head's step, the layers' moments)
            mt_cell[0].phase = "backward_after_lm_head"

    for p in optims:
        p.register_post_accumulate_grad_hook(step)
    return list(optims.values())


class Examples:
    """validation/examples/measure_examples.py's save_on_cpu as it behaves with a GPU (``SimulatedSaveOnCpu``:
    pack copies each saved tensor into a host tensor made outside the tracker, tallied by ``HostLedger``;
    unpack copies it back to a new tracked "device" tensor), imported, not copied."""

    module = None

    @classmethod
    def get(cls):
        if cls.module is None:
            sys.path.insert(0, os.path.join(VALIDATION, "examples"))
            sys.path.insert(0, os.path.join(VALIDATION, "parallel"))
            cls.module = load("measure_examples", os.path.join(VALIDATION, "examples", "measure_examples.py"))
        return cls.module


class SimulatedSaveOnCpu:
    """The simulated ``save_on_cpu`` of one run: ``ctx()`` the offload context, ``point()`` the
    protocol's point with the ledger's current host bytes; ``attach(mt, model)`` makes the ledger
    once the tracker exists and resets it with the tracker's phase stats (``run_protocol`` resets
    them just before the measured iteration)."""

    def __init__(self, mt_cell):
        self.ex = Examples.get()
        self.mt_cell = mt_cell
        self.ledger = None

    def ctx(self):
        return self.ex.SimulatedSaveOnCpu(self.ledger)

    def point(self):
        d = _point(self.mt_cell[0])
        d["host_bytes"] = self.ledger.current
        return d

    def attach(self, mt, model):
        ledger = self.ledger = self.ex.HostLedger(mt, model)
        reset = mt.reset_phase_stats

        def reset_both():       # run_protocol calls it just before the measured iteration
            reset()
            ledger.reset()
        mt.reset_phase_stats = reset_both
        return ledger


class _BaseModelOffloaded(torch.nn.Module):
    """The training step's ``model(input_ids=..., labels=...)``, with the offload context around the base
    model only, as torchtune's recipes place ``activations_handling_ctx``: ``with ctx: logits =
    model(tokens)``, the output head excluded (``get_act_offloading_ctx_manager``'s NoOpManager on
    ``model.output``) and the loss computed outside. Same ops as Hugging Face's ``LlamaForCausalLM.forward``
    (``hidden = self.model(...)``; ``logits = self.lm_head(hidden)``; ``self.loss_function(...)``)."""

    def __init__(self, model, ctx):
        super().__init__()
        self.inner, self.ctx = model, ctx

    def forward(self, input_ids, labels, use_cache=False):
        m = self.inner
        with self.ctx():
            hidden = m.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        logits = m.lm_head(hidden)
        del hidden
        loss = m.loss_function(logits=logits, labels=labels, vocab_size=m.config.vocab_size)
        return types.SimpleNamespace(loss=loss)


def fold_backward_sub_phases(record):
    """The backward split at the LM head's step (``backward_after_lm_head``): both sub-phases kept in
    ``backward_sub_phases``, the backward's peak the larger, the peak phase named ``backward``."""
    phases = record["peak_by_phase"]
    sub = phases.get("backward_after_lm_head")
    if sub is not None:
        record["backward_sub_phases"] = {"backward_to_lm_head_step": phases.get("backward"),
                                         "backward_after_lm_head": phases.pop("backward_after_lm_head")}
        if "backward" not in phases or sub["bytes"] > phases["backward"]["bytes"]:
            phases["backward"] = sub
        if record["peak_phase"] == "backward_after_lm_head":
            record["peak_phase"] = "backward"


def fill_optimizer_phase(record, alive, module="(no op ran: the bytes alive at the step's end)"):
    """No op ran in the loop's step: what is alive at the step's end is the optimizer phase's bytes."""
    phases = record["peak_by_phase"]
    if "optimizer" not in phases:
        end = alive["end_of_step"]
        phases["optimizer"] = {"bytes": end["bytes"], "by_category": end["by_category"], "op": None,
                               "module": module}


def model_facts(model) -> dict:
    return {"parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_tensors": len(list(model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


def peak_summary(m) -> str:
    return f"peak {m['peak_bytes']:>12,} B in {m['peak_phase']:<9} ({m['peak_op']}) {m['wall_s']:5.1f}s"


def parameter_facts(model, params=None) -> dict:
    """``parameters`` (all), ``trainable_parameters`` and ``parameter_tensors`` (of ``params``, the optimizer's:
    AdamW keeps a 4-byte ``step`` tensor per tensor), ``parameter_dtype``."""
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    return {"parameters": int(sum(p.numel() for p in model.parameters())),
            "trainable_parameters": int(sum(p.numel() for p in params)),
            "parameter_tensors": len(params),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


@contextlib.contextmanager
def training_run(cfg, *, build=None, prepare=None, apply_policy=None, optimizer=None, tracker=None, track=None,
                 fake=None):
    """One configuration's model, optimizer and tracker, built as every script builds them: inside
    ``FakeTensorMode`` when ``cfg["method"] == "fake"`` (or ``fake``), warnings silenced; yields a namespace
    (``model``, ``input_ids``, ``params``, ``optimizer``, ``mt``, ``layers``, ``named``, ``t0``) and collects
    the garbage afterwards.

    ``build(cfg)``: (model, input_ids) instead of ``build_model``; ``prepare(model)``: ``build_model``'s (after
    ``train()``, before the checkpointing; after ``build`` where one is given); ``optimizer(run)`` (default: ``build_optimizer`` of ``run.params`` with the config's name and
    implementation; ``False``: none); ``tracker()`` (default ``PhaseMemTracker``; ``False``: none);
    ``track(run)``: what the tracker tracks (default ``model, optimizer, input_ids``)."""
    t0 = time.perf_counter()
    fake = cfg.get("method") == "fake" if fake is None else fake
    run = types.SimpleNamespace(t0=t0, cfg=cfg)
    with (FakeTensorMode() if fake else contextlib.nullcontext()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.model, run.input_ids = build(cfg) if build else build_model(cfg, apply_policy, prepare=prepare)
        if build and prepare is not None:
            prepare(run.model)
        run.params = [p for p in run.model.parameters() if p.requires_grad]
        if optimizer is False:
            run.optimizer = None
        elif optimizer is None:
            run.optimizer = build_optimizer(run.params, cfg["optimizer"], cfg["optimizer_impl"])
        else:
            run.optimizer = optimizer(run)
        run.layers, run.named = _submodules(run.model) if build is None else ([], {})
        run.mt = None
        if tracker is not False:
            run.mt = (tracker or PhaseMemTracker)()
            if track is not None:
                track(run)
            else:
                run.mt.track_external(run.model, run.optimizer, run.input_ids)
        try:
            yield run
        finally:
            run.__dict__.clear()
            gc.collect()


def measure(cfg: dict) -> dict:
    """``validation/measure.py``'s run (the schema of ``validation/configs.py``; also the families' and the
    parallel single-device baselines): the protocol in ``PhaseMemTracker`` and the full record."""
    with training_run(cfg) as run:
        mt, model = run.mt, run.model
        scalars = fake_scalar_values if cfg["method"] == "fake" and cfg["optimizer"] == "adafactor" \
            else contextlib.nullcontext
        alive, t_measured = run_protocol(mt, model, run.optimizer, run.input_ids, autocast=autocast_for(cfg),
                                         scalars=scalars)
        t_end = time.perf_counter()
        return {
            **peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": layer_forward_deltas(mt, run.layers),
            "module_snapshots": {name: _mod_totals(mt, m) for name, m in run.named.items() if m is not None},
            **parameter_facts(model, run.params),
            "attn_implementation": model.config._attn_implementation,
            "experts_implementation": getattr(model.config, "_experts_implementation_internal", None)
            if cfg["family"] == "mixtral" else None,
            "wall_s": round(t_end - run.t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }


# --------------------------------------------------------------------------- records and the CLI
def _versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def previous_runs(path: str, versions: dict, sections=("runs",)) -> tuple[dict, dict]:
    """The file a partial rerun (``--only``) is merged into: its runs by id, and the file
    itself ({} and {} when there is none); warns when it was measured with other package
    ``versions``."""
    if not os.path.exists(path):
        return {}, {}
    with open(path) as f:
        old = json.load(f)
    if {k: old.get(k) for k in versions} != versions:
        print("warning: merging into a file measured with other versions", file=sys.stderr)
    return {r["id"]: r for section in sections for r in old.get(section, [])}, old



def write_json(path, doc: dict, *, sort_keys: bool = True, newline: bool = True, atomic: bool = True) -> None:
    """``json.dump(doc, indent=1)`` to ``path`` (each script keeps its file's own format: sorted keys or
    not, a final newline or not); ``atomic``: through ``path.tmp`` and ``os.replace``."""
    path = str(path)
    tmp = path + ".tmp" if atomic else path
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=sort_keys)
        if newline:
            f.write("\n")
    if atomic:
        os.replace(tmp, path)


def mib_summary(width=10, decimals=1, op=True, wall=6):
    """The console line's measured part: ``peak X MiB in PHASE (OP) Ws``."""
    def summary(m) -> str:
        s = f"peak {m['peak_bytes'] / 2**20:{width}.{decimals}f} MiB in {m['peak_phase']:<9} "
        if op:
            s += f"({m['peak_op']}) "
        return s + f"{m['wall_s']:{wall}.1f}s"
    return summary


def error_record(run: dict, e: BaseException, tail: int = 6) -> str:
    """A failed configuration is kept with ``error`` and ``error_traceback_tail``; returns the console message."""
    run["error"] = f"{type(e).__name__}: {e}".strip()[:2000]
    run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-tail:]
    gc.collect()
    return "ERROR " + run["error"][:300]


def main(argv=None, *, description, configs, measure_run, document, out=None, summary=None, line=None,
         threads=None, keep_previous="only", versions=_versions, sections=("runs",), catch=True, incremental=False,
         sort_keys=True, newline=True, atomic=True, arguments=None, before=None, tail=6) -> int:
    """The command line of every measurement script: ``[--out FILE] [--only ID ...]``; measures every
    configuration (or those named by ``--only``, merged into the existing file) and writes the file.

    ``configs``: the configurations (a list, or ``configs(args)`` for those that depend on the arguments);
    ``measure_run(cfg)``: the ``measured`` record of one; ``document(args, runs, ctx)``: the file's dict (the
    header with environment and generator, ``runs`` = the runs in the configurations' order, ``ctx`` with
    ``elapsed``, ``previous`` (the old file), ``results`` (this invocation's runs)); ``out``: the default
    file (None: ``--out`` is required); ``keep_previous``: ``"only"`` (merge into the file with ``--only``),
    ``"always"``, ``"never"``; ``incremental``: the file is written after each run; ``catch``: a failing
    configuration is recorded with ``error`` (exit status 1) instead of stopping; ``arguments(ap)``: more
    arguments; ``before(args)``: returns an exit status to stop before measuring (``--list``, ...)."""
    ap = argparse.ArgumentParser(description=description)
    if arguments is not None:
        arguments(ap)
    ap.add_argument("--out", default=out, required=out is None and before is None,
                    help="the measurements JSON to write" + (f" (default {out})" if out else ""))
    ap.add_argument("--only", nargs="+", metavar="ID", help="measure only these configuration ids (merged into --out)")
    args = ap.parse_args(argv)
    if before is not None:
        status = before(args)
        if status is not None:
            return status
        if not args.out:
            ap.error("--out is required")
    cpus = os.cpu_count() or 1
    torch.set_num_threads(max(1, min(threads, cpus) if threads else cpus))
    all_configs = list(configs(args) if callable(configs) else configs)
    by_id = {c["id"]: c for c in all_configs}
    unknown = [i for i in args.only or () if i not in by_id]
    if unknown:
        ap.error(f"unknown configuration ids: {unknown}")
    todo = [c for c in all_configs if c["id"] in set(args.only)] if args.only else all_configs
    keep = {"only": bool(args.only), "always": True, "never": False}[keep_previous]
    previous, old = previous_runs(args.out, versions(), sections) if keep else ({}, {})
    summary = summary or mib_summary()
    line = line or (lambda n, total, cfg, msg: f"[{n:3d}/{total}] {cfg['id']:<52} {msg}")
    results: dict = {}
    t0 = time.perf_counter()

    def write() -> dict:
        runs = [results.get(c["id"]) or previous.get(c["id"]) for c in all_configs]
        ctx = types.SimpleNamespace(elapsed=time.perf_counter() - t0, previous=old, results=results)
        doc = document(args, [r for r in runs if r is not None], ctx)
        write_json(args.out, doc, sort_keys=sort_keys, newline=newline, atomic=atomic)
        return doc

    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        if catch:
            try:
                run["measured"] = m = measure_run(cfg)
                msg = summary(m)
            except Exception as e:  # record and go on
                msg = error_record(run, e, tail)
        else:
            run["measured"] = m = measure_run(cfg)
            msg = summary(m)
        results[cfg["id"]] = run
        print(line(n, len(todo), cfg, msg), flush=True)
        if incremental:
            write()
    if not incremental or not todo:
        doc = write()
        errors = [r["id"] for r in doc.get("runs", []) if r.get("error")]
        print(f"wrote {args.out}: {len(doc.get('runs', []))} runs, {len(errors)} errors, "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
    return 0 if all("error" not in r for r in results.values()) else 1


def technique_main(argv, *, description, configs, measure_run, out, generator, setup, versions, summary=peak_summary,
                   threads=None, id_width=44, incremental=False) -> int:
    """``main`` with the file format of the technique harnesses (``validation/techniques/*``): ``generator``,
    ``environment`` (= ``setup``), ``python``, the ``versions()``, ``device`` and the runs. A partial run
    (``--only``) keeps the file's other runs (``generator`` then says ``--only``); ``incremental``: the file's
    runs are always kept and the file is written after each run (``generator`` as given)."""
    def document(args, runs, ctx) -> dict:
        gen = generator + (" --only " + " ".join(args.only) if args.only and not incremental else "")
        return {"generator": gen, "environment": setup, "python": platform.python_version(), **versions(),
                "device": "cpu", "runs": runs}

    return main(argv, description=description, configs=configs, measure_run=measure_run, document=document,
                out=out, summary=summary, threads=threads, versions=versions, incremental=incremental,
                keep_previous="always" if incremental else "only", atomic=False,
                line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<{id_width}} {msg}")


# --------------------------------------------------------------------------- the profiler's memory timeline
PHASE_PREFIX = "phase::"


def profiled_iteration(model, optimizer, input_ids, *, autocast=contextlib.nullcontext, model_kwargs=None,
                       warmup=2):
    """The protocol (``warmup`` iterations, then the measured one) with no dispatch mode anywhere: the measured
    iteration's ``zero_grad(set_to_none=True)``, then its forward (model + loss, autocast exited), backward
    (``del loss`` included, as in ``run_protocol``) and step inside ``torch.profiler.profile(activities=[CPU],
    profile_memory=True, record_shapes=True)``, each phase in a ``record_function("phase::NAME")`` range
    (``forward``, ``backward``, ``optimizer``). Compiled code (a ``torch.compile``d model, loss or step) runs
    compiled: it compiles in the warm-ups. Returns the profiler; ``memory_timeline(prof)`` reads it.

    The profile starts after ``zero_grad``: the CPU allocator reports no free of a block allocated before
    profiling began ("Memory block of unknown size was allocated before the profiling started"), so the
    previous gradients' frees would be missing; after ``zero_grad`` nothing alive before is freed by the
    iteration (the step updates parameters and state in place). The timeline's zero is therefore what is
    alive after ``zero_grad``: parameters, buffers, optimizer state and the inputs."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model_kwargs = model_kwargs or {}

    def iteration(mark) -> None:
        with mark("forward"):
            with autocast():
                loss = model(input_ids=input_ids, labels=input_ids, use_cache=False, **model_kwargs).loss
        with mark("backward"):
            loss.backward()
            del loss
        with mark("optimizer"):
            optimizer.step()

    for _ in range(warmup):
        optimizer.zero_grad(set_to_none=True)
        iteration(lambda phase: contextlib.nullcontext())
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        iteration(lambda phase: record_function(PHASE_PREFIX + phase))
    return prof


def memory_timeline(prof, device_type: str = "cpu") -> dict:
    """Allocated bytes over time, rebuilt from the profiler's ``[memory]`` events (each allocation's
    ``nbytes`` > 0, each free < 0, in the order of their timestamps; those of ``device_type``), relative to
    what was allocated when profiling began (``profiled_iteration``: after ``zero_grad``): the ``peak_bytes``
    above it, the peak of each phase (``peak_by_phase``: the running total's maximum over the events inside
    the ``phase::NAME`` range, or its value at the range's start), the bytes alive at each phase's end
    (``alive``: ``end_of_forward``, ``end_of_backward``, ``end_of_step``), the phase of the peak, and the
    number of memory events."""
    events = prof.profiler.kineto_results.events()
    phases = sorted(((e.name()[len(PHASE_PREFIX):], e.start_ns(), e.start_ns() + e.duration_ns())
                     for e in events if e.name().startswith(PHASE_PREFIX)), key=lambda r: r[1])
    mem = sorted(((e.start_ns(), e.nbytes()) for e in events
                  if e.name() == "[memory]" and e.device_type().name.lower() == device_type), key=lambda r: r[0])
    where = {}
    total = peak = 0
    peak_phase = "start"
    alive = {}
    ends = {"forward": "end_of_forward", "backward": "end_of_backward", "optimizer": "end_of_step"}
    i = 0
    for name, start, end in phases:
        while i < len(mem) and mem[i][0] < start:      # between ranges (none in a protocol's iteration)
            total += mem[i][1]
            i += 1
        ph = total
        while i < len(mem) and mem[i][0] <= end:
            total += mem[i][1]
            i += 1
            ph = max(ph, total)
        where[name] = int(ph)
        if ph > peak:
            peak, peak_phase = ph, name
        if name in ends:
            alive[ends[name]] = int(total)
    outside = len(mem) - i
    return {"peak_bytes": int(peak), "peak_phase": peak_phase, "peak_by_phase": where, "alive": alive,
            "memory_events": len(mem), "memory_events_after_last_phase": outside}


def timeline_measure(cfg: dict, *, compile=False, compile_options=None, warmup=2) -> dict:
    """One configuration measured by the profiler's memory timeline (``profiled_iteration``, no tracker):
    the model built as ``training_run`` builds it (real tensors only), ``torch.compile(model,
    **compile_options)`` when ``compile``; the record of ``memory_timeline`` plus what was alive at the
    timeline's zero (``baseline_bytes``: the storages of parameters, buffers, optimizer state and inputs)."""
    if cfg.get("method", "real") != "real":
        raise ValueError("the profiler's timeline needs real tensors")
    with training_run(cfg, tracker=False) as run:
        model = torch.compile(run.model, **(compile_options or {})) if compile else run.model
        t0 = time.perf_counter()
        prof = profiled_iteration(model, run.optimizer, run.input_ids, autocast=autocast_for(cfg), warmup=warmup)
        wall = time.perf_counter() - t0
        tensors = [*run.model.parameters(), *run.model.buffers(), run.input_ids,
                   *(v for st in run.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        record = memory_timeline(prof)
        del prof
        return {**record, "baseline_bytes": int(sum(storages.values())), "compiled": bool(compile),
                "wall_s": round(wall, 1)}
