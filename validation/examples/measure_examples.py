#!/usr/bin/env python
"""Measure real training iterations for the three example plugin packages (examples/plugins/).

    python3 -m venv /tmp/valvenv
    /tmp/valvenv/bin/pip install -r validation/requirements.txt       # torch==2.13.0 (CPU), transformers==5.23.0
    /tmp/valvenv/bin/pip install --no-deps adam-mini==1.1.1            # pure Python; --no-deps keeps torch 2.13.0
    /tmp/valvenv/bin/python validation/examples/measure_examples.py --out validation/examples/measurements.json

Every run is the steady-state protocol of ``../harness.py`` (``run_protocol``: three iterations of
``zero_grad(set_to_none=True)``; ``loss = model(input_ids=ids, labels=ids, use_cache=False).loss``;
``backward``; ``step``; the third is measured) on the same model and regime as its baseline, so that the
difference is the technique's mechanism only:

* ``adam-mini``: the real ``adam_mini.Adam_mini`` optimizer (PyPI ``adam-mini``) instead of ``AdamW``.
  Baselines: AdamW foreach (what the estimator predicts exactly) and AdamW for-loop (a per-parameter loop,
  like Adam-mini's step). The optimizer state is listed tensor by tensor after the step. Once more with the
  LM head tied to the embedding (``gqa-tiny-tied``), against its own AdamW foreach baseline.
* ``fsdp2-*``: FSDP2 ``fully_shard(layer, reshard_after_forward=R)`` on every decoder layer, then on the root
  (``../parallel/measure_parallel.py``'s ``apply_fsdp``, torchtitan's order), one rank of W=8 under the fake
  process group, for R = True (ZeRO-3, the baseline), 2 and 4 (int: reshard to a group of R ranks after
  forward, the hpZ stand-in) and False (ZeRO-2). The bytes of FSDP2's post-forward (secondary) shards are
  also read directly from the FSDP parameters at every alive point.
* ``offload-*``: ``torch.autograd.graph.save_on_cpu(pin_memory=False)`` around the forward and the loss.
  On a CPU-only machine ``tensor.cpu()`` returns the tensor itself, so the real context manager moves
  nothing (``offload-save-on-cpu-literal`` shows it: same bytes as the baseline; its pack hook is wrapped to
  count what it receives). ``offload-save-on-cpu-simulated`` replicates save_on_cpu's hooks as they behave
  with a GPU: pack copies the saved tensor into a new "host" tensor made outside the tracker (host bytes,
  tallied by a ledger), so the "device" tensor is freed when nothing else holds it; unpack copies it back to
  a new "device" tensor (seen by the tracker, ``temp`` of the backward).

The model is ``gqa-tiny`` of ``../configs.py`` (fp32, SDPA, b=2, s=256): the configuration of
``single-gqa-tiny-fp32-b2-s256`` in ``../parallel/measurements.json``, which the estimator predicts to the
byte without plugins. The whole script takes 1.5-2.5 minutes on 2 cores. ``comparisons`` in the output puts
every run next to its baseline, phase by phase, with the closed-form deltas (``exact``: equal to the byte).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import sys
import time
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, VALIDATION)
sys.path.insert(0, os.path.join(VALIDATION, "parallel"))

import configs as _configs  # noqa: E402
import harness  # noqa: E402  (validation/harness.py)
import measure_parallel as _parallel  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

GENERATOR = ("/tmp/valvenv/bin/python validation/examples/measure_examples.py "
             "--out validation/examples/measurements.json")
SETUP = ("python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt && "
         "/tmp/valvenv/bin/pip install --no-deps adam-mini==1.1.1")

MODEL = "gqa-tiny"
B, S = 2, 256
WORLD = 8


def _config(id, technique, baseline_id, optimizer="adamw", optimizer_impl="foreach", tied=False, **extra) -> dict:
    cfg = _configs._cfg(id, MODEL, B, S, optimizer=optimizer, optimizer_impl=optimizer_impl)
    if tied:  # gqa-tiny with the LM head tied to the embedding
        cfg["model"] = MODEL + "-tied"
        cfg["hf_config"]["tie_word_embeddings"] = True
    cfg.update(technique=technique, baseline_id=baseline_id, **extra)
    return cfg


BASE = "baseline-gqa-tiny-fp32-adamw-foreach-b2-s256"
BASE_LOOP = "baseline-gqa-tiny-fp32-adamw-for-loop-b2-s256"
BASE_TIED = "baseline-gqa-tiny-tied-fp32-adamw-foreach-b2-s256"
ADAM_MINI_KW = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "dim": 256, "n_heads": 8,
                "n_kv_heads": 2, "verbose": False}
FSDP_BASE = "fsdp2-gqa-tiny-fp32-w8-raf-true-b2-s256-r0"


def _fsdp_config(raf, rank=0) -> dict:
    name = {True: "true", False: "false"}.get(raf, str(raf))
    cfg = _parallel._cfg("fsdp2", MODEL, WORLD, rank, raf=True, b=B, s=S)
    cfg["layout"]["reshard_after_forward"] = raf
    cfg.update(id=f"fsdp2-gqa-tiny-fp32-w8-raf-{name}-b2-s256-r{rank}",
               technique="none (ZeRO-3 baseline)" if raf is True else
               ("none (ZeRO-2)" if raf is False else f"hpz-stand-in (reshard_after_forward={raf})"),
               baseline_id=None if raf is True else FSDP_BASE,
               checkpointing="none", dropout=0.0, sweep=None)
    return cfg


RUNS = [
    _config(BASE, "none (baseline)", None),
    _config(BASE_LOOP, "none (baseline, per-parameter loop)", BASE, optimizer_impl="for-loop"),
    _config("adam-mini-gqa-tiny-fp32-b2-s256", "adam-mini", BASE, optimizer="adam-mini", optimizer_impl="for-loop",
            optimizer_kwargs=ADAM_MINI_KW),
    _config(BASE_TIED, "none (baseline, tied embeddings)", None, tied=True),
    _config("adam-mini-gqa-tiny-tied-fp32-b2-s256", "adam-mini (tied embeddings)", BASE_TIED, optimizer="adam-mini",
            optimizer_impl="for-loop", tied=True, optimizer_kwargs=ADAM_MINI_KW),
    _fsdp_config(True),
    _fsdp_config(2),
    _fsdp_config(2, rank=WORLD - 1),
    _fsdp_config(4),
    _fsdp_config(False),
    _config("offload-save-on-cpu-literal-gqa-tiny-fp32-b2-s256", "torch.autograd.graph.save_on_cpu(pin_memory=False) "
            "as is (a no-op on a CPU-only machine)", BASE),
    _config("offload-save-on-cpu-simulated-gqa-tiny-fp32-b2-s256", "save_on_cpu(pin_memory=False) as on a GPU "
            "(pack: copy to an untracked host tensor; unpack: copy back to a tracked device tensor)", BASE),
]


# --------------------------------------------------------------------------- shapes
def shapes(hf: dict) -> dict:
    h, L, a, kv, f, V = (hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"],
                         hf["num_key_value_heads"], hf["intermediate_size"], hf["vocab_size"])
    hd = h // a
    layer = h * h + 2 * kv * hd * h + h * h + 3 * h * f + 2 * h
    return {"h": h, "L": L, "a": a, "kv": kv, "head_dim": hd, "h_kv": kv * hd, "f": f, "V": V,
            "tied": hf["tie_word_embeddings"], "b": B, "s": S, "T": B * S,
            "P_layer": layer, "P_root": V * h * (1 if hf["tie_word_embeddings"] else 2) + h,
            "P": layer * L + V * h * (1 if hf["tie_word_embeddings"] else 2) + h,
            "N_tensors": 9 * L + (2 if hf["tie_word_embeddings"] else 3)}


# --------------------------------------------------------------------------- single-device runs
class LayerPeakTracker(harness.PhaseMemTracker):
    """``../harness.py``'s tracker, also recording the forward's peak over the ops run inside a decoder layer
    (ModTracker's active modules include ``...layers.N``): what the layers' forward holds at most. (Not in the
    backward, where ModTracker's module attribution can be stale, see ../README.md.)"""

    def reset_phase_stats(self) -> None:
        super().reset_phase_stats()
        self.layer_peaks: dict[str, dict] = {}

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        if self.phase != "forward" or not any(".layers." in p for p in self._mod_tracker.parents):
            return
        for dev_snap in self._curr_mem_snap.values():
            tot = dev_snap[harness.TOTAL]
            lp = self.layer_peaks.get(self.phase)
            if lp is None or lp["bytes"] < tot:
                self.layer_peaks[self.phase] = {"bytes": int(tot), "by_category": harness._cats(dev_snap),
                                                **self._where()}


def _make_optimizer(run):
    cfg, model = run.cfg, run.model
    if cfg["optimizer"] == "adam-mini":
        from adam_mini import Adam_mini

        kw = dict(cfg["optimizer_kwargs"])
        kw["betas"] = tuple(kw["betas"])
        return Adam_mini(model.named_parameters(), **kw)
    return harness.build_optimizer(run.params, cfg["optimizer"], cfg["optimizer_impl"])


def measure_single(cfg, forward_ctx=None, extra_point=None, after=None, setup=None) -> dict:
    """The harness's protocol and records, with the optimizer of ``cfg`` and ``forward_ctx(mt)`` (a
    context-manager factory) around the forward and the loss. ``extra_point()`` adds fields to every alive
    point; ``after(mt, model, optimizer)`` returns more fields for ``measured``."""
    with harness.training_run(cfg, optimizer=_make_optimizer, tracker=LayerPeakTracker) as run:
        model, optimizer, mt = run.model, run.optimizer, run.mt
        if setup:
            setup(mt, model)

        def point():
            d = harness._point(mt)
            if extra_point:
                d.update(extra_point())
            return d

        ctx = (lambda: forward_ctx(mt)) if forward_ctx else contextlib.nullcontext
        alive, t_measured = harness.run_protocol(mt, model, optimizer, run.input_ids, autocast=ctx, point=point)
        t_end = time.perf_counter()
        measured = {
            **harness.peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": harness.layer_forward_deltas(mt, run.layers),
            "forward_peak_inside_decoder_layers": {k: v for k, v in mt.layer_peaks.get("forward", {}).items()
                                                   if k not in ("in_backward_pass", "phase")},
            "module_snapshots": {n: harness._mod_totals(mt, m) for n, m in run.named.items() if m is not None},
            **harness.parameter_facts(model, list(model.parameters())),
            "trainable_parameters": int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
            "attn_implementation": model.config._attn_implementation,
        }
        if after:
            measured.update(after(mt, model, optimizer))
        measured["wall_s"] = round(time.perf_counter() - run.t0, 1)
        measured["measured_iteration_wall_s"] = round(t_end - t_measured, 1)
        return measured


# --------------------------------------------------------------------------- Adam-mini
ADAM_MINI_KIND = [  # (kind as in the plugin, predicate on the lower-cased parameter name)
    ("embedding", lambda n: "embed" in n),
    ("output", lambda n: "lm_head" in n),
    ("query", lambda n: "q_proj" in n),
    ("key", lambda n: "k_proj" in n),
    ("value", lambda n: "v_proj" in n),
    ("attention output", lambda n: "o_proj" in n),
    ("mlp", lambda n: ".mlp." in n),
    ("norms", lambda n: "norm" in n),
]


def _nbytes(t) -> int:
    return int(t.untyped_storage().nbytes())


def adam_mini_state(mt, model, optimizer) -> dict:
    """What Adam-mini 1.1.1 keeps, tensor by tensor (after the measured step)."""
    per, blocks, m_bytes, v_bytes = [], {}, 0, 0
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        p = group["params"][0]
        st = optimizer.state[p]
        name = names[id(p)]
        if "head_per_gpu" in st:
            branch = "per head (wqk_names): vmean (heads, 1); m = zeros_like(p).view(-1, dim*dim/n_heads)"
        elif "neuron_per_gpu" in st:
            branch = "per output row (embd/output/wv/attn_proj/mlp names): vmean (rows, 1); m = zeros_like(p.grad)"
        elif "reduced" in st:
            branch = "one scalar for the tensor (other: norms): vmean = 0-dim; m = zeros_like(p)"
        else:
            branch = "Adam (bias): full v"
        m, v = st["m"], st.get("vmean", st.get("v"))
        kind = next(k for k, pred in ADAM_MINI_KIND if pred(name))
        blocks[kind] = blocks.get(kind, 0) + v.numel()
        m_bytes += _nbytes(m)
        v_bytes += _nbytes(v)
        per.append({"name": name, "shape": list(p.shape), "numel": p.numel(), "kind": kind, "branch": branch,
                    "m_shape": list(m.shape), "m_dtype": str(m.dtype).replace("torch.", ""), "m_bytes": _nbytes(m),
                    "v_shape": list(v.shape), "v_dtype": str(v.dtype).replace("torch.", ""), "v_blocks": v.numel(),
                    "v_bytes": _nbytes(v), "step": f"{type(st['step']).__name__} {st['step']}",
                    "weight_decay": group["weight_decay"]})
    tensors = sum(1 for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    return {"optimizer_class": f"{type(optimizer).__module__}.{type(optimizer).__name__}",
            "adam_mini_state": {
                "m_bytes": m_bytes, "v_bytes": v_bytes, "v_blocks": sum(blocks.values()),
                "v_blocks_by_kind": blocks, "state_tensors": tensors,
                "step_counter": "a Python int per parameter (state['step']), no tensor",
                "master_copy": "none: the parameters themselves are fp32 and are updated in place",
                "per_parameter": per}}


def adamw_state(mt, model, optimizer) -> dict:
    st = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"optimizer_state_tensors": len(st), "optimizer_state_bytes": int(sum(_nbytes(t) for t in st))}


# --------------------------------------------------------------------------- activation offload
class HostLedger:
    """What the pack hook was given in the measured forward (calls and numel*element_size bytes, by kind and by
    decoder layer / module) and, for the simulated save_on_cpu, the bytes of the host copies alive (a running
    total, freed when autograd drops the packed copy) and its peak per phase."""

    def __init__(self, mt, model):
        self.mt = mt
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.current = 0
        self.reset()

    def reset(self):
        self.peak_by_phase = {}
        self.packed = {"calls": 0, "bytes": 0, "by_kind": {}, "by_module": {}, "detail": []}

    def _module(self) -> str:
        parents = [p for p in self.mt._mod_tracker.parents if p != "Global"]
        inner = max(parents, key=lambda p: (p.count("."), len(p))) if parents else ""
        m = re.search(r"layers\.(\d+)", inner)
        return f"layers.{m.group(1)}" if m else (inner.split(".", 1)[1] if "." in inner else inner or "<outside>")

    def kind(self, t) -> str:
        if t.untyped_storage().data_ptr() in self.param_ptrs:
            return "parameter"
        return "activation" if t.is_floating_point() else f"other ({str(t.dtype).replace('torch.', '')})"

    def add(self, t, nbytes, live=True):
        k, mod = self.kind(t), self._module()
        self.packed["calls"] += 1
        self.packed["bytes"] += nbytes
        if not re.fullmatch(r"layers\.[1-9]\d*", mod):  # every pack of layer 0 and outside the layers
            self.packed["detail"].append({"module": mod, "kind": k, "shape": list(t.shape),
                                          "dtype": str(t.dtype).replace("torch.", ""), "bytes": nbytes})
        for key, d in ((k, self.packed["by_kind"]), (mod, self.packed["by_module"])):
            e = d.setdefault(key, {"calls": 0, "bytes": 0})
            e["calls"] += 1
            e["bytes"] += nbytes
        if not live:  # the literal save_on_cpu: counted, nothing allocated
            return
        self.current += nbytes
        ph = self.mt.phase
        self.peak_by_phase[ph] = max(self.peak_by_phase.get(ph, 0), self.current)

    def free(self, nbytes):
        self.current -= nbytes


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """torch's own save_on_cpu(pin_memory=False), its pack hook wrapped to count what it is given."""

    def __init__(self, ledger: HostLedger):
        super().__init__(pin_memory=False)
        pack = self.pack_hook

        def counting_pack(t):
            ledger.add(t, t.numel() * t.element_size(), live=False)
            return pack(t)

        self.pack_hook = counting_pack


class SimulatedSaveOnCpu(torch.autograd.graph.saved_tensors_hooks):
    """save_on_cpu as it behaves when the model is on a GPU: pack copies the saved tensor into a new host tensor
    (``torch.empty(size, dtype, layout)`` + ``copy_``, save_on_cpu's own code; ``tensor.cpu()`` allocates the
    same numel) made with the tracker's dispatch mode disabled, so it is host memory, counted by the ledger
    only; unpack copies it back into a new device tensor (``tensor.to(device)``), seen by the tracker."""

    def __init__(self, ledger: HostLedger):
        def pack(t):
            with _disable_current_modes():
                host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout)
                host.copy_(t)
            n = host.numel() * host.element_size()
            ledger.add(t, n)
            weakref.finalize(host, ledger.free, n)
            return (t.device, host)

        def unpack(packed):
            _device, host = packed
            return host.clone()  # the copy back to the device

        super().__init__(pack, unpack)


def measure_offload(cfg, simulated: bool) -> dict:
    holder = {}

    def setup(mt, model):
        ledger = holder["ledger"] = HostLedger(mt, model)
        reset = mt.reset_phase_stats

        def reset_both():  # run_protocol calls it once, just before the measured iteration
            reset()
            ledger.reset()

        mt.reset_phase_stats = reset_both

    def forward_ctx(mt):
        ledger = holder["ledger"]
        return SimulatedSaveOnCpu(ledger) if simulated else CountingSaveOnCpu(ledger)

    def extra_point():
        return {"host_bytes": holder["ledger"].current} if simulated else {}

    def after(mt, model, optimizer):
        led = holder["ledger"]
        rec = {"packed_in_measured_forward": led.packed}
        if simulated:
            rec["host_peak_by_phase"] = led.peak_by_phase
        return {"offload": rec}

    return measure_single(cfg, forward_ctx=forward_ctx, extra_point=extra_point, after=after, setup=setup)


# --------------------------------------------------------------------------- FSDP2 (hpZ stand-in)
def _secondary_bytes(model) -> dict:
    """Bytes of FSDP2's post-forward (secondary) shards alive now, read from the FSDP parameters."""
    total, per_unit = 0, {}
    for name, mod in model.named_modules():
        if not isinstance(mod, _parallel.FSDPModule):
            continue
        group = mod._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        n = sum(_nbytes(fp._sharded_post_forward_param_data) for fp in group.fsdp_params
                if getattr(fp, "_sharded_post_forward_param_data", None) is not None)
        total += n
        if n:
            per_unit[name or "<root>"] = n
    return {"secondary_shard_bytes": total, "secondary_shard_bytes_by_unit": per_unit}


def measure_fsdp(cfg) -> dict:
    return _parallel.measure_parallel(cfg, extra_point=_secondary_bytes)


# --------------------------------------------------------------------------- comparisons (no torch needed)
PHASES = ("forward", "backward", "optimizer")
POINTS = ("end_of_forward", "end_of_backward", "end_of_step")


def _phase_numbers(m: dict) -> dict:
    out = {f"peak_{ph}": m["peak_by_phase"][ph]["bytes"] for ph in PHASES}
    out.update({f"alive_{p}": m["alive"][p]["bytes"] for p in POINTS})
    out["peak"] = m["peak_bytes"]
    return out


def compare(runs: dict) -> list:
    """Per technique: each phase's measured bytes, the baseline's, the delta, and what a closed-form formula
    gives for the delta (``predicted_delta``) or for the bytes themselves (``predicted``); ``exact``: they
    agree to the byte. ``states`` = the run's own ``alive.after_zero_grad`` (parameters, optimizer state,
    input ids, RoPE buffer), which the estimator predicts exactly."""
    sh = shapes(runs[BASE]["hf_config"])
    h, L, a, kv, hkv, hd, f, V, s = (sh[k] for k in ("h", "L", "a", "kv", "h_kv", "head_dim", "f", "V", "s"))
    b, T, e = sh["b"], sh["T"], 4
    out = []

    def entry(run_id, base_id, formulas: dict, delta=None, absolute=None, extra=None, note=""):
        m, bm = runs[run_id]["measured"], runs[base_id]["measured"]
        mm, bb = _phase_numbers(m), _phase_numbers(bm)
        rows = {}
        for k in mm:
            r = rows[k] = {"measured": mm[k], "baseline": bb[k], "delta": mm[k] - bb[k]}
            if delta and k in delta:
                r.update(predicted_delta=delta[k], exact=delta[k] == r["delta"])
            if absolute and k in absolute:
                r.update(predicted=absolute[k], exact=absolute[k] == mm[k])
            if k in formulas:
                r["formula"] = formulas[k]
        out.append({"run": run_id, "baseline": base_id, "phases": rows, **(extra or {}), "note": note})

    # ---- Adam-mini vs AdamW (foreach, and for-loop for the step)
    same = ("peak_forward", "peak_backward", "alive_end_of_forward", "alive_end_of_backward", "alive_end_of_step",
            "peak")
    for am, base in (("adam-mini-gqa-tiny-fp32-b2-s256", BASE), ("adam-mini-gqa-tiny-tied-fp32-b2-s256", BASE_TIED)):
        t = shapes(runs[am]["hf_config"])
        outputs = 1 if t["tied"] else 2  # embedding, and the LM head if untied: one block per vocabulary row
        blocks = outputs * V + L * (a + kv + hkv + h + 2 * f + h) + 2 * L + 1
        state = 4 * blocks - 4 * t["P"] - 4 * t["N_tensors"]  # m kept; v: 4P -> 4 B/block; no step tensors
        am_transient = e * (2 * V * h + 3 * V)  # largest matrix (V rows): update, -update, 3 (V, 1) vectors
        s_f = ("4*blocks - 4*P - 4*N_tensors (Adam-mini state 4*P + 4*blocks, python-int steps; AdamW 8*P + "
               f"4*N_tensors), blocks = {outputs}V + L*(a + kv + h_kv + h + 2f + h) + 2L + 1")
        entry(am, base, {**{k: s_f for k in same},
                         "peak_optimizer": s_f + " + 4*(2*V*h + 3*V) [Adam-mini step transient] - 4*P [AdamW "
                                                 "foreach transient: _foreach_sqrt(exp_avg_sq)]"},
              delta={**{k: state for k in same}, "peak_optimizer": state + am_transient - 4 * t["P"]},
              extra={"adam_mini_blocks": blocks, "adam_mini_state_bytes": 4 * t["P"] + 4 * blocks,
                     "adam_mini_state_bytes_measured": runs[am]["measured"]["alive"]["end_of_step"]["by_category"][
                         "optimizer_state"],
                     "adamw_state_bytes": 8 * t["P"] + 4 * t["N_tensors"],
                     "adam_mini_step_transient_bytes": am_transient})
        if base == BASE:
            entry(am, BASE_LOOP, {"peak_optimizer": s_f + " + 4*(2*V*h + 3*V) - 4*(2*V*h + h) [AdamW for-loop "
                                                          "transient: max_i 2*n_i + n_(i-1), i = LM head, i-1 = final "
                                                          "norm]"},
                  delta={"peak_optimizer": state + am_transient - e * (2 * V * h + h)})

    # ---- hpZ stand-in: FSDP2 reshard_after_forward=int vs True (one rank of W=8; no padding: every dim 0 / 8)
    U = sh["P_layer"]
    for rid in [r for r in runs if r.startswith("fsdp2-") and r != FSDP_BASE]:
        raf = runs[rid]["layout"]["reshard_after_forward"]
        if raf is False:
            entry(rid, FSDP_BASE, {
                "peak_forward": "4*L*P_layer (every layer stays unsharded; the last all-gather buffer still lingers)",
                "alive_end_of_forward": "4*L*P_layer",
                "peak_backward": "4*(L-1)*P_layer (all layers unsharded; ZeRO-3 has the root + one layer's "
                                 "all-gather there)", "peak": "4*(L-1)*P_layer"},
                delta={"peak_forward": e * L * U, "alive_end_of_forward": e * L * U,
                       "peak_backward": e * (L - 1) * U, "peak": e * (L - 1) * U}, note="ZeRO-2, for reference")
            continue
        sec = e * L * U // raf
        f_ = (f"4*L*P_layer/{raf}: every layer's post-forward shard (its all-gathered parameters / {raf}) from the "
              "layer's post-forward to its pre-backward")
        zero = ("alive_end_of_backward", "alive_end_of_step", "peak_optimizer")
        entry(rid, FSDP_BASE, {**{k: f_ for k in ("peak_forward", "peak_backward", "peak", "alive_end_of_forward")},
                               **{k: "0" for k in zero}},
              delta={"peak_forward": sec, "peak_backward": sec, "peak": sec, "alive_end_of_forward": sec,
                     **{k: 0 for k in zero}},
              extra={"secondary_shard_bytes_at_end_of_forward":
                     runs[rid]["measured"]["alive"]["end_of_forward"]["secondary_shard_bytes"],
                     "secondary_formula_bytes": sec}, note=f"P_layer = {U}")

    # ---- activation offload
    lit = "offload-save-on-cpu-literal-gqa-tiny-fp32-b2-s256"
    sim = "offload-save-on-cpu-simulated-gqa-tiny-fp32-b2-s256"
    entry(lit, BASE, {}, delta={k: 0 for k in _phase_numbers(runs[BASE]["measured"])},
          note="on a CPU-only machine save_on_cpu's tensor.cpu() returns the tensor itself: nothing moves")
    sm = runs[sim]["measured"]
    states = sm["alive"]["after_zero_grad"]["bytes"]
    fwd_peak = states + e * 2 * T * V + e * T * h + 8 * b * (s + 1) + 8 * T + 8
    host_layer = e * (14 * T * h + 4 * T + 2 * T * hkv + T * a + 4 * T * f + 4 * s * hd) + e * U
    host_outside = (8 * T + e * (3 * T * h + 2 * T) + e * h + e * V * h + e * T * h
                    + 2 * e * T * V + 8 * T + 4)
    host = L * host_layer + host_outside
    in_layer = states + e * (3 * T * f + 4 * T * h + 2 * s * hd) + 8 * s
    entry(sim, BASE, {
        "alive_end_of_forward": "states + 4 (the loss: every saved tensor was copied out and its device copy freed)",
        "peak_forward": "states + 4*T*V (logits) + 4*T*V (fp32 log-softmax) + 4*T*h (final hidden state, still "
                        "referenced) + 8*b*(s+1) + 8*T (padded and shifted int64 labels) + 8",
        "peak_backward": "states + 3*4*T*V (nll/log-softmax grads + the unpacked log-softmax copy) + 8",
        "peak_optimizer": "baseline's (nothing saved)", "alive_end_of_backward": "baseline's",
        "alive_end_of_step": "baseline's", "peak": "= peak_backward"},
        absolute={"alive_end_of_forward": states + 4, "peak_forward": fwd_peak,
                  "peak_backward": states + 3 * e * T * V + 8, "peak": states + 3 * e * T * V + 8,
                  "peak_optimizer": runs[BASE]["measured"]["peak_by_phase"]["optimizer"]["bytes"],
                  "alive_end_of_backward": runs[BASE]["measured"]["alive"]["end_of_backward"]["bytes"],
                  "alive_end_of_step": runs[BASE]["measured"]["alive"]["end_of_step"]["bytes"]},
        extra={"host": {
            "measured_peak": sm["offload"]["host_peak_by_phase"].get("forward"),
            "measured_end_of_forward": sm["alive"]["end_of_forward"]["host_bytes"],
            "measured_end_of_backward": sm["alive"]["end_of_backward"]["host_bytes"],
            "predicted": host, "exact": host == sm["alive"]["end_of_forward"]["host_bytes"],
            "formula": "L*host_layer + 8*T (embedding indices) + 4*(3*T*h + 2*T) + 4*h (final norm) + 4*V*h + "
                       "4*T*h (LM head weight and input) + 2*4*T*V (log-softmax, saved twice) + 8*T + 4 (nll target, "
                       "total_weight); host_layer = 4*(14*T*h + 4*T + 2*T*h_kv + T*a + 4*T*f + 4*s*head_dim) + "
                       "4*P_layer",
            "host_layer": host_layer,
            "measured_host_layer": sm["offload"]["packed_in_measured_forward"]["by_module"]["layers.0"]["bytes"]},
            "forward_peak_inside_decoder_layers": {
                "measured": sm["forward_peak_inside_decoder_layers"]["bytes"], "predicted": in_layer,
                "exact": in_layer == sm["forward_peak_inside_decoder_layers"]["bytes"],
                "baseline": runs[BASE]["measured"]["forward_peak_inside_decoder_layers"]["bytes"],
                "formula": "states + 4*(3*T*f + 4*T*h + 2*s*head_dim) + 8*s (in flight at the MLP's act*up "
                           "of layer >= 1: act, up, product; embedding output, layer input, residual, MLP input; "
                           "RoPE cos, sin; int64 positions)"}},
        note="device side (host copies invisible to the tracker); host side in 'host'")
    return out


# --------------------------------------------------------------------------- main
def _environment() -> dict:
    def ver(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"setup": SETUP, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "adam-mini": ver("adam-mini"), "device": "cpu",
            "threads": torch.get_num_threads(),
            "process_group": "fake (torch.testing._internal.distributed.fake_pg.FakeStore) for the fsdp2 runs"}


def measure_run(cfg: dict) -> dict:
    if cfg["id"].startswith("fsdp2-"):
        return measure_fsdp(cfg)
    if cfg["id"].startswith("offload-"):
        return measure_offload(cfg, simulated="simulated" in cfg["id"])
    after = adam_mini_state if cfg["optimizer"] == "adam-mini" else adamw_state
    return measure_single(cfg, after=after)


def document(args, runs, ctx) -> dict:
    by_id = {r["id"]: r for r in runs}
    return {
        "generator": GENERATOR,
        "environment": _environment(),
        "model": {"id": MODEL, "hf_config": by_id[BASE]["hf_config"], "shapes": shapes(by_id[BASE]["hf_config"])},
        "total_wall_s": None if args.only else round(ctx.elapsed, 1),
        "runs": runs,
        "comparisons": compare(by_id),
    }


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=RUNS, measure_run=measure_run,
                 document=document, catch=False,
                 summary=lambda m: f"peak {m['peak_bytes']:>11,} B in {m['peak_phase']:<9} ({m['peak_op']}) "
                                   f"{m['wall_s']:5.1f}s",
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<56} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
