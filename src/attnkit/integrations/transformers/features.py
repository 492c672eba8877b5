"""What the installed transformers offers attnkit, learned once when the integration loads.

The integration never reads a private name of transformers. It asks the public
surface instead, once, and keeps the answers in :data:`FEATURES`:

- the version (``transformers.__version__``);
- how the mask interface is called: transformers' own ``sdpa_mask`` (the function
  every registered mask function stands in for) takes ``q_length``/``q_offset`` in
  the releases that pass them, ``cache_position`` (the query positions as a tensor)
  in the older ones; its parameter names are read from its public signature.

Facts that only a release can tell (which model families call the attention
interface, from which version on) are kept in :data:`FAMILY_FIRST_VERSION`, checked
against the installed release by :func:`family_reason`; :func:`report` prints all of
it for ``attnkit explain --transformers``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "FAMILY_FIRST_VERSION",
    "FEATURES",
    "NEWEST_TESTED",
    "OLDEST_SUPPORTED",
    "TransformersFeatures",
    "family_reason",
    "learn",
    "report",
    "version_tuple",
]

OLDEST_SUPPORTED = "5.0.0"
"""The oldest transformers the integration supports (tested)."""

NEWEST_TESTED = "5.24.0"
"""The newest transformers the integration was tested with."""

FAMILY_FIRST_VERSION: dict[str, tuple[str, str]] = {
    "t5": ("T5", "5.15.0"),
}
"""model_type -> (name, first transformers release whose model calls the attention
interface). Before it the family computes its attention itself, so
``attn_implementation="attnkit"`` never reaches attnkit there."""

_NEVER = {
    "bloom": "BLOOM computes its attention (with ALiBi) itself in every release",
    "falcon": "Falcon computes its attention itself in every release (its own eager, "
    "sdpa and flash classes)",
    "mpt": "MPT computes its attention (with ALiBi) itself in every release",
}


def version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string ("5.15.0.dev0" -> (5, 15, 0))."""
    out: list[int] = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


@dataclass(frozen=True)
class TransformersFeatures:
    """The installed transformers, as the integration sees it.

    Attributes:
        version: ``transformers.__version__``.
        mask_positions: "offsets" when the mask interface is called with
            ``q_length``/``q_offset`` (ints, or a tensor for a static cache);
            "cache_position" when it gets the query positions as a (L,) tensor.
        sdpa_mask_parameters: the parameter names of ``masking_utils.sdpa_mask``, the
            dense evaluation the integration calls for patterns it does not recognise.
    """

    version: str
    mask_positions: Literal["offsets", "cache_position"]
    sdpa_mask_parameters: frozenset[str]

    @property
    def supported(self) -> bool:
        """True when the installed release is one the integration supports."""
        return version_tuple(self.version) >= version_tuple(OLDEST_SUPPORTED)


def learn() -> TransformersFeatures:
    """Ask the installed transformers (its public names and signatures) what it offers.

    Raises:
        ImportError: transformers is missing, or older than :data:`OLDEST_SUPPORTED`
            (the message names both versions).
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "attnkit.integrations.transformers needs transformers >= "
            f"{OLDEST_SUPPORTED}, which is not installed: pip install 'attnkit[transformers]'"
        ) from exc

    version = str(transformers.__version__)
    try:
        from transformers import masking_utils
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
    except ImportError as exc:
        raise ImportError(_too_old(version)) from exc
    params = frozenset(inspect.signature(masking_utils.sdpa_mask).parameters)
    if "allow_torch_fix" in params and not _reads(masking_utils.sdpa_mask, "allow_torch_fix"):
        params -= {"allow_torch_fix"}  # deprecated (5.17): passing it only warns
    if "q_length" in params:
        positions: Literal["offsets", "cache_position"] = "offsets"
    elif "cache_position" in params:
        positions = "cache_position"
    else:
        raise ImportError(
            f"attnkit.integrations.transformers: transformers {version}'s mask functions take "
            "neither q_length nor cache_position; attnkit supports transformers "
            f"{OLDEST_SUPPORTED} to {NEWEST_TESTED}"
        )
    features = TransformersFeatures(version, positions, params)
    if not features.supported:
        raise ImportError(_too_old(version))
    return features


def _reads(function: Any, name: str) -> bool:
    """Whether ``function``'s body reads the parameter ``name`` (a deprecated parameter
    stays in the signature and is read by no code); True when the source is not there."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(function))))
    except (OSError, TypeError, SyntaxError):
        return True
    body = tree.body[0].body if tree.body and hasattr(tree.body[0], "body") else []
    return any(
        isinstance(node, ast.Name) and node.id == name
        for statement in body
        for node in ast.walk(statement)
    )


def _too_old(version: str) -> str:
    return (
        f"attnkit.integrations.transformers needs transformers >= {OLDEST_SUPPORTED} (its "
        f"AttentionInterface and AttentionMaskInterface), found {version}: "
        f'pip install "transformers>={OLDEST_SUPPORTED}"'
    )


def family_reason(model_type: str, version: str | None = None) -> str | None:
    """Why a model family's attention does not reach attnkit in a transformers release
    (default: the installed one), naming the first release where it does; None when it
    does, and for a family attnkit has no record of (one whose attention goes through
    transformers' attention interface, as the families of transformers 5 do; a family
    that computes its attention itself gives no error, and its attention no record).

    Args:
        model_type: the config's ``model_type`` ("t5", "llama", ...).
        version: a transformers version string.
    """
    version = FEATURES.version if version is None else version
    if model_type in _NEVER:
        return _NEVER[model_type] + ': attn_implementation="attnkit" does not reach attnkit'
    known = FAMILY_FIRST_VERSION.get(model_type)
    if known is None or version_tuple(version) >= version_tuple(known[1]):
        return None
    name, first = known
    return (
        f"{name} computes its attention itself in transformers {version}: "
        f'attn_implementation="attnkit" does not reach attnkit there; {name} calls the '
        f"attention interface from transformers {first} on"
    )


def report() -> str:
    """What the integration learned about the installed transformers, as lines of text."""
    f = FEATURES
    lines = [
        f"transformers {f.version} (attnkit's integration supports {OLDEST_SUPPORTED} to "
        f"{NEWEST_TESTED}, tested at both ends)",
        "mask interface called with "
        + (
            "q_length and q_offset (an int, or a tensor for a static cache)"
            if f.mask_positions == "offsets"
            else "cache_position (the query positions as a tensor)"
        ),
        "recognised without evaluation: transformers' causal_mask_function and "
        "bidirectional_mask_function; any other mask function is evaluated once per forward "
        "and read back as causal, sliding-window, chunked, packed-sequence or block masks "
        "when it equals one exactly, else kept as the dense mask it is",
        "compiled generate with a static cache: each step's mask keeps one structure, its "
        "positions as tensors (as many graphs as sdpa)",
    ]
    for model_type in sorted({*FAMILY_FIRST_VERSION, *_NEVER}):
        reason = family_reason(model_type, f.version)
        if reason is not None:
            lines.append(reason)
        else:
            name, first = FAMILY_FIRST_VERSION[model_type]
            lines.append(
                f"{name} reaches attnkit (it calls the attention interface from {first} on)"
            )
    lines.append(
        "attention weights: returned when output_attentions reaches the attention function; "
        "GPT-2 never passes it on (its attention module keeps it before 5.3.0, its model drops "
        "it from 5.3.0 on): no weights there, as with sdpa; attnkit.viz.capture and attnkit "
        "show still see every layer"
    )
    return "\n".join(lines)


FEATURES: TransformersFeatures = learn()
"""The record, learned when the integration is imported."""
