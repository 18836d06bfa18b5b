"""The measured profile: hand-derived numbers, options and their errors.

Its accuracy against PyTorch's own measurements is tested in test_validation_report.py;
here each mechanism is checked against a hand derivation on a small Llama-style model
(h=256, ffn=688, 4 layers, 8 heads, vocabulary 32,000, untied: 19,548,416 parameters).
"""

import pytest

from mlsysim_core import InvalidInputError, TrainingMemoryModel
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured.model import RuntimeOverheads
from mlsysim_core.types import HardwareNode, TransformerWorkload

H, F, L, A, V = 256, 688, 4, 8, 32000
P = 2 * V * H + L * (4 * H * H + 3 * H * F + 2 * H) + H
TENSORS = 9 * L + 3
BIG = HardwareNode(name="big", memory_capacity=2**50)

LLAMA_TINY = from_hf_config(dict(
    model_type="llama", vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
    num_attention_heads=A, num_key_value_heads=A, hidden_act="silu", max_position_embeddings=4096,
    rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0, attention_bias=False, mlp_bias=False),
    name="llama-tiny")


@pytest.fixture(scope="module")
def solver():
    return TrainingMemoryModel("measured")


def solve(solver, b=8, s=256, **kw):
    kw.setdefault("runtime_overheads", False)
    kw.setdefault("regime", "fp32")
    return solver.solve(LLAMA_TINY, BIG, b, s, optimizer=kw.pop("optimizer", "adam"),
                        activation_checkpointing=kw.pop("activation_checkpointing", "none"), **kw)


def term(result, label):
    [t] = [t for t in result.terms if t.label.startswith(label)]
    return t


def test_parameter_count_is_the_hand_count():
    assert LLAMA_TINY.parameters == P == 19_548_416


def test_fp32_adam_model_states(solver):
    r = solve(solver)
    assert term(r, "parameters").nbytes == 4 * P
    assert term(r, "adam state").nbytes == 2 * 4 * P                  # m and v, fp32
    assert term(r, "adam step counters").nbytes == 4 * TENSORS         # one fp32 step per tensor
    assert term(r, "adam foreach step").nbytes == 4 * P               # _foreach_sqrt(exp_avg_sq)
    assert term(r, "adam foreach step").phases == ("optimizer_step",)


def test_optimizer_step_implementations(solver):
    fused = solve(solver, optimizer_impl="fused")
    assert not [t for t in fused.terms if "step temporaries" in t.label]
    loop = solve(solver, optimizer_impl="for-loop")
    # for-loop: 2 temporaries of tensor i + the previous tensor's denom; the LM head (V x h)
    # follows the final norm (h): 2*V*h + h elements is the largest
    assert term(loop, "adam for-loop").nbytes == 4 * (2 * V * H + H)


def test_regimes_choose_the_dtypes(solver):
    bf16 = solve(solver, regime="bf16")
    assert term(bf16, "parameters").nbytes == 2 * P and term(bf16, "adam state").nbytes == 2 * 2 * P
    amp = solve(solver, regime="amp-bf16")
    assert term(amp, "parameters").nbytes == 4 * P and term(amp, "adam state").nbytes == 2 * 4 * P
    # autocast keeps a bf16 copy of every matmul weight: q,k,v,o, gate, up, down and the LM head
    layers = L * (4 * H * H + 3 * H * F)
    assert term(amp, "autocast 16-bit copies of the layers").nbytes == 2 * layers
    assert term(amp, "autocast 16-bit copy of the LM head").nbytes == 2 * V * H
    mixed = solve(solver, regime="mixed-bf16")
    assert term(mixed, "fp32 master weights").nbytes == 4 * P and term(mixed, "parameters").nbytes == 2 * P
    # precision alone picks autocast for 16-bit training
    assert solver.solve(LLAMA_TINY, BIG, 8, 256, "bf16").details["regime"] == "amp-bf16"
    assert solver.solve(LLAMA_TINY, BIG, 8, 256, "fp32").details["regime"] == "fp32"


def test_loss_terms_are_the_cross_entropy_mechanism(solver):
    b, s = 8, 256
    T = b * s
    r = solve(solver, b=b, s=s)
    assert term(r, "log-softmax").nbytes == 4 * T * V and term(r, "log-softmax").phases == ("forward", "backward")
    assert term(r, "cross-entropy backward").nbytes == 8 * T * V and term(r, "cross-entropy backward").phases == ("backward",)
    assert term(r, "logits").nbytes == 4 * T * V           # fp32: .float() is the same tensor
    amp = solve(solver, b=b, s=s, regime="amp-bf16")
    assert term(amp, "logits").nbytes == 2 * T * V + 4 * T * V   # bf16 logits and their fp32 copy


def test_layer_activations_fp32_sdpa_by_hand(solver):
    """Per token, fp32: two RMSNorms (normalized + rsqrt), q, k, v, SDPA output and log-sum-exp,
    the mid residual, 4 MLP tensors, the layer output: 4 x (8h + 2h + 4f) + 4 x (2 + a)."""
    b, s = 8, 256
    r = solve(solver, b=b, s=s)
    per_token = 4 * (8 * H + 2 * H + 4 * F) + 4 * (2 + A)
    assert term(r, "decoder layers").nbytes == L * b * s * per_token
    # ... which is what MemTracker measured for llama-tiny at b=8, s=256 (4 layers x 43,597,824 B)
    assert term(r, "decoder layers").nbytes == 4 * 43_597_824


def test_eager_attention_keeps_the_scores(solver):
    b, s = 2, 512
    sdpa, eager = solve(solver, b=b, s=s), solve(solver, b=b, s=s, attention="eager")
    scores = L * b * A * s * s * 4           # the softmax output (fp32) per layer
    lse = L * b * s * A * 4                  # SDPA's log-sum-exp, which eager does not keep
    # with as many KV heads as heads, the rest is the same tensors (q, k, v, output)
    assert term(eager, "decoder layers").nbytes - term(sdpa, "decoder layers").nbytes == scores - lse
    selective = solve(solver, b=b, s=s, attention="eager", activation_checkpointing="selective")
    assert term(selective, "decoder layers").nbytes < term(eager, "decoder layers").nbytes


def test_the_peak_is_a_phase_not_a_sum(solver):
    r = solve(solver)
    totals = r.phase_totals
    assert r.total_memory == max(totals.values()) == totals[r.peak_phase]
    assert r.peak_phase == "backward"    # activation-bound: the first backward ops
    small = solve(solver, b=1, s=128)
    assert small.peak_phase == "optimizer_step"   # state-bound: the foreach step's temporary


def test_checkpointing_and_block_recompute(solver):
    none = solve(solver, activation_checkpointing="none")
    full = solve(solver, activation_checkpointing="full")
    half = solve(solver, activation_checkpointing="full", checkpointed_layers=2)
    assert term(full, "checkpointed layers").nbytes == L * 8 * 256 * H * 4     # fp32 inputs
    assert full.total_memory < half.total_memory < none.total_memory
    assert term(half, "decoder layers").nbytes == term(none, "decoder layers").nbytes / 2


def test_runtime_overheads_are_separate_and_overridable(solver):
    plain = solve(solver)
    r = solve(solver, runtime_overheads=None)
    default = RuntimeOverheads()
    assert default.cublas_workspace is None      # PyTorch's default for the hardware; BIG does not say: 32 MiB per thread (2)
    assert r.runtime_overheads == pytest.approx(default.cuda_context + 2 * 32 * 2**20
                                                + default.allocator_fraction * plain.total_memory)
    assert r.allocated_memory == pytest.approx(plain.total_memory)
    custom = solve(solver, runtime_overheads={"cuda_context": 0, "allocator_fraction": 0.0, "cublas_workspace": 2**20})
    assert custom.runtime_overheads == 2**20
    # NCCL buffers only when ranks communicate
    assert "NCCL buffers" not in {t.label for t in r.terms}


def test_new_optimizers_measured_state(solver):
    sgdm = solve(solver, optimizer="sgd-momentum", regime="bf16")
    assert term(sgdm, "sgd-momentum state").nbytes == 2 * P
    assert not [t for t in solve(solver, optimizer="sgd").terms if t.component == "optimizer_state"]
    ada = solve(solver, optimizer="adafactor")
    # rows + columns of every matrix, full vectors for norms: embed and LM head (V + h each),
    # q,k,v,o (2h each), gate/up/down (f + h each), 2 norms per layer and the final norm
    elements = 2 * (V + H) + L * (4 * 2 * H + 3 * (F + H) + 2 * H) + H
    assert term(ada, "adafactor factored").nbytes == 4 * elements
    lion = solve(solver, optimizer="lion")
    assert term(lion, "lion state").nbytes == 4 * P
    eight = solve(solver, optimizer="adam-8bit")
    # matrices (>= 4,096 elements): 1 B + a 4-byte absmax per 256; norms (256 elements): fp32
    big = 2 * V * H + L * (4 * H * H + 3 * H * F)
    small = 2 * L * H + H
    assert term(eight, "adam-8bit moments").nbytes == 2 * (big + 4 * (big // 256) + 4 * small)


def test_errors_name_the_parameter(solver):
    with pytest.raises(InvalidInputError, match="regime='fp8' is not allowed: one of amp-bf16, amp-fp16, bf16, fp16, fp32, fsdp-bf16"):
        solve(solver, regime="fp8")
    with pytest.raises(InvalidInputError, match="optimizer_impl='apex'"):
        solve(solver, optimizer_impl="apex")
    with pytest.raises(InvalidInputError, match="attention='flash3'"):
        solve(solver, attention="flash3")
    with pytest.raises(InvalidInputError, match=r"dropout=1.0 is not allowed: a probability in \[0.0, 1.0\)"):
        solve(solver, dropout=1.0)
    with pytest.raises(InvalidInputError, match="checkpointed_layers=2 is not allowed: None unless"):
        solve(solver, checkpointed_layers=2)
    with pytest.raises(InvalidInputError, match="checkpointed_layers=9 is not allowed: at most the model's 4"):
        solve(solver, activation_checkpointing="full", checkpointed_layers=9)
    with pytest.raises(InvalidInputError, match="optimizer_impl='fused' is not allowed: foreach or for-loop"):
        solve(solver, optimizer="adafactor", optimizer_impl="fused")
    with pytest.raises(InvalidInputError, match="runtime_overheads"):
        solve(solver, runtime_overheads=3)
    with pytest.raises(InvalidInputError, match="regime='bf16' is not allowed: under profile 'reference', which has no such option"):
        TrainingMemoryModel().solve(LLAMA_TINY, BIG, 8, 256, regime="bf16")
    shapeless = TransformerWorkload(name="opaque", parameters=10**9, layers=24)
    with pytest.raises(InvalidInputError, match=r"model.hidden_dim=None is not allowed.*from_hf_config"):
        solver.solve(shapeless, BIG, 8, 256)
    with pytest.raises(InvalidInputError, match="precision='int8' is not allowed"):
        solver.solve(LLAMA_TINY, BIG, 8, 256, "int8")


def test_an_optimizer_without_a_measured_model_is_refused_by_name(builtin_pm):
    from mlsysim_core import MemoryTerm, OptimizerSpec, PluginManager, hookimpl

    class Old:
        @hookimpl
        def mlsysim_optimizers(self):
            return [OptimizerSpec(name="test.old", state_terms=lambda plan, placement, options: [
                MemoryTerm(component="optimizer_state", label="x", nbytes=1)])]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Old(), name="test_old")
    model = TrainingMemoryModel(plugin_manager=pm)
    assert model.solve(LLAMA_TINY, BIG, 8, 256, optimizer="test.old").optimizer_state == 1   # reference grade
    with pytest.raises(InvalidInputError, match=r"optimizer='test.old' is not allowed: one with a measured.state_terms "
                                                r"callable under profile 'measured': adafactor, adam, adam-8bit"):
        model.solve(LLAMA_TINY, BIG, 8, 256, optimizer="test.old", profile="measured")


def test_reference_numbers_do_not_move():
    r = TrainingMemoryModel().solve("mlsysim:llama3-8b", "mlsysim:h100", 8)
    assert r.profile == "reference" and r.runtime_overheads == 0 and r.details == {}
    assert r.total_memory == pytest.approx(202.297e9, rel=1e-5)


def test_megatron_main_grad_embedding_gradient_is_made_in_the_weight_dtype():
    """Under Megatron-Core's main-grad regime the model keeps no .grad: the embedding lookup's gradient
    is made in the bf16 weight's dtype (embedding_dense_backward), added to the fp32 main_grad by the DDP
    hook and dropped. Llama-3-8B (untied, V 128,256 x h 4,096): V x h x 2 B at the backward's end."""
    from mlsysim_core.solver import TrainingMemoryModel
    r = TrainingMemoryModel("measured").solve("llama3-8b", "h100", 4, precision="bf16",
                                              regime="mixed-bf16-main-grad", activation_checkpointing="none")
    term = next(t for t in r.terms if t.label == "embedding gradient (being computed)")
    assert term.nbytes == 128_256 * 4_096 * 2 and term.phases == ("backward_end",)
