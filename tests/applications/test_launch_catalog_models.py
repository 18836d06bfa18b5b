"""Issue 26: launch files naming models the catalog lacked now answer with the curated entry (added
from a config.json copy, tests/core/test_catalog_launch_models.py), under the measured profile; a file
whose model has no architecture family (StarCoder2, SmolLM3) is still refused naming the model."""

from pathlib import Path

import pytest

from mlsysim_core.catalog import get_model
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.scenario import from_launch

DATA = Path(__file__).resolve().parents[1] / "data" / "launch"

# file, --gpus, the catalog key the file's model resolves to
ANSWERED = [
    ("hf_trainer/alignment-handbook/smollm2/sft/config.yaml", 8, "huggingfacetb/smollm2-1.7b"),
    ("hf_trainer/alignment-handbook/zephyr-7b-gemma/sft/config_full.yaml", 8, "google/gemma-7b"),
    ("litgpt/pretrain/tinyllama.yaml", 8, "tinyllama/tinyllama-1.1b-chat-v1.0"),
]


@pytest.mark.parametrize("name,gpus,key", ANSWERED)
def test_the_file_answers_with_the_curated_model(name, gpus, key):
    launch = from_launch([DATA / name], gpus=gpus, hardware="h100")
    assert launch.scenario.model == key
    result = launch.scenario.solve()
    assert result.profile == "measured" and result.model == get_model(key).name
    assert result.total_memory > result.weights > 0


def test_litgpt_gemma_2b_is_the_curated_gemma_with_litgpts_untied_head():
    launch = from_launch([DATA / "litgpt/finetune/gemma-2b/full.yaml"], hardware="h100")
    model, gemma = launch.scenario.model, get_model("google/gemma-2b")
    assert model["name"] == "google/gemma-2b (LitGPT: untied lm_head)"
    assert (model["layers"], model["hidden_dim"], model["heads"]) == (gemma.layers, gemma.hidden_dim, gemma.heads)
    # LitGPT stores the LM head apart from the embedding: one more vocab x hidden matrix
    assert model["parameters"] == gemma.parameters + gemma.vocab_size * gemma.hidden_dim == 3_030_460_416
    result = launch.scenario.solve()
    assert result.profile == "measured" and result.model == model["name"] and result.total_memory > 0


def test_llamafactorys_qwen2_muon_example_answers_with_the_hand_derived_split():
    """Qwen/Qwen2-1.5B-Instruct resolves, and Muon takes its 2-D matrices while AdamW takes the embedding,
    the q/k/v biases and the norms (each bias once: it was counted twice, refusing the run). By hand
    (h 1,536, kv 256, ffn 8,960, 28 layers, vocabulary 151,936, tied): Muon per layer q 1,536^2 + k, v
    256 x 1,536 each + o 1,536^2 + 3 x 8,960 x 1,536 = 46,792,704, x 28 = 1,310,195,712; AdamW
    151,936 x 1,536 + 28 x (1,536 + 256 + 256 + 2 x 1,536) + 1,536 = 233,518,592 in 1 + 28 x 5 + 1 = 142
    tensors; the two add up to the model's 1,543,714,304 parameters."""
    launch = from_launch([DATA / "llamafactory/examples/extras/muon/qwen2_full_sft.yaml"], gpus=8, hardware="h100")
    assert launch.scenario.model == "qwen/qwen2-1.5b-instruct"
    assert launch.scenario.solve().feasible is not None
    from mlsysim_core.solver import TrainingMemoryModel
    result = TrainingMemoryModel(profile="measured").solve("qwen/qwen2-1.5b-instruct", "h100", 8, optimizer="muon")
    terms = {t.label: t for t in result.terms}
    assert terms["muon momentum buffers"].nbytes == 1_310_195_712 * 4
    assert terms["muon's adamw state (2 moments)"].nbytes == 2 * 233_518_592 * 4
    assert terms["muon's adamw step counters"].nbytes == 142 * 4
    assert 1_310_195_712 + 233_518_592 == 1_543_714_304


@pytest.mark.parametrize("name,model", [
    ("hf_trainer/alignment-handbook/starchat2-15b/sft/config_v0.1.yaml", "bigcode/starcoder2-15b"),
    ("hf_trainer/alignment-handbook/smollm3/sft/sft.yaml", "HuggingFaceTB/SmolLM3-3B-checkpoints"),
])
def test_a_model_without_an_architecture_family_is_still_refused_naming_it(name, model):
    with pytest.raises(InvalidInputError) as err:
        from_launch([DATA / name], gpus=8, hardware="h100")
    assert err.value.parameter == f"{DATA / name}: model_name_or_path" and err.value.value == model
