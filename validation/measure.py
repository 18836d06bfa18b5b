#!/usr/bin/env python
"""Measure the training-memory peak of every configuration in ``configs.py`` with PyTorch's own tracker.

    /tmp/valvenv/bin/python validation/measure.py --out validation/measurements.json [--only ID ...]

Needs ``torch==2.13.0`` (CPU build) and ``transformers==5.23.0`` (see README.md). For each configuration:
build ``AutoModelForCausalLM.from_config`` with random weights (under ``FakeTensorMode`` for ``method=fake``),
the optimizer, and run three training iterations (``zero_grad(set_to_none=True)``; forward with
``labels=input_ids`` so HF computes logits and the cross-entropy; ``backward``; ``step``) inside
``torch.distributed._tools.mem_tracker.MemTracker``. Iterations 1-2 warm up (optimizer state is created in the
first step); the tracker is then left and re-entered, which resets its peak, and iteration 3 is the measured
steady-state iteration.

With ``--only`` the named configurations are measured and merged into an existing ``--out`` file (the others
are kept as they are); without it every configuration is measured and the file is rewritten.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from configs import CONFIGS  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.utils.import_utils import is_fake_tensor  # noqa: E402

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
                 scalars=contextlib.nullcontext, point=None, model_kwargs=None):
    """Three training iterations inside the tracker ``mt``: two warm-ups (the first step
    creates the optimizer state), then the tracker is left and re-entered, which resets its
    peak to what is alive at that moment, and the third is the measured one. Returns the
    bytes alive at each point of the measured iteration and when it started.

    ``point()``: what is alive now (default: ``_point(mt)``); ``model_kwargs``: more inputs
    of the model's forward (e.g. position ids)."""
    alive: dict[str, dict] = {}
    point = point or (lambda: _point(mt))
    model_kwargs = model_kwargs or {}

    def iteration() -> None:
        alive["start"] = point()
        mt.phase = "zero_grad"
        optimizer.zero_grad(set_to_none=True)
        alive["after_zero_grad"] = point()
        mt.phase = "forward"
        with autocast():
            loss = model(input_ids=input_ids, labels=input_ids, use_cache=False, **model_kwargs).loss
        alive["end_of_forward"] = point()
        mt.phase = "backward"
        loss.backward()
        del loss
        alive["end_of_backward"] = point()
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


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf_kwargs = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(hf_kwargs.pop("model_type"), **hf_kwargs)
    fake = cfg["method"] == "fake"
    amp = cfg["regime"] == "amp-bf16"
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # bf16: the parameters are created in bf16 (``model.to(torch.bfloat16)`` after an fp32 build gives the
        # same parameters but fails on fake tensors: "_apply(): Couldn't swap Embedding.weight").
        dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
        model.train()
        if cfg["checkpointing"] == "full":
            # transformers 5: gradient_checkpointing_enable() is a deprecated alias of this one
            # (non-reentrant torch.utils.checkpoint around every decoder layer).
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
        input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
        layers, named = _submodules(model)

        mt = PhaseMemTracker()
        mt.track_external(model, optimizer, input_ids)
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
        scalars = fake_scalar_values if fake and cfg["optimizer"] == "adafactor" else contextlib.nullcontext
        alive, t_measured = run_protocol(mt, model, optimizer, input_ids, autocast=autocast, scalars=scalars)
        t_end = time.perf_counter()

        measured = {
            **peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": layer_forward_deltas(mt, layers),
            "module_snapshots": {name: _mod_totals(mt, m) for name, m in named.items() if m is not None},
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "trainable_parameters": int(sum(p.numel() for p in params)),
            "parameter_tensors": len(params),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "attn_implementation": model.config._attn_implementation,
            "experts_implementation": getattr(model.config, "_experts_implementation_internal", None)
            if cfg["family"] == "mixtral" else None,
            "wall_s": round(t_end - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, optimizer, input_ids, mt, params, layers, named
    gc.collect()
    return measured


# --------------------------------------------------------------------------- main
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="measurements JSON to write")
    ap.add_argument("--only", nargs="+", metavar="ID", help="measure only these configuration ids (merge into --out)")
    args = ap.parse_args(argv)

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    by_id = {c["id"]: c for c in CONFIGS}
    if args.only:
        unknown = [i for i in args.only if i not in by_id]
        if unknown:
            ap.error(f"unknown configuration ids: {unknown}")
        todo = [by_id[i] for i in args.only]
    else:
        todo = list(CONFIGS)

    previous = previous_runs(args.out, _versions())[0] if args.only else {}

    t0 = time.perf_counter()
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = measure(cfg)
            m = run["measured"]
            msg = (f"peak {m['peak_bytes'] / 2**20:10.1f} MiB in {m['peak_phase']:<9} "
                   f"({m['peak_op']}) {m['wall_s']:6.1f}s")
        except Exception as e:  # record and go on
            run["error"] = f"{type(e).__name__}: {e}".strip()[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = f"ERROR {run['error'][:200]}"
            gc.collect()
        results[cfg["id"]] = run
        print(f"[{n:3d}/{len(todo)}] {cfg['method']:<4} {cfg['id']:<58} {msg}", flush=True)
    elapsed = time.perf_counter() - t0

    runs = []
    for cfg in CONFIGS:  # file order = configs.py order
        if cfg["id"] in results:
            runs.append(results[cfg["id"]])
        elif cfg["id"] in previous:
            runs.append(previous[cfg["id"]])
    doc = {
        "generator": "/tmp/valvenv/bin/python validation/measure.py --out validation/measurements.json",
        "environment": "python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt",
        "python": platform.python_version(),
        **_versions(),
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "total_wall_s": None if args.only else round(elapsed, 1),
        "runs": runs,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, args.out)
    errors = [r["id"] for r in runs if r.get("error")]
    print(f"wrote {args.out}: {len(runs)} runs, {len(errors)} errors, {elapsed:.0f}s", flush=True)
    for i in errors:
        print(f"  error: {i}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
