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
new queries at the last positions. Each attention module makes one
:func:`attnkit.attention` call per forward, so :func:`attnkit.viz.capture` and
``attnkit show`` see every layer of any model that follows the interface.

Needs transformers (attnkit's ``transformers`` extra: ``pip install "transformers>=5"``); importing
:mod:`attnkit` alone never imports it.
"""

from __future__ import annotations

from .attention import attnkit_attention
from .masks import SymbolicMask, attnkit_mask

__all__ = ["IMPLEMENTATION", "SymbolicMask", "attnkit_attention", "attnkit_mask", "register"]

IMPLEMENTATION = "attnkit"
"""The name to pass as ``attn_implementation``."""


def register() -> None:
    """Register ``"attnkit"`` with transformers (done on import; calling again is harmless).

    Raises:
        ImportError: transformers is not installed, or too old to have the interfaces.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(
            "attnkit.integrations.transformers needs transformers >= 5 with "
            'AttentionInterface and AttentionMaskInterface: pip install "transformers>=5"'
        ) from exc
    AttentionInterface.register(IMPLEMENTATION, attnkit_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, attnkit_mask)


register()
