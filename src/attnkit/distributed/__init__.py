"""Context-parallel attention over ``torch.distributed``: one sequence, many ranks.

>>> # torchrun --nproc-per-node 4 train.py
>>> import torch.distributed as dist
>>> from attnkit import distributed as cp, masks
>>> dist.init_process_group("gloo")                     # doctest: +SKIP
>>> q_local = cp.shard(q, group=None, layout="zigzag")  # doctest: +SKIP
>>> out_local = cp.context_parallel_attention(          # doctest: +SKIP
...     q_local, k_local, v_local, mask=masks.causal())

- :func:`context_parallel_attention`: exact attention for every score and mask, by
  a ring of K/V shards (:mod:`.ring`) or by an all-to-all head exchange
  (:mod:`.all_to_all`); :func:`explain_context_parallel` says which and why.
- :func:`shard` / :func:`unshard` / :func:`assemble`: cut and rebuild sequences for
  a layout (``"zigzag"`` or ``"contiguous"``, :mod:`.layout`).
- :class:`ContextParallel`: runs an :mod:`attnkit.nn` attention layer on sequence
  shards; :func:`all_reduce_grads` sums parameter gradients across the ranks.
"""

from .api import (
    ContextParallelExplanation,
    all_reduce_grads,
    context_parallel_attention,
    explain_context_parallel,
)
from .errors import ContextParallelError
from .layers import ContextParallel
from .layout import Layout as Layout  # (the type of layout=, as distributed.Layout)
from .layout import assemble, rank_segments, segments, shard, shard_lengths, unshard

__all__ = [
    "ContextParallel",
    "ContextParallelError",
    "ContextParallelExplanation",
    "all_reduce_grads",
    "assemble",
    "context_parallel_attention",
    "explain_context_parallel",
    "rank_segments",
    "segments",
    "shard",
    "shard_lengths",
    "unshard",
]

from .._namespace import public_dir as _public_dir

__dir__ = _public_dir(__all__)
