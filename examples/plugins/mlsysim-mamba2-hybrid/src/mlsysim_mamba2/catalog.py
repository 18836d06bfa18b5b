"""The models this package adds to mlsysim-core's catalog: Bamba-9B and the two shapes PyTorch measured.

Each ``value`` is a ``BambaWorkload`` (``architecture="bamba"``), with ``parameters`` computed
exactly from its shapes (``BambaWorkload.count_parameters()``, checked against
``num_parameters()`` of the measured shapes in ``validation/mamba2/measurements.json``).
"""

from __future__ import annotations

from .workload import BambaWorkload

FMS_FSDP = ("https://github.com/foundation-model-stack/fms-fsdp/blob/main/fms_fsdp/utils/config_utils.py "
            "(model_variant 'mamba_9.8b', the training config of Bamba-9B: d_model, d_intermediate, n_layer, "
            "vocab_size, attn_layer_idx, attn_cfg num_heads / num_heads_kv / head_dim / rotary_emb_dim, "
            "tie_embeddings)")
HF_CONVERT = ("https://github.com/huggingface/transformers/blob/main/src/transformers/models/bamba/"
              "convert_mamba_ssm_checkpoint.py (the conversion that wrote Bamba's config.json: mamba_d_head 64, "
              "mamba_d_state 128, mamba_n_groups 1; mamba_n_heads = hidden x mamba_expand / mamba_d_head)")
BAMBA_CONFIG = ("https://github.com/huggingface/transformers/blob/main/src/transformers/models/bamba/"
                "configuration_bamba.py (BambaConfig defaults the conversion keeps: mamba_d_conv 4, mamba_expand 2, "
                "mamba_chunk_size 256, mamba_conv_bias true, mamba_proj_bias false; partial_rotary_factor 0.5)")
MODEL_CARD = ("https://huggingface.co/ibm-fms/Bamba-9B (model card: 9.78B parameters, 32 layers, hidden 4096, "
              "32 attention heads, 8 KV heads, context length 4096, untied embeddings)")
BAMBA_README = ("https://github.com/foundation-model-stack/bamba/blob/main/README.md (fp32 checkpoint 39.12 GB: "
                "9,780,235,392 x 4 B = 39.12 GB, which the vocabulary 128,256 gives and 128,000 would not)")

BAMBA_9B = BambaWorkload(
    name="ibm-fms/Bamba-9B", parameters=9_780_235_392, layers=32, hidden_dim=4096, heads=32, kv_heads=8,
    vocab_size=128_256, ffn_dim=14_336, tied_embeddings=False, context_length=4096, attention_layers=(9, 18, 27),
    mamba_n_heads=128, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False)

# The two shapes of validation/mamba2/measure_mamba2.py (random weights, never published).
BAMBA_TINY = BambaWorkload(
    name="bamba-tiny", parameters=4_526_216, layers=4, hidden_dim=256, heads=8, kv_heads=2, vocab_size=2048,
    ffn_dim=640, tied_embeddings=False, context_length=4096, attention_layers=(2,), mamba_n_heads=8,
    mamba_d_head=64, mamba_d_state=48, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=32)
BAMBA_G1 = BambaWorkload(
    name="bamba-g1", parameters=4_407_648, layers=4, hidden_dim=256, heads=4, kv_heads=4, vocab_size=2048,
    ffn_dim=640, tied_embeddings=False, context_length=4096, attention_layers=(1, 3), mamba_n_heads=16,
    mamba_d_head=32, mamba_d_state=64, mamba_n_groups=1, mamba_d_conv=3, mamba_chunk_size=16)

VALIDATION = ("validation/mamba2/measure_mamba2.py of mlsysim-core (the configuration it measures; "
              "parameters: num_parameters() recorded in validation/mamba2/measurements.json)")

# (key, aliases, workload, sources, notes)
MODELS = (
    ("ibm-fms/bamba-9b", ("bamba-9b", "bamba-9.8b"), BAMBA_9B, {
        "layers, hidden_dim, ffn_dim, vocab_size, tied_embeddings, attention_layers, heads, kv_heads": FMS_FSDP,
        "mamba_d_head, mamba_d_state, mamba_n_groups, mamba_n_heads": HF_CONVERT,
        "mamba_d_conv, mamba_expand, mamba_chunk_size, mamba_conv_bias, mamba_proj_bias": BAMBA_CONFIG,
        "context_length": MODEL_CARD,
        "parameters": "computed from the shapes (BambaWorkload.count_parameters()); " + BAMBA_README,
    }, "The config.json of ibm-fms/Bamba-9B itself was not read (no network here): its fields are those of the "
       "training config it was converted from, the conversion script and BambaConfig's defaults (sources). "
       "Unverified against that file: mamba_chunk_size (256, BambaConfig's default, which the conversion does "
       "not set) and context_length (4096, the model card's context length; max_position_embeddings in the "
       "converted config.json is BambaConfig's default 262,144 unless the uploaded file sets it). The parameter "
       "count follows from the shapes and agrees with the model card's 9.78B and the 39.12 GB fp32 checkpoint."),
    ("mlsysim-mamba2/bamba-tiny", ("bamba-tiny",), BAMBA_TINY, {
        "layers, hidden_dim, heads, kv_heads, vocab_size, ffn_dim, tied_embeddings, attention_layers, mamba_n_heads, "
        "mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, context_length, parameters":
            VALIDATION,
    }, "A validation shape: 4 layers M M A M, 2 groups, chunk 32 (validation/mamba2/README.md)."),
    ("mlsysim-mamba2/bamba-g1", ("bamba-g1",), BAMBA_G1, {
        "layers, hidden_dim, heads, kv_heads, vocab_size, ffn_dim, tied_embeddings, attention_layers, mamba_n_heads, "
        "mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, context_length, parameters":
            VALIDATION,
    }, "A validation shape: 4 layers M A M A, 1 group, conv 3, chunk 16 (validation/mamba2/README.md)."),
)


def entries():
    """The ``CatalogEntry``s (built on demand: the catalog module loads when the catalog is asked)."""
    from mlsysim_core.catalog import CatalogEntry
    return [CatalogEntry(key=key, aliases=aliases, value=value, sources=dict(sources),
                         extra={"notes": notes})
            for key, aliases, value, sources, notes in MODELS]
