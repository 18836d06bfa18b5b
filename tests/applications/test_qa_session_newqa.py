"""A new user tries the session's features from the CLI (helper NEWQA, issues 24-27): an
error about a value the user gave on the command line over a `--from` file names that value,
never the file as where it came from."""

from pathlib import Path

import pytest

from clitools import error_of, run

from mlsysim_core.search import precision_words

TORCHTUNE_QLORA_8B = (Path(__file__).resolve().parents[1] / "data" / "launch" / "torchtune" / "llama3_1"
                      / "8B_qlora_single_device.yaml")
ARGV = ("estimate", "--from", str(TORCHTUNE_QLORA_8B), "--seq-len", "2048", "-g", "rtx-4090")


def test_a_flag_over_a_launch_file_is_not_said_to_come_from_the_file(capsys):
    # --rope-cache 1024 replaces the reader's rope_cache (the builder's max_seq_len, 131,072):
    # the refusal said "rope_cache comes from default (<file>: model._component_ absent; ...)".
    code, err = error_of(capsys, *ARGV, "--rope-cache", "1024")
    assert code == 2
    assert err == ("mlsysim-core: error: rope_cache=1024 is not allowed: at least the sequence length 2048 "
                   "(torchtune's rope slices cache[:seq_len]: a longer input fails in its forward)")
    # --lora-rank 0 replaces the file's model.lora_rank 8: it said "lora.rank comes from <file>: model.lora_rank/...".
    code, err = error_of(capsys, *ARGV, "--lora-rank", "0")
    assert code == 2
    assert err == "mlsysim-core: error: lora.rank=0 is not allowed: an integer >= 1"


def test_a_file_value_a_flag_makes_wrong_still_names_the_file(capsys):
    # The file's rope_cache (131,072) is too short for --seq-len 200000: the value is the file's.
    argv = [a if a != "2048" else "200000" for a in ARGV]
    code, err = error_of(capsys, *argv)
    assert code == 2
    assert err.startswith("mlsysim-core: error: rope_cache=131072 is not allowed: at least the sequence length 200000")
    assert f"rope_cache comes from {TORCHTUNE_QLORA_8B}: model._component_)" in err


def test_a_regime_alone_is_not_shown_beside_the_default_precision_it_does_not_run_at():
    # `search --regime mixed-bf16-main-grad` headed its table "run: precision fp16, regime
    # mixed-bf16-main-grad" (the CLI's default precision, which that regime never runs at;
    # --precision fp16 with it is refused as a contradiction); `time` said the same.
    code, text = run("search", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "8", "--global-batch", "8",
                     "--regime", "mixed-bf16-main-grad")
    assert code == 0
    assert text.splitlines()[1].startswith("run: regime mixed-bf16-main-grad: mixed-bf16 with Megatron's fp32 "
                                           "main-grad accumulation buffer")
    code, text = run("time", "--model", "llama3-8b", "--hardware", "h100", "--global-batch", "8", "--dp", "8",
                     "--regime", "mixed-bf16-main-grad", "--data-parallel", "mcore-distopt")
    assert code == 0
    assert text.splitlines()[1] == ("profile measured, regime mixed-bf16-main-grad, optimizer adam, global batch 8, "
                                    "seq 2048")
    # A precision the regime runs at, or a regime from the precision, is still said.
    code, text = run("time", "--model", "llama3-8b", "--hardware", "h100", "--global-batch", "8", "--dp", "8",
                     "--regime", "bf16", "--precision", "bf16")
    assert code == 0 and text.splitlines()[1].startswith("profile measured, precision bf16, regime bf16, optimizer")
    assert precision_words("fp16", "amp-fp16") == "precision fp16, "
    assert precision_words("fp16", "mixed-bf16") == ""
    assert precision_words("fp16", None) == "precision fp16, "


@pytest.mark.parametrize("flag, value, unit", [
    ("--host-link-gbps", "-3", "GB/s (10^9 bytes/s)"), ("--host-memory-gbps", "nan", "GB/s (10^9 bytes/s)"),
    ("--flops", "0", "FLOP/s")])
def test_fit_techniques_figures_are_refused_as_typed(capsys, flag, value, unit):
    # --host-link-gbps -3 said "host link B/s=-3000000000.0 is not allowed: a positive number (per second)":
    # neither the flag nor the value the user typed.
    code, err = error_of(capsys, "fit", "techniques", "--model", "llama3-8b", "--hardware", "h100", "-b", "8",
                         flag, value)
    assert code == 2
    assert err == f"mlsysim-core: error: {flag}={float(value)!r} is not allowed: a positive number of {unit}"


def test_fit_techniques_keyword_named_in_python():
    from mlsysim_core.errors import InvalidInputError
    from mlsysim_plugins.measured.technique_fit import fit_techniques
    with pytest.raises(InvalidInputError) as e:
        fit_techniques("llama3-8b", "h100", 8, 2048, host_link_bytes_per_s=-1)
    assert e.value.parameter == "host_link_bytes_per_s"
    assert str(e.value) == "host_link_bytes_per_s=-1 is not allowed: a positive number of B/s"


def test_torchaos_block_size_is_declared_and_another_refused():
    # torchao's NF4Tensor quantizes in blocks of 64 (to_nf4 as torchtune calls it): lora.quant_blocksize=128 was
    # silently ignored (the same 24,035,514,966.4 B as 64); bitsandbytes reads it (24,149,131,955.2 B at 128).
    import mlsysim_core
    from mlsysim_core.errors import NotModelledError
    run_kw = dict(precision="bf16", regime="bf16")
    lora = {"rank": 8, "quantization": "nf4", "quant_implementation": "torchao"}
    same = mlsysim_core.estimate("llama3-8b", "rtx-4090", 1, 2048, lora={**lora, "quant_blocksize": 64}, **run_kw)
    assert same.total_memory == mlsysim_core.estimate("llama3-8b", "rtx-4090", 1, 2048, lora=lora,
                                                      **run_kw).total_memory
    with pytest.raises(NotModelledError) as e:
        mlsysim_core.estimate("llama3-8b", "rtx-4090", 1, 2048, lora={**lora, "quant_blocksize": 128}, **run_kw)
    assert (e.value.parameter, e.value.value) == ("lora.quant_blocksize", 128)
    assert str(e.value).startswith("lora.quant_blocksize=128 is not allowed: 64 with quant_implementation='torchao', "
                                   "or leave it out (torchao quantizes in blocks of 64 whatever quant_blocksize says")
    bnb = mlsysim_core.estimate("llama3-8b", "rtx-4090", 1, 2048, lora={**lora, "quant_implementation": "bitsandbytes",
                                                                         "quant_blocksize": 128}, **run_kw)
    assert bnb.total_memory != mlsysim_core.estimate("llama3-8b", "rtx-4090", 1, 2048, lora={
        **lora, "quant_implementation": "bitsandbytes"}, **run_kw).total_memory


def test_a_rule_refused_by_the_regime_says_it_was_given_as_zero_stage(capsys):
    # --zero-stage 1 under mixed-bf16-main-grad was refused as "data_parallel='zero1'", a name the user never typed.
    argv = ("estimate", "--model", "llama3-8b", "--hardware", "h100", "-b", "8", "--regime", "mixed-bf16-main-grad",
            "--dp", "8")
    code, err = error_of(capsys, *argv, "--zero-stage", "1")
    assert code == 2
    assert err.startswith("mlsysim-core: error: data_parallel='zero1' is not allowed: a data-parallel rule that "
                          "declares 'megatron-main-grad'")
    assert err.endswith("rule 'zero1' declares none, and dp x cp = 8; given as --zero-stage 1)")
    code, err = error_of(capsys, *argv, "--data-parallel", "zero1")
    assert code == 2 and err.endswith("rule 'zero1' declares none, and dp x cp = 8)")
