"""Nothing is costed as something else silently: what the measured profile approximates
about a model (an architecture without a model of its own, multi-head latent attention,
shared experts, assumed shapes) is a note in the result, its JSON, the estimate table and
explain. The reference profile, which reads only the parameter count, adds none (parity)."""

from __future__ import annotations

import io
import json

import pytest

from mlsysim_core.errors import NotModelledError

from mlsysim_core import TrainingMemoryModel, TransformerWorkload, cli
from mlsysim_plugins.measured.shapes import MODELLED_ARCHITECTURES, NOT_MODELLED

MEASURED = TrainingMemoryModel("measured")


def approximations(result) -> list[str]:
    return [n for n in result.notes if n.startswith("approximation:")]


@pytest.mark.parametrize("name", ["llama3-8b", "mistralai/mistral-7b-v0.1", "mixtral-8x7b",
                                  "openai-community/gpt2"])
def test_the_validated_families_carry_no_approximation(name):
    assert approximations(MEASURED.solve(name, "h100", 1, 1024)) == []


def test_deepseek_says_what_it_approximates():
    # DeepSeek has a family of its own (architectures/deepseek.py): MLA and shared experts are
    # modelled; it says which attention kernel it assumes and that its layers are their mean.
    r = MEASURED.solve("deepseek-v3", "h200", 64, 1024, dp_size=64, ep_size=8, zero_stage=3)
    notes = " | ".join(r.notes)
    assert "costed as Mixtral-style" not in notes and "latent attention is not modelled" not in notes
    assert "MLA attention under sdpa: the memory-efficient kernel" in notes
    assert "the DeepSeek layers are costed as their mean (3 dense, 58 MoE" in notes


def test_gemma2_names_soft_capping_and_sliding_windows():
    # Gemma 2 has a family of its own (architectures/gemma.py); a catalog entry without config details
    # hears the soft-capping and sliding-window defaults it is costed with.
    notes = " ".join(approximations(MEASURED.solve("google/gemma-2-2b", "h100", 1, 1024)))
    assert "costed as Llama-style layers" not in notes
    assert "logit_softcapping = 50.0 assumed" in notes and "sliding-window layers assumed" in notes


def test_every_family_the_hf_import_reads_is_modelled_or_says_what_it_leaves_out():
    """(``hf.ARCHITECTURES``: what workloads get; the families here and in ``architectures/``.)"""
    from mlsysim_core.hf import ARCHITECTURES
    from mlsysim_plugins.measured.architectures import family_modules
    modelled = set(MODELLED_ARCHITECTURES) | {a for m in family_modules() for f in m.FAMILIES for a in f.architectures
                                              if f.approximation(a) is None}
    unsaid = [t for t in ARCHITECTURES if t not in modelled and t not in NOT_MODELLED]
    assert unsaid == []


def test_a_hand_built_model_hears_what_was_assumed():
    model = TransformerWorkload(name="x", parameters=1_300_000_000, layers=24, hidden_dim=2048, heads=16,
                                vocab_size=50_304, architecture="llama")
    notes = approximations(MEASURED.solve(model, "h100", 1, 1024))
    assert notes == [
        "approximation: gated MLP assumed (model.gated_mlp unknown)",
        "approximation: MLP width 4 x hidden = 8192 assumed (model.ffn_dim unknown)",
        "approximation: untied embeddings assumed (model.tied_embeddings unknown)",
    ]
    assert approximations(TrainingMemoryModel().solve(model, "h100", 1, 1024)) == []   # reference: none


def test_a_model_without_an_architecture_is_refused_not_costed_as_llama():
    # its layer layout (MLP, norms, positions) is unknown: the measured profile refuses it,
    # naming the architectures its families model; the reference profile answers.
    model = TransformerWorkload(name="x", parameters=1_300_000_000, layers=24, hidden_dim=2048, heads=16,
                                vocab_size=50_304)
    with pytest.raises(NotModelledError) as info:
        MEASURED.solve(model, "h100", 1, 1024)
    assert info.value.parameter == "model.architecture" and info.value.value is None
    assert "gpt2, gpt3, gpt_neox" in info.value.allowed and "architecture='llama'" in info.value.allowed
    assert TrainingMemoryModel().solve(model, "h100", 1, 1024).profile == "reference"


def test_the_notes_reach_the_json_the_table_and_explain():
    out = io.StringIO()
    assert cli.main(["estimate", "-m", "google/gemma-2-2b", "-b", "1", "--json"], out=out) == 0
    assert any("logit soft-capping" in n for n in json.loads(out.getvalue())["notes"])
    out = io.StringIO()
    assert cli.main(["estimate", "-m", "google/gemma-2-2b", "-b", "1", "--explain", "--no-chart"], out=out) == 0
    table, explained = out.getvalue().split("per accelerator:")
    assert "note         approximation: final_logit_softcapping = 30.0 assumed" in table
    assert "note: approximation: final_logit_softcapping = 30.0 assumed" in explained


def _approximated():
    from mlsysim_plugins.measured.families import BUILTIN_FAMILIES
    return [(f, arch, missing) for f in BUILTIN_FAMILIES.values() for arch, missing in f.approximations]


@pytest.mark.parametrize("family,arch,missing", _approximated(), ids=[a for _, a, _ in _approximated()])
def test_every_architecture_a_family_approximates_is_said(family, arch, missing):
    """Each family's approximations reach the notes, as "costed as <family>-style layers (what it
    leaves out)", and the family that names an architecture is the one that costs it."""
    from mlsysim_plugins.measured.families import BUILTIN_FAMILIES, family_for
    from mlsysim_plugins.measured.shapes import approximation_notes
    from mlsysim_core.types import SparseTransformerWorkload
    kw = dict(name=f"{arch}-like", parameters=2_000_000_000, layers=8, hidden_dim=1024, heads=16, vocab_size=32_000,
              ffn_dim=4096, gated_mlp=family.gated_mlp, tied_embeddings=False, architecture=arch)
    model = (SparseTransformerWorkload(**kw, experts=8, active_experts_per_token=2, active_parameters=500_000_000)
             if family.sparse
             else TransformerWorkload(**kw))
    chosen, notes = family_for(model, BUILTIN_FAMILIES)
    assert chosen is family
    said = (f"approximation: architecture {arch!r} has no measured-grade model of its own; costed as "
            f"{family.label}-style layers" + (f" ({missing} not modelled)" if missing else ""))
    assert notes == (said,)
    assert approximation_notes(model)[0] == said
