"""The measured profile's machine keys (``MemoryTerm.key``): what code selects a term by, never its label.

A term's ``label`` is a sentence for people and may change with the wording (a family's own table is
"RoPE tables", a LoRA layer's "decoder layers: saved for backward (LoRA)"); its ``key`` says which
tensor it is. Every producer of a term some other code looks for sets the key, and every selector asks
for the key (issue 24, item 1): a third-party family that returns the built-in's terms relabelled gets
the same bytes. Keys are stable: renaming one is a breaking change for plugins that select by it.
A term nobody selects has no key (``""``).
"""

from mlsysim_core import terms as _terms

# Weights.
ROPE_BUFFERS = "rope_buffers"                   # RoPE's inv_freq buffers (fp32), one set per rotary embedding
QUANTIZATION_STATE = "quantization_state"       # bitsandbytes' QuantState tensors (absmax, code tables): module attributes
ROPE_CACHE = "rope_cache"                       # torchtune's persistent RoPE cache and theta (rope.py): buffers
# Weights' terms that are module attributes, not parameters: a parameter offload (FSDP's CPUOffload moves the
# FlatParameters, DeepSpeed's offload_param the partitioned parameters) leaves them on the accelerator.
NOT_PARAMETERS = (QUANTIZATION_STATE, ROPE_CACHE)
# Activations outside the decoder layers (model.model_activation_terms, lora.model_activation_terms).
TOKEN_IDS = "token_ids"                         # the input token ids (int64), alive in every phase
EMBEDDING_OUTPUT = "embedding_output"           # the embedding's output, saved by the first layer's norm
STAGE_INPUT = "stage_input"                     # a later pipeline stage's received input, saved by its first norm
ROPE_TABLES = "rope_tables"                     # RoPE's cos/sin tables, computed once and saved by every layer
ROPE_FREQS_CIS = "rope_freqs_cis"               # a complex64 freqs_cis table in place of cos/sin (Llama 4, DeepSeek-V2)
# "The RoPE tables" whatever their form: what every selector of the tables asks for (rope_table_bytes).
ROPE_TABLE_KEYS = (ROPE_TABLES, ROPE_FREQS_CIS)
FINAL_NORM = "final_norm"                       # what the final norm saves (with its output: the LM head's input)
FINAL_NORM_OUTPUT = "final_norm_output"         # the final norm's output held apart until the loss (not saved by it)
LOGITS = "logits"                               # the logits at the loss (and their fp32 copy), every token's
CHUNK_LOGITS = "chunk_logits"                   # one chunk's logits (and its fp32 copy) at a chunked loss
LOG_SOFTMAX = "log_softmax"                     # the default cross-entropy's fp32 log-softmax, saved by nll_loss
SHIFTED_LABELS = "shifted_labels"               # the shifted labels (int64), saved by nll_loss
CE_BACKWARD = "ce_backward"                     # the default cross-entropy's fp32 backward temporaries
LM_HEAD_AUTOCAST_COPY = "lm_head_autocast_copy"  # autocast's 16-bit copy of the LM head's weight
TIED_EMBEDDING_GRAD = "tied_embedding_grad"     # a tied embedding's gradient partials and their sum (backward's end)
# The chunked loss (loss.py's chunked_terms): the three terms compile="blocks" replaces.
CHUNKS_LOG_SOFTMAX = "chunks_log_softmax"       # every chunk's fp32 log-softmax
CHUNKS_LOGITS = "chunks_logits"                 # every chunk's logits (and one chunk's fp32 copy)
CHUNKS_BACKWARD = "chunks_backward"             # the chunked loss's backward top: one chunk's temporaries or the LM head's
# The decoder layers (model.layer_terms, lora.layer_terms, compile.py's).
LAYERS_SAVED = "layers_saved"                   # what the kept (not checkpointed) layers save for the backward
CHECKPOINTED_INPUTS = "checkpointed_inputs"     # the checkpointed layers' inputs
RECOMPUTE_WORKING_SET = "recompute_working_set"  # one recomputed layer's working set at the backward's end


def rope_table_bytes(terms, tiers=(_terms.ACCELERATOR,)) -> float:
    """The RoPE tables' bytes among ``terms`` (cos/sin or a complex64 freqs_cis: ``ROPE_TABLE_KEYS``) in the
    given memory tiers (``MemoryTerm.tier``; by default the device's, not an offloaded host copy)."""
    return sum(t.nbytes for t in terms if t.key in ROPE_TABLE_KEYS and t.tier in tiers)
