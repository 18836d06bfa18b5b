"""The plugin author's guide's measured-grade walkthroughs (docs/writing-plugins.md) run.

Every example plugin under docs/examples/ is included in the page verbatim (pymdownx
snippets) and executed here: registered on a fresh ``PluginManager`` (mlsysim-core's
built-ins plus the example, under the entry-point name the page declares) and solved with
``TrainingMemoryModel("measured", plugin_manager=pm)``. Each test asserts the number the
page derives by hand, and that the page shows it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlsysim_core import HardwareNode, NotModelledError, PluginError, TrainingMemoryModel, TransformerWorkload
from mlsysim_core.manager import PluginManager
from mlsysim_core.testing import check_plugin
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
PAGE = ROOT / "docs" / "writing-plugins.md"

# example file -> the entry-point name the guide gives its plugin
PLUGINS = {
    "relu2_family": "myorg_relu2",
    "relu2_rival": "otherorg_relu2",
    "bf16_fp32_state": "myorg_regime",
    "flash_kernel": "myorg_flash2",
    "eager_1f1b": "myorg_eager_1f1b",
    "zero3_prefetch": "myorg_zero3_prefetch",
    "ema_sgd": "myorg_ema_sgd",
    "every_other_layer": "myorg_every_other",
}

GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30)
# Llama-3.1-8B (the catalog's llama3-8b): 8,030,261,248 parameters, 32 layers, h 4096,
# 32 heads, 8 KV heads of 128, MLP 14,336, vocabulary 128,256, untied.
P8B = 8_030_261_248
H, F, LAYERS = 4096, 14_336, 32
# One Llama-3.1-8B layer under autocast (the default regime, amp-fp16) with SDPA, per token:
# input norm 4h+4, q/k/v input casts 6h, q/k/v 2(q + 2kv), attention output + lse 2q + 4a,
# mid residual 4h, post-attention norm 4h+4, gate/up casts 4h, MLP 8f, output 4h.
LLAMA_LAYER_PER_TOKEN = ((4 * H + 4) + 6 * H + 2 * (H + 2 * 1024) + (2 * H + 4 * 32) + 4 * H + (4 * H + 4)
                         + 4 * H + 8 * F + 4 * H)


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def shown(number: int | float) -> bool:
    """The page shows this number, written with thousands separators."""
    return f"{number:,.0f}" in page()


def load(name: str):
    return load_script(EXAMPLES / f"{name}.py")


def manager(*names: str, blocked: tuple[str, ...] = ()) -> PluginManager:
    """mlsysim-core's built-ins plus the named examples, each under its entry-point name.
    ``blocked`` does what MLSYSIM_DISABLED_PLUGINS does to an installed plugin."""
    pm = PluginManager.from_environment(autoload=False, blocked=())
    for name in blocked:
        pm.set_blocked(name)
    for name in names:
        pm.register(load(name), name=PLUGINS[name])
    return pm


def measured(*names: str, **kw) -> TrainingMemoryModel:
    return TrainingMemoryModel("measured", plugin_manager=manager(*names, **kw))


def term(result, label: str):
    found = [t for t in result.terms if t.label == label]
    assert len(found) == 1, [t.label for t in result.terms]
    return found[0]


# --- the page and the files ------------------------------------------------------------------

def test_every_example_is_included_in_the_guide_and_tested_here():
    files = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert files == sorted(PLUGINS)
    included = re.findall(r'^--8<-- "docs/examples/(\w+)\.py"$', page(), flags=re.M)
    assert sorted(set(included)) == files, "each docs/examples/*.py is included with --8<-- in writing-plugins.md"


def test_the_snippets_extension_is_configured_to_fail_on_a_missing_file():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"pymdownx\.snippets:\n(\s+\S.*\n)*?\s+check_paths: true", config)


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_examples_import_only_the_plugin_apis(name):
    imports = re.findall(r"^(?:from|import) (\S+)", (EXAMPLES / f"{name}.py").read_text(encoding="utf-8"), re.M)
    assert all(m in ("attrs", "mlsysim_core") or m.startswith("mlsysim_plugins.measured") for m in imports), imports


def test_the_hand_derivations():
    assert LLAMA_LAYER_PER_TOKEN == 241_800
    assert RELU2_PER_TOKEN == 75_848
    assert LLAMA_LAYER_MATRICES == 218_103_808


# --- an architecture family -------------------------------------------------------------------

TOY = TransformerWorkload(name="myorg-relu2-1b", architecture="myorg_relu2", parameters=835_782_656, layers=16,
                          hidden_dim=2048, heads=16, kv_heads=4, ffn_dim=8192, vocab_size=32_000, gated_mlp=False,
                          tied_embeddings=False, context_length=4096)
# Per token, pure bf16, SDPA: input norm 8h+4, q/k/v 2(q + 2kv), attention output + lse 2q + 4a,
# post-attention norm 8h+4, MLP 2 x 2f (the relu output and its square); the output is not kept.
RELU2_PER_TOKEN = (8 * 2048 + 4) + 2 * (2048 + 2 * 512) + (2 * 2048 + 4 * 16) + (8 * 2048 + 4) + 4 * 8192
RUN = dict(regime="bf16", activation_checkpointing="none", runtime_overheads=False)


def test_a_family_is_chosen_for_its_architecture_and_its_layer_is_costed():
    result = measured("relu2_family").solve(TOY, GPU, 1, 2048, **RUN)
    assert result.notes == ()                                    # modelled as it is: no approximation note
    layers = term(result, "decoder layers: saved for backward")
    assert layers.nbytes == 16 * RELU2_PER_TOKEN * 2048 == 2_485_387_264
    assert layers.source == "no_checkpointing" and shown(layers.nbytes) and shown(RELU2_PER_TOKEN)
    # its parameter tensors (what a for-loop optimizer step walks): the embedding, 16 x 8, the norm, the head
    adam = measured("relu2_family").solve(TOY, GPU, 1, 2048, regime="bf16")
    assert term(adam, "adam step counters").nbytes == (1 + 16 * 8 + 1 + 1) * 4


def test_without_the_family_the_model_is_refused_naming_its_architecture():
    with pytest.raises(NotModelledError) as info:
        TrainingMemoryModel("measured", plugin_manager=manager()).solve(TOY, GPU, 1, 2048, **RUN)
    message = str(info.value)
    assert info.value.parameter == "model.architecture" and info.value.value == "myorg_relu2"
    shown = message.split(" (bert")[0] + " (...) (" + message.split(") (", 1)[1]
    assert f"NotModelledError: {shown}" in page()


def test_a_family_refuses_a_regime_it_was_not_derived_for():
    with pytest.raises(NotModelledError, match="not derived under autocast"):
        measured("relu2_family").solve(TOY, GPU, 1, 2048)         # precision fp16: amp-fp16


def test_two_families_claiming_one_architecture_is_an_error_naming_both_plugins():
    with pytest.raises(PluginError) as err:
        measured("relu2_family", "relu2_rival").solve(TOY, GPU, 1, 2048, **RUN)
    message = str(err.value)
    conflict = message[message.index("architecture 'myorg_relu2'"):]
    assert ("'myorg.relu2' (plugin myorg_relu2), 'otherorg.relu2' (plugin otherorg_relu2)" in conflict
            and "MLSYSIM_DISABLED_PLUGINS=myorg_relu2 or MLSYSIM_DISABLED_PLUGINS=otherorg_relu2" in conflict)
    assert conflict in page()


def test_blocking_one_claimant_leaves_the_other():
    result = measured("relu2_family", "relu2_rival", blocked=("otherorg_relu2",)).solve(TOY, GPU, 1, 2048, **RUN)
    assert term(result, "decoder layers: saved for backward").nbytes == 2_485_387_264


# --- a regime ---------------------------------------------------------------------------------

def test_a_regime_sets_the_bytes_of_each_kind_of_tensor():
    result = measured("bf16_fp32_state").solve("llama3-8b", GPU, 1, 1024, regime="myorg.bf16-fp32-state",
                                               optimizer_impl="fused")
    assert result.details["regime"] == "myorg.bf16-fp32-state"
    assert term(result, "parameters (myorg.bf16-fp32-state, 2 B)").nbytes == P8B * 2 == 16_060_522_496
    assert term(result, "adam state (2 x 32-bit)").nbytes == P8B * 2 * 4 == 64_242_089_984
    assert term(result, "adam step counters").nbytes == 291 * 4
    assert result.optimizer_state == 64_242_091_148
    assert all(shown(n) for n in (16_060_522_496, 64_242_089_984, 64_242_091_148))


def test_a_regime_the_profile_cannot_describe_is_refused_by_name():
    from mlsysim_plugins.measured.regimes import Regime, check_modelled
    fp8 = Regime(name="myorg.fp8", description="fp8 matmuls", weight=2, gradient=2, master=4, state=4, compute=1,
                 residual=2)
    with pytest.raises(NotModelledError, match="regime='myorg.fp8'.*compute=1 B"):
        check_modelled(fp8)


# --- an attention kernel ----------------------------------------------------------------------

def test_a_kernel_says_what_attention_saves():
    solver = measured("flash_kernel")
    kw = dict(activation_checkpointing="none", runtime_overheads=False)
    flash = solver.solve("llama3-8b", GPU, 1, 2048, attention="myorg.flash2", dropout=0.1, **kw)
    sdpa = solver.solve("llama3-8b", GPU, 1, 2048, attention="sdpa", dropout=0.1, **kw)
    layers = term(flash, "decoder layers: saved for backward").nbytes
    assert layers == LAYERS * LLAMA_LAYER_PER_TOKEN * 2048 == 15_846_604_800 and shown(layers)
    # CPU SDPA with dropout: the fp32 math kernel, which keeps the s x s scores
    assert round(term(sdpa, "decoder layers: saved for backward").nbytes / 1e9, 1) == 69.8 and "69.8 GB" in page()


def test_a_kernel_without_the_familys_layout_says_so():
    with pytest.raises(NotModelledError) as err:
        measured("flash_kernel").solve("llama3-8b", GPU, 1, 2048, attention="myorg.flash2",
                                       regime="mixed-bf16-main-grad")
    assert " ".join(str(err.value).split()) in " ".join(page().split())


# --- a pipeline schedule ----------------------------------------------------------------------

def test_a_schedule_sets_the_micro_batches_in_flight():
    result = measured("eager_1f1b").solve("llama3-8b", GPU, 8, 2048, pp_size=4, gradient_accumulation_steps=8,
                                          pipeline_schedule="myorg.eager-1f1b", runtime_overheads=False)
    assert [(r.name, r.in_flight) for r in result.ranks] == [
        ("first stage", 5), ("middle stages (heaviest: stage 1)", 4), ("last stage", 2)]
    first = next(t for t in result.ranks[0].terms if t.label == "decoder layers: saved for backward")
    assert first.nbytes == 5 * 8 * LLAMA_LAYER_PER_TOKEN * 2048 == 19_808_256_000 and shown(first.nbytes)
    assert result.heaviest_rank == "first stage"


# --- sharding buffers (a ZeRO variant) ---------------------------------------------------------

# One Llama-3.1-8B layer's matrices: q, o 4096 x 4096; k, v 4096 x 1024; gate, up, down 4096 x 14,336.
LLAMA_LAYER_MATRICES = 2 * H * H + 2 * H * 1024 + 3 * H * F


def test_a_rules_measured_buffers_replace_its_reference_grade_ones():
    pm = manager("zero3_prefetch")
    kw = dict(dp_size=8, runtime_overheads=False)
    solver = TrainingMemoryModel("measured", plugin_manager=pm)
    mine = solver.solve("llama3-8b", GPU, 8, 2048, data_parallel="myorg.zero3-prefetch", **kw)
    zero3 = solver.solve("llama3-8b", GPU, 8, 2048, zero_stage=3, **kw)
    prefetched = term(mine, "prefetched parameters of the next layer")
    assert prefetched.nbytes == LLAMA_LAYER_MATRICES * 4 == 872_415_232 and shown(prefetched.nbytes)
    assert mine.communication_buffers - zero3.communication_buffers == prefetched.nbytes
    assert all(t.label != "all-gathered parameters (2 layers)" for t in mine.terms)    # replaced
    reference = TrainingMemoryModel(plugin_manager=pm).solve("llama3-8b", GPU, 8, 2048, dp_size=8,
                                                             data_parallel="myorg.zero3-prefetch")
    gathered = term(reference, "all-gathered parameters (2 layers)")
    assert gathered.nbytes == 2 * P8B / 32 * 2 == 1_003_782_656 and shown(gathered.nbytes)
    assert gathered.source == "myorg_zero3_prefetch"


# --- an optimizer -------------------------------------------------------------------------------

def test_an_optimizers_measured_state():
    solver = measured("ema_sgd")
    amp = solver.solve("llama3-8b", GPU, 1, 1024, optimizer="myorg.ema-sgd")
    assert amp.details["regime"] == "amp-fp16" and amp.optimizer_state == P8B * (4 + 4) == 64_242_089_984
    mixed = solver.solve("llama3-8b", GPU, 1, 1024, optimizer="myorg.ema-sgd", regime="mixed-bf16")
    assert term(mixed, "fp32 master weights").nbytes == P8B * 4
    assert mixed.optimizer_state == P8B * 12 == 96_363_134_976 and shown(mixed.optimizer_state)
    sharded = solver.solve("llama3-8b", GPU, 8, 1024, optimizer="myorg.ema-sgd", dp_size=8, zero_stage=1)
    assert term(sharded, "EMA of the weights (fp32)").nbytes == P8B * 4 / 8


# --- a checkpointing strategy -----------------------------------------------------------------------

def test_a_strategys_measured_activations():
    result = measured("every_other_layer").solve("llama3-8b", GPU, 1, 2048, runtime_overheads=False,
                                                 activation_checkpointing="myorg.every-other")
    kept = term(result, "decoder layers: saved for backward").nbytes
    inputs = term(result, "checkpointed layers: their inputs").nbytes
    assert kept == 16 * LLAMA_LAYER_PER_TOKEN * 2048 == 7_923_302_400 and shown(kept)
    assert inputs == 16 * 2048 * H * 4 == 536_870_912 and shown(inputs)
    assert term(result, "recompute working set (one layer)").phases == ("backward_end",)


# --- the conformance kit, on the spec plugins ----------------------------------------------------------

@pytest.mark.parametrize("name", ["ema_sgd", "every_other_layer", "zero3_prefetch"])
def test_the_spec_examples_conform(name):
    report = check_plugin(PLUGINS[name], plugin_manager=manager(name), allow_direct_registration=True)
    assert report.ok, report.failures
