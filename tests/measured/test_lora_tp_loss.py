"""LoRA under tensor parallelism with Megatron-Core's own loss (issue 25 items 2 and 4): the frozen LM head's logits
kept vocab-parallel (each tp rank its V/tp slice, never all-gathered) and Megatron's unfused vocab-parallel
cross-entropy on them, as Megatron-Bridge trains LoRA (``cross_entropy_loss_fusion=False``). One rank of a (dp, tp)
world measured under the fake process group (validation/lora_parallel/measure_lora_tp_loss.py ->
tp_loss_measurements.json; this test needs no torch), every phase compared (compare_tp.py --loss); the loss's terms
by hand; with sequence parallelism (the LM head's input all-gathered from the sequence chunks, its gradient
reduce-scattered); the fused loss still refused by type and message."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
COMPARE = load_script("validation/lora_parallel/compare_tp.py")
RUNS = COMPARE.runs(COMPARE.LOSS_DATA)
COMPARED = [(run, COMPARE.compare(run)) for run in RUNS]


def _run(key: str) -> dict:
    return next(r for r in RUNS if key in r["id"])


def test_the_measurements():
    data = json.loads(COMPARE.LOSS_DATA.read_text(encoding="utf-8"))
    assert data["torch"].split("+")[0] == "2.13.0" and data["transformers"] == "5.23.0"
    assert "measure_lora_tp_loss.py" in data["generator"]
    assert len(RUNS) == 8 and not any(r.get("error") for r in RUNS)
    for run in RUNS:
        assert run["loss"] == "megatron_vocab_parallel" and run["model_regime"] == "mixed-bf16-main-grad"
        assert run["layout"]["kind"] in ("tp", "tp+sp") and run["layout"]["data_parallel"] in ("mcore-distopt",
                                                                                              "mcore-ddp")
        assert run["measured"]["lora"]["loss"] == "megatron_vocab_parallel"


@pytest.mark.parametrize("run,c", COMPARED, ids=[r["id"] for r in RUNS])
def test_every_phase_within_one_percent(run, c):
    for phase, error in c["errors"].items():
        assert abs(error) <= 0.01, (phase, error)
    assert abs(c["peak"][2]) <= 0.001


def test_the_loss_by_hand():
    # llama-tiny (h 256, V 32,000), b 2 x s 256 = T 512 tokens, tp 2: the rank's logits shard 512 x 16,000 in bf16;
    # Megatron's loss upcasts it once into the softmax it saves (fp32), the target mask (bool) and masked target
    # (int64) saved, the per-token max, predicted logit, sum of exp and loss (fp32) in the forward, and in the backward
    # autograd's bf16 cast of the fp32 gradient beside the softmax; the final norm's output (bf16, T x h) held by
    # GPTModel until the loss returns (the frozen LM head saves none of it)
    run = _run("llama-tiny-mixed-bf16-main-grad-r16-all-tp2-dp1-mcore-distopt")
    T, h, v = 2 * 256, 256, 32_000 // 2
    terms = {t.label: t for t in COMPARE.solve(run).ranks[0].terms}
    assert terms["softmax, made in place in the logits' fp32 copy (saved)"].nbytes == 4 * T * v == 32_768_000
    assert terms["logits (2 B, held until the loss returns)"].nbytes == 2 * T * v == 16_384_000
    assert terms["logits gradient cast to the logits dtype beside the softmax"].nbytes == 2 * T * v
    assert terms["target mask (bool) and masked target (int64)"].nbytes == 9 * T
    assert terms["final norm output (held until the loss)"].nbytes == 2 * T * h == 262_144
    assert terms["final norm output (held until the loss)"].phases == ("forward",)
    # the default cross-entropy's terms (the whole vocabulary's log-softmax) are gone
    assert not {"log-softmax of the logits (fp32)", "cross-entropy backward temporaries (fp32)"} & set(terms)


def test_the_loss_with_sequence_parallelism_by_hand():
    # b 1 x s 256 = T 256 tokens, tp 2 with SP: the logits of the whole sequence on the rank's V/tp (the head's input
    # all-gathered first), the final norm's output held on the rank's s/tp tokens (bf16)
    run = _run("tpsp-megatron_vocab_parallel-llama-tiny-mixed-bf16-main-grad-r16-all-tp2-dp2")
    T, h, v = 256, 256, 32_000 // 2
    terms = {t.label: t.nbytes for t in COMPARE.solve(run).ranks[0].terms}
    assert terms["softmax, made in place in the logits' fp32 copy (saved)"] == 4 * T * v
    assert terms["final norm output (held until the loss; sequence parallel)"] == 2 * T * h // 2
    assert "final norm output (held until the loss)" not in terms


def test_only_the_loss_differs_from_the_default_loss():
    # the same rank with the default cross-entropy (tp_dp_measurements.json): every term outside the activations
    # (weights, the grad buffer, master weights, Adam) byte-identical
    run = _run("llama-tiny-mixed-bf16-main-grad-r16-all-tp2-dp4-mcore-distopt")
    default = copy.deepcopy(run)
    del default["loss"]

    def rest(r):
        return sorted((t.component, t.label, t.nbytes) for t in COMPARE.solve(r).ranks[0].terms
                      if t.component != "activations")
    assert rest(run) == rest(default)


def _solve(solver=None, **kw):
    args = dict(regime="mixed-bf16-main-grad", tp_size=2, dp_size=4, data_parallel="mcore-distopt",
                activation_checkpointing="none", optimizer_impl="fused", loss="megatron_vocab_parallel")
    args.update(kw)
    return (solver or TrainingMemoryModel("measured")).solve("llama3-8b", "h100", 4, 2048, "bf16",
                                                 lora={"rank": 16, "adapter_dtype": "base"},
                                                 runtime_overheads=False, **args)


def test_llama3_8b_loss_by_hand():
    # Llama 3 8B (h 4,096, V 128,256), micro-batch 1 x 2,048 tokens, tp 2: V/tp = 64,128
    T, h, v = 2048, 4096, 128_256 // 2
    terms = {t.label: t.nbytes for t in _solve().ranks[0].terms}
    assert terms["softmax, made in place in the logits' fp32 copy (saved)"] == 4 * T * v == 525_336_576
    assert terms["logits (2 B, held until the loss returns)"] == 2 * T * v
    assert terms["final norm output (held until the loss)"] == 2 * T * h == 16_777_216


@pytest.mark.parametrize("kw,parameter,message", [
    # Megatron's fused (torch.compile'd) loss with LoRA under tp: not measured
    ({"loss": "megatron_fused"}, "loss", "'megatron_vocab_parallel' under Megatron-Core's data-parallel rules"),
    ({"loss": "megatron_fused", "sequence_parallel": True}, "loss", "its fused (torch.compile'd) variant"),
    # Megatron's loss outside Megatron-Core's regime and rules (pure bf16, no data parallelism)
    ({"regime": "bf16", "dp_size": 1, "data_parallel": None}, "loss", "a Megatron-Core regime "
     "(regime='mixed-bf16-main-grad') under tp > 1"),
])
def test_refused(kw, parameter, message):
    # (loss._refuse: under LoRA and tp only an implementation declaring "lora_tensor_parallel" passes)
    with pytest.raises(NotModelledError) as e:
        _solve(**kw)
    assert e.value.parameter == parameter
    assert message in str(e.value)


def test_the_validation_page_shows_the_table():
    begin, end = COMPARE.MARKERS["loss"]
    doc = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    assert doc[doc.index(begin) + len(begin):doc.index(end)].strip() == COMPARE.table(COMPARE.LOSS_DATA)



def test_a_renamed_vocab_parallel_loss_is_let_through_by_its_declaration():
    """One plugin world: the LoRA-under-tp check reads what the loss declares ("lora_tensor_parallel" in its
    allows), not its name: the built-in registered again under another name gives the same bytes, and the same
    implementation without the declaration is refused naming the loss."""
    import attrs

    from mlsysim_core import hookimpl
    from mlsysim_core.manager import PluginManager
    from mlsysim_core.registry import PluginInfo
    from mlsysim_plugins.measured.loss_implementations import HOOK

    builtin = TrainingMemoryModel().registry.extensions[HOOK]["megatron_vocab_parallel"]
    copies = [attrs.evolve(builtin, name="my_vocab_parallel"),
              attrs.evolve(builtin, name="my_undeclared", allows=builtin.allows - {"lora_tensor_parallel"})]

    class Third:
        pass
    setattr(Third, HOOK, staticmethod(hookimpl(lambda: list(copies))))
    installed = PluginManager.from_environment(autoload=False, blocked=())
    pm = PluginManager()
    for name, plugin in sorted(installed.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=name, info=installed.info(name))
    pm.register(Third(), name="acme_losses", info=PluginInfo(name="acme_losses", distribution="acme", version="1"))
    pm.check()
    world = TrainingMemoryModel("measured", plugin_manager=pm)
    base = _solve()
    renamed = _solve(solver=world, loss="my_vocab_parallel")
    assert renamed.total_memory == base.total_memory and renamed.phase_totals == base.phase_totals
    with pytest.raises(NotModelledError) as e:
        _solve(solver=world, loss="my_undeclared")
    assert e.value.parameter == "loss" and "under LoRA over tp=2" in str(e.value)
