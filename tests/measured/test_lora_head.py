"""LoRA on the LM head (``target_modules`` naming ``lm_head``: torchtune's ``apply_lora_to_output``, LitGPT's
``lora_head``, peft's ``lm_head``): the counts, the measured profile against validation/lora_head/measurements.json
(torchtune 0.6.1's ``lora_llama3``, every phase), hand-derived bytes, the refusals and the launch readers. No torch."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.catalog import get_model
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.finetune import LoRAConfig, lora_counts
from mlsysim_core.hf import from_hf_config
from mlsysim_core.scenario import from_launch
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
compare = load_script("validation/lora_head/compare.py")
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare.rows()}
RUNS = {r["id"]: r for r in __import__("json").loads(Path(compare.PATH).read_text(encoding="utf-8"))["runs"]}
PHASES = compare.PHASES
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
LAUNCH = ROOT / "tests" / "data" / "launch"
# torchtune returns ``self.output(h).float()``: the bf16 logits are freed when the model returns, where the priced
# path keeps them beside the fp32 copy (+2 T V c, test_compile_blocks.test_the_bf16_forward_is_torchtunes_lm_head):
# the bf16 cross-entropy twins' forward peak, with the output adapter or without it
TORCHTUNE_BF16_LOGITS = {"forward": ("bf16-eager-lora",)}


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def offset(rid, phase):
    return any(k in rid for k in TORCHTUNE_BF16_LOGITS.get(phase, ()))


def test_every_phase_within_the_issue_targets():
    """Every run (the head-* runs and their nohead-* twins), every phase: median <= 1 %, max <= 5 % (issue 25), but
    the bf16 cross-entropy forward (torchtune's bf16 logits, priced kept: +13 to +16 %, the twins alike)."""
    assert len(ROWS) == 8 and sum(r.startswith("head-") for r in ROWS) == 4
    for phase in PHASES:
        errors = [abs(err(r, phase)) for r in ROWS if not offset(r, phase)]
        assert statistics.median(errors) <= 0.01 and max(errors) <= 0.05, phase
        assert max(abs(err(r, phase)) for r in ROWS if not offset(r, phase)) < 0.003, phase
    for rid in ROWS:
        if offset(rid, "forward"):
            pred, meas = ROWS[rid]
            T, V = 512, 8000
            assert 0.96 < (pred["forward"] - meas["forward"]) / (2 * T * V) < 1.001, rid


def test_the_output_adapter_adds_what_was_measured():
    """Each head-* run minus its nohead-* twin, predicted against measured: within 64 B in every phase (the
    parameters and AdamW state, the saved c T (h + r), the fp32 cross-entropy's sum at 3 x 4 T V, the gradients),
    but the bf16 cross-entropy forward, 258,152 B (0.5 % of the peak) under the measured, not explained."""
    for rid in (r for r in ROWS if r.startswith("head-")):
        (pred, meas), (tpred, tmeas) = ROWS[rid], ROWS["no" + rid]
        for phase in PHASES:
            gap = (pred[phase] - tpred[phase]) - (meas[phase] - tmeas[phase])
            if offset(rid, phase):
                assert gap == -258_152, (rid, phase)
            else:
                assert abs(gap) <= 64, (rid, phase, gap)


def model(vocab=8000, **over):
    hf = dict(RUNS["head-llama3-2l-v8000-untied-fp32-eager-lora-qv-b2-s256"]["hf_config"], vocab_size=vocab, **over)
    return from_hf_config(hf, name="tt-head")


def solve(targets=("q_proj", "v_proj", "lm_head"), regime="fp32", loss=None, m=None, **kw):
    lora = kw.pop("lora", None) or LoRAConfig(rank=8, target_modules=targets, adapter_dtype="base")
    extra = {"loss": loss} if loss else {}
    precision = "bf16" if regime == "amp-bf16" else regime
    return TrainingMemoryModel().solve(m or model(), BIG, 2, 256, precision, "adamw", kw.pop("checkpointing", "none"),
                                       profile="measured", regime=regime, attention="sdpa", device="cpu",
                                       runtime_overheads=False, lora=lora, **extra, **kw)


def terms(r):
    return {t.label: t for t in r.terms}


def test_hand_derived_fp32_cross_entropy():
    """fp32, T = 512, h 256, V 8,000, r 8. Saved: lora_a's input (the final norm's output) and lora_b's, 4 x 512 x
    (256 + 8) = 540,672 B. The forward's moment at the sum, 3 x 4 T V = 49,152,000 B, against the loss's logits and
    log-softmax 2 x 4 T V and labels 8 T: 16,379,904 B beyond (measured 16,379,884). The adapter: 8 x (256 + 8,000)
    = 66,048 parameters, 264,192 B, and AdamW's two moments; its gradients 264,192 B."""
    head, plain = solve(), solve(("q_proj", "v_proj"))
    t = terms(head)
    assert t["the LM head adapter's saved input and r-wide output"].nbytes == 540_672
    assert t["the LM head adapter's output sum (transient), beyond the loss's moment"].nbytes == 16_379_904
    def of(r, component):
        return sum(x.nbytes for x in r.terms if x.component == component)
    assert of(head, "weights") - of(plain, "weights") == 264_192
    assert of(head, "gradients") - of(plain, "gradients") == 264_192
    # AdamW's two moments and two more step counters (measured: the timeline's baseline, 3 x 264,192 + 8 B with the
    # weights), and the foreach step's one temporary over them
    assert of(head, "optimizer_state") - of(plain, "optimizer_state") == 2 * 264_192 + 2 * 4 + 264_192


def test_chunked_output_keeps_the_sum_under_the_loss():
    """torchtune's chunked output calls the head per chunk (t = 2 x 32 = 64 tokens): the earlier chunks' outputs
    c (T - t) V and the last chunk's 3 c t V, 4 x 8,000 x (448 + 192) = 20,480,000 B, under the chunked loss's
    forward (every chunk's logits and log-softmax, one fp32 copy: 2 x 4 T V + 8 T): nothing beyond."""
    t = terms(solve(loss="chunked"))["the LM head adapter's output sum (transient), beyond the loss's moment"]
    assert t.nbytes == 0 and "= 20,480,000 B" in t.formula and "t = 64" in t.formula


def test_no_head_target_no_head_terms():
    labels = set(terms(solve(("q_proj", "v_proj"))))
    assert not any("LM head adapter" in label for label in labels)


def test_counts():
    """Once, not per layer: r (h + V); with DoRA + V; a tied head's adapter is its own (the shared weight frozen)."""
    mistral = get_model("mistralai/mistral-7b-v0.1")
    qv = LoRAConfig(rank=64, target_modules=("q_proj", "v_proj"))
    head = LoRAConfig(rank=64, target_modules=("q_proj", "v_proj", "lm_head"))
    c = lora_counts(mistral, head)
    assert c.trainable_parameters - lora_counts(mistral, qv).trainable_parameters == 64 * (4096 + 32_000) == 2_310_144
    assert c.head_modules == (("lm_head", 4096, 32_000, 2_310_144),)
    dora = LoRAConfig(rank=64, target_modules=("q_proj", "v_proj", "lm_head"), use_dora=True)
    assert lora_counts(mistral, dora).head_modules[0][3] == 2_310_144 + 32_000
    tied = get_model("meta-llama/Llama-3.2-1B")
    assert tied.tied_embeddings
    t = lora_counts(tied, LoRAConfig(rank=8, target_modules=("q_proj", "lm_head")))
    assert t.head_modules == (("lm_head", 2048, 128_256, 8 * (2048 + 128_256)),)
    assert lora_counts(tied, LoRAConfig(rank=8, target_modules="all-linear")).head_modules == ()   # peft's all-linear


def test_counts_refusals():
    mistral = get_model("mistralai/mistral-7b-v0.1")
    with pytest.raises(NotModelledError, match="an adapter on the LM head alone"):
        LoRAConfig(rank=8, target_modules=("lm_head",))
    with pytest.raises(InvalidInputError, match="lora.modules_to_save.*either adapted or a trainable copy"):
        lora_counts(mistral, LoRAConfig(rank=8, target_modules=("q_proj", "lm_head"), modules_to_save=("lm_head",)))
    with pytest.raises(InvalidInputError, match="lora.rank"):
        lora_counts(model(vocab=8000, hidden_size=64, head_dim=8, intermediate_size=128),
                    LoRAConfig(rank=100, target_modules=("q_proj", "lm_head")))


@pytest.mark.parametrize("kw, name, message", [
    (dict(lora=LoRAConfig(rank=8, target_modules=("q_proj", "lm_head"), quantization="nf4")), "lora.quantization",
     "QLoRA with an adapted LM head"),
    (dict(lora=LoRAConfig(rank=8, target_modules=("q_proj", "lm_head"), use_dora=True, adapter_dtype="base")),
     "lora.use_dora", "DoRA's magnitude and weight norm on the LM head"),
    (dict(lora=LoRAConfig(rank=8, target_modules=("q_proj", "lm_head"), dropout=0.1, adapter_dtype="base")),
     "lora.dropout", "dropout mask"),
    (dict(regime="bf16", lora=LoRAConfig(rank=8, target_modules=("q_proj", "lm_head"))), "lora.adapter_dtype",
     "peft's autocast_adapter_dtype"),
    (dict(regime="amp-bf16"), "regime", "fp32 or a pure 16-bit regime"),
    (dict(dp_size=2), "dp_size", "sharding, gathers and stages"),
    (dict(loss="torchtune_linear"), "loss", "torchtune_linear with an adapter on the LM head"),
    (dict(compile="blocks"), "compile", "measured eager"),
])
def test_refused_by_name(kw, name, message):
    with pytest.raises(NotModelledError, match=message) as e:
        solve(**kw)
    assert e.value.parameter == name


def test_torchtune_apply_lora_to_output_answers():
    """mistral/7B_lora.yaml (apply_lora_to_output: True, rank 64, bf16, the chunked loss, checkpointed layers): the
    head a target; on one GPU it answers, the head adapter's 2 x 2,310,144 B and its saved 2 x T x (4,096 + 64) B
    priced; on 8 (FSDP2) the head adapter's sharding is refused, naming dp_size."""
    path = LAUNCH / "torchtune" / "mistral" / "7B_lora.yaml"
    s = from_launch([path], gpus=1, seq_len=2048).scenario
    assert s.profile_options["lora"]["target_modules"][-1] == "lm_head"
    r = s.solve()
    off = from_launch([path], gpus=1, seq_len=2048, overrides=["model.apply_lora_to_output=False"]).scenario.solve()
    assert r.weights - off.weights == 2 * 2_310_144
    T = 4 * 2048
    assert terms(r)["the LM head adapter's saved input and r-wide output"].nbytes == 2 * T * (4096 + 64)
    with pytest.raises(NotModelledError) as e:
        from_launch([path], gpus=8, seq_len=2048).scenario.solve()
    assert e.value.parameter == "dp_size"


def test_torchtune_refuses_a_tied_output(tmp_path):
    """torchtune's lora_llama3_2 raises on apply_lora_to_output (its 1B and 3B tie the output to the embedding)."""
    text = (LAUNCH / "torchtune" / "llama3_2" / "3B_lora_single_device.yaml").read_text()
    assert "  apply_lora_to_mlp: True\n" in text and "apply_lora_to_output" not in text
    path = tmp_path / "3B_lora_single_device.yaml"
    path.write_text(text.replace("  apply_lora_to_mlp: True\n", "  apply_lora_to_mlp: True\n  apply_lora_to_output: True\n"))
    with pytest.raises(NotModelledError, match="tied to its embedding") as e:
        from_launch([path], seq_len=2048)
    assert e.value.parameter == "model.apply_lora_to_output"


def test_litgpt_lora_head_is_the_target():
    """finetune/phi-3/lora.yaml (lora_head: true): the head a target. Solved (on a Llama-style model: Phi-3's own
    fused qkv is refused first) the head adapter is refused: the reader builds the adapters in the base's dtype, as
    LitGPT does, and LitGPT's chunked LM head and loss with a head adapter are not measured (the loss is named)."""
    path = LAUNCH / "litgpt" / "finetune" / "phi-3" / "lora.yaml"
    s = from_launch([path]).scenario
    assert s.profile_options["lora"]["target_modules"][-1] == "lm_head"
    with pytest.raises(NotModelledError) as e:
        from_launch([path], model="mistralai/mistral-7b-v0.1").scenario.solve()
    assert e.value.parameter == "loss" and e.value.value == "litgpt_chunked"
    assert "'lm_head' in lora.target_modules" in str(e.value)


def test_the_docs_table_is_the_comparison():
    page = (ROOT / "docs" / "finetune.md").read_text(encoding="utf-8")
    assert compare.deltas() in page


def test_peft_target_modules_naming_lm_head(tmp_path):
    """A Hugging Face / axolotl / LLaMA-Factory config's peft target_modules with lm_head: the same target (axolotl's
    examples/llama-3/lora-1b.yml with lm_head added); its lora_dropout 0.05 on the head is refused by name."""
    text = (LAUNCH / "axolotl" / "examples" / "llama-3" / "lora-1b.yml").read_text()
    path = tmp_path / "lora-1b.yml"
    path.write_text(text.replace("lora_target_modules:\n", "lora_target_modules:\n  - lm_head\n", 1))
    s = from_launch([path], gpus=1).scenario
    assert "lm_head" in s.profile_options["lora"]["target_modules"]
    with pytest.raises(NotModelledError, match="the head adapter's dropout mask") as e:
        s.solve()
    assert e.value.parameter == "lora.dropout"
