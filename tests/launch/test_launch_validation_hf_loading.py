"""The axolotl 15f7910d Llama-3 70B QLoRA + FSDP row: what each GPU holds while the model loads
(validation/loading/axolotl_qlora_fsdp_70b.py, derived from source) and the row's verdict."""

import pytest
from scripttools import load_script

ROW = "axolotl-ai-cloud/axolotl@15f7910d examples/llama-3/README.md:13"


@pytest.fixture(scope="module")
def loading():
    return load_script("validation/loading/axolotl_qlora_fsdp_70b.py")


@pytest.fixture(scope="module")
def tool():
    return load_script("tools/launch_validation_hf.py")


def _quant_state(n):
    # nf4 + double quant: uint8 absmax per 64 elements, fp32 offset, fp32 nested absmax per 256 blocks,
    # the nested 256-entry fp32 code, the 16-entry fp32 nf4 code
    blocks = -(-n // 64)
    return blocks + 4 + 4 * -(-blocks // 256) + 1024 + 64


def test_the_whole_quantized_model_is_on_each_gpu_after_model_to(loading):
    """Llama-3-70B by hand: h 8,192, 80 layers, 64 heads of 128, 8 KV heads, ffn 28,672, V 128,256."""
    shapes = [8192 * 8192, 8192 * 1024, 8192 * 1024, 8192 * 8192] + [8192 * 28672] * 3
    assert sum(shapes) == 855_638_016
    codes = 80 * sum(n // 2 for n in shapes)                  # two codes a byte (bf16 quant storage)
    states = 80 * sum(_quant_state(n) for n in shapes)
    plain = 2 * (2 * 128_256 * 8192 + 161 * 8192)             # embeddings, LM head, 161 norms, bf16
    adapters = 2 * 80 * 8 * (2 * 16384 + 2 * 9216 + 3 * 36864)  # r (in + out), bf16
    assert (codes, plain, adapters) == (34_225_520_640, 4_205_330_432, 207_093_760)
    stages = {name: nbytes for name, nbytes, _ in loading.stages()}
    assert stages["after model.to(cuda) (axolotl models.py:803)"] == codes + states + plain + adapters
    assert stages["after get_peft_model"] == plain + 80 * 7 * 64     # the nf4 code tables stay
    layer = 855_638_016 // 2 + 2 * 2 * 8192                       # one layer's flat parameter: codes, two norms
    assert stages["FSDP wrap, the first decoder layer"] == codes + states + plain + adapters + layer + layer // 2
    root = 2 * (2 * 128_256 * 8192 + 8192)                        # embeddings, final norm, LM head: one flat parameter
    assert stages["FSDP wrap, the root unit (last)"] == plain + states + root + root // 2
    assert "reaches at least 46,670,656,704 B" in dict((n, w) for n, _, w in loading.stages())[
        "FSDP wrap, the root unit (last)"]                         # the first layer's high-water + the root's copies
    assert codes + states + plain + adapters + layer + layer // 2 + root + root // 2 == 46_670_656_704
    # above the published 21 GiB (VRAM, CUDA context included) before any training byte
    assert stages["after model.to(cuda) (axolotl models.py:803)"] > 21 * 2**30


def test_quantization_states_agree_with_the_measured_profile(loading, tool):
    """The derivation's QuantState bytes are the profile's 'quantization constants' term of the row (every
    rank keeps them whole), so the loading stages and the training prediction count the same tensors."""
    from mlsysim_core.scenario import from_launch
    launch = from_launch([tool.DATA / "axolotl/readme_15f7910d/llama-3/qlora-fsdp-70b.yaml"], gpus=2,
                         hardware="nvidia/l40s")
    term = [t for t in launch.scenario.solve().terms if t.label == "quantization constants"]
    stages = {name: nbytes for name, nbytes, _ in loading.stages()}
    states = stages["after model.to(cuda) (axolotl models.py:803)"] - 34_225_520_640 - 4_205_330_432 - 207_093_760
    assert [t.nbytes for t in term] == [states] == [1_086_870_720]


def test_the_row_stays_and_says_it_is_below_the_loading_floor(tool):
    spec = next(r for r in tool.ROWS if r[0] == ROW)
    line = tool.row(*spec)
    assert "| 8.00 GiB (total, with runtime overheads; approximated: bf16/fp16) | -61.9 % (not comparable: " in line
    assert "below this config's loading floor at 15f7910d, 37.00 GiB alive on each GPU after axolotl's " \
           "model.to(cuda)" in line


def test_the_docs_table_is_the_derivation(loading):
    assert loading.main(["--check"]) == 0


def test_fsdp1_wrap_measured_on_the_cpu_is_the_mechanism():
    """validation/loading/measure_fsdp1_wrap.py (torch 2.13 CPU, bitsandbytes 0.50.2, a 4-bit gqa-tiny Llama under
    peft, FSDP1 as accelerate prepares it, rank 0 of a fake world of 2): each unit allocates its flat parameter
    (torch.cat) and its shard (clone) and frees the flat parameter and its originals; the high-water mark is at the
    root unit. By hand: h 256, 4 layers, 8 heads of 32, 2 KV heads, MLP 688, vocab 32,000, LoRA r 8 in fp32."""
    import json
    from scripttools import ROOT
    record = json.loads((ROOT / "validation" / "loading" / "fsdp1_wrap.json").read_text())
    layer = (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688) // 2 + 2 * 256 * 2     # codes (bf16 storage) + 2 norms
    root = 2 * (2 * 32000 * 256 + 256)                                               # embeddings, LM head, final norm
    adapters = 4 * 4 * 8 * (512 + 320 + 320 + 512 + 3 * 944)
    assert (layer, root, adapters) == (347_136, 32_768_512, 575_488)
    high_water = root + root // 2 - 4 * (layer - layer // 2) - (adapters - adapters // 2)
    assert record["predicted"]["high_water"] == high_water == 48_170_752
    measured = record["measured"]["high_water"]
    assert abs(measured - high_water) <= 4096, measured         # 48,174,848 B: +4,096 B (0.008 %)
