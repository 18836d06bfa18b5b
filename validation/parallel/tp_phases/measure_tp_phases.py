#!/usr/bin/env python
"""Every phase of one tensor-parallel rank (no SP) of a Llama-3-8B-shaped model, pure bf16, b=1, s=2048.

    python3 validation/parallel/tp_phases/measure_tp_phases.py --out validation/parallel/tp_phases/measurements.json

Reuses ``../measure_parallel.py`` unchanged: its configuration record (``_cfg``), fake process group, DTensor TP plan
(``apply_tp``, sp=False), ``FakeTensorMode`` build, tracker (``PhaseMemTracker``) and protocol (3 iterations, the
3rd measured). The only addition is a subclass of its tracker (installed as ``measure_parallel.PhaseMemTracker``) that
also records, for every live storage, where it was created (phase, aten op, innermost module, shape, dtype), and
dumps that provenance (a) at each phase's peak and (b) at each phase boundary (= alive at end of forward / backward /
step), plus per-module PRE/POST forward/backward snapshots (by category) of the embedding, each decoder layer, the
final norm and the LM head. Needs torch==2.13.0 (CPU) and transformers==5.23.0 (validation/requirements.txt).

Llama-3-8B shapes (h 4096, f 14336, 32 heads, 8 KV heads, V 128256, untied) with L = 2, 4 and 32 decoder layers (2
and 4 separate the per-layer from the layer-independent part; 32 is the real depth), tp = 2, 4, 8, rank 0 (TP ranks are
identical, see ../README.md).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
PARALLEL = os.path.dirname(HERE)
sys.path.insert(0, PARALLEL)

import measure_parallel as mp  # noqa: E402  (puts validation/ on sys.path, imports configs, harness)
import harness  # noqa: E402  (validation/harness.py)

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.distributed._tools.common_utils import get_untyped_storages  # noqa: E402
from torch.distributed._tools.mem_tracker import _ModState  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

configs = mp._configs
TOTAL = mp.TOTAL
LAYERS = (2, 4, 32)
TPS = (2, 4, 8)
B, S = 1, 2048
EMB_BW = "backward_embedding"


def _model_name(layers: int) -> str:
    return f"llama-3-8b-L{layers}"


for _L in LAYERS:
    _d = dict(configs.LLAMA3_8B)
    _d["num_hidden_layers"] = _L
    mp.MODELS[_model_name(_L)] = ("llama-gqa", _d)


def _cat_name(reftype) -> str:
    return mp.MEM_CATEGORY.get(reftype, str(reftype))


class ProvenanceTracker(mp.PhaseMemTracker):
    """PhaseMemTracker + where each storage was created + provenance dumps at phase peaks and boundaries."""

    last = None

    def __init__(self) -> None:
        self._phase = "start"
        self._in_emb_bw = False
        self._pending = set()
        self.boundary: dict[str, list] = {}
        self.peak_dump: dict[str, list] = {}
        super().__init__()
        ProvenanceTracker.last = self

    # phase boundaries: run_protocol sets mt.phase; what is alive when it changes is the previous phase's end
    @property
    def phase(self):
        return self._phase

    @phase.setter
    def phase(self, value):
        self._in_emb_bw = False
        prev = getattr(self, "_phase", None)
        if prev is not None and prev != value and hasattr(self, "_WINFO"):
            self.boundary[f"end_of_{prev}"] = self._dump()
        self._phase = value

    def reset_phase_stats(self) -> None:
        super().reset_phase_stats()
        self.peak_dump = {}

    def _track(self, reftype, t) -> None:
        super()._track(reftype, t)
        sts = get_untyped_storages(t)
        for st in sts:
            winfo = self._WINFO.get(st, (None, None))[0]
            if winfo is not None and not hasattr(winfo, "_prov"):
                w = self._where() if hasattr(self, "_mod_tracker") else {"op": None, "module": ""}
                winfo._prov = (self._phase, w["op"], w["module"], tuple(t.shape), str(t.dtype).replace("torch.", ""))

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
        winfos = super()._update_and_maybe_create_winfos(t, reftype, update_existing)
        for winfo in winfos:  # parameters, gradients, optimizer states and inputs registered by track_external
            if not hasattr(winfo, "_prov"):
                lt = t.to_local() if isinstance(t, DTensor) else t  # local shape of a DTensor parameter
                winfo._prov = ("registered", None, "", tuple(lt.shape), str(lt.dtype).replace("torch.", ""))
        return winfos

    def __exit__(self, *args):
        # the modules die with measure_parallel's frame (memory_tracking is weak): read them as each tracked
        # section ends; the last section is the measured iteration
        self.module_snapshots = _module_snapshots(self)
        return super().__exit__(*args)

    def _dump(self) -> list:
        agg = defaultdict(lambda: [0, 0])
        for winfo, _ in list(self._WINFO.values()):
            if winfo.mem_consumed <= 0:
                continue
            prov = getattr(winfo, "_prov", ("?", None, "", (), "?"))
            key = (_cat_name(winfo.reftype),) + prov[:3] + (list(prov[3]), prov[4])
            k = json.dumps(key)
            agg[k][0] += 1
            agg[k][1] += int(winfo.mem_consumed)
        rows = []
        for k, (n, nbytes) in agg.items():
            cat, phase, op, module, shape, dtype = json.loads(k)
            rows.append({"category": cat, "created_in": phase, "op": op, "module": module, "shape": shape,
                         "dtype": dtype, "count": n, "bytes": nbytes})
        rows.sort(key=lambda r: -r["bytes"])
        return rows

    def _update_peak_stats(self, peak_state) -> None:
        before = {ph: v["bytes"] for ph, v in self.phase_peaks.items()}
        super()._update_peak_stats(peak_state)
        # sub-phase "backward_embedding": from the embedding's backward op (aten.embedding_dense_backward) to the end
        # of the backward; the estimator's ``backward_end`` phase is this moment
        if self._phase == "backward" and self._in_emb_bw:
            for dev_snap in self._curr_mem_snap.values():
                tot = dev_snap[TOTAL]
                pp = self.phase_peaks.get(EMB_BW)
                if pp is None or pp["bytes"] < tot:
                    self.phase_peaks[EMB_BW] = {"bytes": tot, "snap": dict(dev_snap), **self._where()}
        for ph in (self._phase, EMB_BW):
            pp = self.phase_peaks.get(ph)
            if pp is not None and pp["bytes"] != before.get(ph):
                self._pending.add(ph)  # dumped after the op (see __torch_dispatch__)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._pending = set()
        if func is torch.ops.aten.embedding_dense_backward.default and self._phase == "backward":
            self._in_emb_bw = True
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if self._pending:  # a phase's peak rose at this op: record what is alive at it
            dump = self._dump()
            for ph in self._pending:
                self.peak_dump[ph] = dump
            self._pending = set()
        return res


mp.PhaseMemTracker = ProvenanceTracker  # measure_parallel._measure_in_pg instantiates it by this global name


def _snap(snap_list):
    if not snap_list:
        return None
    dev = mp._one_device(snap_list[0])
    return {"bytes": int(dev[TOTAL]) if dev else 0, "by_category": mp._cats(dev, mp.MEM_CATEGORY)}


def _module_snapshots(mt) -> dict:
    out = {}
    for mod, stats in mt.memory_tracking.items():
        name = stats.mod_fqn
        short = name.split(".", 1)[1] if "." in name else name
        if not (short in ("model.embed_tokens", "model.norm", "lm_head", "model", "")
                or (short.startswith("model.layers.") and short.count(".") == 2)):
            continue
        d = {}
        for st in (_ModState.PRE_FW, _ModState.POST_FW, _ModState.PRE_BW, _ModState.POST_BW):
            v = _snap(stats.snapshots.get(st))
            if v is not None:
                d[st.value] = v
        out[short or name] = d
    return out


def _summary_rows(rows, keep=("activation", "temp", "other", "gradient")):
    return [r for r in rows if r["category"] in keep]


def configs_to_run(layers=LAYERS, tps=TPS) -> list[dict]:
    out = []
    for L in layers:
        for t in tps:
            c = mp._cfg("tp", _model_name(L), t, 0, regime="bf16", b=B, s=S, method="fake",
                        note=f"Llama-3-8B shapes with {L} of 32 decoder layers")
            c["id"] = f"tp-llama3-8b-L{L}-bf16-w{t}-b{B}-s{S}-fake-r0"
            c["single_device_id"] = None
            out.append(c)
    return out


def measure_one(cfg: dict) -> dict:
    ProvenanceTracker.last = None
    m = mp.measure_parallel(cfg)
    mt = ProvenanceTracker.last
    m["provenance_at_phase_peak"] = {ph: rows for ph, rows in sorted(mt.peak_dump.items()) if rows is not None}
    m["provenance_alive_at"] = {k: mt.boundary[k] for k in ("end_of_forward", "end_of_backward", "end_of_optimizer")
                                if k in mt.boundary}
    m["module_snapshots"] = mt.module_snapshots
    ProvenanceTracker.last = None
    return m


def document(args, runs, ctx) -> dict:
    argv_s = " ".join(ctx.argv)
    return {
        "generator": f"python3 validation/parallel/tp_phases/measure_tp_phases.py {argv_s}".strip(),
        "environment": "python venv with torch==2.13.0 (CPU build) and transformers==5.23.0 "
                       "(pip install -r validation/requirements.txt); fake process group, FakeTensorMode",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "total_wall_s": round(ctx.elapsed, 1),
        "runs": runs,
    }


def _summary(m) -> str:
    return (f"peak {m['peak_bytes'] / 2**30:8.3f} GiB in {m['peak_phase']} "
            + " ".join(f"{ph}={v['bytes'] / 2**30:.3f}" for ph, v in m["peak_by_phase"].items())
            + f" ({m['wall_s']}s)")


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
        ap.add_argument("--tp", type=int, nargs="+", default=list(TPS))

    args_list = sys.argv[1:] if argv is None else list(argv)
    return harness.main(argv, description=__doc__.split("\n\n")[0],
                        configs=lambda args: configs_to_run(args.layers, args.tp), measure_run=measure_one,
                        document=lambda args, runs, ctx: document(args, runs, _with_argv(ctx, args_list)),
                        arguments=arguments, catch=False, summary=_summary,
                        line=lambda n, t, c, msg: f"{c['id']:50} {msg}")


def _with_argv(ctx, argv):
    ctx.argv = argv
    return ctx


if __name__ == "__main__":
    sys.exit(main())
