"""``compile=True`` (issue 25, item 1): torch.compile in the measured profile against the compiled runs of
validation/compile/ (the profiler's memory timeline; every phase: forward peak, backward peak, optimizer
peak, alive at the end of the forward and of the backward), hand-derived byte counts, the default unchanged,
and what is refused. No torch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
from mlsysim_core.types import HardwareNode
from mlsysim_plugins.measured import compile as C

ROOT = Path(__file__).resolve().parents[2]
RUNS = [r for r in json.loads((ROOT / "validation/compile/measurements.json").read_text(encoding="utf-8"))["runs"]
        if r.get("measured")]
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward")
LLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=4096,
             rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0, use_cache=False)


def solve(hf=None, b=1, s=512, regime="bf16", checkpointing="none", model=None, **options):
    options = {"regime": regime, "attention": "sdpa", "device": "cpu", "runtime_overheads": False, **options}
    model = model or from_hf_config(hf or LLAMA, name="llama-tiny-2l")
    return TrainingMemoryModel().solve(model, BIG, b, s, regime if regime in ("fp32", "bf16") else "bf16", "adamw",
                                       checkpointing, profile="measured", **options)


def solve_run(run, **options):
    return solve(run["hf_config"], run["batch_size"], run["seq_len"], run["regime"], run["checkpointing"], **options)


def predicted(result) -> dict:
    """Absolute bytes per phase: the peaks (the backward's: the larger of its top and its end), what is alive at
    the end of the forward (every term saved across it) and of the backward (the step's terms but its
    temporaries)."""
    t = result.phase_totals
    eof = sum(x.nbytes for x in result.terms if FORWARD in x.phases and BACKWARD in x.phases)
    eob = sum(x.nbytes for x in result.terms if OPTIMIZER_STEP in x.phases
              and (tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))
    return {"forward": t["forward"], "backward": max(t["backward"], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
            "end_of_forward": eof, "end_of_backward": eob}


def measured(run, key="compiled") -> dict:
    """Absolute bytes per phase: the timeline's figures above its zero plus what was alive at its zero."""
    m = run["measured"][key]
    base = m["baseline_bytes"]
    return {"forward": base + m["peak_by_phase"]["forward"], "backward": base + m["peak_by_phase"]["backward"],
            "optimizer": base + m["peak_by_phase"]["optimizer"],
            "end_of_forward": base + m["alive"]["end_of_forward"], "end_of_backward": base + m["alive"]["end_of_backward"]}


def errors(run) -> dict:
    p, m = predicted(solve_run(run, compile=True)), measured(run)
    return {k: (p[k] - m[k]) / m[k] for k in PHASES}


ERRORS = {r["id"]: errors(r) for r in RUNS}


# --- against PyTorch ------------------------------------------------------------------------------------

def test_the_cells_cover_logits_and_layers_dominated_runs():
    ids = set(ERRORS)
    assert len(ids) >= 12
    assert any("v1024" in i and "-nockpt-" in i for i in ids) and any("v1024" in i and "-ckpt-" in i for i in ids)
    assert any(r["seq_len"] >= 2048 for r in RUNS) and any(r["regime"] == "bf16" for r in RUNS)


APPROXIMATE = {i for i in ERRORS if "-ckpt-" in i and "-v1024" in i}   # full checkpointing, the layers at the peaks


@pytest.mark.parametrize("phase", PHASES)
def test_targets_every_phase(phase):
    """Issue 25's target (median |error| <= 1 %, max <= 5 %) on every phase of every run but the approximate
    moments of full checkpointing where the layers set the peaks; those within 7 %, and the ones beyond 5 %
    named (the grouped-query run's forward peak: docs/compile.md)."""
    values = [abs(e[phase]) for e in ERRORS.values()]
    assert statistics.median(values) <= 0.01, values
    assert max(abs(e[phase]) for i, e in ERRORS.items() if i not in APPROXIMATE) <= 0.05
    assert max(abs(ERRORS[i][phase]) for i in APPROXIMATE) <= 0.07
    beyond = sorted(i for i in APPROXIMATE if abs(ERRORS[i][phase]) > 0.05)
    assert beyond == (["llama-tiny-3l-v1024-kv2-fp32-ckpt-b2-s512"] if phase == "forward" else [])


@pytest.mark.parametrize("rid", sorted(i for i in ERRORS if ("-nockpt-" in i or "-v1024" not in i) and "-tied" not in i))
def test_exact_where_the_saved_set_and_the_loss_set_the_peaks(rid):
    """Without checkpointing, and with it where the loss sets the peaks, every phase to within 16 bytes (the
    timeline counts an 8-byte scalar pair in the forward and foreach AdamW's 10-12 byte allocation)."""
    run = next(r for r in RUNS if r["id"] == rid)
    p, m = predicted(solve_run(run, compile=True)), measured(run)
    for phase in PHASES:
        assert abs(p[phase] - m[phase]) <= 16, (phase, p[phase], m[phase])


def test_the_eager_prediction_of_the_same_cells_is_unchanged_and_exact():
    """The eager timeline of the same runs, predicted by the profile without compile (the reference the
    compiled numbers are read against): exact but for the wide model's eager backward (llama-small, a
    1,024-token vocabulary: the eager profile's layer backward, -1.1 %)."""
    for run in RUNS:
        if "-nockpt-" not in run["id"]:
            continue
        p, m = predicted(solve_run(run)), measured(run, "eager")
        for phase in ("forward", "backward", "end_of_forward", "end_of_backward"):
            limit = 0.012 if (phase, run["id"]) == ("backward", "llama-small-3l-v1024-fp32-nockpt-b1-s512") else 5e-4
            assert abs(p[phase] - m[phase]) / m[phase] < limit, (run["id"], phase, p[phase], m[phase])


# --- hand-derived ---------------------------------------------------------------------------------------

def test_a_layer_saves_the_partitioners_set():
    """llama-tiny (h 256, f 688, 8 heads of 32), fp32, per token: q, k, v 3 x 1,024 + SDPA's output 1,024 and
    fp32 log-sum-exp 32 + o 1,024 + gate, up 2 x 2,752 + down 1,024 (the residual) + 2 norms x (1,024 + 4)
    + SiLU(gate) x up 2,752 = 16,488 B: the eager layer's normalized x (2 x 1,024) and SiLU's output
    (2,752) are recomputed in the backward."""
    r = solve(LLAMA, regime="fp32", compile=True)
    layers = next(t for t in r.terms if t.label.startswith("decoder layers"))
    assert layers.nbytes == 2 * 512 * 16488
    bf16 = next(t for t in solve(LLAMA, compile=True).terms if t.label.startswith("decoder layers"))
    # bf16 per token: 2 x (3 x 256 + 256 + 256 + 2 x 688 + 256 + 2 x 256 + 688) + 32 + 2 x 4 = 8,264
    assert bf16.nbytes == 2 * 512 * 8264


def test_the_end_of_the_forward_by_hand():
    """bf16, b = 2, s = 512 (T = 1,024), V = 32,000: the embedding output 524,288 + 2 layers x 8,462,336
    (8,264 B per token) + the mask 2 x 2 x 512^2 + the final norm 1,024 x (512 + 4) + the bf16
    logits 65,536,000 + max/log-sum-exp 8,192 + padded labels 8 x 2 x 513 + two scalars: 84,578,328 B above
    the parameters, optimizer state, inputs and buffers (measured: 84,578,328)."""
    r = solve(LLAMA, b=2, compile=True)
    saved = sum(t.nbytes for t in r.terms if FORWARD in t.phases and BACKWARD in t.phases
                and t.component == "activations" and t.label != "input token ids (int64)")
    assert saved == 524288 + 2 * 1024 * 8264 + 2 * 2 * 512**2 + 1024 * 516 + 65536000 + 8192 + 8 * 2 * 513 + 8
    run = next(r for r in RUNS if r["id"] == "llama-tiny-2l-bf16-nockpt-b2-s512")
    assert saved == run["measured"]["compiled"]["alive"]["end_of_forward"]


def test_the_loss_backward_by_hand():
    """The backward's top: the logits' tangent (zeros) and gradient, 2 x c x T x V, and a per-token fp32
    buffer, beside everything saved: fp32 b = 1: 2 x 4 x 512 x 32,000 + 4 x 512 + 4."""
    r = solve(LLAMA, regime="fp32", compile=True)
    top = next(t for t in r.terms if t.label.startswith("compiled loss backward"))
    assert top.nbytes == 2 * 4 * 512 * 32000 + 4 * 512 + 4 and tuple(top.phases) == (BACKWARD,)
    eager = solve(LLAMA, regime="fp32")
    # fp32: compile saves the logits (4 T V) where eager saved the log-softmax (4 T V); the layers save less
    assert r.phase_totals["backward"] < eager.phase_totals["backward"]


def test_full_checkpointing_keeps_the_inputs_and_the_rng_states_on_the_cpu():
    r = solve(LLAMA, checkpointing="full", compile=True)
    inputs = next(t for t in r.terms if t.label.startswith("checkpointed layers"))
    assert inputs.nbytes == 2 * (2 * 512 * 256 + 5056)
    cuda = solve(LLAMA, checkpointing="full", compile=True, device="cuda")
    assert next(t for t in cuda.terms if t.label.startswith("checkpointed layers")).nbytes == 2 * 2 * 512 * 256
    assert any("approximate moments" in n for n in r.notes)


def test_tied_embeddings_end_of_the_backward_within_a_quarter_percent():
    """Tied: the end of the backward holds the LM head's partial, the fp32 accumulator and the logits' gradient
    (the LM head's weight gradient computed last); the first layer's five input-gradient parts are counted
    though the fp32 run's peak comes after them (+0.13 %)."""
    for rid in ("llama-tiny-2l-v32000-tied-fp32-nockpt-b1-s64", "llama-tiny-2l-v32000-tied-bf16-nockpt-b1-s64"):
        assert abs(ERRORS[rid]["backward"]) < 0.0025, (rid, ERRORS[rid])
        assert all(abs(ERRORS[rid][p]) < 1e-6 for p in PHASES if p != "backward")


def test_the_embedding_backward_accumulates_in_fp32():
    """embedding_dense_backward's decomposition: new_zeros in the computation dtype (fp32 for bf16), an
    accumulating index_put, a cast: V x h x (4 + 2) in bf16 beside the first layer's input gradient (the
    residual's, q, k and v's input gradients, their sum: 5 x T x h x 2). llama-tiny-2l, V = 1,024, bf16,
    s = 256: 262,144 x 6 + 5 x 256 x 256 x 2 = 2,228,224 B (the CPU timeline's end of the backward: 1,048,576
    and 524,288 allocated beside five 131,072-byte buffers)."""
    hf = dict(LLAMA, vocab_size=1024)
    end = next(t for t in solve(hf, s=256, compile=True).terms if t.label.startswith("compiled backward's end"))
    assert end.nbytes == 1024 * 256 * 6 + 5 * 256 * 256 * 2 and tuple(end.phases) == (BACKWARD_END,)
    fp32 = next(t for t in solve(hf, s=256, regime="fp32", compile=True).terms
                if t.label.startswith("compiled backward's end"))
    assert fp32.nbytes == 1024 * 256 * 4 + 5 * 256 * 256 * 4       # no accumulator of another dtype
    tied = next(t for t in solve(dict(hf, tie_word_embeddings=True), s=256, compile=True).terms
                if t.label.startswith("compiled backward's end"))
    # tied: the LM head's partial + the lookup's fp32 accumulator + the logits' gradient kept for the LM head's
    # weight gradient, computed last (validation/compile's tied cells)
    assert tied.nbytes == 1024 * 256 * (2 + 4) + 2 * 256 * 1024 + 5 * 256 * 256 * 2 and "computed last" in tied.formula


# --- the default unchanged, the option named ---------------------------------------------------------------

@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_off_is_byte_identical(ckpt):
    base = solve(LLAMA, checkpointing=ckpt).to_dict()
    assert solve(LLAMA, checkpointing=ckpt, compile=False).to_dict() == base
    assert solve(LLAMA, checkpointing=ckpt, compile=None).to_dict() == base


def test_the_result_says_what_is_modelled():
    r = solve(LLAMA, compile=True)
    assert any(n.startswith("compile=True: torch.compile (Inductor") and "CUDA" in n for n in r.notes)
    assert "compile" in r.to_dict()["notes"][-1]


# --- refused, naming the parameter and what is allowed -------------------------------------------------------

@pytest.mark.parametrize("options, parameter", [
    (dict(activation_checkpointing="selective"), "activation_checkpointing"),
    (dict(activation_checkpointing="full", checkpointed_layers=1), "checkpointed_layers"),
    (dict(loss="chunked"), "loss"),
    (dict(regime="amp-bf16"), "regime"),
    (dict(attention="eager"), "attention"),
    (dict(dropout=0.1), "dropout"),
    (dict(lora={"rank": 8, "use_dora": True}), "lora"),          # (plain LoRA: test_compile_lora_whole.py)
    (dict(optimizer_in_backward=True), "optimizer_in_backward"),
    (dict(activation_offload="save_on_cpu"), "activation_offload"),
    (dict(offload="optimizer"), "offload"),
    (dict(compile="max-autotune"), "compile"),
])
def test_refused(options, parameter):
    kw = {"compile": True, **options}
    ckpt = kw.pop("activation_checkpointing", "none")
    regime = kw.pop("regime", "bf16")
    with pytest.raises(NotModelledError, match=parameter) as e:
        solve(LLAMA, regime=regime, checkpointing=ckpt, **kw)
    assert "compile" in str(e.value)


def test_refused_families_by_what_they_declare():
    mixtral = dict(LLAMA, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    with pytest.raises(NotModelledError, match="declares .*(softmax|topk|grouped_mm)"):
        solve(mixtral, compile=True)
    qwen3 = dict(LLAMA, model_type="qwen3", head_dim=32)
    with pytest.raises(NotModelledError, match="more parameters"):
        solve(qwen3, compile=True)
    mistral = dict(LLAMA, model_type="mistral", sliding_window=128)
    with pytest.raises(NotModelledError, match="sliding_window=128"):
        solve(mistral, compile=True)
    assert solve(dict(LLAMA, model_type="mistral", sliding_window=None), compile=True).total_memory == \
        solve(LLAMA, compile=True).total_memory
    gpt2 = dict(model_type="gpt2", n_embd=256, n_layer=2, n_head=8, vocab_size=1024, n_positions=1024)
    with pytest.raises(NotModelledError, match="op_outputs"):
        solve(gpt2, compile=True)


def test_parallel_layouts_are_refused():
    with pytest.raises(NotModelledError, match="one device"):
        solve(LLAMA, compile=True, tp_size=2)


def test_undeclared_layer_parameters():
    from mlsysim_plugins.measured.families import resolve_family
    from mlsysim_plugins.measured.shapes import _shape_of
    llama = from_hf_config(LLAMA, name="l")
    assert C.undeclared_layer_parameters(_shape_of(llama, resolve_family("llama"))) == 0
