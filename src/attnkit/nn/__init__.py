"""Attention layers built on :func:`attnkit.attention`.

- :class:`MultiheadAttention`: a drop-in for ``torch.nn.MultiheadAttention``.
- :class:`EinsumMultiHeadAttention`: Keras ``MultiHeadAttention`` semantics
  (any number of batch dims, chosen attention axes).
- :class:`MultiHeadAttention` (capital H, Keras's spelling): the same layer with
  Keras's arguments, its feature sizes inferred from the first call.
- :class:`SelfAttention`: the classic self-attention block (fused or separate
  QKV, attention dropout, output projection), and a decoder block with
  ``causal=True``, grouped-query ``num_kv_heads`` and a static
  :class:`KVCache` for incremental decoding.
- :class:`AdditiveAttention`, :class:`DotProductAttention`: d2l's layers.
- :class:`NadarayaWatson`: kernel regression as attention.

Every layer computes its attention through :func:`attnkit.attention`; none
writes its own softmax or masking. :class:`InputShapeError` (a ``ValueError``
and an ``AssertionError``) reports inputs of the wrong shape.
"""

from ._common import InputShapeError, attention_override
from .classic import AdditiveAttention, DotProductAttention, KernelScore, NadarayaWatson
from .einsum import EinsumMultiHeadAttention
from .keras_mha import MultiHeadAttention
from .kv_cache import KVCache
from .multihead import MultiheadAttention
from .self_attention import SelfAttention

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "EinsumMultiHeadAttention",
    "InputShapeError",
    "KVCache",
    "KernelScore",
    "MultiHeadAttention",
    "MultiheadAttention",
    "NadarayaWatson",
    "SelfAttention",
    "attention_override",
]

from .._namespace import public_dir as _public_dir

__dir__ = _public_dir(__all__)
