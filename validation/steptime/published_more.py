"""Published throughput on accelerators without a fitted calibration (issue 27 item 4): B200 and GB200 rows,
held out, reported per accelerator by calibrate.py as uncalibrated. Run by published.py (its last line), which
passes its own names (``_row``, ``_MB``, ``_CP_TE``, ...) as this module's globals: the rows are recorded as
published.py's Megatron-Bridge rows are, with its helpers, not copies of them.

Sources (read from the repository's git objects):

* NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at commit 067f987df03b8355b03192d88d70f1709fedf51a
  (published.py's ``_MB``): section '## 26.04.01 NeMo Container', the B200 and GB200 rows beside the H100 rows
  published.py records; section '## 25.11 NeMo Container' (its tables are per system, '#### System: DGX-B200' /
  '#### System: DGX-GB200', with a GA column): its B200 and GB200 rows of catalog models (26.04.01 has no dense B200
  row; several 25.11 layouts recur in 26.04.01, a later container's measurement of the same layout). The archive's nomenclature: 'FSDP > 0: use FSDP with sharding group size = #GPUs / (TP x PP)',
  'FSDP = 0: use DDP'; footnote: 'In MoE training benchmarks, we force-balance the token distribution among
  experts and all benchmarks are token-dropless.' (the planner's balanced routing).
* The recipes, where a row states one (src/megatron/bridge/perf_recipes/<family>/<system>/*.py at the same commit;
  a recipe is only cited where its layout is the row's: the recipes are the current ones, not necessarily the
  runs'): gpt_oss/gb200/gpt_oss.py gpt_oss_120b_pretrain_64gpu_gb200_bf16_config ('expert_model_parallel_size = 64',
  'micro_batch_size = 4', 'recompute_modules = ["layernorm", "moe_act"]', 'overlap_moe_expert_parallel_comm =
  True'); gpt_oss/b200/gpt_oss.py gpt_oss_120b_pretrain_64gpu_b200_bf16_config (EP 8, MBS 4, the same recompute,
  no EP overlap set); deepseek/b200/deepseek_v3.py deepseek_v3_pretrain_256gpu_b200_fp8mx_config (PP 8, VP 2,
  EP 32: 'moe_flex_dispatcher_backend = "deepep"', 'overlap_moe_expert_parallel_comm = True',
  set_deepseek_v3_pipeline_model_parallel_layout: an uneven layout the pp rule does not express);
  deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_fp8mx_config (PP 4, VP 4, EP 64, the same
  layout call, no dispatcher or EP overlap set in the function); llama/{b200,gb200}/llama3.py
  llama3_8b_pretrain_8gpu_*_fp8cs_config ('micro_batch_size = 2', 'cuda_graph_scope = ["full_iteration"]',
  'CommOverlapConfig(tp_comm_overlap=False)'); llama/gb200/llama3.py llama3_70b_pretrain_64gpu_gb200_fp8cs_config
  ('micro_batch_size = 2', 'use_megatron_fsdp = True'); qwen/{b200,gb200}/qwen3_moe.py and
  qwen/common.py _enable_hybridep_full_iteration_mxfp8 (the flex 'hybridep' dispatcher, EP overlap, fp8 attention),
  deepseek/common.py (_deepseek_v3_common: the flex 'hybridep' dispatcher), llama/gb200/llama3.py and llama31.py on
  recipes/llama/h100/llama3.py's base configs (TP communication overlap on); the rows' notes say which (_RECIPE).

Not recorded: 25.11's DGX-B200 'DeepSeekV3 (w/ MTP)' row (the multi-token-prediction module is not in the catalog's
model), 26.04.01's GB200 LLAMA3.1_405B MXFP8 row (PP 16 x VP 8 = 128 model chunks for 126 layers: the pp
rule refuses a chunk without a layer, LayoutError), NVFP4 rows (the planner has no 4-bit matmul), GB300/B300 rows (not in the catalog), Nemotron 3 and
Kimi K2 rows (not in the catalog), 25.09's rows (no precision column), the 26.06 and later tables (later
containers' measurements, mostly of 26.04.01's GB200 layouts; the H100 rows are 26.04.01's: one release compared). No AMD MI300X training table with full layouts (TP/PP/DP, batch and sequence
per run) was found in the stored corpora; MI300X stays without comparable rows.

Precision: 'FP8' / 'FP8-CS' is Transformer Engine's current (tensorwise) scaling, its casts timed as TE's
(steptime.TE_CURRENT_SCALING); 'MXFP8' / 'FP8-MX' (32-element blocks with an E8M0 scale each,
Blackwell's block-scaled tensor-core MMA) is timed as float8 too: the GEMMs at the fp8 peak, the casts TE's
MXFP8 quantizer's (steptime.TE_MXFP8), as each such row's notes say.
"""

_B_NOTE = ("DGX-B200 (8 x B200 per node, NVLink 5 inside the node, one 400 Gb/s ConnectX-7 per GPU: the catalog's "
           "nvidia/b200). ")
_GB_NOTE = ("DGX-GB200 (GB200 NVL72 racks: 72 GPUs in one NVLink 5 domain, 18 compute trays of 4 GPUs each with "
            "'4x NVIDIA ConnectX-7 single port 400G OSFP NIC' for the cluster network, docs.nvidia.com/dgx/"
            "dgxgb200-user-guide/hardware.html): timed with the NVLink domain as the node (calibrate.py) and 50e9 B/s "
            "per GPU across racks. Runs over 72 GPUs: how NVIDIA placed them over racks is not stated. ")
_MB_BW = ("Data parallelism recorded as Megatron's distributed optimizer where FSDP is 0 (the recipes' default; the "
          "table does not say), Megatron FSDP (sharding over #GPUs / (TP x PP)) where it is not. Checkpointing not "
          "stated in the table (the recipes' selective recompute of single modules is not modelled): none. ")
_MX = ("MXFP8 timed as float8: GEMMs at the fp8 peak (Blackwell's block-scaled MMA), casts as Transformer Engine's "
       "MXFP8 quantizer's (steptime.TE_MXFP8: one pass, both usages and the 1/32 scales, weights once a step). ")
_MB_2511 = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at commit 067f987df03b8355b03192d88d70f1709fedf51a "
            "(file last changed in 4ab94dfad36641cabdeb96452b21bf676aac4772), section '## 25.11 NeMo Container' / "
            "'### Pre-Training Performance', columns '| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP "
            "| TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |'")
_DSV3 = ("DeepSeek-V3: the catalog's model (671B, without the multi-token-prediction module); MLA timed from the "
         "catalog's shapes. The recipe's custom pipeline layout (set_deepseek_v3_pipeline_model_parallel_layout) is "
         "not expressed: even stages. ")
_HYB = ("flex dispatcher with the 'hybridep' backend (timed node-forwarded, as published.py's H100 Qwen3-30B row; "
        "inside one node it changes nothing)")
_TPO = ("the base recipe's TP communication overlap (tp_comm_overlap=True, userbuffers; timed as async TP, as "
        "published.py's _MB_TP_OVERLAP rows are)")
# What a recipe with the row's layout states (release, model, system, precision): (ep_dispatcher, ep_overlap, async_tp,
# note). Rows not listed: no recipe at the commit has their layout, or the recipe states none of these.
_RECIPE = {
    ("2604", "GPT OSS 120B", "gb200", "BF16"): (None, True, False, "Recipe: overlap_moe_expert_parallel_comm=True (timed "
                                                "as EP overlap); dispatcher not set (the EP rule's default all-to-all). "),
    ("2604", "GPT OSS 120B", "b200", "BF16"): (None, False, False, "Recipe: no EP overlap, dispatcher not set. "),
    ("2604", "DeepSeekV3", "b200", "MXFP8"): ("flex", True, False, "Recipe: flex dispatcher with the 'deepep' backend "
                                              "(timed node-forwarded), overlap_moe_expert_parallel_comm=True (timed as EP "
                                              "overlap). "),
    ("2604", "DeepSeekV3", "gb200", "MXFP8"): ("flex", True, False, "Recipe (deepseek/common.py _deepseek_v3_common, "
                                               "_enable_deepseek_full_iteration_mxfp8): " + _HYB + ", "
                                               "overlap_moe_expert_parallel_comm=True (timed as EP overlap). "),
    ("2511", "DeepSeekV3", "gb200", "BF16"): ("flex", False, False, "Recipe (deepseek_v3_pretrain_256gpu_gb200_bf16_config, "
                                              "PP 4, VP 4, EP 64, _deepseek_v3_common): " + _HYB + ", no EP overlap set. "),
    ("2604", "Qwen3_30B_a3B", "b200", "MXFP8"): ("flex", True, False, "Recipe (qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config): "
                                                 + _HYB + ", overlap_moe_expert_parallel_comm=True (timed as EP overlap). "),
    ("2604", "Qwen3_30B_a3B", "gb200", "MXFP8"): ("flex", True, False, "Recipe (qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config, "
                                                  "_enable_hybridep_full_iteration_mxfp8): " + _HYB + ", "
                                                  "overlap_moe_expert_parallel_comm=True (timed as EP overlap), "
                                                  "fp8_dot_product_attention=True (not modelled: attention timed in bf16). "),
    ("2604", "Qwen3_235B_a22B", "gb200", "MXFP8"): ("flex", True, False, "Recipe (qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config, "
                                                    "PP 8, VP 3, EP 32, _enable_hybridep_full_iteration_mxfp8): " + _HYB
                                                    + ", overlap_moe_expert_parallel_comm=True (timed as EP overlap), "
                                                    "fp8_dot_product_attention=True (not modelled: attention timed in bf16). "),
    ("2604", "LLAMA3_70B", "gb200", "MXFP8"): (None, None, True, "Recipe (llama3_70b_pretrain_64gpu_gb200_fp8mx_config, TP 2, "
                                               "PP 4, VP 5, on llama3_70b_pretrain_config): " + _TPO + ". "),
    ("2604", "LLAMA3.1_405B", "gb200", "FP8"): (None, None, True, "Recipe (llama31_405b_pretrain_256gpu_gb200_fp8cs_config, "
                                                "TP 4, PP 16, VP 4, on llama31_405b_pretrain_config): " + _TPO + ". "),
    ("2511", "LLAMA3.1_405B", "gb200", "FP8-CS"): (None, None, True, "Recipe (llama31_405b_pretrain_256gpu_gb200_fp8cs_config, "
                                                   "the row's TP 4, PP 16, VP 4, GBS 1536): " + _TPO + ". "),
    ("2511", "Qwen3_30B_a3B", "gb200", "FP8-MX"): ("flex", True, False, "Recipe (qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config, "
                                                   "the row's EP 8, MBS 4): " + _HYB + ", overlap_moe_expert_parallel_comm=True "
                                                   "(timed as EP overlap), fp8_dot_product_attention=True (not modelled). "),
    ("2511", "LLAMA3.1_405B", "b200", "FP8-CS"): (None, None, True, "Recipe: the B200 405B recipes at this commit have "
                                                  "another layout (PP 16); their userbuffers configuration is named "
                                                  "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192 (the row's TP 4 x CP 2) "
                                                  "and their base llama31_405b_pretrain_config sets " + _TPO + ". "),
}

CASES_MORE = []
# 26.04.01: (model, catalog model, system, GPUs, precision, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, tokens/s/GPU, TFLOP/s/GPU)
for _m, _cat, _sys, _g, _prec, _gbs, _mbs, _seq, _fsdp, _tp, _pp, _cp, _vp, _ep, _tps, _tf in [
        ("LLAMA3_70B", "meta-llama/meta-llama-3-70b", "GB200", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 4224, 1892),
        ("LLAMA3_70B", "meta-llama/meta-llama-3-70b", "GB200", 64, "MXFP8", 256, 1, 8192, 0, 2, 4, 1, 5, None, 3712, 1664),
        ("LLAMA3.1_405B", "meta-llama/llama-3.1-405b", "GB200", 256, "FP8", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 864, 2144),
        ("DeepSeekV3", "deepseek-ai/deepseek-v3", "GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4256, 1106),
        ("DeepSeekV3", "deepseek-ai/deepseek-v3", "B200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 8, 1, 2, 32, 3328, 864),
        ("GPT OSS 120B", "openai/gpt-oss-120b", "GB200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 16640, 452),
        ("GPT OSS 120B", "openai/gpt-oss-120b", "B200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 13568, 369),
        ("Qwen3_30B_a3B", "qwen/qwen3-30b-a3b", "GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26112, 599),
        ("Qwen3_30B_a3B", "qwen/qwen3-30b-a3b", "B200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 27136, 619),
        ("Qwen3_235B_a22B", "qwen/qwen3-235b-a22b-instruct-2507", "GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 5680, 840),
        ("Qwen3_235B_a22B", "qwen/qwen3-235b-a22b-instruct-2507", "B200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, None, 8, 3776, 560)]:
    _txt = (f"| DGX-{_sys} | {_g} | {_prec} | {_gbs} | {_mbs} | {_seq} | {_fsdp} | {_tp} | {_pp} | {_cp} | "
            f"{_vp or 'n/a'} | {_ep or 'n/a'} | {_tps} | {_tf} |")
    CASES_MORE.append((_m, _cat, _sys, _g, _prec, _gbs, _mbs, _seq, _fsdp, _tp, _pp, _cp, _vp, _ep, _tps, _tf,
                       f"{_MB}, '#### Model: {_m}' row '{_txt}'", "2604"))
# 25.11: (model, catalog model, system, GPUs, precision, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, GA, tokens/s/GPU, TFLOP/s/GPU)
for _m, _cat, _sys, _g, _prec, _gbs, _mbs, _seq, _fsdp, _tp, _pp, _cp, _vp, _ep, _ga, _tps, _tf, _txt in [
        ("LLAMA3_8B", "meta-llama/meta-llama-3-8b", "B200", 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1, None, 1, 8, 30624, 1576,
         "| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 30624 (29521) | 1576 (1519) |"),
        ("LLAMA3.1_405B", "meta-llama/llama-3.1-405b", "B200", 128, "FP8-CS", 64, 1, 8192, 0, 4, 8, 2, 8, 1, 32, 661, 1667,
         "| LLAMA3.1_405B | 128 | FP8-CS (FP8-MX) | 64 | 1 | 8192 | 0 | 4 | 8 | 2 | 8 | 1 | 32 | 661 (624) | 1667 (1576) |"),
        ("LLAMA3_8B", "meta-llama/meta-llama-3-8b", "GB200", 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1, None, 1, 8, 31508, 1622,
         "| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 31508 (29789) | 1622 (1533) |"),
        ("DeepSeekV3", "deepseek-ai/deepseek-v3", "GB200", 256, "BF16", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 64, 3139, 782,
         "| DeepSeekV3 (w/o MTP) | 256 | BF16 | 4096 | 1 | 4096 | 0 | 1 | 4 | 1 | 4 | 64 | 64 | 3139 | 782 |"),
        ("GPT OSS 120B", "openai/gpt-oss-120b", "GB200", 64, "BF16", 1280, 1, 8192, 0, 1, 1, 1, None, 64, 20, 15876, 488,
         "| GPT OSS 120B | 64 | BF16 | 1280 | 1 | 8192 | 0 | 1 | 1 | 1 | 1 | 64 | 20 | 15876 | 488 |"),
        ("Qwen3_235B_a22B", "qwen/qwen3-235b-a22b-instruct-2507", "GB200", 256, "BF16", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 256, 4916, 728,
         "| Qwen3_235B_a22B | 256 | BF16 | 8192 | 1 | 4096 | 0 | 1 | 8 | 1 | 3 | 32 | 256 | 4916 | 728 |"),
        ("LLAMA3_70B", "meta-llama/meta-llama-3-70b", "GB200", 64, "FP8-CS", 256, 2, 8192, 64, 1, 1, 1, None, 1, 2, 4312, 1937,
         "| LLAMA3_70B | 64 | FP8-CS | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | 1 | 1 | 2 | 4312 | 1937 |"),
        ("LLAMA3.1_405B", "meta-llama/llama-3.1-405b", "GB200", 256, "FP8-CS", 1536, 1, 8192, 0, 4, 16, 1, 4, 1, 384, 813, 2053,
         "| LLAMA3.1_405B | 256 | FP8-CS | 1536 | 1 | 8192 | 0 | 4 | 16 | 1 | 4 | 1 | 384 | 813 | 2053 |"),
        ("DeepSeekV3", "deepseek-ai/deepseek-v3", "GB200", 256, "FP8-MX", 4096, 1, 4096, 0, 1, 8, 1, 4, 32, 128, 4018, 1003,
         "| DeepSeekV3 (w/o MTP) | 256 | FP8-MX | 4096 | 1 | 4096 | 0 | 1 | 8 | 1 | 4 | 32 | 128 | 4018 | 1003 |"),
        ("Qwen3_30B_a3B", "qwen/qwen3-30b-a3b", "GB200", 8, "FP8-MX", 512, 4, 4096, 0, 1, 1, 1, None, 8, 16, 23766, 547,
         "| Qwen3_30B_a3B | 8 | FP8-MX | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 16 | 23766 | 547 |"),
        ("GPT OSS 120B", "openai/gpt-oss-120b", "B200", 64, "BF16", 512, 4, 4096, 0, 1, 1, 1, None, 8, 2, 8213, 223,
         "| GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 2 | 8213 | 223 |"),
        ("Qwen3_30B_a3B", "qwen/qwen3-30b-a3b", "B200", 8, "FP8-MX", 512, 1, 4096, 0, 1, 1, 1, None, 8, 64, 9299, 214,
         "| Qwen3_30B_a3B | 8 | FP8-MX | 512 | 1 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 64 | 9299 | 214 |"),
        ("Qwen3_235B_a22B", "qwen/qwen3-235b-a22b-instruct-2507", "B200", 64, "FP8-MX", 1024, 1, 4096, 0, 1, 8, 1, 2, 8, 128, 3269, 484,
         "| Qwen3_235B_a22B | 64 | FP8-MX | 1024 | 1 | 4096 | 0 | 1 | 8 | 1 | 2 | 8 | 128 | 3269 | 484 |")]:
    assert _ga == _gbs // (_g // (_tp * _pp * _cp) * _mbs), _txt       # the table's GA is GBS / (DP x MBS)
    CASES_MORE.append((_m, _cat, _sys, _g, _prec, _gbs, _mbs, _seq, _fsdp, _tp, _pp, _cp, _vp, _ep, _tps, _tf,
                       f"{_MB_2511}, '#### System: DGX-{_sys}' row '{_txt}'", "2511"))

for (_m, _cat, _sys, _g, _prec, _gbs, _mbs, _seq, _fsdp, _tp, _pp, _cp, _vp, _ep, _tps, _tf, _src, _rel) in list(CASES_MORE):
    _hw = _sys.lower()
    _dp = _g // (_tp * _pp * _cp)
    _mx = _prec in ("MXFP8", "FP8-MX")
    _ep_dispatcher, _ep_overlap, _async_tp, _rnote = _RECIPE.get((_rel, _m, _hw, _prec), (None, None, False, ""))
    # the pipeline's sends: a recipe (_RECIPE) carries a CommOverlapConfig (each sets it or its fields), which sets
    # overlap_p2p_comm at VP > 1 (published.py's pp_p2p, cited there); rows without a recipe: not stated, blocking
    _p2p = "overlapped" if (_vp or 1) > 1 and (_rel, _m, _hw, _prec) in _RECIPE else None
    CASES_MORE.append(_row(
        id=f"megatron-bridge-{_rel}-{_m.lower().replace(' ', '-').replace('_', '-')}-{_g}x{_hw}-{_prec.lower()}",
        source=_src, model=_cat, hardware=_hw, devices=_g, tp=_tp, cp=_cp, pp=_pp, ep=_ep or 1, virtual_stages=_vp,
        pp_schedule="Interleaved1F1B" if _vp else ("1F1B" if _pp > 1 else None),
        dp_shard=_dp if _fsdp else 1, dp_replicate=1 if _fsdp else _dp, micro_batch=_mbs, local_batch=_gbs // _dp,
        global_batch=_gbs, seq_len=_seq, checkpointing=None, compile=None, float8=_prec != "BF16", async_tp=_async_tp,
        float8_recipe=None if _prec == "BF16" else "te-mxfp8" if _mx else "te-current-scaling",
        tokens_per_s_per_gpu=_tps, tflops_per_gpu=_tf, sharding=None if _fsdp else "distributed-optimizer",
        cp_ring="transformer-engine" if _cp > 1 else None, ep_dispatcher=_ep_dispatcher, ep_overlap=_ep_overlap,
        network_bandwidth=50e9 if _hw == "gb200" else None, pp_p2p=_p2p,
        notes=(_GB_NOTE if _hw == "gb200" else _B_NOTE) + _MB_BW + _rnote + (_MX if _mx else "") + f"DP {_dp}. "
              + ("Pipeline sends overlapped (the recipe's CommOverlapConfig at VP > 1; published.py's pp_p2p). "
                 if _p2p else "")
              + (_CP_TE if _cp > 1 else "") + (_DSV3 if "DeepSeek" in _m else "")
              + ("Qwen3-235B: the catalog's model is the Instruct-2507 checkpoint (same architecture as the "
                 "pre-trained one). " if "235" in _m else "")
              + ("GPT-OSS alternates sliding-window (128) and full attention: its windowed layers timed as windowed. "
                 if "OSS" in _m else "")))
CASES_MORE = [c for c in CASES_MORE if isinstance(c, dict)]
