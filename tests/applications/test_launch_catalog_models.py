"""Issue 26: launch files naming models the catalog lacked now answer with the curated entry (added
from a config.json copy, tests/core/test_catalog_launch_models.py), under the measured profile; a file
whose model has no architecture family (StarCoder2, SmolLM3) is still refused naming the model."""

from pathlib import Path

import pytest

from mlsysim_core.catalog import get_model
from mlsysim_core.errors import InvalidInputError, NotModelledError
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


def test_llamafactorys_qwen2_example_gets_past_the_catalog_to_its_optimizer():
    """Qwen/Qwen2-1.5B-Instruct resolves; what is refused now is the example's Muon optimizer on a Qwen2
    (biased q/k/v), named as such: the model is no longer the reason."""
    launch = from_launch([DATA / "llamafactory/examples/extras/muon/qwen2_full_sft.yaml"], gpus=8, hardware="h100")
    assert launch.scenario.model == "qwen/qwen2-1.5b-instruct"
    with pytest.raises(NotModelledError, match=r"optimizer='muon' is not allowed: .*qwen2: the Muon/AdamW split"):
        launch.scenario.solve()


@pytest.mark.parametrize("name,model", [
    ("hf_trainer/alignment-handbook/starchat2-15b/sft/config_v0.1.yaml", "bigcode/starcoder2-15b"),
    ("hf_trainer/alignment-handbook/smollm3/sft/sft.yaml", "HuggingFaceTB/SmolLM3-3B-checkpoints"),
])
def test_a_model_without_an_architecture_family_is_still_refused_naming_it(name, model):
    with pytest.raises(InvalidInputError) as err:
        from_launch([DATA / name], gpus=8, hardware="h100")
    assert err.value.parameter == f"{DATA / name}: model_name_or_path" and err.value.value == model
