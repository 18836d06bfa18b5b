#!/usr/bin/env python
"""Checkpointing policies under tensor parallelism, one rank, every phase (issue 25 item 3).

    /tmp/polvenv/bin/python validation/parallel/policies/measure_policies.py --out validation/parallel/policies/measurements.json
    /tmp/polvenv/bin/python validation/parallel/policies/measure_policies.py --out ... --only ID [ID ...]   # merged
    /tmp/polvenv/bin/python validation/parallel/policies/measure_policies.py --list

Each run is ``../tp_plans/measure_tp_plans.py``'s (fake process group, FakeTensorMode build, its tracker that
skips DTensor's shape propagation, AdamW foreach, 3 iterations, the 3rd measured, MemTracker: local shards only)
with one change: after the plan is applied, the run's checkpointing policy is applied to every decoder layer
exactly as ``../../techniques/checkpointing/measure_checkpointing.py`` applies it on one device (imported:
torchtitan v0.2.2's op-SAC policy and save list through ``activation_checkpointing_enable(use_reentrant=False,
context_fn=create_selective_checkpoint_contexts(...))``, every-k through each layer's ``gradient_checkpointing``
flag, mlp-only / attention-only as a non-reentrant checkpoint around the module's forward; the TP hooks on
``self_attn`` / ``mlp`` stay outside it). torchtitan applies TP, then AC, then FSDP (parallelize.py): the
same order.

Plans (``../tp_plans``): ``torchtitan`` (sequence parallelism and loss parallelism: torchtitan's Llama-3
``apply_tp``) and ``megatron`` (the same layout without sequence parallelism: norms replicated, row-parallel
outputs all-reduced, vocabulary-parallel LM head and loss). Model ``llama-pol``: a Llama of h 1024, f 2816,
4 layers, 16 heads, 8 KV heads, V 8192 (small vocabulary so that the layers, not the logits, weigh), pure bf16,
b 1, s 2048. Needs torch==2.13.0 (CPU) and transformers==5.23.0.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PARALLEL = os.path.dirname(HERE)
VALIDATION = os.path.dirname(PARALLEL)
sys.path.insert(0, os.path.join(PARALLEL, "tp_plans"))
sys.path.insert(0, os.path.join(VALIDATION, "techniques", "checkpointing"))

import measure_tp_plans as tpl  # noqa: E402  (its tracker, plans, measure())
import measure_checkpointing as mc  # noqa: E402  (the policies as measured on one device)

mp = tpl.mp
torch = tpl.torch
harness = tpl.harness
configs = mp._configs

mp.MODELS["llama-pol"] = ("llama-gqa", configs._llama(1024, 2816, 4, 16, 8, 8192))

TORCHTITAN_AC_SRC = ("pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce) torchtitan/distributed/"
                     "activation_checkpoint.py (op SAC policy :98-128, layer SAC every k :24-49), torchtitan/models/"
                     "llama3/infra/parallelize.py :36-51 (_op_sac_save_list), apply order TP -> AC -> FSDP")

RUNS = [  # (plan, tp, policy, options)
    ("torchtitan", 2, "op-sac", {}), ("torchtitan", 4, "op-sac", {}),
    ("megatron", 2, "op-sac", {}), ("megatron", 4, "op-sac", {}),
    ("torchtitan", 2, "mlp-only", {}), ("megatron", 2, "mlp-only", {}),
    ("torchtitan", 2, "attention-only", {}), ("megatron", 2, "attention-only", {}),
    ("torchtitan", 2, "every-k", {"k": 2}), ("megatron", 2, "every-k", {"k": 2}),
    ("torchtitan", 2, "none", {}), ("megatron", 2, "none", {}),
]


def build_configs() -> list[dict]:
    out = []
    for plan, tp, policy, options in RUNS:
        c = tpl._cfg(plan, "llama-pol", tp, regime="bf16", b=1, s=2048, method="fake",
                     note="Llama h 1024 f 2816 L 4 a 16 kv 8 V 8192")
        c["id"] = f"{policy}-" + c["id"]
        c["checkpointing"] = policy
        c["policy_options"] = options
        c["checkpointing_source"] = TORCHTITAN_AC_SRC
        out.append(c)
    return out


FIRST_LAYER_BW = "backward_first_layer"
_BASE_TRACKER = tpl.Tracker


class PolicyTracker(_BASE_TRACKER):
    """``../tp_plans``' tracker with one more sub-phase of the backward, ``backward_first_layer``: the peak from
    the moment the gradient of the first decoder layer's output exists (a tensor hook on that output: no
    allocation of its own) to the embedding's backward (``backward_embedding``, ``../tp_phases``). It holds the
    first layer's backward, with its recompute under a checkpointing policy: the estimator's ``backward_end``
    phase is the larger of that moment and the embedding's."""

    def __init__(self) -> None:
        self._in_first = False
        super().__init__()

    @property
    def phase(self):
        return self._phase

    @phase.setter
    def phase(self, value):
        self._in_first = False
        _BASE_TRACKER.phase.fset(self, value)

    def first_layer_backward(self) -> None:
        if self._phase == "backward":
            self._in_first = True

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        if self._phase == "backward" and self._in_first and not self._in_emb_bw:
            for dev_snap in self._curr_mem_snap.values():
                tot = dev_snap[tpl.tpp.TOTAL]
                pp = self.phase_peaks.get(FIRST_LAYER_BW)
                if pp is None or pp["bytes"] < tot:
                    self.phase_peaks[FIRST_LAYER_BW] = {"bytes": tot, "snap": dict(dev_snap), **self._where()}
                    self._pending.add(FIRST_LAYER_BW)      # its provenance dumped after the op (../tp_phases)


def _mark_first_layer(model) -> None:
    """A tensor hook on the first decoder layer's output: tells the tracker its backward has begun."""
    _, layers = mp._decoder(model)

    def hook(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        if torch.is_grad_enabled() and out.requires_grad:
            out.register_hook(lambda grad: (tpl.tpp.ProvenanceTracker.last.first_layer_backward()
                                            if tpl.tpp.ProvenanceTracker.last is not None else None))
    layers[0].register_forward_hook(hook)


CONFIGS = build_configs()
assert len({c["id"] for c in CONFIGS}) == len(CONFIGS)


def measure(cfg: dict) -> dict:
    plan = tpl.PLANS[cfg["plan"]["name"]]
    orig_apply = plan["apply"]
    policy, options = cfg["checkpointing"], cfg["policy_options"]

    def apply(model, mesh):
        out = orig_apply(model, mesh)
        if policy != "none":
            mc.apply_policy(model, policy, options)
        _mark_first_layer(model)
        return out

    plan["apply"], orig_tracker = apply, tpl.Tracker
    tpl.Tracker = PolicyTracker      # measure_tp_plans.measure installs it by this global name
    try:
        return tpl.measure(cfg)
    finally:
        plan["apply"], tpl.Tracker = orig_apply, orig_tracker


def document(args, runs, ctx) -> dict:
    doc = tpl.document(args, runs, ctx)
    doc["generator"] = ("/tmp/polvenv/bin/python validation/parallel/policies/measure_policies.py --out "
                        "validation/parallel/policies/measurements.json")
    doc["environment"] = ("python3 -m venv /tmp/polvenv; /tmp/polvenv/bin/pip install -r validation/requirements.txt "
                          "(torch==2.13.0 CPU, transformers==5.23.0); fake process group (one rank: 0)")
    return doc


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--list", action="store_true")

    def before(args):
        if args.list:
            for c in CONFIGS:
                print(c["id"])
            return 0
        return None

    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, arguments=arguments, before=before, catch=False,
                        summary=lambda m: f"peak {m['peak_bytes'] / 2**30:8.3f} GiB in {m['peak_phase']:<9} "
                        + " ".join(f"{ph}={v / 2**30:.3f}" for ph, v in m["phase_peaks"].items())
                        + f" ({m['wall_s']}s)",
                        line=lambda n, t, c, msg: f"{c['id']:60} {msg}")


if __name__ == "__main__":
    sys.exit(main())
