"""``BambaWorkload``: a Mamba-2 + attention hybrid (transformers' ``bamba``) as an mlsysim-core workload.

A ``TransformerWorkload`` (so every profile can read it: the reference profile sees ``parameters``,
``layers``, ``hidden_dim`` and ``heads``) with the fields of a ``BambaConfig`` that the Mamba-2
layers need: which layers are attention (``attention_layers``, the config's ``attn_layer_indices``;
the others are Mamba-2 mixer layers) and the mixer's sizes. ``architecture`` is ``"bamba"``: the
measured profile costs it with this package's ``ArchitectureFamily`` (``family.py``).
"""

from __future__ import annotations

from typing import Mapping

import attrs

from mlsysim_core import InvalidInputError, InvalidInputTypeError, TransformerWorkload

from . import layer_bytes

MAMBA, ATTENTION = layer_bytes.MAMBA, layer_bytes.ATTENTION
ROTARY_FRACTION = 0.5      # BambaConfig hard-codes partial_rotary_factor = 0.5: RoPE rotates half of each head


def _positive(instance, attribute, value):
    parameter = f"{type(instance).__name__}.{attribute.name}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputTypeError(parameter, value, "a whole number >= 1", f"got {type(value).__name__}")
    if value < 1:
        raise InvalidInputError(parameter, value, "a whole number >= 1")


def _flag(instance, attribute, value):
    if not isinstance(value, bool):
        raise InvalidInputTypeError(f"{type(instance).__name__}.{attribute.name}", value, "True or False",
                                    f"got {type(value).__name__}")


def _indices(value) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidInputTypeError("BambaWorkload.attention_layers", value,
                                    "a sequence of layer indices (the config's attn_layer_indices)",
                                    f"got {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidInputTypeError("BambaWorkload.attention_layers", list(value),
                                        "whole-number layer indices", f"got {type(v).__name__} {v!r}")
        out.append(v)
    return tuple(out)


def _size(**kw):
    return attrs.field(validator=_positive, **kw)


@attrs.frozen(kw_only=True)
class BambaWorkload(TransformerWorkload):
    """A Bamba model: ``layers`` decoder layers, each an input RMSNorm, then a Mamba-2 mixer or
    (the indices in ``attention_layers``) grouped-query attention, then a SwiGLU MLP of ``ffn_dim``.

    Mixer fields (``BambaConfig``'s names without the ``mamba_`` prefix where it is unambiguous):
    ``mamba_n_heads`` x ``mamba_d_head`` = d_inner = ``mamba_expand`` x ``hidden_dim``;
    ``mamba_d_state`` (n), ``mamba_n_groups`` (g, dividing the heads), ``mamba_d_conv`` (the causal
    conv's kernel), ``mamba_chunk_size`` (the chunked scan's chunk), ``mamba_conv_bias``,
    ``mamba_proj_bias``. ``hidden_dim``, ``heads``, ``vocab_size`` and ``ffn_dim`` are required
    (the shapes are the model). ``parameters`` is the total; ``count_parameters()`` gives the exact
    count the shapes imply (``from_hf_config`` fills it in).
    """

    attention_layers: tuple[int, ...] = attrs.field(default=(), converter=_indices)
    mamba_n_heads: int = _size()
    mamba_d_head: int = _size()
    mamba_d_state: int = _size()
    mamba_n_groups: int = _size(default=1)
    mamba_d_conv: int = _size(default=4)
    mamba_expand: int = _size(default=2)
    mamba_chunk_size: int = _size(default=256)
    mamba_conv_bias: bool = attrs.field(default=True, validator=_flag)
    mamba_proj_bias: bool = attrs.field(default=False, validator=_flag)
    architecture: str | None = "bamba"
    gated_mlp: bool | None = True
    tied_embeddings: bool | None = False

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        cls = type(self).__name__
        for name in ("hidden_dim", "heads", "vocab_size", "ffn_dim"):
            if getattr(self, name) is None:
                raise InvalidInputError(f"{cls}.{name}", None, "a value: a Bamba model is its shapes",
                                        "every field of the config's sizes is needed to cost its layers")
        if self.gated_mlp is False:
            raise InvalidInputError(f"{cls}.gated_mlp", False, "True (every Bamba layer has a SwiGLU MLP)")
        bad = sorted(i for i in self.attention_layers if not 0 <= i < self.layers)
        if bad or len(set(self.attention_layers)) != len(self.attention_layers):
            raise InvalidInputError(f"{cls}.attention_layers", list(self.attention_layers),
                                    f"distinct indices in [0, {self.layers}) (layers={self.layers})",
                                    f"out of range: {bad}" if bad else "an index is listed twice")
        d_inner = self.mamba_expand * self.hidden_dim
        if self.mamba_n_heads * self.mamba_d_head != d_inner:
            raise InvalidInputError(f"{cls}.mamba_d_head", self.mamba_d_head,
                                    f"mamba_expand x hidden_dim / mamba_n_heads = {d_inner} / {self.mamba_n_heads}",
                                    "the mixer's heads tile its inner width d_inner = mamba_expand x hidden_dim")
        if self.mamba_n_heads % self.mamba_n_groups:
            raise InvalidInputError(f"{cls}.mamba_n_groups", self.mamba_n_groups,
                                    f"a divisor of mamba_n_heads={self.mamba_n_heads}",
                                    "each group's B and C are shared by the same number of heads")

    # --- what the family reads -------------------------------------------------------------

    @property
    def layer_types(self) -> tuple[str, ...]:
        """``"mamba"`` or ``"attention"``, one per decoder layer, in order."""
        attention = set(self.attention_layers)
        return tuple(ATTENTION if i in attention else MAMBA for i in range(self.layers))

    @property
    def mamba_layers(self) -> int:
        return self.layers - len(self.attention_layers)

    @property
    def d_inner(self) -> int:
        return self.mamba_n_heads * self.mamba_d_head

    def shape(self) -> layer_bytes.BambaShape:
        """The shape numbers ``layer_bytes``' formulas take."""
        head_dim = self.head_dim or self.hidden_dim // self.heads
        return layer_bytes.BambaShape(
            vocab=self.vocab_size, hidden=self.hidden_dim, ffn=self.ffn_dim, layer_types=self.layer_types,
            heads=self.heads, kv_heads=self.kv_heads or self.heads, head_dim=head_dim,
            rotary_dim=int(head_dim * ROTARY_FRACTION), d_inner=self.d_inner, n_heads=self.mamba_n_heads,
            mamba_head_dim=self.mamba_d_head, d_state=self.mamba_d_state, n_groups=self.mamba_n_groups,
            conv_kernel=self.mamba_d_conv, chunk_size=self.mamba_chunk_size, proj_bias=self.mamba_proj_bias,
            conv_bias=self.mamba_conv_bias, tied=bool(self.tied_embeddings))

    def count_parameters(self) -> int:
        """Every parameter of ``BambaForCausalLM`` with these shapes (``layer_bytes.bamba_parameters``)."""
        return layer_bytes.bamba_parameters(self.shape())

    @classmethod
    def from_hf_config(cls, config: Mapping, *, name: str | None = None) -> "BambaWorkload":
        """A workload from a Bamba ``config.json`` (a dict), with the exact parameter count.
        Keys it omits take ``BambaConfig``'s defaults (transformers 5.23), as ``layer_bytes.bamba_shape``
        reads them; ``context_length`` is ``max_position_embeddings`` when given."""
        s = layer_bytes.bamba_shape(dict(config))
        expand = s.d_inner // s.hidden
        return cls(
            name=name or config.get("_name_or_path") or "bamba", parameters=layer_bytes.bamba_parameters(s),
            layers=s.layers, hidden_dim=s.hidden, heads=s.heads, kv_heads=s.kv_heads,
            head_dim=s.head_dim if s.head_dim * s.heads != s.hidden else None, vocab_size=s.vocab, ffn_dim=s.ffn,
            tied_embeddings=s.tied, context_length=config.get("max_position_embeddings"),
            attention_layers=tuple(i for i, t in enumerate(s.layer_types) if t == ATTENTION),
            mamba_n_heads=s.n_heads, mamba_d_head=s.mamba_head_dim, mamba_d_state=s.d_state,
            mamba_n_groups=s.n_groups, mamba_d_conv=s.conv_kernel, mamba_expand=expand,
            mamba_chunk_size=s.chunk_size, mamba_conv_bias=s.conv_bias, mamba_proj_bias=s.proj_bias)
