"""The attribution records: what :func:`attnkit.viz.explain` and
:func:`attnkit.viz.explain_generation` return, read by the page, the export and the
options. Records only: nothing here runs a model, so every reader imports them without
the attribution code (which loads models)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Attribution", "GenerationAttribution", "Target"]


@dataclass(frozen=True)
class Target:
    """What an :class:`Attribution` explains.

    Attributes:
        kind: ``"next_token"`` (a causal LM's logit of ``index`` predicted at ``position``),
            ``"class"`` (a classifier's logit of class ``index``) or ``"similarity"``
            (the cosine similarity of the mean-pooled embeddings of the text and ``label``).
        position: the position whose output is explained: the LM's predicting position;
            a classifier's pooled token (0 for an encoder, the last for a decoder);
            None for a similarity or an image classifier that means every token (every
            position, through the mean).
        index: the token id or class index; None for a similarity.
        label: the token's text, the class's name, or the second text.
    """

    kind: str
    position: int | None
    index: int | None
    label: str

    def __str__(self) -> str:
        if self.kind == "next_token":
            return (
                f"logit of next token {self.label!r} (id {self.index}) at position {self.position}"
            )
        if self.kind == "class":
            return f"logit of class {self.index} ({self.label})"
        return f"cosine similarity of the mean-pooled embeddings with {self.label!r}"


@dataclass(frozen=True)
class Attribution:
    """The result of :func:`explain`.

    Attributes:
        tokens: the input's tokens as written (special tokens included).
        scores: (n_tokens,) relevance of each input token, in the model's dtype (for
            ``"rollout"``, the weights' dtype: float32 for a half-precision model, whose
            attention weights attnkit gives in float32).
        method: the method that made ``scores``.
        target: what is explained (:class:`Target`).
        target_value: y, the explained scalar at the input.
        head_importance: (layers, heads) Michel et al.'s ``|Σ o ⊙ ∂y/∂o|``, layers in
            forward order; None for ``"rollout"``.
        relevance: (n_tokens, n_tokens) the whole matrix whose target row gives
            ``scores`` (for an image classifier whose head reads several tokens, the mix
            of their rows: :func:`~attnkit.viz.attribution_image.pooled_rows`): Chefer's
            ``R`` (attention × gradient) or the rollout; else None.
        baseline_value: y at zero embeddings (integrated gradients), else None.
    """

    tokens: list[str]
    scores: torch.Tensor
    method: str
    target: Target
    target_value: float
    head_importance: torch.Tensor | None = None
    relevance: torch.Tensor | None = None
    baseline_value: float | None = None


@dataclass(frozen=True)
class GenerationAttribution:
    """The result of :func:`explain_generation`.

    Attributes:
        tokens: every token, prompt and generated, as written (n = L + N).
        prompt_length: L, the prompt's tokens.
        method: the method of every row.
        scores: (N, n - 1) row t: the relevance of each source to generated token L + t
            (NaN for the sources from L + t on, which came later).
        target_ids: (N,) the generated tokens' ids.
        target_values: (N,) each target logit at its input.
        head_importance: (N, layers, heads) each step's head importance; None for rollout.
    """

    tokens: list[str]
    prompt_length: int
    method: str
    scores: torch.Tensor
    target_ids: list[int]
    target_values: torch.Tensor
    head_importance: torch.Tensor | None = None
