"""Loss implementations are registrations (issue 25 item 5; measured/loss_implementations.py,
published_losses.py): each published loss's bytes by hand, every phase; a third-party loss
registered through ``mlsysim_measured_losses`` gives the same bytes as the built-in it copies;
what is refused names the option and the value. No torch (the measurements: validation/
techniques/loss/, compared by test_technique_loss.py)."""

from __future__ import annotations

import math

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.manager import PluginManager
from mlsysim_core.registry import PluginInfo
from mlsysim_core.terms import BACKWARD, FORWARD, PHASES
from mlsysim_core.types import HardwareNode
from mlsysim_plugins.measured.loss_implementations import HOOK, LossImplementation
from mlsysim_plugins.measured.published_losses import PUBLISHED
from scripttools import load_script

BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
LLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=4096,
             rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0, use_cache=False)
MODEL = from_hf_config(LLAMA, name="llama")
V, h, B, S = 32000, 256, 2, 256
T = B * S
SAVED = (FORWARD, BACKWARD)
NEW = ("torchtune_linear", "torchtitan_chunked", "trl_chunked_nll", "litgpt_chunked", "cut_cross_entropy",
       "megatron_fused", "megatron_vocab_parallel")


def solve(solver=None, regime="bf16", **options):
    solver = solver or TrainingMemoryModel()
    return solver.solve(MODEL, BIG, B, S, "fp32" if regime == "fp32" else "bf16", "adamw", "none",
                        profile="measured", regime=regime, attention="sdpa", device="cpu", runtime_overheads=False,
                        **options)


def terms(result):
    return {t.label: t for t in result.terms if t.component == "activations"}


def check(result, label, nbytes, phases):
    term = terms(result)[label]
    assert term.nbytes == nbytes, (label, term.nbytes, nbytes, term.formula)
    assert tuple(term.phases) == tuple(phases), (label, term.phases)


def test_every_published_loss_is_registered():
    names = set(TrainingMemoryModel().registry.extensions[HOOK])
    assert {"cross_entropy", "chunked", "fused_linear", *NEW} <= names
    for impl in PUBLISHED:
        assert impl.source and "/" in impl.source       # library, path and commit


def test_default_unchanged_by_the_registry():
    """loss=None and loss='cross_entropy' solve to the same bytes (the default's four terms)."""
    a, b = solve(), solve(loss="cross_entropy")
    assert a.total_memory == b.total_memory and a.phase_totals == b.phase_totals
    assert "log-softmax of the logits (fp32)" in terms(a)


# --- each implementation by hand (bf16: c = w = g = 2) -----------------------------------------------

def test_torchtune_linear_by_hand():
    for share, Tv in ((None, T), (0.5, 256)):
        r = solve(loss="torchtune_linear", **({"loss_token_share": share} if share else {}))
        t = math.ceil(Tv / 8)
        check(r, "LM head input: the masked hidden state", 2 * Tv * h, SAVED)
        check(r, "log-softmax of every chunk's logits (fp32)", 4 * Tv * V, SAVED)
        check(r, "labels: shifted, masked and their indices (int64)", 8 * T + 16 * Tv, SAVED)
        check(r, "logits, one chunk (2 B) + its fp32 copy", 2 * t * V + 4 * t * V, (FORWARD,))
        moments = [8 * t * V, 2 * t * V + 2 * V * h + 2 * t * h - 4 * t * V,
                   3 * 2 * V * h + 2 * 2 * t * h - 8 * t * V]
        check(r, "chunked linear cross-entropy backward, one chunk at a time", max(moments), (BACKWARD,))
        check(r, "final norm output (alive until the loss)", 2 * T * h, (FORWARD,))
        assert any("torchtune's LinearCrossEntropyLoss" in n for n in r.notes)


def test_torchtitan_chunked_by_hand():
    r = solve(loss="torchtitan_chunked")
    t = T // 8
    check(r, "chunked loss: the hidden state's gradient (accumulated in the forward)", 2 * T * h, SAVED)
    check(r, "chunked loss: GradAccumulator's fp32 buffer", 4 * T * h, (FORWARD,))
    check(r, "chunked loss: the LM head's weight gradient (from the first chunk, in the forward)", 2 * V * h,
          (FORWARD,))
    check(r, "chunked loss: labels (int64)", 8 * T, SAVED)
    check(r, "chunked loss: one chunk's forward and backward",
          max(2 * t * V + 12 * t * V, 2 * 2 * t * V + 2 * V * h + 2 * t * h), (FORWARD,))
    assert "cross-entropy backward temporaries (fp32)" not in terms(r)
    # fp32: the accumulator is the gradient itself, no separate buffer
    amp = solve(regime="amp-bf16", loss="torchtitan_chunked")
    check(amp, "chunked loss: one chunk's forward and backward",
          max(2 * t * V + 12 * t * V, 2 * 2 * t * V + 2 * V * h + 2 * t * h, 2 * t * V + 2 * V * h + 4 * V * h + 2 * t * h),
          (FORWARD,))
    r32 = solve(regime="fp32", loss="torchtitan_chunked")
    assert "chunked loss: GradAccumulator's fp32 buffer" not in terms(r32)
    check(r32, "chunked loss: the hidden state's gradient (accumulated in the forward)", 4 * T * h, SAVED)


def test_trl_chunked_nll_by_hand():
    r = solve(loss="trl_chunked_nll")
    t = 256                                                # TRL's chunk_size
    up = 4 * t * h + 4 * V * h                             # h.float(), w.float() (bf16 model)
    check(r, "packed hidden state (hidden[order], every shifted token)", 2 * T * h, SAVED)
    check(r, "packed labels and the sort order (int64)", 16 * T, SAVED)
    check(r, "chunked nll: one checkpointed chunk's forward", max(up + 4 * t * V, 16 * t * V), (FORWARD,))
    grad = 2 * V * h                                       # two chunks: the first's LM head gradient exists
    check(r, "chunked nll: one chunk recomputed and its backward",
          max(up + 16 * t * V + grad, up + 12 * t * V + 4 * t * h + 4 * V * h + grad,
              up + 8 * t * V + 4 * V * h + 2 * V * h + 4 * t * h + grad), (BACKWARD,))
    one = solve(loss="trl_chunked_nll", loss_token_share=0.5)      # 256 tokens: one chunk, no gradient before it
    check(one, "chunked nll: one chunk recomputed and its backward",
          max(up + 16 * t * V, up + 12 * t * V + 4 * t * h + 4 * V * h), (BACKWARD,))
    small = solve(loss="trl_chunked_nll", loss_chunks=64)
    check(small, "chunked nll: one checkpointed chunk's forward",
          max(4 * 64 * h + 4 * V * h + 4 * 64 * V, 16 * 64 * V), (FORWARD,))


def test_litgpt_chunked_by_hand():
    r = solve(loss="litgpt_chunked")
    check(r, "logits (2 B, held through the backward and the step)", 2 * T * V, PHASES)
    check(r, "log-softmax of every chunk (2 B)", 2 * T * V, SAVED)
    check(r, "shifted targets (int64) and per-token losses", 8 * T + 2 * T, SAVED)
    check(r, "chunks' logits gradients and their concatenation", 2 * T * V, (BACKWARD,))
    check(r, "the shifted logits' copy (2 B, reshape of logits[..., :-1, :])", 2 * (T - B) * V, (FORWARD,))
    amp = solve(regime="amp-bf16", loss="litgpt_chunked")
    check(amp, "log-softmax of every chunk (4 B)", 4 * T * V, SAVED)
    check(amp, "one chunk's fp32 cast", 4 * 128 * V, (FORWARD,))


def test_cut_cross_entropy_by_hand():
    r = solve(loss="cut_cross_entropy", loss_token_share=0.25)
    Tv = 128
    check(r, "CCE: log-sum-exp (fp32) and the valid tokens' indices (int32)", 8 * Tv, SAVED)
    check(r, "CCE: shifted labels (int64)", 8 * T, SAVED)
    check(r, "CCE: per-token dot product (fp32)", 4 * Tv, (FORWARD,))
    check(r, "CCE: backward's per-token scale (fp32)", 4 * Tv, (BACKWARD,))
    check(r, "CCE: per-vocabulary logit average (fp32)", 4 * V, SAVED)     # cce_lse_forward.py line 201
    assert not any(t.nbytes >= T * V for t in terms(r).values() if "CCE" in t.label)
    assert any("unvalidated" in n for n in r.notes)
    assert "CCE: the LM head's input e (saved; the classifier frozen)" not in terms(r)   # trained: the LM head's own


def test_cut_cross_entropy_under_lora_by_hand():
    """The classifier frozen (LoRA): CCE saves e, the LM head's input (cce.py line 141), c x T x h, which a frozen
    nn.Linear would not keep, and allocates no weight-gradient accumulator (cce_backward.py line 394): the same
    gradients as LoRA with the default cross-entropy, its four T x V terms replaced by CCE's."""
    lora = {"rank": 8}
    r, default = solve(loss="cut_cross_entropy", lora=lora), solve(lora=lora)
    label = "CCE: the LM head's input e (saved; the classifier frozen)"
    check(r, label, 2 * T * h, SAVED)
    check(r, "CCE: log-sum-exp (fp32) and the valid tokens' indices (int32)", 8 * T, SAVED)
    check(r, "CCE: per-vocabulary logit average (fp32)", 4 * V, SAVED)
    assert not any("logits" in k or "cross-entropy" in k for k in terms(r))      # no logits, no log-softmax
    assert "log-softmax of the logits (fp32)" in terms(default)
    grads = [sum(t.nbytes for t in x.terms if t.component == "gradients") for x in (r, default)]
    assert grads[0] == grads[1] > 0          # the adapters' only: no dc for the frozen head
    assert terms(r)["final norm"].nbytes == terms(default)["final norm"].nbytes
    # the peak's loss moment: the default keeps 4 T V (log-softmax) + 8 T (labels) + 8 T V (backward temporaries)
    # where CCE keeps e, its statistics and labels: 2 T h + 8 T + 8 T + 4 V + 4 T
    moment = {k: sum(t.nbytes for t in x.terms if t.component == "activations" and BACKWARD in t.phases
                     and ("CCE" in t.label or t.label in ("log-softmax of the logits (fp32)", "shifted labels (int64)",
                                                          "cross-entropy backward temporaries (fp32)")))
              for k, x in (("cce", r), ("default", default))}
    assert moment == {"cce": 2 * T * h + 8 * T + 8 * T + 4 * V + 4 * T, "default": 4 * T * V + 8 * T + 8 * T * V}
    check(solve(regime="fp32", loss="cut_cross_entropy", lora=lora), label, 4 * T * h, SAVED)
    check(solve(regime="amp-bf16", loss="cut_cross_entropy", lora=lora), label, 2 * T * h, SAVED)   # e.to(bf16)
    q = solve(loss="cut_cross_entropy", lora={"rank": 8, "quantization": "nf4"})     # QLoRA: the head stays bf16
    check(q, label, 2 * T * h, SAVED)
    assert any("unvalidated" in n for n in q.notes)


def test_megatron_fused_by_hand():
    """Compiled (jit_fuser = torch.compile): the eager steps' bytes + Inductor's fresh fp32 [T, V] buffer of the
    one-hot subtraction in the backward, beside the softmax and the bf16 gradient."""
    r = solve(loss="megatron_fused")
    check(r, "softmax, made in place in the logits' fp32 copy (saved)", 4 * T * V, SAVED)
    check(r, "target mask (bool) and masked target (int64)", 9 * T, SAVED)
    check(r, "logits (2 B, held until the loss returns)", 2 * T * V, (FORWARD,))
    check(r, "per-token statistics (fp32): max, predicted logit and sum of exp concatenated, loss", 16 * T, (FORWARD,))
    check(r, "logits gradient cast to bf16 beside the softmax", 2 * T * V, (BACKWARD,))
    check(r, "compiled calculate_gradients: Inductor's fresh fp32 buffer for the one-hot subtraction", 4 * T * V,
          (BACKWARD,))
    with pytest.raises(NotModelledError, match="16-bit logits"):
        solve(regime="fp32", loss="megatron_fused")


def test_megatron_vocab_parallel_by_hand():
    """Unfused, eager: in place; the fp32 gradient cast by autograd beside the softmax; no compiled buffer.
    The backward is the fused one's less 4 x T x V, exactly; fp32 logits are worked in place."""
    r = solve(loss="megatron_vocab_parallel")
    check(r, "softmax, made in place in the logits' fp32 copy (saved)", 4 * T * V, SAVED)
    check(r, "target mask (bool) and masked target (int64)", 9 * T, SAVED)
    check(r, "logits (2 B, held until the loss returns)", 2 * T * V, (FORWARD,))
    check(r, "per-token statistics (fp32): max, predicted logit, sum of exp, loss (target.clone() beside them)",
          16 * T, (FORWARD,))
    check(r, "logits gradient cast to the logits dtype beside the softmax", 2 * T * V, (BACKWARD,))
    assert not any(t.label.startswith("compiled") for t in r.terms)
    fused = solve(loss="megatron_fused")
    assert fused.phase_totals[BACKWARD] - r.phase_totals[BACKWARD] == 4 * T * V
    assert fused.phase_totals[FORWARD] == r.phase_totals[FORWARD]
    fp32 = solve(regime="fp32", loss="megatron_vocab_parallel")
    check(fp32, "logits (4 B, held until the loss returns)", 0, (FORWARD,))
    check(fp32, "logits gradient cast to the logits dtype beside the softmax", 0, (BACKWARD,))


def test_megatron_fused_under_megatron_tp_splits_the_vocabulary():
    big = TrainingMemoryModel()
    kw = dict(profile="measured", regime="mixed-bf16-main-grad", runtime_overheads=False, tp_size=2, loss="megatron_fused")
    r = big.solve(MODEL, BIG, B, S, "bf16", "adamw", "none", **kw)
    ranks = r.ranks if getattr(r, "ranks", None) else (r,)
    found = [t for k in ranks for t in k.terms if t.label.startswith("softmax, made in place")]
    assert found and all(t.nbytes == 4 * T * V / 2 for t in found)


def test_every_phase_moves_as_declared():
    """Against the default: the phase totals differ by exactly what the terms declare."""
    base = solve()
    for name in NEW:
        r = solve(loss=name)
        for phase in PHASES:
            declared = sum(t.nbytes for t in r.terms if phase in t.phases)
            assert r.phase_totals[phase] == pytest.approx(declared), (name, phase)
        if name != "litgpt_chunked":          # LitGPT's loop holds the logits through the step
            assert r.phase_totals["optimizer_step"] == base.phase_totals["optimizer_step"], name


# --- a third party's loss, registered through the hook ----------------------------------------------

THIRD = PluginInfo(name="acme_losses", distribution="acme-losses", version="1.0")


class _Module:
    def __init__(self, items):
        setattr(self, HOOK, hookimpl(lambda: list(items)))


def _world(items) -> TrainingMemoryModel:
    builtin = PluginManager.from_environment(autoload=False, blocked=())
    pm = PluginManager()
    for name, plugin in sorted(builtin.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=name, info=builtin.info(name))
    pm.register(_Module(items), name=THIRD.name, info=THIRD)
    pm.check()
    return TrainingMemoryModel(plugin_manager=pm)


@pytest.mark.parametrize("name", ["chunked", "fused_linear", *NEW])
def test_a_third_party_copy_gives_the_same_bytes(name):
    builtin = {i.name: i for i in TrainingMemoryModel().registry.extensions[HOOK].values()}[name]
    copy = attrs.evolve(builtin, name=f"acme_{name}")
    solver = _world([copy])
    assert f"acme_{name}" in solver.registry.extensions[HOOK]
    regime = "fp32" if name == "trl_chunked_nll" else "amp-bf16"
    a, b = solve(regime=regime, loss=name), solve(solver, regime=regime, loss=f"acme_{name}")
    assert [(t.label, t.nbytes, t.phases) for t in a.terms] == [(t.label, t.nbytes, t.phases) for t in b.terms]
    assert a.phase_totals == b.phase_totals and a.total_memory == b.total_memory


def test_a_third_party_loss_declares_its_memory():
    from mlsysim_core.terms import ACTIVATIONS, MemoryTerm

    def acme_terms(ctx):
        return [MemoryTerm(component=ACTIVATIONS, label="acme: lse", nbytes=4 * ctx.valid, phases=SAVED),
                MemoryTerm(component=ACTIVATIONS, label="acme: tile", nbytes=ctx.compute * 128 * ctx.vocab,
                           phases=(FORWARD,))]
    acme = LossImplementation(name="acme_tiled", terms=acme_terms, token_share=True, note="loss: acme's tiled loss")
    r = solve(_world([acme]), loss="acme_tiled", loss_token_share=0.5)
    check(r, "acme: lse", 4 * 256, SAVED)
    check(r, "acme: tile", 2 * 128 * V, (FORWARD,))
    assert "loss: acme's tiled loss" in r.notes


# --- refused, naming the option and the value ----------------------------------------------------------

@pytest.mark.parametrize("options, name", [
    ({"loss": "focal"}, "loss"), ({"loss": "cut_cross_entropy", "loss_chunks": 4}, "loss_chunks"),
    ({"loss": "torchtune_linear", "loss_chunks": 0}, "loss_chunks"), ({"loss_token_share": 0.0}, "loss_token_share"),
    ({"loss": "torchtune_linear", "loss_token_share": 1.5}, "loss_token_share"),
    ({"loss": "torchtitan_chunked", "loss_chunks": 7}, "loss_chunks")])
def test_bad_values_refused(options, name):
    with pytest.raises(InvalidInputError) as err:
        solve(**options)
    text = str(err.value)
    assert name in text and repr(options[name]) in text


def test_not_modelled_is_refused_by_name():
    with pytest.raises(NotModelledError, match="trl_chunked_nll.*tensor parallelism"):     # (autocast and LoRA:
        TrainingMemoryModel().solve(MODEL, BIG, B, S, "bf16", "adamw", "none", tp_size=2,   # test_trl_loss.py)
                                    profile="measured", regime="bf16", loss="trl_chunked_nll")
    with pytest.raises(NotModelledError, match="megatron_fused"):
        TrainingMemoryModel().solve(MODEL, BIG, B, S, "bf16", "adamw", "none", tp_size=2, profile="measured",
                                    regime="bf16", loss="megatron_fused")
    with pytest.raises(NotModelledError, match="LoRA"):      # (torchtune's two losses declare LoRA: test_lora_variants)
        solve(loss="torchtitan_chunked", lora={"rank": 8})


def test_share_said_when_it_changes_nothing():
    r = solve(loss="chunked", loss_token_share=0.5)
    assert any("loss_token_share=0.5 changes nothing here" in n for n in r.notes)


# --- against the measurements (validation/techniques/loss/published_measurements.json) ----------------

REPORT = load_script("validation/techniques/loss/report_published.py")
PUBLISHED_RUNS = REPORT.runs()
PUBLISHED_ERRORS = {r["id"]: REPORT.errors(r) for r in PUBLISHED_RUNS}


def test_every_cpu_runnable_published_loss_is_measured():
    measured = {r["loss"] for r in PUBLISHED_RUNS}
    assert {"torchtune_linear", "torchtitan_chunked", "trl_chunked_nll", "litgpt_chunked", "megatron_fused",
            "megatron_vocab_parallel"} <= measured
    # Megatron's runs by the profiler's memory timeline (a compiled loss runs under no dispatch mode)
    assert all(r["measured"]["method"].startswith("torch.profiler") for r in PUBLISHED_RUNS if r["loss"].startswith("megatron"))
    assert {r["regime"] for r in PUBLISHED_RUNS if r["loss"] == "torchtune_linear"} >= {"bf16", "fp32"}


@pytest.mark.parametrize("rid", sorted(PUBLISHED_ERRORS))
def test_each_published_run_every_phase(rid):
    """Every phase within 5 % of PyTorch's measurement (the issue's max)."""
    for phase, err in PUBLISHED_ERRORS[rid].items():
        assert abs(err) <= 0.05, (rid, phase, f"{100 * err:+.2f} %")


def test_published_medians_every_phase():
    """Median |error| per phase over the runs within 1 % (the issue's target)."""
    import statistics
    for phase in ("peak", "forward", "backward", "optimizer"):
        values = [abs(e[phase]) for e in PUBLISHED_ERRORS.values()]
        assert statistics.median(values) <= 0.01, (phase, values)


def test_validation_table_in_the_docs_is_the_tools_output():
    """docs/validation.md's "Published loss implementations" rows are report_published.py's."""
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs/validation.md").read_text(encoding="utf-8")
    assert REPORT.table() in page, "run: python validation/techniques/loss/report_published.py"
