"""Score functions: how a query and a key become a logit.

Every score is an ``nn.Module`` (parameter-free ones have no parameters) with

- ``logits(q, k)``: the materialized score, q (..., L, Eq), k (..., S, Ek) -> (..., L, S);
- ``dot_form(q, k)``: for scores that reduce *exactly* to a dot product (class
  attribute ``dot_reducible``), the ``(q', k', key_bias)`` with
  ``logits(q, k) == q' @ k'^T + key_bias + row_constant(q, k)``, where ``key_bias``
  is ``None`` or (..., 1, S) and ``row_constant`` is a per-query term (..., L) that
  softmax ignores and that backends add back to lse so it stays exact.

The ``scale`` of :func:`attnkit.attention` multiplies every logit; when it is
``None`` each score uses its own default (``1/sqrt(E)`` for ``ScaledDot``, 1 for
the others).
"""

from __future__ import annotations

import copy
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ._args import MAX_POSITION, as_bool, as_factory_device, as_factory_dtype
from ._host import readable

__all__ = [
    "Additive",
    "Bilinear",
    "Dot",
    "FeatureTerms",
    "Gaussian",
    "ScaledDot",
    "Score",
    "ScoreName",
    "resolve_score",
]


@dataclass(frozen=True)
class FeatureTerms:
    """A score's logit written as a sum over features, one term per feature: what the
    viewer's neuron view draws (:meth:`Score.feature_terms`).

    Attributes:
        kind: how feature d's term is formed from ``query[..., i, d]`` and
            ``key[..., j, d]``: ``"dot"``: ``q'_d · k'_d``; ``"gaussian"``:
            ``-(q'_d - k'_d)² · inv_two_var``; ``"additive"``:
            ``tanh(q'_d + k'_d) · weights[d]``. The logit is the sum over d, times the
            call's scale.
        query: (..., L, D) the query side q'.
        key: (..., S, D) the key side k'.
        weights: (D,) the Additive score's ``w_v``; None otherwise.
        inv_two_var: the Gaussian's ``1/2σ²``; None otherwise.
    """

    kind: str
    query: torch.Tensor
    key: torch.Tensor
    weights: torch.Tensor | None = None
    inv_two_var: float | None = None


class Score(nn.Module):
    """Base class of score functions: how a query and a key become a logit.

    A subclass sets ``name`` (what :func:`attnkit.explain` and the messages call it)
    and implements :meth:`logits`; one that reduces exactly to a dot product sets
    ``dot_reducible = True`` and implements :meth:`dot_form` (and :meth:`row_constant`
    when its dot form drops a per-query term), which lets the fused dot-product
    backends (``sdpa``) run it. Every backend can run a score that is not dot-reducible
    except ``sdpa``; :func:`attnkit.explain` says which backend takes a call.

    Attributes:
        name: the score's name (``"dot"``, ``"scaled_dot"``, ``"bilinear"``, ...).
        dot_reducible: True when :meth:`dot_form` gives the logits exactly as a dot
            product plus a per-key bias (and a per-query constant softmax ignores).
    """

    name: str = "score"
    dot_reducible: bool = False

    def __init__(self) -> None:
        """A score with no parameters of its own (subclasses add theirs)."""
        super().__init__()

    def query_dim(self) -> int | None:
        """Feature size the query must have, or None if it must equal the key's."""
        return None

    def key_dim(self) -> int | None:
        """Feature size the key must have, or None if it must equal the query's."""
        return None

    def default_scale(self, E: int) -> float:
        """The logits' multiplier when ``attention(scale=None)``: 1 unless overridden."""
        return 1.0

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`logits`, so ``torch.func.functional_call`` can run a score."""
        return self.logits(q, k)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Materialized scores: q (..., L, Eq), k (..., S, Ek) -> (..., L, S), unscaled."""
        raise NotImplementedError

    def dot_form(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(q', k', key_bias)`` with ``logits == q' k'^T + key_bias + row_constant``."""
        raise NotImplementedError(f"score {self.name!r} does not reduce to a dot product")

    def row_constant(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
        """Per-query term (..., L) that ``dot_form`` drops; None when there is none."""
        return None

    def feature_terms(self, q: torch.Tensor, k: torch.Tensor) -> FeatureTerms:
        """The logit as a sum over features (see :class:`FeatureTerms`), for the
        viewer's neuron view. q (..., L, Eq), k (..., S, Ek). The default: a score whose
        dot form has no key bias is the dot product of its sides (q' · k', e.g. Bilinear's
        qW and k); any other score is read as q · k unless it overrides this."""
        if self.dot_reducible:
            qd, kd, key_bias = self.dot_form(q, k)
            if key_bias is None:
                return FeatureTerms("dot", qd, kd)
        return FeatureTerms("dot", q, k)

    def cast(self, dtype: torch.dtype) -> Score:
        """This score with its parameters in ``dtype`` for one call, differentiably
        (gradients flow back to the original parameters in their own dtype), as a
        shallow copy: the module itself, which other threads may be using, is never
        modified. Buffers keep their dtype (a fixed Gaussian bandwidth stays float64; the
        score casts it where it is used).

        Args:
            dtype: the parameters' dtype, e.g. float32 for half-precision inputs that a
                backend computes in float32.

        Returns:
            ``self`` when every parameter already has ``dtype``, else the shallow copy.

        Examples:
            >>> import torch, attnkit
            >>> score = attnkit.scores.Bilinear(4, 4)
            >>> score.cast(torch.float64).weight.dtype, score.weight.dtype
            (torch.float64, torch.float32)
        """
        if all(p.dtype == dtype for p in self.parameters()):
            return self
        return _cast_module(self, dtype)  # type: ignore[return-value]

    def check_parameters(self, dtype: torch.dtype | None = None) -> None:
        """Raise ValueError, naming the parameter and its value, when a parameter holds a
        value at which the score is undefined (training or ``load_state_dict`` can set
        one that the constructor refuses), or, given the call's input ``dtype``, one
        whose logits overflow it. Read only where it is free: on the CPU, outside
        ``torch.compile``. The default checks nothing; :func:`attnkit.attention` calls it
        for every score object before any compute."""

    def extra_repr(self) -> str:
        return ""


BANDWIDTH_HEADROOM = 2.0**10
"""How far below the dtype's largest value ``1/σ²`` must stay: the Gaussian's dot form
doubles it, and its gradients multiply it by distances and counts (at a σ of 6e-20 in
float32, where 1/σ² itself fits, a key's gradient was inf)."""


def check_bandwidth(sigma: torch.Tensor, owner: str, dtype: torch.dtype | None = None) -> None:
    """Raise ValueError naming ``owner`` when the 0-d bandwidth ``sigma`` is 0 or not
    finite, or (given the call's ``dtype``) so small that ``1/σ²`` comes within
    :data:`BANDWIDTH_HEADROOM` of the largest value of the dtype the logits are computed
    in (float32 for half inputs), where it is readable for
    free (:func:`attnkit._host.readable`): a learnable σ can reach a value its
    constructor refuses (an optimizer step, ``load_state_dict``). A negative σ is a
    bandwidth of |σ| (the kernels read σ²)."""
    if not readable(sigma):
        return
    value = float(sigma.detach())
    if value == 0 or not math.isfinite(value):
        raise ValueError(
            f"{owner} sigma must be a nonzero finite bandwidth, got {value} (as an optimizer "
            "step or load_state_dict left it); the kernel is undefined there: set it anew "
            "(sigma.data.fill_(1.0)) or train with a smaller step"
        )
    if dtype is None:
        return
    computed = torch.promote_types(dtype, torch.float32)
    smallest = math.sqrt(BANDWIDTH_HEADROOM / torch.finfo(computed).max)
    if abs(value) < smallest:
        raise ValueError(
            f"{owner} sigma {value:g} is too small for {computed} logits: 1/σ² and the "
            f"terms its gradients form overflow it below about {smallest:.1g}; scale "
            "the inputs and sigma up together (the weights do not change), or run in "
            "float64"
        )


def _cast_module(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    clone = copy.copy(module)  # a new object sharing the tensors; the dicts are replaced below
    params = {n: (None if p is None else p.to(dtype)) for n, p in module._parameters.items()}
    clone.__dict__["_parameters"] = params
    clone.__dict__["_modules"] = {
        n: (None if m is None else _cast_module(m, dtype)) for n, m in module._modules.items()
    }
    return clone


class Dot(Score):
    """Dot product: ``q · k``.

    ``logits[..., i, j] = q[..., i, :] · k[..., j, :]``, multiplied by
    ``attention(scale=...)``, 1 by default (no ``1/sqrt(E)``). Parameter-free, the
    object behind ``score="dot"``. Query and key need the same feature size E; every
    backend runs it.

    Examples:
        >>> import torch, attnkit
        >>> q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 3)
        >>> attnkit.attention(q, k, v, score=attnkit.scores.Dot()).shape
        torch.Size([2, 5, 3])
    """

    name = "dot"
    dot_reducible = True

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1)  # (..., L, S)

    def dot_form(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return q, k, None


class ScaledDot(Dot):
    """Scaled dot product: ``scale · q · k``, ``scale = 1/sqrt(E)`` by default.

    The default score (``score="scaled_dot"``, SDPA's and the Transformer's):
    ``logits[..., i, j] = scale * q[..., i, :] · k[..., j, :]``. Query and key need the
    same feature size E; every backend runs it. A ``scale`` given to
    :func:`attnkit.attention` takes the place of this one.

    Args:
        scale: the multiplier, a positive finite float; None (default):
            ``1/sqrt(E)``, E the query's feature size.

    Raises:
        TypeError: ``scale`` is not a number.
        ValueError: ``scale`` is not positive and finite.
    """

    name = "scaled_dot"

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = None if scale is None else _check_scale("ScaledDot(scale)", scale)

    def default_scale(self, E: int) -> float:
        """``scale`` when given, else ``1/sqrt(E)``."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(E)

    def extra_repr(self) -> str:
        return "" if self.scale is None else f"scale={self.scale}"


class Bilinear(Score):
    """Bilinear: ``q · W · kᵀ`` with ``weight`` of shape (query_dim, key_dim).

    Reduces exactly to a dot product of ``q W`` and ``k``.

    ``logits[..., i, j] = q[..., i, :] @ weight @ k[..., j, :]``, times
    ``attention(scale=...)`` (1 by default). Query and key may have different feature
    sizes: q (..., L, query_dim), k (..., S, key_dim). Being dot-reducible, it runs on
    every backend (``sdpa`` included, as the dot product of ``q @ weight`` and k).

    Args:
        query_dim: the query's feature size, a positive int.
        key_dim: the key's feature size, a positive int.
        device: where the weight is created (default: torch's default device).
        dtype: the weight's dtype (default: torch's default dtype).

    Attributes:
        weight: ``nn.Parameter`` of shape (query_dim, key_dim), Xavier-uniform
            initialized.

    Raises:
        ValueError: ``query_dim`` or ``key_dim`` is not a positive int.

    Examples:
        >>> import torch, attnkit
        >>> score = attnkit.scores.Bilinear(16, 32)
        >>> score.weight.shape
        torch.Size([16, 32])
        >>> q, k, v = torch.randn(2, 5, 16), torch.randn(2, 7, 32), torch.randn(2, 7, 4)
        >>> attnkit.attention(q, k, v, score=score).shape
        torch.Size([2, 5, 4])
    """

    name = "bilinear"
    dot_reducible = True

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        query_dim = _check_dim("Bilinear", "query_dim", query_dim)
        key_dim = _check_dim("Bilinear", "key_dim", key_dim)
        dtype = as_factory_dtype("scores.Bilinear", dtype)
        device = as_factory_device("scores.Bilinear", device)
        self.weight = nn.Parameter(torch.empty(query_dim, key_dim, device=device, dtype=dtype))
        nn.init.xavier_uniform_(self.weight)

    def query_dim(self) -> int | None:
        return int(self.weight.shape[0])

    def key_dim(self) -> int | None:
        return int(self.weight.shape[1])

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q @ self.weight) @ k.transpose(-2, -1)  # (..., L, S)

    def dot_form(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return q @ self.weight, k, None  # (..., L, Ek), (..., S, Ek)

    def extra_repr(self) -> str:
        return f"query_dim={self.weight.shape[0]}, key_dim={self.weight.shape[1]}"


class Additive(Score):
    """Additive (Bahdanau): ``w_vᵀ · tanh(W_q · q + W_k · k)``.

    Submodules are named as in d2l (``W_q``, ``W_k``, ``w_v``, all bias-free
    ``nn.Linear``), so d2l state_dicts load unchanged.

    ``logits[..., i, j] = w_v · tanh(W_q q[..., i, :] + W_k k[..., j, :])``, times
    ``attention(scale=...)`` (1 by default). Query and key may have different feature
    sizes: q (..., L, query_dim), k (..., S, key_dim). Not a dot product, so ``sdpa``
    does not run it: the ``chunked`` and ``reference`` backends do, and ``triton`` on
    CUDA.

    Args:
        query_dim: the query's feature size, a positive int.
        key_dim: the key's feature size, a positive int.
        hidden_dim: the size of the hidden layer (d2l's ``num_hiddens``), a positive int.
        device: where the weights are created (default: torch's default device).
        dtype: the weights' dtype (default: torch's default dtype).

    Attributes:
        W_q: ``nn.Linear(query_dim, hidden_dim, bias=False)``: weight (hidden_dim, query_dim).
        W_k: ``nn.Linear(key_dim, hidden_dim, bias=False)``: weight (hidden_dim, key_dim).
        w_v: ``nn.Linear(hidden_dim, 1, bias=False)``: weight (1, hidden_dim).

    Raises:
        ValueError: a dim is not a positive int.

    Examples:
        >>> import torch, attnkit
        >>> score = attnkit.scores.Additive(query_dim=20, key_dim=2, hidden_dim=8)
        >>> score.W_q.weight.shape, score.W_k.weight.shape, score.w_v.weight.shape
        (torch.Size([8, 20]), torch.Size([8, 2]), torch.Size([1, 8]))
        >>> q, k, v = torch.randn(2, 1, 20), torch.randn(2, 10, 2), torch.randn(2, 10, 4)
        >>> attnkit.attention(q, k, v, score=score).shape
        torch.Size([2, 1, 4])
    """

    name = "additive"
    dot_reducible = False

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        hidden_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        query_dim = _check_dim("Additive", "query_dim", query_dim)
        key_dim = _check_dim("Additive", "key_dim", key_dim)
        hidden_dim = _check_dim("Additive", "hidden_dim", hidden_dim)
        dtype = as_factory_dtype("scores.Additive", dtype)
        device = as_factory_device("scores.Additive", device)
        kw = {"device": device, "dtype": dtype, "bias": False}
        self.W_q = nn.Linear(query_dim, hidden_dim, **kw)  # type: ignore[arg-type]
        self.W_k = nn.Linear(key_dim, hidden_dim, **kw)  # type: ignore[arg-type]
        self.w_v = nn.Linear(hidden_dim, 1, **kw)  # type: ignore[arg-type]

    def query_dim(self) -> int | None:
        return int(self.W_q.in_features)

    def key_dim(self) -> int | None:
        return int(self.W_k.in_features)

    @property
    def hidden_dim(self) -> int:
        """The hidden layer's size (``W_q.out_features``)."""
        return int(self.W_q.out_features)

    def project(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected features: (..., L, hidden) and (..., S, hidden)."""
        return self.W_q(q), self.W_k(k)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        qh, kh = self.project(q, k)
        feats = torch.tanh(qh.unsqueeze(-2) + kh.unsqueeze(-3))  # (..., L, S, hidden)
        return feats @ self.w_v.weight.squeeze(0)  # (..., L, S)

    def feature_terms(self, q: torch.Tensor, k: torch.Tensor) -> FeatureTerms:
        """``tanh(W_q q + W_k k) · w_v`` per hidden feature: sides (..., L, hidden) and
        (..., S, hidden), weights ``w_v`` (hidden,)."""
        qh, kh = self.project(q, k)
        return FeatureTerms("additive", qh, kh, weights=self.w_v.weight.reshape(-1))

    def extra_repr(self) -> str:
        return ""


class Gaussian(Score):
    """Gaussian kernel: ``-‖q - k‖² / (2σ²)`` (Nadaraya–Watson with softmax).

    Reduces exactly to a dot product: ``q·k/σ² - ‖k‖²/(2σ²) - ‖q‖²/(2σ²)``; the last
    term is constant per query, which softmax ignores (it is added back to lse).
    ``sigma`` may be learnable (``learnable=True`` makes it an ``nn.Parameter``).

    ``logits[..., i, j] = -‖q[..., i, :] - k[..., j, :]‖² / (2σ²)``, times
    ``attention(scale=...)`` (1 by default); ``score="gaussian"`` is ``Gaussian(1.0)``.
    Query and key need the same feature size. Every backend runs it in the dot form
    (centred on the keys' mean); where that form would lose precision (inputs that span
    many bandwidths) only ``chunked`` and ``reference``, which form the differences
    ``q - k``, take the call.

    Args:
        sigma: the bandwidth σ, a positive finite number or 0-d tensor (default 1.0).
        learnable: keyword-only; True: ``sigma`` is an ``nn.Parameter`` in torch's
            default dtype (trained with the model); False (default): a buffer in
            float64, cast to the inputs' dtype where it is used.

    Attributes:
        sigma: the 0-d bandwidth (a parameter or a buffer, as above).

    Raises:
        TypeError: ``sigma`` is not a number or a tensor (a bool included).
        ValueError: ``sigma`` is not a positive finite scalar.

    Examples:
        >>> import torch, attnkit
        >>> x = torch.linspace(0, 5, 50).reshape(1, 50, 1)      # Nadaraya–Watson
        >>> y = torch.sin(x)
        >>> q = torch.tensor([[[2.5]]])
        >>> attnkit.attention(q, x, y, score=attnkit.scores.Gaussian(0.5)).shape
        torch.Size([1, 1, 1])
    """

    name = "gaussian"
    dot_reducible = True

    def __init__(self, sigma: float | torch.Tensor = 1.0, *, learnable: bool = False) -> None:
        super().__init__()
        learnable = as_bool("Gaussian", "learnable", learnable)
        # A fixed bandwidth is kept in float64 so float64 inputs see it exactly.
        dtype = torch.get_default_dtype() if learnable else torch.float64
        if isinstance(sigma, bool) or not isinstance(sigma, (numbers.Real, torch.Tensor)):
            raise TypeError(
                f"Gaussian: sigma must be a positive finite number or a 0-d tensor, got {sigma!r}"
            )
        value = torch.as_tensor(sigma, dtype=dtype).detach().clone()
        if value.ndim != 0 or not bool(torch.isfinite(value)) or float(value) <= 0:
            raise ValueError(f"Gaussian: sigma must be a positive finite scalar, got {sigma!r}")
        if learnable:
            self.sigma = nn.Parameter(value)
        else:
            self.register_buffer("sigma", value)

    def check_parameters(self, dtype: torch.dtype | None = None) -> None:
        """σ must be nonzero and finite where it is read (a negative σ is a bandwidth of
        |σ|: the score reads σ², as a learnable σ that crosses 0 in training), and
        ``1 / (2σ²)`` finite in the logits' dtype."""
        check_bandwidth(self.sigma, "score: Gaussian", dtype)

    def _inv_two_var(self, like: torch.Tensor) -> torch.Tensor:
        """``1 / (2σ²)`` in ``like``'s dtype, as ``0.5 · (1/σ)²``: its gradient goes
        through ``1/σ`` (``-1/σ³`` at most), where ``0.5 / σ²``'s own backward forms
        ``0.5 / σ⁴``, beyond float32 for σ below 6e-10 (a learnt σ's gradient was inf)."""
        sigma = self.sigma.to(dtype=like.dtype, device=like.device)
        inverse = 1.0 / sigma
        return 0.5 * (inverse * inverse)

    @staticmethod
    def _center(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Mean key (..., 1, E), shared by every query that sees these keys (GQA too)."""
        center = k.detach().mean(dim=-2, keepdim=True)  # (..., Hk, 1, E)
        if (
            q.ndim >= 3
            and center.ndim >= 3
            and center.shape[-3] != 1
            and center.shape[-3] != q.shape[-3]
        ):
            center = center.mean(dim=-3, keepdim=True)  # (..., 1, 1, E)
        return center

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., L, S, E)
        return -(diff * diff).sum(-1) * self._inv_two_var(q)  # (..., L, S)

    def feature_terms(self, q: torch.Tensor, k: torch.Tensor) -> FeatureTerms:
        """``-(q_d - k_d)² / 2σ²`` per feature: the sides are q and k themselves."""
        return FeatureTerms(
            "gaussian",
            q,
            k,
            inv_two_var=float(self._inv_two_var(q.new_empty((), dtype=torch.float32))),
        )

    def dot_form(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        c = self._inv_two_var(q)
        # Translation invariance: centring on the keys' mean keeps norms small, so the
        # expanded form loses no precision to cancellation.
        center = self._center(q, k)
        kc = k - center  # (..., S, E)
        key_bias = torch.linalg.vecdot(kc, kc).unsqueeze(-2) * (-c)  # (..., 1, S)
        return (q - center).mul_(2 * c), kc, key_bias  # scaled in place: one pass fewer

    def row_constant(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
        """The per-query term ``-‖q - c‖²/(2σ²)`` that ``dot_form`` drops: (..., L)."""
        qc = q - self._center(q, k)
        return -(qc * qc).sum(-1) * self._inv_two_var(q)

    def extra_repr(self) -> str:
        return f"sigma={float(self.sigma):g}"


def _check_dim(owner: str, name: str, value: object) -> int:
    """``value`` as a Python int (a NumPy int too, as torch's layers take it) when it is
    a positive size up to 2**60, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    n = operator.index(value)
    if not 0 < n <= MAX_POSITION:
        raise ValueError(f"{owner}: {name} must be a positive int up to 2**60, got {n}")
    return n


def _check_scale(name: str, value: object) -> float:
    """``value`` as a float when it is a positive finite real (NumPy's too), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive finite float, got {value!r}")
    try:
        f = float(value)
    except OverflowError:  # (an int beyond any float)
        raise ValueError(f"{name} must be a positive finite float, got {value!r}") from None
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"{name} must be a positive finite float, got {value!r}")
    return f


ScoreName = Literal["dot", "scaled_dot", "gaussian"]
"""The scores :func:`attnkit.attention` takes by name (``score="dot"``): the ones
without learned weights. :class:`Bilinear` and :class:`Additive` are passed as objects."""

_NAMED: dict[str, type[Score]] = {"dot": Dot, "scaled_dot": ScaledDot, "gaussian": Gaussian}


WITH_WEIGHTS: dict[str, tuple[type[Score], str]] = {
    Bilinear.name: (Bilinear, "scores.Bilinear(query_dim, key_dim)"),
    Additive.name: (Additive, "scores.Additive(query_dim, key_dim, hidden_dim)"),
}
"""The scores with learned weights by name: (the class, how to build one). A name cannot
carry weights, so :func:`attnkit.attention` takes these as objects only."""


def refuse_weighted_name(name: str) -> None:
    """Raise the ValueError for ``score=name`` where ``name`` is in :data:`WITH_WEIGHTS`:
    it names the object to pass."""
    raise ValueError(
        f"score: {name!r} needs learned weights, so it is not a name attention() takes; "
        f"pass a {WITH_WEIGHTS[name][1]} object (its weights are parameters you train or "
        f"load). Names attention() takes: {', '.join(sorted(_NAMED))}"
    )


_SHARED: dict[str, Score] = {name: cls() for name, cls in _NAMED.items()}
"""The parameter-free named scores, built once at import: a dict that never changes
after import gives torch.compile no reason to recompile on a later call."""


def is_shared_score(score: Score) -> bool:
    """True for the parameter-free score objects built once from a name ("scaled_dot")."""
    return _SHARED.get(score.name) is score


def resolve_score(score: ScoreName | str | Score) -> Score:
    """Turn ``"dot"``, ``"scaled_dot"``, ``"gaussian"`` or a :class:`Score` into a Score.

    What :func:`attnkit.attention` does with its ``score=`` argument.

    Args:
        score: a name of a parameter-free score (``"dot"``, ``"scaled_dot"``,
            ``"gaussian"``) or a :class:`Score` object.

    Returns:
        The object itself when ``score`` is a Score; for a name, the one shared
        instance of :class:`Dot`, :class:`ScaledDot` or :class:`Gaussian` (σ = 1)
        built at import (the same object on every call).

    Raises:
        ValueError: an unknown name (``"bilinear"`` and ``"additive"`` hold weights:
            build :class:`Bilinear` or :class:`Additive` instead).
        TypeError: ``score`` is neither a string nor a Score.

    Examples:
        >>> from attnkit import scores
        >>> scores.resolve_score("scaled_dot")
        ScaledDot()
        >>> scores.resolve_score("gaussian") is scores.resolve_score("gaussian")
        True
    """
    if isinstance(score, Score):
        return score
    if isinstance(score, str):
        shared = _SHARED.get(score)
        if shared is None and score in WITH_WEIGHTS:
            refuse_weighted_name(score)
        if shared is None:
            raise ValueError(
                f"score: unknown score {score!r}; expected one of {sorted(_NAMED)} or a "
                "Score object (scores.Bilinear, scores.Additive, ...)"
            )
        return shared
    raise TypeError(
        f"score: expected a string ({', '.join(sorted(_NAMED))}) or an attnkit.scores.Score, "
        f"got {type(score).__name__}"
    )


from ._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
