"""Published training-throughput measurements (issue 17's calibration and held-out checks). Every row cites its source exactly.

Sources (all read from the repositories' git objects or from a stored copy of the paper; nothing here is
computed by this project except where a note says 'derived', with the arithmetic shown):

* pytorch/torchtitan at commit b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (2026-08-21):
  - benchmarks/llama3_h100_202412_torchtitan.md (last changed in 820504e20d1149fbf0b98c567af24c4b0433b22d),
    Tables 1-6: Llama 3.1 8B/70B/405B on 8-512 H100 (96 GB HBM2e, 500 W power limit), torchtitan 9dec370
    (2024-12-26). Throughput is 'TPS/GPU' read at iteration 90; memory is the maximum over GPUs. It reports
    no per-row MFU: 'the 1D Llama 3.1 8B model training on 8 or 128 H100 GPUs without Float8 achieves 33% to
    39% MFU (with or without torch.compile, respectively)' and its footnote 2 says that MFU used the SXM peak
    although the GPUs' peak is 'between SXM and NVL'.
  - benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (last changed in 2887250bbd9103d0bc997ea2efb3a525b5e5dbc0):
    vanilla vs async TP, Llama 3 8B (64 H100) and 70B (256 H100), bf16 / float8 tensorwise / float8 rowwise.
  - benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (last changed in 4a61bd87d3c7e92bcfeb5d5464d9e6bd13ef440a):
    Llama 3.1 8B, FSDP + compile + float8 on 32 and 64 H200.
  - torchtitan/components/quantization/mxfp8.md (last changed in 5b5f578a4663552393854f63c8917e237e2d2ad4):
    8x B200 dense (model not named in the file) and a Llama 4 Scout run on GB200.
  - torchtitan/components/quantization/nvfp4.md (last changed in 73aed7f6c09c04041dae2d2c185bb4c6384ebb3f):
    Llama 3 8B and Qwen3 8B on 4 Blackwell GPUs (exact SKU not stated).
  Unstated fields of the 2024-12 tables come from the torchtitan commit those tables name (9dec370ad26b5f8e9a7333a0e36165018262644b):
  train_configs/llama3_8b.toml ('seq_len = 8192', "mode = 'selective'", "selective_ac_option = 'op'"),
  train_configs/llama3_70b.toml and llama3_405b.toml ('seq_len = 8192'), torchtitan/config_manager.py
  (pipeline_parallel_microbatches: 'The default value will be the number of pipeline stages, if unspecified.').
  torchtitan's FLOP count for MFU at that commit (torchtitan/utils.py get_num_flop_per_token):
  'flop_per_token = 6 * num_params + 12 * l * h * q * t' with num_params excluding the embedding
  (train.py: get_num_params(model, exclude_embedding=True)), l layers, h heads, q head dim, t seq_len,
  'we follow the convention and do not account for sparsity in causal attention', recomputation not counted;
  peak 989e12 for H100 SXM (835e12 NVL, 756e12 PCIe), 989e12 for H200 (get_peak_flops).

* NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):
  - README.md (last changed in 71e2246e1a3b5b95b15358eb60dceace3d99bf93), section 'Performance Benchmarking':
    the table is an IMAGE, images/model_table.png (last changed in f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4,
    2024-07-15); its nine rows are transcribed here from the image. README: 'Vocabulary size: 131,072 tokens',
    'Sequence length: 4,096 tokens', 'Fine-grained overlapping with DP (--overlap-grad-reduce,
    --overlap-param-gather), TP (--tp-comm-overlap), and PP (enabled by default)', 'Throughputs include all
    operations (data loading, optimizer steps, communication, and logging)'; the weak/strong scaling figures
    (images/weak_scaling.png, images/strong_scaling.png) are labelled 'Megatron-Core r0.8.0'. The strong-scaling
    figure (GPT-3 175B, 96 to 4,608 H100, batch 1,152, 'MFU from 47% to 42%') gives no per-point numbers or
    layouts, so it is not recorded.
  - examples/llama/README.md (last changed in bd32927e7e9ea7be86dfad58fc44b9b34a305774), 'FP8 Performance'.
  - megatron/core/transformer/moe/README.md at 4015ff17658cc7ac622cc0f5a3be254dc384f26f (the version before
    0888a06d26a39d3ecdb2613c731166c7190e7870 removed it): '468 TFLOPS for Mixtral 8X7B bf16 training'.
  Megatron's FLOP count (megatron/training/training.py num_floating_point_operations, e.g. at
  b5a7b5ff8311aa98137df24b15b9032f7345f098, 2024-07-19): 12 * B * s * l * h^2 * ((1 + g/a + s/h) * (a*kv/h)
  + (ffn/h) * experts_routed_to * (3/2 if swiglu) + V/(2*l*h)), i.e. forward + wgrad + dgrad GEMMs only,
  the full (non-causal) s^2 attention term, logits included, recomputation not counted
  ('see APPENDIX: FLOATING-POINT OPERATIONS in https://arxiv.org/abs/2104.04473').

* The Llama 3 Herd of Models (arXiv 2407.21783), section 3.3.2, p. 10, Table 4 'Scaling configurations and MFU
  for each stage of Llama 3 405B pre-training'. No page of the paper itself was reachable; the rows are quoted
  from a stored text extraction of the arXiv PDF (find_string id 55567177796, and the same rows in ids
  39822971701 and 70888892482). The paper defines MFU only by citing Chowdhery et al. (2023) (PaLM); its FLOP formula and peak are not
  restated. The paper text quoted in notes: 'H100 GPUs, each running at 700W TDP with 80GB HBM3' (3.3.1).

Not found: the torchtitan paper's own tables (arXiv 2410.06511) could not be read from any stored copy (a third
party quotes 6,258 -> 9,409 tok/s for its 8-GPU Table 1, different from the benchmark file above; not recorded);
NVIDIA NeMo / Megatron Bridge performance tables were not mined in the time available.

* mosaicml/llm-foundry at commit 8c8dd48f72168c5d51e2f7b151595892a8fba43d: scripts/train/benchmarking/README.md,
  table 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (18 rows, MPT 1B-70B on 128-512 H100, FSDP, seq 2048). Its
  other tables (H100 single-node, A100 40/80GB, fp8) were not transcribed in the time available.

Field conventions: devices = total GPUs; dp_shard = FSDP (sharded data-parallel) degree, dp_replicate = plain
replicas; local_batch = sequences per data-parallel rank per optimizer step as the source states it (for
Megatron its micro-batch is given separately in notes when stated); global_batch in sequences; memory_gib as
the source prints it (GiB for torchtitan; the nvfp4 file prints 'GiB'); None = the source does not say.
"""

_TT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
_TT_2412 = f"pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md at commit {_TT}"
_TT_ATP = f"pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md at commit {_TT}"
_TT_H200 = f"pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md at commit {_TT}"
_TT_MX = f"pytorch/torchtitan torchtitan/components/quantization/mxfp8.md at commit {_TT}"
_TT_FP4 = f"pytorch/torchtitan torchtitan/components/quantization/nvfp4.md at commit {_TT}"
_TT9 = "9dec370ad26b5f8e9a7333a0e36165018262644b"
_MG = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
_MG_TABLE = f"NVIDIA/Megatron-LM README.md 'Performance Benchmarking' at commit {_MG}, table image images/model_table.png (transcribed)"
_MG_LLAMA = f"NVIDIA/Megatron-LM examples/llama/README.md at commit {_MG}, table 'FP8 Performance'"
_L3 = "The Llama 3 Herd of Models, arXiv 2407.21783, section 3.3.2 p. 10, Table 4 'Scaling configurations and MFU for each stage of Llama 3 405B pre-training'"

_H100_GT = ("H100 on Grand Teton: 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth', "
            "'400 Gb/s per GPU' RDMA between hosts, 'default 500W power limit'. ")
_TT_FLOPS = ("torchtitan MFU convention (not used by this file for any row): 6*N_nonembedding + 12*l*h*q*t per token, "
             "peak 989e12 (H100 SXM). ")

_BASE = dict(regime=None, virtual_stages_derived=None, async_tp_derived=None, pp_p2p=None, attn_impl=None, cp_ring=None, dp_gradient_sync=None, pp_stages=None, ep_dispatcher=None, ep_overlap=None, expert_tp=None, model=None, model_note=None, model_dims=None, micro_batch=None, sharding=None, virtual_stages=None,
             power_watts=None, memory_bandwidth=None, network_bandwidth=None, hardware=None, devices=None, tp=1, cp=1, pp=1, pp_schedule=None, dp_shard=None,
             dp_replicate=1, ep=1, local_batch=None, global_batch=None, seq_len=None, checkpointing=None,
             compile=None, float8=False, async_tp=False, tokens_per_s_per_gpu=None, tflops_per_gpu=None,
             mfu=None, memory_gib=None, notes="", flops_convention=None)


def _row(**kw):
    row = dict(_BASE)
    row.update(kw)
    return row


# --- torchtitan, benchmarks/llama3_h100_202412_torchtitan.md -----------------------------------------------

_T1 = ("Table 1** 1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local batch size 2, global batch size 16. "
       "Selective activation checkpointing.")
_T2 = ("Table 2** FSDP + CP + torch.compile + Float8. Llama 3.1 8B model. 8 GPUs. Local batch size 1. "
       "Full activation checkpointing.")
_T3 = ("Table 3** 1D Parallelism (FSDP). Llama 3.1 8B model. 128 GPUs. Local batch size 2, global batch size 256. "
       "Selective activation checkpointing.")
_T4 = ("Table 4** 2D parallelism (FSDP + TP) + torch.compile + Float8. Llama 3.1 70B model. 256 GPUs (FSDP 32, TP 8). "
       "Local batch size 16, global batch size 512. Full activation checkpointing.")
_T5 = ("Table 5** 3D parallelism (FSDP + TP + PP) + torch.compile + Float8 + AsyncTP. Llama 3.1 405B model. "
       "512 GPUs (FSDP 8, TP 8, PP8). Local batch size 32, global batch size 256. Full activation checkpointing.")
_T6 = ("Table 6** 4D parallelism (FSDP + TP + PP + CP) + torch.compile + Float8 + AsyncTP + 1F1B. Llama 3.1 405B model. "
       "512 GPUs (TP 8, PP8). Local batch size 8. Full activation checkpointing.")
_SEQ8B = (f"seq_len 8192 not stated in the table: torchtitan {_TT9} train_configs/llama3_8b.toml 'seq_len = 8192'. ")
_SAC = (f"'Selective' = per-op SAC by the default of torchtitan {_TT9} train_configs/llama3_8b.toml "
        "(\"mode = 'selective'\", \"selective_ac_option = 'op'\"). ")
_F8 = "Float8 = torchao Float8Linear on nn.Linear (tensorwise scaling at that time). "

CASES = [
    _row(id="torchtitan-2412-llama3.1-8b-8xh100-fsdp", source=f"{_TT_2412}, table '{_T1}' row '| FSDP | 5,762 | 82.4 |'",
         model="meta-llama/llama-3.1-8b", hardware="h100", devices=8, dp_shard=8, local_batch=2, global_batch=16,
         seq_len=8192, checkpointing="selective-op", compile=False, tokens_per_s_per_gpu=5762, memory_gib=82.4,
         notes=_H100_GT + _SEQ8B + _SAC + "Text: 1D 8B without Float8 on 8 or 128 GPUs 'achieves 33% to 39% MFU (with or without torch.compile, respectively)' (not per row). " + _TT_FLOPS),
    _row(id="torchtitan-2412-llama3.1-8b-8xh100-fsdp-compile", source=f"{_TT_2412}, table '{_T1}' row '| FSDP + torch.compile | 6,667 | 77.0 |'",
         model="meta-llama/llama-3.1-8b", hardware="h100", devices=8, dp_shard=8, local_batch=2, global_batch=16,
         seq_len=8192, checkpointing="selective-op", compile=True, tokens_per_s_per_gpu=6667, memory_gib=77.0,
         notes=_H100_GT + _SEQ8B + _SAC + _TT_FLOPS),
    _row(id="torchtitan-2412-llama3.1-8b-8xh100-fsdp-compile-float8", source=f"{_TT_2412}, table '{_T1}' row '| FSDP + torch.compile + Float8 | 8,532 | 76.8 |'",
         model="meta-llama/llama-3.1-8b", hardware="h100", devices=8, dp_shard=8, local_batch=2, global_batch=16,
         seq_len=8192, checkpointing="selective-op", compile=True, float8=True, tokens_per_s_per_gpu=8532, memory_gib=76.8,
         notes=_H100_GT + _SEQ8B + _SAC + _F8 + "The file reports no MFU with Float8 ('the definition of MFU under such scenario is not well-defined')."),
]

for _fsdp, _cp, _seq, _tps, _mem, _txt in [
        (8, 1, 32768, 3890, 83.9, "| FSDP 8, CP 1 | 32768 | 3,890 | 83.9 |"),
        (4, 2, 65536, 2540, 84.2, "| FSDP 4, CP 2 | 65536 | 2,540 | 84.2 |"),
        (2, 4, 131072, 1071, 84.0, "| FSDP 2, CP 4 | 131072 | 1,071 | 84.0 |"),
        (1, 8, 262144, 548, 84.5, "| FSDP 1, CP 8 | 262144 | 548 | 84.5 |")]:
    CASES.append(_row(
        id=f"torchtitan-2412-llama3.1-8b-8xh100-fsdp{_fsdp}-cp{_cp}-seq{_seq}", source=f"{_TT_2412}, table '{_T2}' row '{_txt}'",
        model="meta-llama/llama-3.1-8b", hardware="h100", devices=8, cp=_cp, dp_shard=_fsdp, local_batch=1,
        global_batch=_fsdp, seq_len=_seq, checkpointing="full", compile=True, float8=True, tokens_per_s_per_gpu=_tps,
        memory_gib=_mem,
        notes=_H100_GT + _F8 + f"global_batch derived: local batch 1 x FSDP {_fsdp} data-parallel ranks (CP ranks share one sequence)."))

CASES += [
    _row(id="torchtitan-2412-llama3.1-8b-128xh100-fsdp", source=f"{_TT_2412}, table '{_T3}' row '| FSDP | 5,605 | 67.0 |'",
         model="meta-llama/llama-3.1-8b", hardware="h100", devices=128, dp_shard=128, local_batch=2, global_batch=256,
         seq_len=8192, checkpointing="selective-op", compile=False, tokens_per_s_per_gpu=5605, memory_gib=67.0,
         notes=_H100_GT + _SEQ8B + _SAC + "16 hosts over RDMA. " + _TT_FLOPS),
    _row(id="torchtitan-2412-llama3.1-8b-128xh100-fsdp-compile", source=f"{_TT_2412}, table '{_T3}' row '| FSDP + torch.compile | 6,514 | 62.0 |'",
         model="meta-llama/llama-3.1-8b", hardware="h100", devices=128, dp_shard=128, local_batch=2, global_batch=256,
         seq_len=8192, checkpointing="selective-op", compile=True, tokens_per_s_per_gpu=6514, memory_gib=62.0,
         notes=_H100_GT + _SEQ8B + _SAC + "16 hosts over RDMA. " + _TT_FLOPS),
    _row(id="torchtitan-2412-llama3.1-8b-128xh100-fsdp-compile-float8", source=f"{_TT_2412}, table '{_T3}' row '| FSDP + torch.compile + Float8 | 8,380 | 61.8 |'",
         model="meta-llama/llama-3.1-8b", hardware="h100", devices=128, dp_shard=128, local_batch=2, global_batch=256,
         seq_len=8192, checkpointing="selective-op", compile=True, float8=True, tokens_per_s_per_gpu=8380, memory_gib=61.8,
         notes=_H100_GT + _SEQ8B + _SAC + _F8 + "16 hosts over RDMA."),
    _row(id="torchtitan-2412-llama3.1-70b-256xh100-fsdp32-tp8", source=f"{_TT_2412}, table '{_T4}' row '| 2D | 829 | 71.9 |'",
         model="meta-llama/llama-3.1-70b", hardware="h100", devices=256, tp=8, dp_shard=32, local_batch=16, global_batch=512,
         seq_len=8192, checkpointing="full", compile=True, float8=True, async_tp=False, tokens_per_s_per_gpu=829, memory_gib=71.9,
         notes=_H100_GT + _F8 + f"seq_len from torchtitan {_TT9} train_configs/llama3_70b.toml 'seq_len = 8192'. TP within a host (8 GPUs per host)."),
    _row(id="torchtitan-2412-llama3.1-70b-256xh100-fsdp32-tp8-asynctp", source=f"{_TT_2412}, table '{_T4}' row '| 2D + AsyncTP | 876 | 67.6 |'",
         model="meta-llama/llama-3.1-70b", hardware="h100", devices=256, tp=8, dp_shard=32, local_batch=16, global_batch=512,
         seq_len=8192, checkpointing="full", compile=True, float8=True, async_tp=True, tokens_per_s_per_gpu=876, memory_gib=67.6,
         notes=_H100_GT + _F8 + f"seq_len from torchtitan {_TT9} train_configs/llama3_70b.toml 'seq_len = 8192'."),
    _row(id="torchtitan-2412-llama3.1-405b-512xh100-fsdp8-tp8-pp8-1f1b", source=f"{_TT_2412}, table '{_T5}' row '| 1F1B | 100 | 82.5 |'",
         model="meta-llama/llama-3.1-405b", hardware="h100", devices=512, tp=8, pp=8, pp_schedule="1F1B", dp_shard=8,
         local_batch=32, global_batch=256, seq_len=8192, checkpointing="full", compile=True, float8=True, async_tp=True,
         tokens_per_s_per_gpu=100, memory_gib=82.5,
         notes=_H100_GT + _F8 + f"seq_len from torchtitan {_TT9} train_configs/llama3_405b.toml 'seq_len = 8192'. Microbatch count not stated; "
               f"{_TT9} torchtitan/config_manager.py pipeline_parallel_microbatches default: 'the number of pipeline stages' (8 for 1F1B). Memory: 'the maximum across all GPUs'."),
    _row(id="torchtitan-2412-llama3.1-405b-512xh100-fsdp8-tp8-pp8-interleaved1f1b", source=f"{_TT_2412}, table '{_T5}' row '| Interleaved 1F1B | 128 | 72.7 |'",
         model="meta-llama/llama-3.1-405b", hardware="h100", devices=512, tp=8, pp=8, pp_schedule="Interleaved1F1B", dp_shard=8,
         local_batch=32, global_batch=256, seq_len=8192, checkpointing="full", compile=True, float8=True, async_tp=True,
         tokens_per_s_per_gpu=128, memory_gib=72.7,
         notes=_H100_GT + _F8 + f"seq_len from {_TT9} train_configs/llama3_405b.toml. Stages per rank and microbatch count not stated "
               "(default microbatches = number of pipeline stages). Memory: 'the maximum across all GPUs'."),
]

for _fsdp, _cp, _seq, _tps, _mem, _txt in [
        (8, 1, 32768, 76, 75.3, "| FSDP 8, CP 1 | 32768 | 76 | 75.3 |"),
        (4, 2, 65536, 47, 75.9, "| FSDP 4, CP 2 | 65536 | 47 | 75.9 |"),
        (2, 4, 131072, 31, 77.1, "| FSDP 2, CP 4 | 131072 | 31 | 77.1 |"),
        (1, 8, 262144, 16, 84.9, "| FSDP 1, CP 8 | 262144 | 16 | 84.9 |")]:
    CASES.append(_row(
        id=f"torchtitan-2412-llama3.1-405b-512xh100-fsdp{_fsdp}-tp8-pp8-cp{_cp}-seq{_seq}", source=f"{_TT_2412}, table '{_T6}' row '{_txt}'",
        model="meta-llama/llama-3.1-405b", hardware="h100", devices=512, tp=8, pp=8, pp_schedule="1F1B", cp=_cp, dp_shard=_fsdp,
        local_batch=8, global_batch=8 * _fsdp, seq_len=_seq, checkpointing="full", compile=True, float8=True, async_tp=True,
        tokens_per_s_per_gpu=_tps, memory_gib=_mem,
        notes=_H100_GT + _F8 + f"global_batch derived: local batch 8 x FSDP {_fsdp}. Microbatch count not stated (default = number of pipeline stages). "
              "Memory: 'the maximum across all GPUs'."))

# --- torchtitan, benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md ------------------------------------------

_A70 = "Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC,  local batch size 16"
_A8 = "Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12"
_ATP_NOTE = (_H100_GT + "Column header is 'Vanilla TP tokens/sec' / 'Async TP tokens/sec'; read here as per GPU (the 2024-12 file's "
             "same 70B float8 2D layout gives 829 TPS/GPU; an assumption, the file does not say 'per GPU'). Model named 'Llama3' "
             "(section 'Models: Llama 3.1 8B, 70B'). torchtitan 820504e (2025-06-13), torch 38410cf9. "
             "seq_len not stated: torchtitan 820504e20d1149fbf0b98c567af24c4b0433b22d torchtitan/models/llama3/train_configs/"
             "llama3_{8b,70b}.toml 'seq_len = 8192'. ")
for _size, _title, _rows in [
        ("70b", _A70, [("bf16", False, 597.3, 652.4, "| None (bfloat16)   | 597.3 | 652.4 | 1.09 |"),
                       ("float8-tensorwise", True, 809.8, 942.4, "| float8 tensorwise | 809.8 | 942.4 | 1.16 |"),
                       ("float8-rowwise", True, 599.6, 624.8, "| float8 rowwise    | 599.6 | 624.8 | 1.04 |")]),
        ("8b", _A8, [("bf16", False, 4378, 4809.4, "| None (bfloat16)   | 4378   | 4809.4 | 1.10 |"),
                     ("float8-tensorwise", True, 5078.1, 5570.1, "| float8 tensorwise | 5078.1 | 5570.1 | 1.10 |"),
                     ("float8-rowwise", True, 3708.5, 3914.9, "| float8 rowwise    | 3708.5 | 3914.9 | 1.06 |")])]:
    for _q, _f8, _van, _asy, _txt in _rows:
        for _async, _tps in [(False, _van), (True, _asy)]:
            CASES.append(_row(
                id=f"torchtitan-2506-asynctp-llama3-{_size}-{'256' if _size == '70b' else '64'}xh100-{_q}-{'asynctp' if _async else 'vanillatp'}",
                source=f"{_TT_ATP}, table '#### {_title}' row '{_txt}' ({'Async TP' if _async else 'Vanilla TP'} tokens/sec column)",
                model="meta-llama/llama-3.1-70b" if _size == "70b" else "meta-llama/llama-3.1-8b", hardware="h100",
                devices=256 if _size == "70b" else 64, tp=8, dp_shard=32 if _size == "70b" else 8,
                local_batch=16 if _size == "70b" else 12,
                global_batch=16 * 32 if _size == "70b" else 12 * 8, seq_len=8192,
                checkpointing="full" if _size == "70b" else "selective-op", compile=True, float8=_f8, async_tp=_async,
                # (the row's recipe: torchao's rowwise Float8Linear, steptime.TORCHAO_ROWWISE; tensorwise: the default)
                float8_recipe="torchao-rowwise" if _q == "float8-rowwise" else None,
                tokens_per_s_per_gpu=_tps,
                notes=_ATP_NOTE + f"Quantization: {_q}. global_batch derived: local batch x FSDP degree. "
                      + ("Float8 rowwise: the file notes 'the low baseline performance of the vanilla TP float8 rowwise training is being addressed' (torchtitan issue 1207). " if _q == "float8-rowwise" else "")))

# --- torchtitan, benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md -----------------------------------------

_H200_CFG = ("Command: '--job.config-file torchtitan/models/llama3/train_configs/llama3_8b.toml --training.local_batch_size=2 "
             "--training.compile --model.converters=\"quantize.linear.float8\" --quantize.linear.float8.enable_fsdp_float8_all_gather "
             "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp --quantize.linear.float8.force_recompute_fp8_weight_in_bwd'; "
             "torchtitan e7c0cae934df78d6e9c2835f42ff1f757dc3fddc, whose llama3_8b.toml has 'seq_len = 8192', 'data_parallel_shard_degree = -1', "
             "'tensor_parallel_degree = 1', mode = \"selective\", selective_ac_option = \"op\". Hardware: '8 NVIDIA H200 GPUs connected via NVLink', "
             "'400Gb/s (Mellanox CX-7) per GPU'. TPS and memory 'arbitrarily sampled at the 100th iteration'. Trainy team on WhiteFiber, June 2025. ")
CASES += [
    _row(id="torchtitan-2506-trainy-llama3.1-8b-32xh200-fsdp-compile-float8",
         source=f"{_TT_H200}, table under '### Results' row '| 4 | 10938 | 47.96 |' (NUM_NODES 4)",
         model="meta-llama/llama-3.1-8b", hardware="h200", devices=32, dp_shard=32, local_batch=2, global_batch=64,
         seq_len=8192, checkpointing="selective-op", compile=True, float8=True, tokens_per_s_per_gpu=10938, memory_gib=47.96,
         notes=_H200_CFG + "global_batch derived: 2 x 32."),
    _row(id="torchtitan-2506-trainy-llama3.1-8b-64xh200-fsdp-compile-float8",
         source=f"{_TT_H200}, table under '### Results' row '| 8 | 10753 | 46.97 |' (NUM_NODES 8)",
         model="meta-llama/llama-3.1-8b", hardware="h200", devices=64, dp_shard=64, local_batch=2, global_batch=128,
         seq_len=8192, checkpointing="selective-op", compile=True, float8=True, tokens_per_s_per_gpu=10753, memory_gib=46.97,
         notes=_H200_CFG + "global_batch derived: 2 x 64."),
]

# --- torchtitan, quantization docs (Blackwell) -----------------------------------------------------------------

_MX_T = ("Single-node training on 8x power limited B200 GPUs, batch size 1, sequence length 8192, steps 100, torch.compile, "
         "FSDP2, per-op SAC:")
_MX_NOTE = ("The file does not name the model of this table (it cites 'TorchAO MX Formats Benchmarks', "
            "pytorch/ao torchao/prototype/mx_formats README); 'power limited B200' (limit not stated); 'Peak Memory (GB)' column "
            "recorded in memory_gib as printed (unit GB); tokens/s is the 'Median tokens/s' (per GPU not stated). "
            "torchtitan 6fc499f6f5b32151a799188be2208cfb09faed30, pytorch 2.9.0.dev20250815+cu128. ")
for _q, _f8, _mem, _tps, _txt in [
        ("bf16", False, 33.71, 8307.5, "| None (bfloat16)        | 33.71           | 8307.5          | -                 |"),
        ("mxfp8-cublas", True, 33.88, 9969.0, "| mxfp8_cublas           | 33.88           | 9969.0          | +20.0%            |"),
        ("mxfp8-cublas-rceil", True, 33.88, 9642.0, "| mxfp8_cublas_rceil     | 33.88           | 9642.0          | +16.1%            |"),
        ("float8-tensorwise", True, 33.38, 10417.0, "| float8 tensorwise      | 33.38           | 10417.0         | +25.4%            |")]:
    CASES.append(_row(
        id=f"torchtitan-mxfp8doc-dense-8xb200-{_q}", source=f"{_TT_MX}, section '#### Dense Models', table '{_MX_T}' row '{_txt}'",
        model=None, hardware="b200", devices=8, dp_shard=8, local_batch=1, global_batch=8, seq_len=8192,
        checkpointing="selective-op", compile=True, float8=_f8, tokens_per_s_per_gpu=_tps, memory_gib=_mem,
        notes=_MX_NOTE + f"Recipe: {_q} (float8=True here means any 8-bit recipe: mxfp8 or float8). global_batch derived: 1 x 8.",
        model_note="not named in the source"))

_SCOUT_NOTE = ("Text: '512 GPU training on 64 node GB200 cluster' but the config list says 'Parallelisms (64 nodes of 4 devices each = 256 "
               "chips)', 'FSDP=256 (on attention layers, shared experts, dense layer FFNs) and 256/4=64 (on routed experts)', 'EP=16 (on "
               "routed experts)', 'Sequence length: 8192', 'Local batch size: 10', \"Activation checkpointing mode: `none`\", "
               "'`torch.compile` enabled', mxfp8 on routed experts' grouped GEMMs and on linears except output, router.gate, wk, wv. "
               "devices recorded as 256 (the config list; the '512 GPU' heading conflicts, perhaps counting the GB200's two dies). "
               "'Median tokens/s' (per GPU not stated). Llama 4 Scout is not in the catalog (catalog has llama-4-maverick-17b-128e only). ")
CASES += [
    _row(id="torchtitan-mxfp8doc-llama4-scout-gb200-bf16",
         source=f"{_TT_MX}, section '#### MoE models', table after '512 GPU training on 64 node GB200 cluster:' row '| None (bfloat16)        | 6169            | -                 |'",
         model=None, model_note="Llama4 Scout (torchtitan llama4 flavor; dimensions not given in this source)", hardware="gb200",
         devices=256, dp_shard=256, ep=16, local_batch=10, global_batch=2560, seq_len=8192, checkpointing="none", compile=True,
         float8=False, tokens_per_s_per_gpu=6169, notes=_SCOUT_NOTE + "global_batch derived: 10 x 256."),
    _row(id="torchtitan-mxfp8doc-llama4-scout-gb200-mxfp8",
         source=f"{_TT_MX}, section '#### MoE models', table after '512 GPU training on 64 node GB200 cluster:' row '| mxfp8                  | 7401            | +20.3%            |'",
         model=None, model_note="Llama4 Scout (torchtitan llama4 flavor; dimensions not given in this source)", hardware="gb200",
         devices=256, dp_shard=256, ep=16, local_batch=10, global_batch=2560, seq_len=8192, checkpointing="none", compile=True,
         float8=True, tokens_per_s_per_gpu=7401, notes=_SCOUT_NOTE + "float8=True here means mxfp8. global_batch derived: 10 x 256."),
]

_FP4_L = ("### Llama 3 8B 200M-Token Evidence: 'eager + `torch.compile` runs trained Llama 3 8B on C4 for 200M tokens with global batch "
          "size 128 (local batch size 32, FSDP degree 4). Results are reported at step 760.'")
_FP4_Q = ("### Qwen3 8B 200M-Token Evidence / #### Random Initialization: 'global batch size 64 (local batch size 16, FSDP degree 4), "
          "sequence length 2048'")
_FP4_NOTE = ("Hardware: the file requires 'NVIDIA Blackwell SM100 or later GPU' and does not name the SKU; memory percentages imply a "
             "capacity of about 184 GiB (110.95 GiB = 60.2%). Usage command for Llama: 'torchrun --standalone --nproc_per_node 4', "
             "'--training.num_tokens_per_microbatch_per_dp_rank 65536', '--training.max_context_length 2048' (65536 = 32 x 2048). "
             "Activation checkpointing not stated. PyTorch 2.14.0a0+gitd9abf9e, TorchAO 0.18.0+gitcb76f29. 'Tokens/sec (per GPU)'. ")
for _name, _q, _tps, _mem, _txt in [
        ("llama", "nvfp4-bf16-tail", 30040, 110.95, "| NVFP4 (bf16 tail) | 1.2715 | 30,040 | 110.95 GiB (60.2%) |"),
        ("llama", "mxfp8", 28084, 179.94, "| MXFP8 | 1.2671 | 28,084 | 179.94 GiB (97.6%) |"),
        ("llama", "bf16", 21919, 174.49, "| BF16 | 1.2738 | 21,919 | 174.49 GiB (94.7%) |"),
        ("qwen", "nvfp4-bf16-tail", 26732, 78.63, "| NVFP4 (bf16 tail) | 3.82986 | 26,732 | 78.63 GiB (42.67%) |"),
        ("qwen", "mxfp8", 27587, 112.63, "| MXFP8 | 3.81545 | 27,587 | 112.63 GiB (61.12%) |"),
        ("qwen", "bf16", 20913, 112.88, "| BF16 | 3.81439 | 20,913 | 112.88 GiB (61.25%) |")]:
    _llama = _name == "llama"
    CASES.append(_row(
        id=f"torchtitan-nvfp4doc-{'llama3-8b' if _llama else 'qwen3-8b'}-4xblackwell-{_q}",
        source=f"{_TT_FP4}, section '{_FP4_L if _llama else _FP4_Q}' row '{_txt}'",
        model="meta-llama/llama-3.1-8b" if _llama else "qwen/qwen3-8b", hardware="blackwell-unspecified", devices=4, dp_shard=4,
        local_batch=32 if _llama else 16, global_batch=128 if _llama else 64, seq_len=2048, compile=True,
        float8=_q != "bf16", tokens_per_s_per_gpu=_tps, memory_gib=_mem,
        notes=_FP4_NOTE + ("Model named 'Llama 3 8B' (config 'llama3_8b_first_85_pct_layers_nvfp4'; 32 layers; torchtitan's llama3 8B flavor is Llama 3.1 8B); seq_len 2048 from the usage command. "
                           if _llama else "Qwen3 8B, 'Peak Reserved Memory'; 1,526 optimizer steps, reported at step 1,520. ")
              + f"Recipe: {_q} (float8=True means any sub-16-bit recipe; NVFP4 'layers 0-26 use NVFP4 and layers 27-31 remain bf16' for Llama)."))

# --- Megatron-LM, README.md 'Performance Benchmarking' (images/model_table.png) --------------------------------

_MG_NOTE = ("GPT models, 'Vocabulary size: 131,072 tokens', 'Sequence length: 4,096 tokens'; H100 ('up to 47% Model FLOP Utilization "
            "(MFU) on H100 clusters'); Megatron-Core r0.8.0 (figure legends). Overlap flags: --overlap-grad-reduce, --overlap-param-gather, "
            "--tp-comm-overlap, PP overlap by default. Precision, micro-batch, FFN size, activation recomputation, virtual-pipeline size "
            "and sequence parallelism are not stated. Data parallel is the distributed optimizer / DDP (not FSDP): recorded as "
            "dp_replicate. 'Batch size' is the global batch in sequences. MFU/TFLOP/s use Megatron's num_floating_point_operations "
            "(12*B*s*l*h^2*(...), full non-causal attention term, logits included, no recomputation); MFU ~ TFLOP/s / 989 "
            "(e.g. 465.9/989 = 0.471). async_tp is set True where TP > 1 because of --tp-comm-overlap (Transformer Engine's overlap of TP communication with the GEMMs, Megatron's counterpart of async TP); float8 None: precision not stated. ")
# The pipelined rows' schedule, derived: the README lists PP overlap among the benchmarks' communication optimizations
# ("Fine-grained overlapping with DP (...), TP (--tp-comm-overlap), and PP (enabled by default)"), and Megatron-LM runs
# PP overlap only under the interleaved schedule (megatron/training/arguments.py at d98e8a6: without a virtual pipeline
# "# Overlap P2P communication is disabled if not using the interleaved schedule. args.overlap_p2p_comm = False",
# warning "non-interleaved schedule does not support overlapping p2p communication"). V is not stated: the least
# Megatron accepts for the row's layers per stage (its check "number of layers per pipeline stage must be divisible
# number of layers per virtual pipeline stage"), the smallest divisor above 1 (84 / 2 = 42 layers: 2; 92 / 4 = 23: 23;
# 96 / 6 = 16: 2; 96 / 8 = 12: 2; 112 / 16 = 7: 7), with the sends overlapped (pp_p2p).
def _least_vp(layers_per_stage: int) -> int:
    return min(d for d in range(2, layers_per_stage + 1) if layers_per_stage % d == 0)


_MG_VP = ("interleaved schedule, derived: the README lists PP overlap ('PP (enabled by default)'), which Megatron-LM runs "
          "only interleaved (arguments.py: 'non-interleaved schedule does not support overlapping p2p communication'); "
          "V = {vp}, not stated: the least Megatron accepts for {per} layers a stage (layers per stage divisible by V)")
for _size, _heads, _hidden, _layers, _tp, _pp, _dp, _gpus, _batch, _tf, _mfu, _agg in [
        ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 0.41, 19.6),
        ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 0.47, 44.7),
        ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 0.49, 93.9),
        ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 0.46, 176.5),
        ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 0.42, 322.3),
        ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 0.43, 645.9),
        ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 0.44, 997.2),
        ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 0.48, 1457.4),
        ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 0.47, 2825.6)]:
    CASES.append(_row(
        id=f"megatron-readme-gpt-{_size.lower()}-{_gpus}xh100-tp{_tp}-pp{_pp}",
        source=(f"{_MG_TABLE}, columns 'Model size | Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | "
                f"Data-parallel size | Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s', row "
                f"'{_size} | {_heads} | {_hidden} | {_layers} | {_tp} | {_pp} | {_dp} | {_gpus} | {_batch} | {_tf} | {round(_mfu * 100)}% | {_agg}'"),
        model=None,
        model_note=f"GPT-style {_size}: {_layers} layers, hidden {_hidden}, {_heads} heads, vocab 131072 (ffn size not stated)",
        hardware="h100", devices=_gpus, tp=_tp, pp=_pp, pp_schedule="Interleaved1F1B" if _pp > 1 else None,
        virtual_stages=_least_vp(_layers // _pp) if _pp > 1 else None,
        virtual_stages_derived=_MG_VP.format(vp=_least_vp(_layers // _pp), per=_layers // _pp) if _pp > 1 else None,
        pp_p2p="overlapped" if _pp > 1 else None, dp_shard=1, dp_replicate=_dp, local_batch=_batch // _dp,
        global_batch=_batch, seq_len=4096, compile=None, float8=None, async_tp=(_tp > 1) or None, tflops_per_gpu=_tf, mfu=_mfu,
        flops_convention="megatron", sharding="distributed-optimizer",
        model_dims=dict(name=f"GPT {_size} (Megatron-LM README)", layers=_layers, hidden_dim=_hidden, heads=_heads,
                        ffn_dim=4 * _hidden, vocab_size=131072, gated_mlp=False, tied_embeddings=True,
                        parameters=12 * _layers * _hidden ** 2 + 13 * _layers * _hidden + 131072 * _hidden + 4096 * _hidden,
                        position_table=4096 * _hidden, architecture="gpt3", context_length=4096,
                        source="the row's layers, hidden size and heads; vocabulary 131,072 and sequence 4,096 from the "
                               "README; ffn 4 x hidden, GELU, learned positions and tied embeddings ASSUMED (Megatron's GPT "
                               "defaults: --ffn-hidden-size defaults to 4 * hidden_size; not stated by the table)"),
        notes=_MG_NOTE + f"local_batch derived: {_batch} / DP {_dp}. Aggregate petaFLOP/s {_agg}. "
              + ("The 177B row is the README's 'standard GPT-3 model (slightly more than 175 billion parameters due to larger vocabulary size)'; "
                 "the catalog's openai/gpt-3-175b has a smaller vocabulary. " if _size == "177B" else "")))

# --- Megatron-LM, examples/llama/README.md 'FP8 Performance' ---------------------------------------------------

_MGL_NOTE = ("Columns 'Model | #-GPUs | GBS | MBS | Seq Length | TP | PP | CP | VP | EP | GA | Tokens/sec/GPU | TFLOP/sec/GPU'. "
             "Hardware not printed in the table; the section's script is examples/llama/train_llama3_8b_h100_fp8.sh ('FP8 format: hybrid') "
             "and 'This configuration follows those defined in NeMo Framework's performance scripts'. Recomputation not stated. "
             "DP = GPUs / (TP*PP*CP) derived; local_batch = GBS/DP = MBS x GA (derived). Precision FP8 (hybrid), "
             "Transformer Engine's delayed scaling: the script's FP8 args ('--fp8-format hybrid --fp8-amax-history-len "
             "1024 --fp8-amax-compute-algo max') name no --fp8-recipe, whose default is 'delayed' (Megatron-LM "
             "megatron/training/arguments.py \"'--fp8-recipe', default='delayed'\"); casts timed as "
             "steptime.TE_DELAYED_SCALING. "
             "TFLOP/s use Megatron's FLOP count (see module docstring); MFU against an FP8 peak is not given. ")
# Megatron's context parallelism: Transformer Engine's attention with its P2P ring unless --cp-comm-type says
# otherwise (NVIDIA/Megatron-LM megatron/training/arguments.py: "'--cp-comm-type', nargs='+', type=str,
# default=["p2p"]"; Megatron-Core's TEDotProductAttention passes it to Transformer Engine's DotProductAttention, whose
# "p2p" is AttnFuncWithCPAndKVP2P). Neither table names a cp_comm_type: the default, stated here.
_CP_TE = ("Context parallelism: Transformer Engine's P2P ring (Megatron's --cp-comm-type default 'p2p'; the source "
          "names none), timed as the cp rule's ring='transformer-engine'. ")
# TP communication overlap, derived from the section's own words: "This configuration follows those defined in NeMo
# Framework's performance scripts, which can be found at https://github.com/NVIDIA/NeMo/tree/main/scripts/performance".
# Those scripts for the two TP rows' models on H100 in FP8 turn it on at exactly the rows' layouts: NVIDIA/NeMo
# scripts/performance/llm/pretrain_llama3_70b.py at 7e86c2bcf10002065ff55ddedb7c36bd3b170f59 ('assert
# comm_overlap_callback_idx is not None, "MegatronCommOverlapCallback missing. Required for performance."',
# 'tp_comm_overlap_cfg = ub_cfg[gpu_type][args.compute_dtype]' with "h100": {"fp8":
# userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192}: TP 4, MBS 1, seq 8192) and pretrain_llama31_405b.py at
# 6775d98b3a809a1b6d1a3c953d7250674480105e (the same, userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192: TP 8, CP 2,
# MBS 1, seq 8192): Transformer Engine's userbuffers overlap, timed as async TP (overlap={"tp": "decomposed"}), as the
# Megatron-Bridge rows with the same recipes are (_MB_TP_OVERLAP). The 8B row has TP 1.
_MGL_TP_OVERLAP = ("TP communication overlap: derived, the section's 'This configuration follows those defined in NeMo "
                   "Framework's performance scripts'; NeMo's scripts/performance/llm/pretrain_llama3_70b.py (7e86c2b) and "
                   "pretrain_llama31_405b.py (6775d98) set tp_comm_overlap_cfg for H100 FP8 at this layout "
                   "(userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192 / _h16384_tp8_cp2_mbs1_seqlen8192): timed as async TP. ")
for _m, _g, _gbs, _mbs, _tp, _pp, _cp, _vp, _ga, _tps, _tf, _txt, _cat in [
        ("llama3-8b", 8, 128, 1, 1, 1, 2, 1, 32, 13812, 800, "| LLAMA3-8B | 8 | 128 | 1 | 8192 | 1 | 1 | 2 | 1 | 1 | 32 | 13812 | 800 |", "meta-llama/meta-llama-3-8b"),
        ("llama3-70b", 64, 128, 1, 4, 8, 1, 5, 64, 1621, 780, "| LLAMA3-70B | 64 | 128 | 1 | 8192 | 4 | 8 | 1 | 5 | 1 | 64 | 1621 | 780 |", "meta-llama/meta-llama-3-70b"),
        ("llama3-405b", 1024, 512, 1, 8, 8, 2, 8, 64, 315, 834, "| LLAMA3-405B | 1024 | 512 | 1 | 8192 | 8 | 8 | 2 | 8 | 1 | 64 | 315 | 834 |", "meta-llama/llama-3.1-405b")]:
    _dp = _g // (_tp * _pp * _cp)
    CASES.append(_row(
        id=f"megatron-examples-{_m}-{_g}xh100-fp8", source=f"{_MG_LLAMA} row '{_txt}'",
        model=_cat, hardware="h100", devices=_g, tp=_tp, cp=_cp, pp=_pp,
        pp_schedule="Interleaved1F1B" if _vp > 1 else ("1F1B" if _pp > 1 else None), dp_shard=1, dp_replicate=_dp,
        local_batch=_gbs // _dp, global_batch=_gbs, seq_len=8192, compile=None, float8=True,
        async_tp=True if _tp > 1 else None,     # (_MGL_TP_OVERLAP: derived from NeMo's performance scripts)
        async_tp_derived=("TP communication overlap (derived: NeMo's performance scripts, which the section says it "
                          "follows)") if _tp > 1 else None,
        float8_recipe="te-delayed-scaling",     # (_MGL_NOTE: the script's FP8 args name no --fp8-recipe)
        tokens_per_s_per_gpu=_tps, tflops_per_gpu=_tf, virtual_stages=_vp, micro_batch=_mbs, sharding="distributed-optimizer",
        cp_ring="transformer-engine" if _cp > 1 else None,
        notes=_MGL_NOTE + (_MGL_TP_OVERLAP if _tp > 1 else "") + f"VP (virtual pipeline stages) {_vp}; GA {_ga}; MBS {_mbs}; DP {_dp} (derived). "
              + (_CP_TE if _cp > 1 else "")
              + ("405B exists only as Llama 3.1. " if _m == "llama3-405b" else "")))

# --- Megatron-LM, MoE README (v0.9 claim) ---------------------------------------------------------------------

CASES.append(_row(
    id="megatron-moe-readme-mixtral-8x7b-bf16-468tflops",
    source=("NVIDIA/Megatron-LM megatron/core/transformer/moe/README.md at commit 4015ff17658cc7ac622cc0f5a3be254dc384f26f, line 3: "
            "'With MCore v0.9, we've achieved remarkable performance of **468 TFLOPS** for Mixtral 8X7B bf16 training.'"),
    model="mistralai/mixtral-8x7b-v0.1", hardware="h100", devices=None, tp=None, cp=None, pp=None, dp_shard=None, dp_replicate=None,
    ep=None, seq_len=None, compile=None, float8=False, async_tp=None, tflops_per_gpu=468,
    notes=("The claim gives no layout. The same file's 'Reference Best Parallel Mapping' (MCore v0.8) lists '| Mixtral 8x7B(Dropless)  |   32K     "
           "| All-to-All | BF16      | 64    | 4096    | 1  | 8  | 4  | 8  | 1   | 256 |' (Vocab, Dispatcher, Precision, #GPUs, SEQ LEN, TP, EP, PP, "
           "VP, MBS, GBS) with 'Detailed Benchmark Information: Server: 8xH100 80GB HBM3, NVLink 4th Generation, InfiniBand 8x400 Gbit/s'; "
           "whether the 468 TFLOPS was measured with that mapping is not said, so the layout fields stay None. Hardware H100 is from that "
           "benchmark-information block (an inference). Megatron's FLOP count for MoE counts topk routed experts (see module docstring).")))

# --- MosaicML llm-foundry, scripts/train/benchmarking/README.md 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' -------

_LF = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit 8c8dd48f72168c5d51e2f7b151595892a8fba43d "
       "(file last changed in 495218376830947dce625efabc4d86be7c47cc45), table '## H100 80GB BF16 (Large Scale, >= 128 GPUs)'")
_LF_COLS = ("Model | SeqLen (T) | # GPUs | GPU | MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | "
            "Throughput (S/s) | Throughput (T/s) | Throughput (T/s/GPU) | GlobalBatchSize (T) | Precision | MP Mode | Sharding Strategy | "
            "Activation Checkpointing | Activation CPUOffload | NumParams")
_LF_NOTE = ("MPT models (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml; dimensions not in the table), trained with Composer FSDP on "
            "the MosaicML platform. MFU convention (same file, '### MFU'): (3 * 2 * n_params * seq_len + 3 * n_layers * 2 * 2 * d_model * "
            "seq_len**2) * seq_per_sec / (gpu_num * GPU_AVAILABLE_FLOPS); 'All FLOP calculations exclude the operations required for "
            "normalization, activation, and residuals'; HFU adds one forward for activation checkpointing. local_batch = MicroBatchSize x "
            "GradAccum (per GPU per step; GlobalBatchSize / # GPUs). Sharding FULL_SHARD = FSDP (ZeRO-3), SHARD_GRAD_OP = ZeRO-2 (gradients "
            "and optimizer state sharded, parameters kept whole after forward); both recorded as dp_shard = # GPUs. Activation "
            "Checkpointing True recorded as 'full' (the HFU formula counts one extra forward pass). torch.compile not stated. ")
_LF_ROWS = """
|  70b | 2048 | 512 | h100_80gb | 41.25 | 55.0 | 408 | 8 | 1 | 4096 | 251 | 515636 | 1007 | 8388608 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |
|  70b | 2048 | 256 | h100_80gb | 42.42 | 56.56 | 419 | 8 | 1 | 2048 | 129 | 265149 | 1035 | 4194304 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |
|  70b | 2048 | 128 | h100_80gb | 43.36 | 57.81 | 428 | 8 | 1 | 1024 | 66 | 135490 | 1058 | 2097152 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |
|  30b | 2048 | 512 | h100_80gb | 40.27 | 53.69 | 398 | 8 | 1 | 4096 | 528 | 1083366 | 2115 | 8388608 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  30b | 2048 | 256 | h100_80gb | 40.89 | 54.52 | 404 | 8 | 1 | 2048 | 268 | 550022 | 2148 | 4194304 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  30b | 2048 | 128 | h100_80gb | 41.85 | 55.8 | 414 | 8 | 1 | 1024 | 137 | 281491 | 2199 | 2097152 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  13b | 2048 | 512 | h100_80gb | 41.12 | 54.83 | 406 | 16 | 1 | 8192 | 1238 | 2535811 | 4952 | 16777216 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12853954560 |
|  13b | 2048 | 256 | h100_80gb | 41.42 | 55.23 | 409 | 16 | 1 | 4096 | 623 | 1277214 | 4989 | 8388608 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12853954560 |
|  13b | 2048 | 128 | h100_80gb | 42.18 | 56.24 | 417 | 16 | 1 | 2048 | 317 | 650264 | 5080 | 4194304 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12853954560 |
|  7b | 2048 | 512 | h100_80gb | 42.2 | 42.2 | 417 | 6 | 1 | 3072 | 2417 | 4951479 | 9670 | 6291456 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |
|  7b | 2048 | 256 | h100_80gb | 44.15 | 44.15 | 436 | 6 | 1 | 1536 | 1264 | 2590548 | 10119 | 3145728 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |
|  7b | 2048 | 128 | h100_80gb | 45.71 | 45.71 | 452 | 6 | 1 | 768 | 654 | 1340830 | 10475 | 1572864 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |
|  3b | 2048 | 512 | h100_80gb | 39.24 | 39.24 | 388 | 8 | 1 | 4096 | 5416 | 11092218 | 21664 | 8388608 | amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 2651837440 |
|  3b | 2048 | 256 | h100_80gb | 41.25 | 41.25 | 408 | 8 | 1 | 2048 | 2846 | 5829686 | 22772 | 4194304 | amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 2651837440 |
|  3b | 2048 | 128 | h100_80gb | 42.43 | 42.43 | 419 | 8 | 1 | 1024 | 1463 | 2998098 | 23422 | 2097152 | amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 2651837440 |
|  1b | 2048 | 512 | h100_80gb | 36.65 | 36.65 | 362 | 12 | 1 | 6144 | 9959 | 20396905 | 39837 | 12582912 | amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 1315950592 |
|  1b | 2048 | 256 | h100_80gb | 39.15 | 39.15 | 387 | 12 | 1 | 3072 | 5319 | 10894207 | 42555 | 6291456 | amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 1315950592 |
|  1b | 2048 | 128 | h100_80gb | 40.6 | 40.6 | 401 | 12 | 1 | 1536 | 2757 | 5647854 | 44123 | 3145728 | amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 1315950592 |
"""
# The MPT models' dimensions (d_model, n_heads, n_layers; expansion_ratio 4, vocab_size 50368, GELU MLP, tied
# embeddings, ALiBi) from the same commit's yamls, scripts/train/yamls/pretrain/mpt-<size>.yaml ('d_model', 'n_heads',
# 'n_layers', 'expansion_ratio: 4', 'vocab_size: 50368'); scripts/train/benchmarking/submit_benchmarks.py sets
# "parameters['model']['norm_type'] = 'low_precision_layernorm'". NumParams (the table's column) grows with the
# sequence by seq x d_model: a position table, counted as an embedding here.
# The attention kernel (the table has no column for it): the tables were written by the commits that added them,
# b2a43a1477a45f40f4086a1c72f851b0ab42d0ac (2023-10-19: the H100 single/multi-node, H100 FP8 and A100 tables) and
# 5e85bd62d4ec9e13353ca95877477602ab538e5b (2024-01-06: H100 large scale), with that commit's
# scripts/train/benchmarking/submit_benchmarks.py, whose "parser.add_argument('--attn_impl', type=str,
# default='triton')" and "parameters['model']['attn_config']['attn_impl'] = args.attn_impl" set every run's
# attn_impl to 'triton' (the README's own example command passes no --attn_impl): llmfoundry/models/layers/
# attention.py's triton_flash_attn_fn, the Triton FlashAttention kernel (llmfoundry/models/layers/
# flash_attn_triton.py, on triton-pre-mlir). The default became 'flash' only in 7f0fdae66d252801c524b47522d6b2e589576d23 (2024-03-26), after both.
_MPT_YAML = ("mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-{size}.yaml at commit 8c8dd48f72168c5d51e2f7b151595892a8fba43d: "
             "'d_model: {h}', 'n_heads: {a}', 'n_layers: {l}', 'expansion_ratio: 4', 'vocab_size: 50368'")
_MPT_DIMS = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24), "3b": (2560, 20, 32),
             "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}


def _mpt(size: str, params: int, seq: int) -> dict:
    h, a, l = _MPT_DIMS[size]
    return dict(name=f"MPT-{size} (llm-foundry)", parameters=params, layers=l, hidden_dim=h, heads=a, ffn_dim=4 * h,
                vocab_size=50368, gated_mlp=False, tied_embeddings=True, position_table=seq * h, architecture="gpt3",
                context_length=seq,
                source=_MPT_YAML.format(size=size, h=h, a=a, l=l))


# The row's 'MP Mode' column, Composer's FSDP mixed_precision (mosaicml/composer composer/trainer/mosaic_fsdp_utils.py
# get_mixed_precision, the same at v0.16.4 1c9d8d17989424d804bc3baef03ba11d5005fd88 and v0.17.2
# 7e0e40a72a6b0c87cca4d408792336e4e5c742da, the versions llm-foundry's setup.py pinned when the tables were written,
# 'mosaicml[...]>=0.16.4,<0.17' at b2a43a1 and '>=0.17.2,<0.18' at 5e85bd6): "elif mixed_precision == 'DEFAULT':
# param_dtype = _get_torch_dtype(precision); reduce_dtype = torch.float32" (amp_bf16 and amp_fp8 both give bfloat16:
# 'We use torch.bfloat16 by default for amp_fp8'), FSDP's sharded flat parameters fp32: the regime 'fsdp-bf16';
# "elif mixed_precision == 'PURE': param_dtype = ...(precision); reduce_dtype = ...(precision)": gathered and reduced in
# bf16, calibrate.py's regime 'composer-fsdp-pure-bf16' (fsdp-bf16 reduced in 2 B).
_LF_REGIME = {"DEFAULT": "fsdp-bf16", "PURE": "composer-fsdp-pure-bf16"}


def _lf_rows(text: str, table: str, hardware: str, tag: str, notes: str = "") -> list:
    rows = []
    for line in text.strip().splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        gpus, mb, ga, gbs = int(c[2]), int(c[7]), int(c[8]), int(c[9])
        ident = f"llmfoundry-mpt-{c[0]}-{gpus}x{tag}-seq{c[1]}"
        if any(r["id"] == ident for r in [*CASES, *rows]):      # (two rows of one run at other micro-batches)
            ident += f"-mb{mb}"
        rows.append(_row(
            id=ident, source=f"{table}, columns '{_LF_COLS}', row '{line.strip()}'",
            model=None, model_note=f"MPT-{c[0]}, NumParams {c[19]}", model_dims=_mpt(c[0], int(c[19]), int(c[1])),
            hardware=hardware, devices=gpus, dp_shard=gpus, local_batch=gbs // gpus, global_batch=gbs, seq_len=int(c[1]),
            micro_batch=mb, sharding=c[16], checkpointing="full" if c[17] == "True" else "none", compile=False,
            attn_impl="triton", regime=_LF_REGIME[c[15]],
            float8=c[14] == "amp_fp8", tokens_per_s_per_gpu=int(c[12]), tflops_per_gpu=float(c[6]),
            mfu=round(float(c[4]) / 100, 4),
            notes=_LF_NOTE + notes + f"MicroBatchSize {mb}, GradAccum {ga}; sharding {c[16]}; precision {c[14]}; MP Mode "
                  f"{c[15]} (regime {_LF_REGIME[c[15]]}); HFU {c[5]}%; "
                  f"Throughput {c[10]} sequences/s, {c[11]} tokens/s in all. compile=False: Composer's FSDP at that time "
                  "(the benchmark scripts set no compile)."))
    return rows


CASES += _lf_rows(_LF_ROWS, _LF, "h100", "h100")

_LF_BASE = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit 8c8dd48f72168c5d51e2f7b151595892a8fba43d "
            "(file last changed in 495218376830947dce625efabc4d86be7c47cc45), table ")
_LF_H100 = """
|  70b | 2048 | 64 | h100_80gb | 42.57 | 56.76 | 421 | 8 | 4 | 2048 | 32 | 66523 | 1039 | 4194304 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |
|  70b | 2048 | 32 | h100_80gb | 36.15 | 48.2 | 357 | 2 | 16 | 1024 | 13 | 28242 | 882 | 2097152 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |
|  30b | 8192 | 8 | h100_80gb | 29.92 | 39.9 | 296 | 1 | 21 | 168 | 1 | 11072 | 1384 | 1376256 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 30019254272 |
|  30b | 4096 | 8 | h100_80gb | 35.86 | 47.81 | 354 | 1 | 21 | 168 | 3 | 14419 | 1802 | 688128 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29989894144 |
|  30b | 2048 | 32 | h100_80gb | 43.92 | 58.57 | 434 | 14 | 3 | 1344 | 36 | 73860 | 2308 | 2752512 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  30b | 2048 | 16 | h100_80gb | 43.07 | 57.42 | 426 | 10 | 3 | 480 | 17 | 36209 | 2263 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  30b | 2048 | 8 | h100_80gb | 38.11 | 50.82 | 377 | 3 | 21 | 504 | 7 | 16022 | 2002 | 1032192 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  30b | 1024 | 8 | h100_80gb | 38.76 | 51.68 | 383 | 6 | 21 | 1008 | 16 | 16672 | 2084 | 1032192 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29967874048 |
|  13b | 32768 | 8 | h100_80gb | 31.68 | 42.24 | 313 | 1 | 3 | 24 | 0 | 15812 | 1976 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 13011240960 |
|  13b | 16384 | 8 | h100_80gb | 35.55 | 47.4 | 351 | 3 | 3 | 72 | 1 | 23881 | 2985 | 1179648 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12927354880 |
|  13b | 4096 | 8 | h100_80gb | 41.6 | 55.47 | 411 | 10 | 3 | 240 | 9 | 37740 | 4717 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12864440320 |
|  13b | 2048 | 64 | h100_80gb | 39.86 | 39.86 | 394 | 2 | 1 | 128 | 150 | 307209 | 4800 | 262144 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 12853954560 |
|  13b | 2048 | 32 | h100_80gb | 39.95 | 39.95 | 395 | 2 | 1 | 64 | 75 | 153960 | 4811 | 131072 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 12853954560 |
|  13b | 2048 | 16 | h100_80gb | 39.58 | 39.58 | 391 | 2 | 1 | 32 | 37 | 76280 | 4767 | 65536 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 12853954560 |
|  13b | 2048 | 8 | h100_80gb | 39.79 | 39.79 | 393 | 2 | 1 | 16 | 18 | 38336 | 4792 | 32768 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 12853954560 |
|  13b | 1024 | 8 | h100_80gb | 44.27 | 59.03 | 438 | 40 | 3 | 960 | 42 | 44019 | 5502 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12848711680 |
|  7b | 65536 | 8 | h100_80gb | 28.59 | 38.13 | 282 | 1 | 2 | 16 | 0 | 15654 | 1956 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6918905856 |
|  7b | 32768 | 8 | h100_80gb | 30.94 | 41.25 | 306 | 2 | 2 | 32 | 0 | 26550 | 3318 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6784688128 |
|  7b | 8192 | 8 | h100_80gb | 37.14 | 49.52 | 367 | 8 | 2 | 128 | 6 | 55481 | 6935 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6684024832 |
|  7b | 4096 | 8 | h100_80gb | 40.42 | 53.9 | 399 | 16 | 2 | 256 | 16 | 68893 | 8611 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6667247616 |
|  7b | 2048 | 8 | h100_80gb | 46.44 | 46.44 | 459 | 6 | 1 | 48 | 41 | 85144 | 10643 | 98304 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |
|  7b | 1024 | 8 | h100_80gb | 42.83 | 57.11 | 423 | 64 | 2 | 1024 | 79 | 81628 | 10203 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6654664704 |
|  3b | 65536 | 8 | h100_80gb | 26.81 | 35.74 | 265 | 1 | 2 | 16 | 0 | 26099 | 3262 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 2814366720 |
|  3b | 32768 | 8 | h100_80gb | 28.84 | 38.46 | 285 | 3 | 6 | 144 | 1 | 46984 | 5873 | 4718592 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 2730480640 |
|  3b | 16384 | 8 | h100_80gb | 36.34 | 36.34 | 359 | 1 | 6 | 48 | 5 | 89223 | 11152 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2688537600 |
|  3b | 8192 | 8 | h100_80gb | 40.31 | 40.31 | 398 | 3 | 6 | 144 | 16 | 132626 | 16578 | 1179648 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2667566080 |
|  3b | 4096 | 8 | h100_80gb | 42.31 | 42.31 | 418 | 5 | 6 | 240 | 40 | 167712 | 20964 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2657080320 |
|  3b | 2048 | 64 | h100_80gb | 40.8 | 40.8 | 403 | 6 | 3 | 1152 | 703 | 1441663 | 22525 | 2359296 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2651837440 |
|  3b | 2048 | 32 | h100_80gb | 41.7 | 41.7 | 412 | 6 | 3 | 576 | 359 | 736701 | 23021 | 1179648 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2651837440 |
|  3b | 2048 | 16 | h100_80gb | 43.73 | 43.73 | 432 | 10 | 3 | 480 | 188 | 386285 | 24142 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2651837440 |
|  3b | 1024 | 8 | h100_80gb | 46.2 | 46.2 | 457 | 20 | 6 | 960 | 211 | 216369 | 27046 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2649216000 |
|  3b | 512 | 8 | h100_80gb | 46.32 | 46.32 | 458 | 40 | 6 | 1920 | 436 | 223721 | 27965 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2647905280 |
|  1b | 65536 | 8 | h100_80gb | 26.34 | 35.12 | 260 | 1 | 2 | 16 | 0 | 44050 | 5506 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 1445974016 |
|  1b | 32768 | 8 | h100_80gb | 33.54 | 33.54 | 331 | 1 | 4 | 32 | 2 | 96203 | 12025 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1378865152 |
|  1b | 16384 | 8 | h100_80gb | 35.22 | 35.22 | 348 | 2 | 4 | 64 | 9 | 157194 | 19649 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1345310720 |
|  1b | 8192 | 8 | h100_80gb | 37.73 | 37.73 | 373 | 3 | 4 | 96 | 28 | 233256 | 29157 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1328533504 |
|  1b | 4096 | 8 | h100_80gb | 40.26 | 40.26 | 398 | 7 | 4 | 224 | 75 | 308282 | 38535 | 917504 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1320144896 |
|  1b | 2048 | 64 | h100_80gb | 40.85 | 40.85 | 404 | 20 | 1 | 1280 | 1387 | 2841754 | 44402 | 2621440 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1315950592 |
|  1b | 2048 | 32 | h100_80gb | 41.52 | 41.52 | 410 | 20 | 1 | 640 | 705 | 1444183 | 45130 | 1310720 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1315950592 |
|  1b | 2048 | 16 | h100_80gb | 42.36 | 42.36 | 419 | 20 | 1 | 320 | 359 | 736596 | 46037 | 655360 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1315950592 |
|  1b | 2048 | 8 | h100_80gb | 41.82 | 41.82 | 413 | 14 | 1 | 112 | 177 | 363645 | 45455 | 229376 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1315950592 |
|  1b | 1024 | 8 | h100_80gb | 41.95 | 41.95 | 415 | 18 | 4 | 576 | 382 | 391287 | 48910 | 589824 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1313853440 |
|  1b | 512 | 8 | h100_80gb | 43.21 | 43.21 | 427 | 56 | 4 | 1792 | 816 | 418201 | 52275 | 917504 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1312804864 |
|  760m | 32768 | 8 | h100_80gb | 31.84 | 31.84 | 315 | 1 | 2 | 16 | 3 | 130333 | 16291 | 524288 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 807656448 |
|  760m | 16384 | 8 | h100_80gb | 33.57 | 33.57 | 332 | 3 | 2 | 48 | 13 | 222521 | 27815 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 782490624 |
|  760m | 8192 | 8 | h100_80gb | 34.84 | 34.84 | 344 | 6 | 2 | 96 | 40 | 334602 | 41825 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 769907712 |
|  760m | 4096 | 8 | h100_80gb | 35.83 | 35.83 | 354 | 12 | 2 | 192 | 108 | 443674 | 55459 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 763616256 |
|  760m | 2048 | 32 | h100_80gb | 37.57 | 37.57 | 371 | 24 | 1 | 768 | 1062 | 2175091 | 67971 | 1572864 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 760470528 |
|  760m | 2048 | 16 | h100_80gb | 37.89 | 37.89 | 374 | 24 | 1 | 384 | 535 | 1096819 | 68551 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 760470528 |
|  760m | 2048 | 8 | h100_80gb | 34.9 | 34.9 | 345 | 24 | 2 | 384 | 246 | 505177 | 63147 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 760470528 |
|  760m | 1024 | 8 | h100_80gb | 39.76 | 39.76 | 393 | 48 | 2 | 768 | 613 | 628648 | 78581 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 758897664 |
|  760m | 512 | 8 | h100_80gb | 40.42 | 40.42 | 399 | 96 | 2 | 1536 | 1308 | 669998 | 83749 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 758111232 |
"""
_LF_FP8 = """
|  3b | 32768 | 8 | h100_80gb | 14.38 | 19.18 | 284 | 3 | 6 | 144 | 1 | 46853 | 5856 | 4718592 | amp_fp8 | DEFAULT | FULL_SHARD | True | False | 2730480640 |
|  3b | 8192 | 8 | h100_80gb | 23.28 | 23.28 | 460 | 3 | 6 | 144 | 18 | 153174 | 19146 | 1179648 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 2667566080 |
|  3b | 2048 | 8 | h100_80gb | 27.7 | 27.7 | 548 | 10 | 6 | 480 | 119 | 244692 | 30586 | 983040 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 2651837440 |
|  3b | 512 | 8 | h100_80gb | 30.25 | 30.25 | 598 | 40 | 6 | 1920 | 570 | 292217 | 36527 | 983040 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 2647905280 |
|  1b | 32768 | 8 | h100_80gb | 17.55 | 17.55 | 347 | 1 | 4 | 32 | 3 | 100643 | 12580 | 1048576 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 1378865152 |
|  1b | 8192 | 8 | h100_80gb | 20.71 | 20.71 | 409 | 2 | 4 | 64 | 31 | 256087 | 32010 | 524288 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 1328533504 |
|  1b | 512 | 8 | h100_80gb | 29.06 | 29.06 | 575 | 56 | 4 | 1792 | 1098 | 562523 | 70315 | 917504 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 1312804864 |
"""
_LF_A100 = """
|  70b | 2048 | 64 | a100_80gb | 53.33 | 71.1 | 166 | 8 | 4 | 2048 | 12 | 26274 | 410 | 4194304 | bf16 | PURE | FULL_SHARD | True | False | 64862437376 |
|  70b | 2048 | 32 | a100_80gb | 48.56 | 64.75 | 151 | 2 | 16 | 1024 | 5 | 11962 | 373 | 2097152 | bf16 | PURE | FULL_SHARD | True | False | 64862437376 |
|  30b | 8192 | 8 | a100_80gb | 39.38 | 52.5 | 122 | 1 | 21 | 168 | 0 | 4594 | 574 | 1376256 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 30019254272 |
|  30b | 4096 | 8 | a100_80gb | 51.37 | 68.49 | 160 | 1 | 21 | 168 | 1 | 6513 | 814 | 688128 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29989894144 |
|  30b | 2048 | 8 | a100_80gb | 55.3 | 73.74 | 172 | 3 | 21 | 504 | 3 | 7330 | 916 | 1032192 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |
|  30b | 1024 | 8 | a100_80gb | 55.82 | 74.43 | 174 | 6 | 21 | 1008 | 7 | 7571 | 946 | 1032192 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29967874048 |
|  30b | 512 | 8 | a100_80gb | 56.4 | 75.2 | 175 | 12 | 21 | 2016 | 15 | 7739 | 967 | 1032192 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29964204032 |
|  13b | 32768 | 8 | a100_80gb | 51.69 | 68.92 | 161 | 1 | 3 | 24 | 0 | 8134 | 1016 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 13011240960 |
|  13b | 16384 | 8 | a100_80gb | 54.07 | 72.1 | 168 | 3 | 3 | 72 | 0 | 11454 | 1431 | 1179648 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12927354880 |
|  13b | 8192 | 8 | a100_80gb | 56.07 | 74.76 | 174 | 5 | 3 | 120 | 1 | 14362 | 1795 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12885411840 |
|  13b | 4096 | 8 | a100_80gb | 57.62 | 76.82 | 179 | 10 | 3 | 240 | 4 | 16482 | 2060 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12864440320 |
|  13b | 2048 | 8 | a100_80gb | 59.57 | 59.57 | 185 | 2 | 3 | 48 | 8 | 18097 | 2262 | 98304 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 12853954560 |
|  13b | 1024 | 8 | a100_80gb | 59.48 | 79.3 | 185 | 40 | 3 | 960 | 18 | 18647 | 2330 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12848711680 |
|  7b | 65536 | 8 | a100_80gb | 46.97 | 62.63 | 146 | 1 | 2 | 16 | 0 | 8108 | 1013 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6918905856 |
|  7b | 32768 | 8 | a100_80gb | 49.46 | 65.94 | 154 | 2 | 2 | 32 | 0 | 13382 | 1672 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6784688128 |
|  7b | 16384 | 8 | a100_80gb | 51.96 | 69.28 | 162 | 4 | 2 | 64 | 1 | 19629 | 2453 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6717579264 |
|  7b | 8192 | 8 | a100_80gb | 54.47 | 72.62 | 169 | 8 | 2 | 128 | 3 | 25655 | 3206 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6684024832 |
|  7b | 4096 | 8 | a100_80gb | 54.84 | 73.12 | 171 | 16 | 2 | 256 | 7 | 29472 | 3684 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6667247616 |
|  7b | 2048 | 8 | a100_80gb | 64.23 | 64.23 | 200 | 6 | 2 | 96 | 18 | 37130 | 4641 | 196608 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |
|  7b | 1024 | 8 | a100_80gb | 58.01 | 77.35 | 180 | 64 | 2 | 1024 | 34 | 34857 | 4357 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 6654664704 |
|  3b | 65536 | 8 | a100_80gb | 46.05 | 61.41 | 143 | 1 | 2 | 16 | 0 | 14137 | 1767 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 2814366720 |
|  3b | 32768 | 8 | a100_80gb | 47.18 | 62.91 | 147 | 3 | 6 | 144 | 0 | 24235 | 3029 | 4718592 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 2730480640 |
|  3b | 16384 | 8 | a100_80gb | 57.13 | 57.13 | 178 | 1 | 6 | 48 | 2 | 44233 | 5529 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2688537600 |
|  3b | 8192 | 8 | a100_80gb | 59.34 | 59.34 | 185 | 3 | 6 | 144 | 7 | 61567 | 7695 | 1179648 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2667566080 |
|  3b | 4096 | 8 | a100_80gb | 60.53 | 60.53 | 188 | 5 | 6 | 240 | 18 | 75658 | 9457 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2657080320 |
|  3b | 2048 | 8 | a100_80gb | 62.11 | 62.11 | 193 | 10 | 2 | 160 | 42 | 86491 | 10811 | 327680 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2651837440 |
|  3b | 1024 | 8 | a100_80gb | 62.73 | 62.73 | 195 | 20 | 6 | 960 | 90 | 92643 | 11580 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2649216000 |
|  3b | 512 | 8 | a100_80gb | 63.71 | 63.71 | 198 | 40 | 6 | 1920 | 189 | 97019 | 12127 | 983040 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 2647905280 |
|  1b | 65536 | 8 | a100_80gb | 46.18 | 61.57 | 144 | 1 | 2 | 16 | 0 | 24353 | 3044 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 1445974016 |
|  1b | 32768 | 8 | a100_80gb | 55.52 | 55.52 | 173 | 1 | 4 | 32 | 1 | 50207 | 6275 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1378865152 |
|  1b | 16384 | 8 | a100_80gb | 56.6 | 56.6 | 176 | 2 | 4 | 64 | 4 | 79650 | 9956 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1345310720 |
|  1b | 8192 | 8 | a100_80gb | 56.69 | 56.69 | 176 | 3 | 4 | 96 | 13 | 110516 | 13814 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1328533504 |
|  1b | 4096 | 8 | a100_80gb | 59.0 | 59.0 | 184 | 7 | 4 | 224 | 34 | 142457 | 17807 | 917504 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1320144896 |
|  1b | 2048 | 8 | a100_80gb | 59.86 | 59.86 | 186 | 14 | 4 | 448 | 80 | 164109 | 20513 | 917504 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1315950592 |
|  1b | 1024 | 8 | a100_80gb | 60.15 | 60.15 | 187 | 18 | 4 | 576 | 172 | 176898 | 22112 | 589824 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1313853440 |
|  1b | 512 | 8 | a100_80gb | 60.68 | 60.68 | 189 | 56 | 4 | 1792 | 361 | 185186 | 23148 | 917504 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 1312804864 |
|  760m | 65536 | 8 | a100_80gb | 45.34 | 60.45 | 141 | 1 | 2 | 16 | 0 | 33150 | 4143 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | True | False | 857988096 |
|  760m | 32768 | 8 | a100_80gb | 54.57 | 54.57 | 170 | 1 | 2 | 16 | 2 | 70417 | 8802 | 524288 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 807656448 |
|  760m | 16384 | 8 | a100_80gb | 54.64 | 54.64 | 170 | 3 | 2 | 48 | 6 | 114198 | 14274 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 782490624 |
|  760m | 8192 | 8 | a100_80gb | 55.31 | 55.31 | 172 | 6 | 2 | 96 | 20 | 167471 | 20933 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 769907712 |
|  760m | 4096 | 8 | a100_80gb | 56.05 | 56.05 | 174 | 12 | 2 | 192 | 53 | 218808 | 27351 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 763616256 |
|  760m | 2048 | 8 | a100_80gb | 56.85 | 56.85 | 177 | 24 | 2 | 384 | 126 | 259472 | 32434 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 760470528 |
|  760m | 1024 | 8 | a100_80gb | 47.76 | 47.76 | 149 | 48 | 2 | 768 | 232 | 238122 | 29765 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 758897664 |
|  760m | 512 | 8 | a100_80gb | 45.07 | 45.07 | 140 | 96 | 2 | 1536 | 460 | 235571 | 29446 | 786432 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 758111232 |
|  350m | 65536 | 8 | a100_80gb | 52.7 | 52.7 | 164 | 1 | 2 | 16 | 0 | 60195 | 7524 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 420997120 |
|  350m | 32768 | 8 | a100_80gb | 52.46 | 52.46 | 163 | 2 | 2 | 32 | 3 | 109222 | 13652 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 387442688 |
|  350m | 16384 | 8 | a100_80gb | 53.28 | 53.28 | 166 | 4 | 2 | 64 | 11 | 188478 | 23559 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 370665472 |
|  350m | 8192 | 8 | a100_80gb | 53.8 | 53.8 | 167 | 8 | 2 | 128 | 35 | 292559 | 36569 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 362276864 |
|  350m | 4096 | 8 | a100_80gb | 53.31 | 53.31 | 166 | 16 | 2 | 256 | 96 | 396442 | 49555 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 358082560 |
|  350m | 2048 | 8 | a100_80gb | 51.62 | 51.62 | 161 | 32 | 2 | 512 | 229 | 470263 | 58782 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 355985408 |
|  350m | 1024 | 8 | a100_80gb | 50.51 | 50.51 | 157 | 64 | 2 | 1024 | 506 | 518504 | 64813 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 354936832 |
|  350m | 512 | 8 | a100_80gb | 50.61 | 50.61 | 157 | 128 | 2 | 2048 | 1083 | 554643 | 69330 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 354412544 |
|  125m | 65536 | 8 | a100_80gb | 54.13 | 54.13 | 168 | 1 | 2 | 16 | 2 | 162946 | 20368 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 174070272 |
|  125m | 32768 | 8 | a100_80gb | 52.71 | 52.71 | 164 | 2 | 2 | 32 | 8 | 291256 | 36407 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 148904448 |
|  125m | 16384 | 8 | a100_80gb | 50.61 | 50.61 | 157 | 4 | 2 | 64 | 29 | 480322 | 60040 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 136321536 |
|  125m | 8192 | 8 | a100_80gb | 48.85 | 48.85 | 152 | 8 | 2 | 128 | 88 | 723142 | 90392 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 130030080 |
|  125m | 4096 | 8 | a100_80gb | 46.08 | 46.08 | 143 | 16 | 2 | 256 | 231 | 947172 | 118396 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 126884352 |
|  125m | 2048 | 8 | a100_80gb | 44.79 | 44.79 | 139 | 40 | 2 | 640 | 557 | 1142641 | 142830 | 1310720 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 125311488 |
|  125m | 2048 | 8 | a100_80gb | 44.45 | 44.45 | 138 | 32 | 2 | 512 | 553 | 1133901 | 141737 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 125311488 |
|  125m | 1024 | 8 | a100_80gb | 43.15 | 43.15 | 134 | 64 | 2 | 1024 | 1222 | 1251751 | 156468 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 124525056 |
|  125m | 512 | 8 | a100_80gb | 42.56 | 42.56 | 132 | 128 | 2 | 2048 | 2588 | 1325455 | 165681 | 1048576 | amp_bf16 | DEFAULT | FULL_SHARD | False | False | 124131840 |
"""
CASES += _lf_rows(_LF_H100, _LF_BASE + "'## H100 80GB BF16'", "h100", "h100")
CASES += _lf_rows(_LF_FP8, _LF_BASE + "'## H100 80GB FP8'", "h100", "h100-fp8",
                  "amp_fp8: TransformerEngine's float8 linears (Composer's 'amp_fp8'). ")
CASES += _lf_rows(_LF_A100, _LF_BASE + "'## A100 80GB with 1600 Gbps node-node interconnect (RoCE)'", "a100", "a100",
                  "A100 80GB (form factor not stated: the catalog's SXM4 80GB assumed); '1600 Gbps node-node interconnect "
                  "(RoCE)' = 200e9 B/s per node of 8 GPUs, 25e9 B/s per GPU (recorded in network_bandwidth). Rows on 32 and "
                  "64 GPUs have 'MP Mode' PURE and precision bf16 (the others amp_bf16). ")
for _c in CASES:
    if _c["hardware"] == "a100" and _c["source"].startswith(_LF_BASE):
        _c["network_bandwidth"] = 25e9

# --- Narayanan et al. 2021 (Megatron-LM, SC21), Table 1 -------------------------------------------------------

_NAR = ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM (Narayanan et al. 2021, arXiv "
        "2104.04473), Table 1 (weak scaling, columns 'Number of parameters (billion) | Attention heads | Hidden size | Number "
        "of layers | Tensor model-parallel size | Pipeline model-parallel size | Number of GPUs | Batch size | Achieved "
        "teraFLOP/s per GPU | Percentage of theoretical peak FLOP/s | Achieved aggregate petaFLOP/s')")
_NAR_NOTE = ("No page of the paper itself was reachable; the rows are quoted from stored public transcriptions of Table 1 "
             "that agree row for row (find_string ids 66766946069, 55320678230, 66890646596, 63236651303). Selene: A100 80GB, "
             "8 per node with NVLink/NVSwitch and 8 x 200 Gb/s HDR InfiniBand per node (25e9 B/s per GPU, recorded in "
             "network_bandwidth); vocabulary 51,200, sequence 2048, mixed precision; the FLOP count is the paper's "
             "F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), which counts activation recomputation (checkpointing 'full'); "
             "parameters P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)). Micro-batch size, pipeline schedule (1F1B or "
             "interleaved) not stated per row; data parallelism is Megatron's DDP (2021: no distributed optimizer, no "
             "sequence parallelism). ")
for _b, _a, _h, _l, _t, _p, _n, _bs, _x, _pct, _agg in [
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0)]:
    _dp = _n // (_t * _p)
    CASES.append(_row(
        id=f"narayanan2021-table1-gpt-{_b:g}b-{_n}xa100-tp{_t}-pp{_p}",
        source=f"{_NAR}, row '{_b} | {_a} | {_h} | {_l} | {_t} | {_p} | {_n} | {_bs} | {_x} | {_pct}% | {_agg}'",
        model=None, model_note=f"GPT {_b:g}B: {_l} layers, hidden {_h}, {_a} heads, vocabulary 51,200",
        model_dims=dict(name=f"GPT {_b:g}B (Narayanan et al. 2021)", layers=_l, hidden_dim=_h, heads=_a, ffn_dim=4 * _h,
                        vocab_size=51200, gated_mlp=False, tied_embeddings=True, architecture="gpt3", context_length=2048,
                        parameters=round(12 * _l * _h ** 2 * (1 + 13 / (12 * _h) + (51200 + 2048) / (12 * _l * _h))),
                        position_table=2048 * _h,
                        source="the row's heads, hidden size and layers; the paper's vocabulary 51,200, sequence 2048 and "
                               "parameter formula (4h MLP, learned positions, tied embeddings)"),
        hardware="a100", devices=_n, tp=_t, pp=_p, dp_shard=1, dp_replicate=_dp, local_batch=_bs // _dp, global_batch=_bs,
        seq_len=2048, checkpointing="full", compile=None, float8=False, async_tp=False, tflops_per_gpu=_x,
        mfu=_pct / 100, flops_convention="megatron-2021", sharding="ddp", network_bandwidth=25e9,
        notes=_NAR_NOTE + f"dp {_dp} derived: {_n} / ({_t} x {_p}). Aggregate petaFLOP/s {_agg}."))

# --- NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, '26.04.01 NeMo Container' ---------------------

_MB = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at commit 067f987df03b8355b03192d88d70f1709fedf51a "
       "(file last changed in 4ab94dfad36641cabdeb96452b21bf676aac4772), section '## 26.04.01 NeMo Container' / "
       "'### Pre-Training Performance', columns '| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP "
       "| CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |'")
_MB_NOTE = ("DGX-H100 (8 x H100 SXM 80GB per node, 700 W). Megatron-Bridge performance recipes (scripts/performance); "
            "data parallelism recorded as Megatron's distributed optimizer (the recipes' default; the table does not say), "
            "TP communication overlap and the MoE dispatcher not stated in the table (timed without them unless the row's "
            "recipe, _MB_RECIPE or _MB_TP_OVERLAP, says); H100 FP8 is "
            "Transformer Engine's current scaling (the recipes' fp8cs configs; its casts timed as TE's, "
            "steptime.TE_CURRENT_SCALING). DP derived = GPUs / (TP x PP x CP); GA = GBS / (DP x "
            "MBS) derived. ")
# The recipes behind the table's MoE rows (a later version than the table's commit: the table names no dispatcher).
# NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/qwen/qwen3_workload_base_configs.py at commit
# f29a269f8728ff9075f88a226f92e554196a7e41: QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2 (V1's TP 2, PP 8, VP 4, EP 32,
# 'moe_a2a_overlap=True', with 'global_batch_size=8192', the table's GBS); QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1
# ('num_gpus=16', 'global_batch_size=1024', 'expert_model_parallel_size=16', 'moe_a2a_overlap=False',
# 'moe_flex_dispatcher_backend="hybridep"'). scripts/performance/configs/qwen/qwen3_llm_pretrain.py at commit
# 826618be9ea5c3b4cf11e582089dc1dee8586fe9: qwen3_235b_a22b_pretrain_config_h100 sets
# 'cfg.model.moe_token_dispatcher_type = "alltoall"', qwen3_30b_a3b_pretrain_config_h100 '"flex"'.
# The dense Llama rows' recipes, at the table's own commit (067f987df03b8355b03192d88d70f1709fedf51a):
# src/megatron/bridge/perf_recipes/llama/h100/llama3.py llama3_70b_pretrain_64gpu_h100_fp8cs_config ("TP=4 PP=8,
# GBS=256": 'virtual_pipeline_model_parallel_size = 5', 'micro_batch_size = 1', 'sequence_parallel = True',
# 'cfg.comm_overlap.tp_comm_overlap_cfg = userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192', no recompute set) on
# llama3_70b_pretrain_config = src/megatron/bridge/recipes/llama/h100/llama3.py
# llama3_70b_pretrain_32gpu_h100_bf16_config ('CommOverlapConfig(tp_comm_overlap=True, ...)'); llama31.py
# llama31_405b_pretrain_1024gpu_h100_fp8cs_config (TP 8, PP 8, CP 2, VP 8, 'micro_batch_size = 1',
# 'tp_comm_overlap_cfg = userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192') on llama31_405b_pretrain_config
# (recipes/llama/h100/llama3.py llama31_405b_pretrain_256gpu_h100_bf16_config, 'tp_comm_overlap=True'):
# Transformer Engine's userbuffers TP communication overlap, timed as async TP (overlap={"tp": "decomposed"}).
_MB_TP_OVERLAP = {"LLAMA3_70B": "Recipe: TP communication overlap on (tp_comm_overlap=True, userbuffers; timed as async "
                                "TP), VP 5, MBS 1, recompute_granularity None in the base recipe. ",
                  "LLAMA3.1_405B": "Recipe: TP communication overlap on (tp_comm_overlap=True, userbuffers; timed as "
                                   "async TP), VP 8, MBS 1. "}
_MB_RECIPE = {
    "Qwen3_235B_a22B": ("alltoall", True, "Recipe (_MB_RECIPE): dispatcher 'alltoall' (NCCL all-to-all: every copy of a "
                        "token to each expert's rank), moe_a2a_overlap=True (timed as EP overlap). "),
    "Qwen3_30B_a3B": ("flex", False, "Recipe (_MB_RECIPE): dispatcher 'flex' with the 'hybridep' backend (timed "
                      "node-forwarded: a token sent once to each other node holding one of its experts; assumed of "
                      "HybridEP, which the recipe names, not its traffic), moe_a2a_overlap=False. "),
}
# GPT-OSS 120B's recipe at the table's commit (src/megatron/bridge/perf_recipes/gpt_oss/h100/gpt_oss.py at
# 067f987df03b8355b03192d88d70f1709fedf51a, gpt_oss_120b_pretrain_64gpu_h100_bf16_config, "64x H100, BF16, PP=4 EP=8,
# GBS=1280"): 'cfg.model.recompute_modules = ["layernorm", "moe_act"]', 'cfg.model.recompute_granularity =
# "selective"': Megatron-Core recomputes the layer norms' and the experts' activation outputs in the backward.
_MB_RECOMPUTE = {"GPT OSS 120B": ("megatron-selective-layernorm-moe-act",
                                  "Recipe: recompute_granularity 'selective', recompute_modules ['layernorm', 'moe_act'] "
                                  "(gpt_oss_120b_pretrain_64gpu_h100_bf16_config at 067f987). ")}
for _m, _cat, _g, _prec, _gbs, _mbs, _seq, _tp, _pp, _cp, _vp, _ep, _tps, _tf in [
        ("LLAMA3_70B", "meta-llama/meta-llama-3-70b", 64, "FP8", 256, 1, 8192, 4, 8, 1, 5, None, 1664, 731),
        ("LLAMA3.1_405B", "meta-llama/llama-3.1-405b", 1024, "FP8", 1536, 1, 8192, 8, 8, 2, 8, None, 328, 827),
        ("GPT OSS 120B", "openai/gpt-oss-120b", 64, "BF16", 1280, 1, 4096, 1, 4, 1, None, 8, 5824, 158),
        ("Qwen3_30B_a3B", "qwen/qwen3-30b-a3b", 16, "FP8", 1024, 1, 4096, 1, 1, 1, None, 16, 8960, 206),
        ("Qwen3_235B_a22B", "qwen/qwen3-235b-a22b-instruct-2507", 256, "FP8", 8192, 1, 4096, 2, 8, 1, 4, 32, 1712, 253)]:
    _dp = _g // (_tp * _pp * _cp)
    _txt = (f"| DGX-H100 | {_g} | {_prec} | {_gbs} | {_mbs} | {_seq} | 0 | {_tp} | {_pp} | {_cp} | {_vp or 'n/a'} | "
            f"{_ep or 'n/a'} | {_tps} | {_tf} |")
    CASES.append(_row(
        id=f"megatron-bridge-2604-{_m.lower().replace(' ', '-').replace('_', '-')}-{_g}xh100-{_prec.lower()}",
        source=f"{_MB}, '#### Model: {_m}' row '{_txt}'", model=_cat, hardware="h100", devices=_g, tp=_tp, cp=_cp,
        pp=_pp, ep=_ep or 1, virtual_stages=_vp, pp_schedule="Interleaved1F1B" if _vp else ("1F1B" if _pp > 1 else None),
        dp_shard=1, dp_replicate=_dp, micro_batch=_mbs, local_batch=_gbs // _dp, global_batch=_gbs, seq_len=_seq,
        checkpointing=_MB_RECOMPUTE.get(_m, (None,))[0], compile=None, float8=_prec == "FP8", async_tp=_m in _MB_TP_OVERLAP, tokens_per_s_per_gpu=_tps,
        float8_recipe="te-current-scaling" if _prec == "FP8" else None,     # (the rows' recipes: *_h100_fp8cs_*)
        tflops_per_gpu=_tf, sharding="distributed-optimizer", expert_tp=1 if _ep and _tp > 1 else None,
        cp_ring="transformer-engine" if _cp > 1 else None,
        ep_dispatcher=_MB_RECIPE.get(_m, (None,))[0], ep_overlap=_MB_RECIPE.get(_m, (None, None))[1],
        notes=_MB_NOTE + _MB_RECIPE.get(_m, (None, None, ""))[2] + _MB_TP_OVERLAP.get(_m, "")
              + _MB_RECOMPUTE.get(_m, (None, ""))[1] + f"DP {_dp}. "
              + (_CP_TE if _cp > 1 else "") + ("Expert tensor parallelism 1, the recipe's: the fp8cs perf recipe builds "
                                          "on recipes/qwen/h100/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config "
                                          "at 067f987df03b8355b03192d88d70f1709fedf51a, 'cfg.model.expert_tensor_parallel_size "
                                          "= 1', which it does not change (EP 32 x TP 2 would exceed the 32 devices of a stage "
                                          "otherwise). " if _ep and _tp > 1 else "") + ("Qwen3-235B: the catalog's model is the Instruct-2507 checkpoint (same "
                                          "architecture as the pre-trained one). " if "235" in _m else "")
              + ("GPT-OSS alternates sliding-window (128) and full attention: its windowed layers timed as windowed. "
                 if "OSS" in _m else "")))

# --- Llama 3 Herd of Models, Table 4 -------------------------------------------------------------------------

_L3_NOTE = ("H100 80GB HBM3 at 700W (section 3.3.1), RoCE 400 Gbps. 'Batch size/DP' (sequences per DP group per step) recorded as "
            "local_batch; global_batch derived = DP x Batch size/DP. DP is FSDP ('DP stands for FSDP'); 'for model shards we do not "
            "reshard after forward computation'. Order of dimensions [TP, CP, PP, DP]. Pipeline: 'an interleaved schedule (Narayanan "
            "et al., 2021) with V pipeline stages on one pipeline rank' with a tunable number N of contiguous micro-batches (V, N not "
            "stated); first and last stages each have one fewer Transformer layer. 'BF16 Model FLOPs Utilization (MFU; Chowdhery et al. "
            "(2023))'; the FLOP formula and the peak are not restated (430 TFLOPs at 43% puts the peak near 1000 TFLOP/s, i.e. H100 SXM dense BF16). "
            "Gradients: 'we use FP32 gradient accumulation during backward computation over multiple micro-batches and also "
            "reduce-scatter gradients in FP32 across data parallel workers in FSDP' (section 3.3.2, 'Numerical stability'): "
            "recorded as dp_gradient_sync 'step' (fsdp-grad-op's gradient_sync='step': the unsharded fp32 gradients "
            "accumulated, reduce-scattered once per step). Stages: 'we reduce one Transformer layer each from the first and "
            "the last stages, respectively': recorded as pp_stages 'ends-one-fewer' (126 layers over PP 16: 7, 14 x 8, 7). "
            "tokens_per_s_per_gpu is not printed. ")
_L3_V = ("virtual_stages 8 derived from the text, not printed: 'we reduce one Transformer layer each from the first and the last "
         "stages, respectively. This means that the first model chunk on the first stage has only the embedding, and the last "
         "model chunk on the last stage has only output projection and loss calculation': the layer taken off the first stage "
         "was its first chunk's only one, so a chunk is one layer, and a middle stage's ceil((126 + 2) / 16) = 8 layers are V = 8 "
         "chunks (126 + 2 = 16 x 8: the embedding and the head each a chunk). ")
CASES += [
    _row(id="llama3-paper-table4-405b-8192xh100-tp8-pp16-dp64", source=f"{_L3}, row '8,192 | 8 | 1 | 16 | 64 | 8,192 | 32 | 16M | 430 | 43%'",
         model="meta-llama/llama-3.1-405b", hardware="h100", devices=8192, tp=8, cp=1, pp=16, pp_schedule="Interleaved1F1B (Llama 3 variant)",
         dp_shard=64, local_batch=32, global_batch=2048, seq_len=8192, checkpointing="none", compile=None, async_tp=None, tflops_per_gpu=430, mfu=0.43,
         flops_convention="palm", sharding="no-reshard-after-forward", dp_gradient_sync="step",
         pp_stages="ends-one-fewer", virtual_stages=8,
         virtual_stages_derived="8 stages per rank (derived: the first chunk of the first stage holds only the embedding, so a "
                                "chunk is one layer)",
         notes=_L3_NOTE + _L3_V + "Checkpointing: 'we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing.' "
               "global_batch 64 x 32 = 2048 sequences = 16.8M tokens ('16M')."),
    _row(id="llama3-paper-table4-405b-16384xh100-tp8-pp16-dp128", source=f"{_L3}, row '16,384 | 8 | 1 | 16 | 128 | 8,192 | 16 | 16M | 400 | 41%'",
         model="meta-llama/llama-3.1-405b", hardware="h100", devices=16384, tp=8, cp=1, pp=16, pp_schedule="Interleaved1F1B (Llama 3 variant)",
         dp_shard=128, local_batch=16, global_batch=2048, seq_len=8192, checkpointing="none", compile=None, async_tp=None, tflops_per_gpu=400, mfu=0.41,
         flops_convention="palm", sharding="no-reshard-after-forward", dp_gradient_sync="step",
         pp_stages="ends-one-fewer", virtual_stages=8,
         virtual_stages_derived="8 stages per rank (derived: the first chunk of the first stage holds only the embedding, so a "
                                "chunk is one layer)",
         notes=_L3_NOTE + _L3_V + "Checkpointing as the 8K row. Text: 'The slight drop in MFU to 41% on 16K GPUs with DP=128 compared to 43% on 8K GPUs "
               "with DP=64 is due to the lower batch size per DP group needed to keep the global tokens per batch constant during training.'"),
    _row(id="llama3-paper-table4-405b-16384xh100-tp8-cp16-pp16-seq131072", source=f"{_L3}, row '16,384 | 8 | 16 | 16 | 4 | 131,072 | 16 | 16M | 380 | 38%'",
         model="meta-llama/llama-3.1-405b", hardware="h100", devices=16384, tp=8, cp=16, pp=16, pp_schedule="Interleaved1F1B (Llama 3 variant)",
         dp_shard=8, local_batch=16, global_batch=128, seq_len=131072, checkpointing=None, compile=None, async_tp=None, tflops_per_gpu=380, mfu=0.38,
         flops_convention="palm", sharding="no-reshard-after-forward", dp_gradient_sync="step",
         pp_stages="ends-one-fewer", virtual_stages=8,
         virtual_stages_derived="8 stages per rank (derived: the first chunk of the first stage holds only the embedding, so a "
                                "chunk is one layer)",
         notes=_L3_NOTE + _L3_V + "DP: the arXiv PDF prints 4 (some copies print 8); dp_shard 8 is derived: 16,384 / (8 x 16 x 16) = 8, and 8 x 16 x 131,072 "
               "= 16.8M tokens matches '16M' (DP 4 would give 8,192 GPUs and 8.4M tokens). global_batch derived 8 x 16 = 128 sequences. "
               "CP is all-gather based (K, V all-gathered), input split into 2 x CP chunks for load balance. Activation checkpointing "
               "for 128K is not stated."),
]

# The hardware the torchtitan H100 files state (_H100_GT): 500 W power limit, 2.4 TB/s HBM2e. Their pipeline
# micro-batch count: 'the number of pipeline stages' by default (config_manager.py at 9dec370, quoted above).
for _c in CASES:
    if _c["source"].startswith((_TT_2412, _TT_ATP)):
        _c["power_watts"], _c["memory_bandwidth"] = 500, 2.4e12
        if _c["pp"] > 1:
            _c["micro_batch"] = _c["local_batch"] // _c["pp"]
    if _c["source"].startswith(_TT_2412) and _c["pp_schedule"] == "Interleaved1F1B":
        _c["notes"] += "Stages per rank not stated: timed with 2 (virtual_stages None here; calibrate.py says so). "

del _fsdp, _cp, _seq, _tps, _mem, _txt, _size, _title, _rows, _q, _f8, _van, _asy, _async, _llama, _name
del _b, _a, _h, _l, _t, _p, _n, _bs, _x, _pct, _prec, _ep
del _heads, _hidden, _layers, _tp, _pp, _dp, _gpus, _batch, _tf, _mfu, _agg, _m, _g, _gbs, _mbs, _vp, _ga, _cat

# How the pipeline's sends ran (pp_p2p: the pp rule's option p2p, pipeline_parallel.PipelineOptions), where the source
# states it or runs a default that says it; 'overlapped': each send and receive posted asynchronously beside a chunk's
# compute.
# * The Llama 3 paper, section 3.3.2: 'we adopt asynchronous point-to-point communication in PP, which considerably
#   speeds up training'.
# * Megatron-LM's examples (the interleaved rows, VP > 1): overlap_p2p_comm is Megatron-LM's default
#   (megatron/training/arguments.py at d98e8a64ddf34856e74b24714e3bedb2f5a39553: "'--no-overlap-p2p-communication',
#   action='store_false', ... dest='overlap_p2p_comm'"), turned off only 'if not using the interleaved schedule';
#   the section's script passes no --no-overlap-p2p-communication.
# * Megatron-Bridge's H100 rows with VP: CommOverlapConfig sets it for every recipe with one at VP > 1
#   (src/megatron/bridge/training/comm_overlap.py at 067f987df03b8355b03192d88d70f1709fedf51a,
#   _get_model_comm_overlap_cfgs: "# PP overlap ... if vp_size > 1: comm_overlap_cfg.overlap_p2p_comm = True;
#   comm_overlap_cfg.batch_p2p_comm = False"), and the rows' recipes have one (the Llama 3 70B and 3.1 405B fp8cs
#   configs' base recipes above, tp_comm_overlap=True; perf_recipes/qwen/h100/qwen3_moe.py
#   qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config 'cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False,
#   ...)' with 'virtual_pipeline_model_parallel_size = 4').
# published_more.py's B200 and GB200 rows (uncalibrated) state it there: the rows whose recipe it cites (_RECIPE), each
# with a comm_overlap config (perf_recipes/llama/*/llama3*.py on llama3*_pretrain_config's CommOverlapConfig,
# qwen/gb200/qwen3_moe.py 'cfg.comm_overlap = CommOverlapConfig(...)', deepseek/common.py and deepseek/*/deepseek_v3.py
# setting cfg.comm_overlap's fields), at VP > 1.
for _c in CASES:
    if (_c["source"].startswith(_L3) or (_c["source"].startswith((_MG_LLAMA, _MB)) and (_c["virtual_stages"] or 1) > 1)):
        _c["pp_p2p"] = "overlapped"
        _c["notes"] += "Pipeline sends overlapped (asynchronous; published.py's pp_p2p, cited there). "

CASES += __import__("runpy").run_path(__file__.replace("published.py", "published_more.py"), init_globals=dict(globals()))["CASES_MORE"]

# The training regime each source ran (the measured profile's regime: the dtypes of the weights, gradients, master copy
# and of the data-parallel collectives, Regime.collective_bytes; a name calibrate.py registers where no built-in fits):
# * torchtitan: FSDP2's MixedPrecisionPolicy (torchtitan config_manager.py at 0011fb905e9561a51af0f265e35d989f7448b1d8:
#   '--training.mixed_precision_param' default 'bfloat16', '--training.mixed_precision_reduce' default 'float32'):
#   'fsdp-bf16' (gathered in bf16, reduced in fp32). Its float8 runs keep the bf16 all-gather (torchao's
#   enable_fsdp_float8_all_gather is off by default and no file turns it on).
# * Megatron-Bridge's performance recipes, which the tables ran: bf16_mixed ('params_dtype=torch.bfloat16',
#   src/megatron/bridge/training/mixed_precision.py at the table's commit 067f987df03b8355b03192d88d70f1709fedf51a) with
#   the fp32 reduction turned off for the benchmark: src/megatron/bridge/perf_recipes/_common.py there, _perf_precision
#   ("Always sets ``grad_reduce_in_fp32=False``", 'cfg.grad_reduce_in_fp32 = False') and _benchmark_common
#   ('cfg.ddp.grad_reduce_in_fp32 = False'); the earlier scripts/performance configs the same (at
#   f29a269f8728ff9075f88a226f92e554196a7e41, e.g. configs/llama/llama31_llm_pretrain.py 'cfg.ddp.grad_reduce_in_fp32 =
#   False'). Megatron-Core's grad buffer is then bf16 ("grad_dtype = torch.float if ... grad_reduce_in_fp32 else
#   param.dtype", regimes.py): bf16 gradients accumulated and reduced in bf16, an fp32 master copy: 'mixed-bf16'. The FP8
#   rows' recipes (bf16_with_fp8_current_scaling_mixed with 'cfg.first_last_layers_bf16 = False', bf16_with_mxfp8_mixed)
#   set 'cfg.fp8_param_gather = True': the distributed optimizer all-gathers fp8 parameters,
#   'megatron-bf16-grads-fp8-gather' (calibrate.py). published_more.py's rows too (below).
# * Megatron-LM README (precision not stated; bf16 assumed, calibrate.py says so): '--bf16' turns on
#   accumulate_allreduce_grads_in_fp32 (megatron/training/arguments.py at 000c4ac24f61159c138b0975def722c65245983c:
#   "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"): 'mixed-bf16-main-grad'.
# * Megatron-LM examples/llama FP8 (examples/llama/train_llama3_8b_h100_fp8.sh, read at
#   157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9, not the table's commit: '--bf16', '--grad-reduce-in-bf16',
#   '--fp8-param-gather'): bf16 gradients reduced in bf16, parameters gathered in fp8: 'megatron-bf16-grads-fp8-gather'.
# * The Llama 3 paper: 'reduce-scatter gradients in FP32' (section 3.3.2) with BF16 compute ('BF16 Model FLOPs
#   Utilization'): 'fsdp-bf16' (the parameters gathered in bf16 assumed: not stated).
# * Narayanan et al. 2021: mixed precision with Megatron-LM's fp16 of 2021 (fp16 parameters and gradients, an fp32
#   master copy; the gradients all-reduced in fp16: accumulate_allreduce_grads_in_fp32 is forced only for bf16,
#   arguments.py above): 'mixed-bf16' (the same bytes), assumed (the paper names no dtype for its gradients).
# * llm-foundry: each row's 'MP Mode' column (_LF_REGIME).
_REGIME_BY_SOURCE = (((_TT_2412, _TT_ATP, _TT_H200, _TT_MX, _TT_FP4), "fsdp-bf16"),
                     ((_MG_TABLE,), "mixed-bf16-main-grad"), ((_MG_LLAMA,), "megatron-bf16-grads-fp8-gather"),
                     ((_L3,), "fsdp-bf16"), ((_NAR,), "mixed-bf16"))
for _c in CASES:
    for _sources, _regime in _REGIME_BY_SOURCE:
        if _c["regime"] is None and _c["source"].startswith(_sources):
            _c["regime"] = _regime
    if _c["regime"] is None and _c["source"].startswith("NVIDIA-NeMo/Megatron-Bridge"):
        _c["regime"] = "megatron-bf16-grads-fp8-gather" if _c["float8"] else "mixed-bf16"
del _c, _sources, _regime
