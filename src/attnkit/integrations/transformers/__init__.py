"""``attn_implementation="attnkit"`` for Hugging Face transformers (5.x) models.

Importing this module registers :func:`attnkit_attention` in transformers'
``AttentionInterface`` and :func:`attnkit_mask` in its ``AttentionMaskInterface``,
both under the name ``"attnkit"``::

    import attnkit.integrations.transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnkit")
    model.set_attn_implementation("attnkit")                  # or switch a loaded model
    out = model(ids, output_attentions=True)                  # exact weights, no eager path

Causal, sliding-window, chunked, packed-sequence and padding masks reach attnkit as
symbolic masks (never a (B, 1, L, S) tensor); grouped-query K/V heads stay grouped;
Gemma 2's softcap, gpt-oss's sinks and T5's relative position bias become
:mod:`attnkit.mods` modifiers; ``generate()`` decodes against the KV cache with the
new queries at the last positions, and a compiled static-cache ``generate()`` keeps
one graph (the mask's positions travel as tensors). Each attention module makes one
:func:`attnkit.attention` call per forward, so :func:`attnkit.viz.capture` and
``attnkit show`` see every layer of any model that follows the interface.

What the installed transformers offers (its mask interface's arguments, which model
families call the attention interface) is learned once, here, from its public
names and signatures (:mod:`.features`; ``attnkit explain --transformers`` prints it).

Needs transformers 5.0.0 or newer (tested up to 5.24.0;
``pip install "transformers>=5"``); importing :mod:`attnkit` alone never
imports it.
"""

from __future__ import annotations

from .attention import attnkit_attention
from .features import FEATURES, TransformersFeatures, family_reason, report
from .masks import SymbolicMask, attnkit_mask

__all__ = [
    "FEATURES",
    "IMPLEMENTATION",
    "SymbolicMask",
    "TransformersFeatures",
    "attnkit_attention",
    "attnkit_mask",
    "family_reason",
    "register",
    "report",
]

IMPLEMENTATION = "attnkit"
"""The name to pass as ``attn_implementation``."""


def register() -> None:
    """Register ``"attnkit"`` with transformers (done on import; calling again is harmless).

    Raises:
        ImportError: transformers is not installed, or older than the oldest release the
            integration supports (the message names both).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, attnkit_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, attnkit_mask)


register()

from ..._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
